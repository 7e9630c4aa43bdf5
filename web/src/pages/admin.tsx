// Platform pages: every tenant, and every worker with its slices.

import { api, ok } from '../api/client';
import { formatAgo, formatBytes, formatTime } from '../format';
import { tenantPath } from '../router';
import { Badge, Empty, Link, Loaded, PageHeader, useLoad } from '../ui';

export function TenantsPage() {
  const [load, reload] = useLoad(() => ok(api.GET('/v1/tenants')), []);
  return (
    <section>
      <PageHeader title="Tenants">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="tenants">
        {({ tenants }) =>
          tenants.length === 0 ? (
            <Empty>No tenants.</Empty>
          ) : (
            <div class="table-wrap">
              <table data-testid="tenants">
                <thead>
                  <tr>
                    <th>Name</th>
                    <th>Display name</th>
                    <th>Created</th>
                    <th>Open</th>
                  </tr>
                </thead>
                <tbody>
                  {tenants.map((t) => (
                    <tr key={t.id}>
                      <td>
                        <Link href={tenantPath(t.name, 'models')}>{t.name}</Link>
                      </td>
                      <td>{t.display_name}</td>
                      <td>{formatTime(t.created_at)}</td>
                      <td class="actions">
                        <Link href={tenantPath(t.name, 'deployments')}>deployments</Link> <Link href={tenantPath(t.name, 'quotas')}>quotas</Link>{' '}
                        <Link href={tenantPath(t.name, 'usage')}>usage</Link>
                      </td>
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

async function loadWorkers() {
  const [workers, tenants] = await Promise.all([ok(api.GET('/v1/workers')), ok(api.GET('/v1/tenants'))]);
  return { workers: workers.workers, tenantNames: new Map(tenants.tenants.map((t) => [t.id, t.name])) };
}

export function WorkersPage() {
  const [load, reload] = useLoad(loadWorkers, []);
  return (
    <section>
      <PageHeader title="Workers">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="workers">
        {({ workers, tenantNames }) =>
          workers.length === 0 ? (
            <Empty>No workers have connected.</Empty>
          ) : (
            <div class="workers wide">
              {workers.map((w) => (
                <div class="card" key={w.id} data-testid="worker">
                  <h2>
                    {w.id} <Badge value={w.state} />
                  </h2>
                  <p class="muted">
                    HTTP <code>{w.http_endpoint}</code>, gRPC <code>{w.grpc_endpoint}</code>
                    {w.metrics_endpoint && (
                      <>
                        , metrics <code>{w.metrics_endpoint}</code>
                      </>
                    )}
                    . {w.replicas} replica{w.replicas === 1 ? '' : 's'}; last heartbeat <span title={formatTime(w.last_heartbeat_at)}>{formatAgo(w.last_heartbeat_at)}</span>.
                  </p>
                  <table>
                    <thead>
                      <tr>
                        <th>Slice</th>
                        <th>Profile</th>
                        <th>Kind</th>
                        <th class="num">Memory</th>
                        <th>Tenant</th>
                        <th>Health</th>
                      </tr>
                    </thead>
                    <tbody>
                      {w.slices.map((s) => (
                        <tr key={s.id}>
                          <td>
                            <code>{s.id}</code>
                          </td>
                          <td>{s.profile}</td>
                          <td>{s.kind}</td>
                          <td class="num">{formatBytes(s.memory_bytes)}</td>
                          <td>{s.tenant_id ? (tenantNames.get(s.tenant_id) ?? <code>{s.tenant_id.slice(0, 8)}</code>) : <span class="muted">free</span>}</td>
                          <td data-testid="slice-health" title={s.unhealthy_reason ?? undefined}>
                            {s.health === 'healthy' ? s.health : <strong>{s.health}: {s.unhealthy_reason ?? 'no reason given'}</strong>}
                          </td>
                        </tr>
                      ))}
                    </tbody>
                  </table>
                </div>
              ))}
            </div>
          )
        }
      </Loaded>
    </section>
  );
}
