// Quotas: each limit with its current use.

import { api, ok } from '../api/client';
import { formatBytes, formatCents, formatCount, formatPercent } from '../format';
import { quotaRows, type QuotaRow } from '../shape';
import { Loaded, PageHeader, useLoad } from '../ui';

function amount(v: number, unit: QuotaRow['unit']): string {
  if (unit === 'bytes') return formatBytes(v);
  if (unit === 'cents') return formatCents(v);
  if (unit === 'per_second') return `${formatCount(v)}/s`;
  return formatCount(v);
}

export function QuotasPage(props: { tenant: string }) {
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
        )}
      </Loaded>
    </section>
  );
}
