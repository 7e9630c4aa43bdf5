// Usage and invoices: a month's invoice (lines by model) and the usage behind it.

import { useState } from 'preact/hooks';
import { api, ok } from '../api/client';
import { formatBytes, formatCents, formatCount, formatQuantity, formatTime } from '../format';
import { query, setQuery } from '../router';
import { invoiceByModel, recentPeriods } from '../shape';
import { Empty, Loaded, PageHeader, useLoad } from '../ui';

/** `[from, to)` of a `YYYY-MM` month, RFC 3339. */
function periodBounds(period: string): { from: string; to: string } {
  const [y, m] = period.split('-').map(Number);
  return { from: new Date(Date.UTC(y, m - 1, 1)).toISOString(), to: new Date(Date.UTC(y, m, 1)).toISOString() };
}

const UNIT_LABEL: Record<string, string> = { slice_hour: 'slice-hours', '1000_inferences': 'thousand inferences' };

export function UsagePage(props: { tenant: string }) {
  const { tenant } = props;
  const periods = recentPeriods(new Date(), 12);
  const [period, setPeriod] = useState(query().get('period') ?? periods[0]);
  const [invoice, reloadInvoice] = useLoad(
    () => ok(api.GET('/v1/tenants/{tenant}/invoices/{period}', { params: { path: { tenant, period } } })),
    [tenant, period],
  );
  const [usage, reloadUsage] = useLoad(() => {
    const { from, to } = periodBounds(period);
    const now = new Date().toISOString();
    const q = { from, to: to < now ? to : now, group_by: ['model' as const, 'version' as const, 'profile' as const] };
    return ok(api.GET('/v1/tenants/{tenant}/usage', { params: { path: { tenant }, query: q } }));
  }, [tenant, period]);
  const choose = (p: string) => {
    setPeriod(p);
    setQuery({ period: p });
  };
  return (
    <section>
      <PageHeader title="Usage & invoices">
        <label>
          Month{' '}
          <select value={period} onChange={(e) => choose((e.target as HTMLSelectElement).value)} data-testid="period">
            {periods.map((p) => (
              <option key={p} value={p}>
                {p}
              </option>
            ))}
          </select>
        </label>
        <button
          type="button"
          onClick={() => {
            reloadInvoice();
            reloadUsage();
          }}
        >
          Refresh
        </button>
      </PageHeader>
      <h2>Invoice {period}</h2>
      <Loaded load={invoice} retry={reloadInvoice} what="the invoice">
        {(inv) =>
          inv.lines.length === 0 ? (
            <Empty>Nothing billed in {inv.period} (total {formatCents(inv.total_cents, inv.currency)}).</Empty>
          ) : (
            <div class="table-wrap">
              <table data-testid="invoice">
                <thead>
                  <tr>
                    <th>Model</th>
                    <th>Profile</th>
                    <th>Item</th>
                    <th class="num">Quantity</th>
                    <th class="num">Unit price</th>
                    <th class="num">Amount</th>
                  </tr>
                </thead>
                {invoiceByModel(inv).map((g) => (
                  <tbody key={g.model}>
                    {g.lines.map((l, i) => (
                      <tr key={i}>
                        <td>{i === 0 ? g.model : ''}</td>
                        <td>{l.slice_profile}</td>
                        <td>{l.kind === 'slice_hours' ? 'Slice time' : 'Inferences'}</td>
                        <td class="num">
                          {formatQuantity(l.quantity)} {UNIT_LABEL[l.unit] ?? l.unit}
                        </td>
                        <td class="num">{formatCents(l.unit_price_cents, inv.currency)}</td>
                        <td class="num">{formatCents(l.amount_cents, inv.currency)}</td>
                      </tr>
                    ))}
                    <tr class="subtotal">
                      <td colSpan={5}>Subtotal {g.model}</td>
                      <td class="num">{formatCents(g.subtotalCents, inv.currency)}</td>
                    </tr>
                  </tbody>
                ))}
                <tfoot>
                  <tr class="total">
                    <td colSpan={5}>Total ({inv.currency})</td>
                    <td class="num" data-testid="invoice-total">
                      {formatCents(inv.total_cents, inv.currency)}
                    </td>
                  </tr>
                  {inv.status === 'issued' && (
                    <tr>
                      <td colSpan={5} data-testid="invoice-issued">
                        Issued {formatTime(inv.issued_at)}
                        {inv.issued_total_cents !== undefined && inv.issued_total_cents !== inv.total_cents
                          ? ' (usage arrived after issue: the issued total differs)'
                          : ''}
                      </td>
                      <td class="num">{formatCents(inv.issued_total_cents ?? inv.total_cents, inv.currency)}</td>
                    </tr>
                  )}
                  {inv.gpu_seconds > 0 && (
                    <tr>
                      <td colSpan={5}>GPU time (whole GPUs and MIG instances)</td>
                      <td class="num" data-testid="invoice-gpu-seconds">
                        {formatQuantity(inv.gpu_seconds, 1)} s
                      </td>
                    </tr>
                  )}
                </tfoot>
              </table>
            </div>
          )
        }
      </Loaded>
      <h2>Usage {period}</h2>
      <Loaded load={usage} retry={reloadUsage} what="usage">
        {({ usage: rows }) =>
          rows.length === 0 ? (
            <Empty>No usage recorded in {period}.</Empty>
          ) : (
            <div class="table-wrap">
              <table data-testid="usage">
                <thead>
                  <tr>
                    <th>Model</th>
                    <th>Version</th>
                    <th>Profile</th>
                    <th class="num">Requests</th>
                    <th class="num">Failed</th>
                    <th class="num">Inferences</th>
                    <th class="num">Compute s</th>
                    <th class="num">Slice s</th>
                    <th class="num">GPU s</th>
                    <th class="num">In</th>
                    <th class="num">Out</th>
                    <th class="num" title="Requests the gateway refused under the tenant's rate or concurrency limit">
                      Throttled
                    </th>
                  </tr>
                </thead>
                <tbody>
                  {rows.map((r, i) => (
                    <tr key={i}>
                      <td>{r.model ?? '–'}</td>
                      <td class="num">{r.version ?? '–'}</td>
                      <td>{r.slice_profile ?? '–'}</td>
                      <td class="num">{formatCount(r.requests)}</td>
                      <td class="num">{formatCount(r.failures)}</td>
                      <td class="num">{formatCount(r.inferences)}</td>
                      <td class="num">{formatQuantity(r.compute_seconds, 3)}</td>
                      <td class="num">{formatQuantity(r.slice_seconds, 1)}</td>
                      <td class="num">{formatQuantity(r.gpu_seconds, 1)}</td>
                      <td class="num">{formatBytes(r.bytes_in)}</td>
                      <td class="num">{formatBytes(r.bytes_out)}</td>
                      <td class="num">{formatCount(r.throttled)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          )
        }
      </Loaded>
    </section>
  );
}
