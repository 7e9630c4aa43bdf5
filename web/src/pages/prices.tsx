// Prices (platform admins): the price schedule, edited as a table and saved whole after a
// confirmation (invoices are computed from it when read, so a changed past entry changes past
// invoices; adding an entry with a later start is how prices change).

import { useEffect, useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { formatCents } from '../format';
import { priceForm, pricesBody, type PriceForm } from '../forms';
import { ConfirmDialog, Empty, Loaded, PageHeader, useLoad } from '../ui';

/** The first minute of the next month, UTC, as a `datetime-local` value. */
function nextMonth(now: Date = new Date()): string {
  return new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() + 1, 1)).toISOString().slice(0, 16);
}

export function PricesPage() {
  const [load, reload] = useLoad(() => ok(api.GET('/v1/prices')), []);
  return (
    <section>
      <PageHeader title="Prices">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="prices">
        {(p) => <PriceEditor initial={p.prices.map(priceForm)} onSaved={reload} />}
      </Loaded>
    </section>
  );
}

function PriceEditor(props: { initial: PriceForm[]; onSaved: () => void }) {
  const [rows, setRows] = useState<PriceForm[]>(props.initial);
  const [confirming, setConfirming] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  useEffect(() => setRows(props.initial), [JSON.stringify(props.initial)]);
  const parsed = pricesBody(rows);
  const set = (i: number, field: keyof PriceForm, value: string) => setRows(rows.map((r, j) => (j === i ? { ...r, [field]: value } : r)));
  const add = () => setRows([...rows, { slice_profile: 'cpu', per_slice_hour_cents: '0', per_1000_inferences_cents: '0', effective_from: nextMonth() }]);
  const save = async () => {
    if (!parsed.ok) return;
    setBusy(true);
    setError(null);
    try {
      await ok(api.PUT('/v1/prices', { body: parsed.value }));
      setConfirming(false);
      setNotice('The price schedule is saved; invoices use it from now on.');
      props.onSaved();
    } catch (e) {
      setError(messageOf(e));
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      {notice && (
        <p class="state notice" role="status">
          {notice}
        </p>
      )}
      {rows.length === 0 ? (
        <Empty>No prices: every invoice is zero. Add an entry below.</Empty>
      ) : (
        <div class="table-wrap">
          <table data-testid="prices">
            <thead>
              <tr>
                <th>Profile</th>
                <th>Cents per slice-hour</th>
                <th>Cents per 1,000 inferences</th>
                <th>From (UTC)</th>
                <th>Per slice-hour</th>
                <th />
              </tr>
            </thead>
            <tbody>
              {rows.map((r, i) => (
                <tr key={i} data-row={i}>
                  <td>
                    <input aria-label={`Profile, row ${i + 1}`} value={r.slice_profile} size={12} onInput={(e) => set(i, 'slice_profile', (e.target as HTMLInputElement).value)} />
                  </td>
                  <td>
                    <input aria-label={`Cents per slice-hour, row ${i + 1}`} inputMode="decimal" value={r.per_slice_hour_cents} size={10} onInput={(e) => set(i, 'per_slice_hour_cents', (e.target as HTMLInputElement).value)} />
                  </td>
                  <td>
                    <input aria-label={`Cents per 1000 inferences, row ${i + 1}`} inputMode="decimal" value={r.per_1000_inferences_cents} size={10} onInput={(e) => set(i, 'per_1000_inferences_cents', (e.target as HTMLInputElement).value)} />
                  </td>
                  <td>
                    <input aria-label={`Effective from, row ${i + 1}`} type="datetime-local" value={r.effective_from} onInput={(e) => set(i, 'effective_from', (e.target as HTMLInputElement).value)} />
                  </td>
                  <td class="num">{Number.isFinite(Number(r.per_slice_hour_cents)) ? formatCents(Number(r.per_slice_hour_cents)) : '–'}</td>
                  <td>
                    <button type="button" onClick={() => setRows(rows.filter((_, j) => j !== i))}>
                      Remove
                    </button>
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <div class="toolbar inline">
        <button type="button" onClick={add}>
          Add entry
        </button>
        <button type="button" class="primary" disabled={!parsed.ok} onClick={() => (setError(null), setConfirming(true))}>
          Save prices
        </button>
        {!parsed.ok && <span class="reason">{parsed.error}</span>}
      </div>
      {confirming && (
        <ConfirmDialog title="Replace the price schedule?" confirmLabel="Save prices" danger busy={busy} error={error} onConfirm={save} onCancel={() => setConfirming(false)}>
          <p>
            The schedule becomes these {rows.length} entr{rows.length === 1 ? 'y' : 'ies'}. Invoices are computed when read, so a changed or removed past entry
            changes past invoices too.
          </p>
        </ConfirmDialog>
      )}
    </>
  );
}
