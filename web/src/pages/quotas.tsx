// Quotas: each limit with its current use; platform admins change the limits.

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { formatBytes, formatCents, formatCount, formatPercent } from '../format';
import { quotaBody, quotaForm, type QuotaForm } from '../forms';
import type { Session } from '../session';
import { quotaRows, type QuotaRow, type Quotas } from '../shape';
import { ErrorBox, Loaded, PageHeader, useLoad } from '../ui';

function amount(v: number, unit: QuotaRow['unit']): string {
  if (unit === 'bytes') return formatBytes(v);
  if (unit === 'cents') return formatCents(v);
  if (unit === 'per_second') return `${formatCount(v)}/s`;
  return formatCount(v);
}

export function QuotasPage(props: { session: Session; tenant: string }) {
  const { tenant } = props;
  const [load, reload] = useLoad(async () => {
    const [quotas, invoice] = await Promise.all([
      ok(api.GET('/v1/tenants/{tenant}/quotas', { params: { path: { tenant } } })),
      // The month's spend so far; the quotas still show without it.
      ok(api.GET('/v1/tenants/{tenant}/invoices', { params: { path: { tenant } } })).catch(() => null),
    ]);
    return { quotas, spent: invoice ? invoice.total_cents : null };
  }, [tenant]);
  return (
    <section>
      <PageHeader title="Quotas">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="quotas">
        {({ quotas, spent }) => (
          <>
          <div class="table-wrap">
            <table data-testid="quotas">
              <thead>
                <tr>
                  <th>Quota</th>
                  <th class="num">In use</th>
                  <th class="num">Limit</th>
                  <th>Share</th>
                </tr>
              </thead>
              <tbody>
                {quotaRows(quotas, spent).map((r) => (
                  <tr key={r.name}>
                    <td>{r.name}</td>
                    <td class="num">{r.used === null ? <span class="muted">not tracked here</span> : amount(r.used, r.unit)}</td>
                    <td class="num">{r.unit === 'cents' && r.limit === 0 ? 'unlimited' : amount(r.limit, r.unit)}</td>
                    <td>
                      {r.share === null ? (
                        <span class="muted">–</span>
                      ) : (
                        <span class="meter-wrap">
                          <meter min={0} max={1} low={0.7} high={0.9} optimum={0} value={Math.min(r.share, 1)} aria-label={`${r.name} used`} />{' '}
                          {formatPercent(r.share)}
                        </span>
                      )}
                    </td>
                  </tr>
                ))}
              </tbody>
            </table>
          </div>
          {props.session.abilities.platform && <QuotaEditor tenant={tenant} quotas={quotas} onSaved={reload} />}
          </>
        )}
      </Loaded>
    </section>
  );
}

const QUOTA_FIELDS: { key: Exclude<keyof QuotaForm, 'slices'>; label: string }[] = [
  { key: 'models', label: 'Models' },
  { key: 'versions', label: 'Versions' },
  { key: 'storage_bytes', label: 'Storage (bytes)' },
  { key: 'replicas', label: 'Replicas' },
  { key: 'requests_per_second', label: 'Requests per second (0 unlimited)' },
  { key: 'concurrent_requests', label: 'Concurrent requests (0 unlimited)' },
  { key: 'monthly_spend_cents', label: 'Monthly spend in cents (0 unlimited)' },
];

/** The limits as a form (platform admins); saving replaces them all. */
function QuotaEditor(props: { tenant: string; quotas: Quotas; onSaved: () => void }) {
  const [form, setForm] = useState<QuotaForm>(() => quotaForm(props.quotas.limits));
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const parsed = quotaBody(form);
  const save = async (e: Event) => {
    e.preventDefault();
    if (!parsed.ok) return setError(parsed.error);
    setBusy(true);
    setError(null);
    setNotice(null);
    try {
      await ok(api.PUT('/v1/tenants/{tenant}/quotas', { params: { path: { tenant: props.tenant } }, body: parsed.value }));
      setNotice(`Quotas of ${props.tenant} saved.`);
      props.onSaved();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <form class="form-card" onSubmit={save} aria-label="Change quotas">
      <h2>Change limits</h2>
      <div class="form-grid">
        {QUOTA_FIELDS.map((f) => (
          <label key={f.key}>
            {f.label}
            <input name={f.key} inputMode="numeric" value={form[f.key]} onInput={(e) => setForm({ ...form, [f.key]: (e.target as HTMLInputElement).value })} />
          </label>
        ))}
        <label>
          Slices per profile (profile=count, one a line)
          <textarea name="slices" rows={3} value={form.slices} onInput={(e) => setForm({ ...form, slices: (e.target as HTMLTextAreaElement).value })} />
        </label>
      </div>
      <div class="toolbar inline">
        <button type="submit" class="primary" disabled={busy}>
          {busy ? 'Saving…' : 'Save quotas'}
        </button>
        {notice && (
          <span class="state notice" role="status">
            {notice}
          </span>
        )}
      </div>
      {error && <ErrorBox message={error} />}
    </form>
  );
}
