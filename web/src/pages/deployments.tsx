// Deployments: the list, and one deployment's replicas per worker and slice with its recent
// placement events.

import { useEffect } from 'preact/hooks';
import { api, ok } from '../api/client';
import { formatAgo, formatBytes, formatTime } from '../format';
import { tenantPath } from '../router';
import { countStates, replicasByWorker, type Deployment } from '../shape';
import { Badge, Empty, Link, Loaded, PageHeader, useLoad } from '../ui';

/** Calls `f` every `ms` while the page is shown. */
function useEvery(ms: number, f: () => void): void {
  useEffect(() => {
    const id = setInterval(f, ms);
    return () => clearInterval(id);
  }, [ms, f]);
}

function target(d: Deployment): string {
  return d.alias ? `alias ${d.alias} → v${d.version}` : `v${d.version}`;
}

export function DeploymentsPage(props: { tenant: string }) {
  const { tenant } = props;
  const [load, reload] = useLoad(() => ok(api.GET('/v1/tenants/{tenant}/deployments', { params: { path: { tenant } } })), [tenant]);
  useEvery(10_000, reload);
  return (
    <section>
      <PageHeader title="Deployments">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="deployments">
        {({ deployments }) =>
          deployments.length === 0 ? (
            <Empty>
              No deployments. Deploy a model with <code>tessera deploy --model NAME --alias production --wait</code>.
            </Empty>
          ) : (
            <div class="table-wrap">
              <table>
                <thead>
                  <tr>
                    <th>Name</th>
                    <th>Model</th>
                    <th>Target</th>
                    <th>Serving</th>
                    <th>Profile</th>
                    <th>Replicas</th>
                    <th>State</th>
                  </tr>
                </thead>
                <tbody>
                  {deployments.map((d) => {
                    const counts = countStates(d.replica_status);
                    return (
                      <tr key={d.id}>
                        <td>
                          <Link href={tenantPath(tenant, 'deployments', d.name)}>{d.name}</Link>
                        </td>
                        <td>
                          <Link href={tenantPath(tenant, 'models', d.model)}>{d.model}</Link>
                        </td>
                        <td>{target(d)}</td>
                        <td class="num">{d.serving_version ?? <span class="muted">none</span>}</td>
                        <td>{d.profile}</td>
                        <td>
                          {counts.ready ?? 0}/{d.replicas} ready
                        </td>
                        <td>
                          <Badge value={d.state} />
                        </td>
                      </tr>
                    );
                  })}
                </tbody>
              </table>
            </div>
          )
        }
      </Loaded>
    </section>
  );
}

async function loadDeployment(tenant: string, deployment: string) {
  const path = { tenant, deployment };
  const [d, events] = await Promise.all([
    ok(api.GET('/v1/tenants/{tenant}/deployments/{deployment}', { params: { path } })),
    ok(api.GET('/v1/tenants/{tenant}/deployments/{deployment}/events', { params: { path } })),
  ]);
  return { deployment: d, events: events.events.slice().reverse() };
}

export function DeploymentPage(props: { tenant: string; name: string }) {
  const { tenant, name } = props;
  const [load, reload] = useLoad(() => loadDeployment(tenant, name), [tenant, name]);
  useEvery(5_000, reload);
  return (
    <section>
      <p class="crumbs">
        <Link href={tenantPath(tenant, 'deployments')}>Deployments</Link> / {name}
      </p>
      <PageHeader title={`Deployment ${name}`}>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what={`deployment ${name}`}>
        {({ deployment: d, events }) => (
          <>
            <dl class="facts">
              <dt>Model</dt>
              <dd>
                <Link href={tenantPath(tenant, 'models', d.model)}>{d.model}</Link>
              </dd>
              <dt>Target</dt>
              <dd>{target(d)}</dd>
              <dt>Serving version</dt>
              <dd>{d.serving_version ?? 'none'}</dd>
              <dt>State</dt>
              <dd>
                <Badge value={d.state} />
              </dd>
              <dt>Profile</dt>
              <dd>{d.profile}</dd>
              <dt>Replicas</dt>
              <dd>
                {d.replicas} × {d.instance_count} instance{d.instance_count === 1 ? '' : 's'}, {formatBytes(d.memory_bytes)} each
              </dd>
              <dt>Batching</dt>
              <dd>
                {d.max_batch_size != null ? `max batch ${d.max_batch_size}` : 'from the model config'}
                {d.dynamic_batching ? `, dynamic (delay ${d.dynamic_batching.max_queue_delay_microseconds ?? 0} µs)` : ''}
              </dd>
              <dt>Updated</dt>
              <dd title={formatTime(d.updated_at)}>{formatAgo(d.updated_at)}</dd>
            </dl>
            <h2>Replicas by worker and slice</h2>
            {d.replica_status.length === 0 ? (
              <Empty>No replicas (scaled to zero).</Empty>
            ) : (
              <div class="workers">
                {replicasByWorker(d.replica_status).map((w) => (
                  <div class="card" key={w.worker ?? 'unplaced'} data-testid="worker-group">
                    <h3>{w.worker ? `Worker ${w.worker}` : 'Not placed yet'}</h3>
                    {w.slices.map((s) => (
                      <div key={s.slice ?? 'none'}>
                        <h4>{s.slice ? `Slice ${s.slice}` : 'No slice'}</h4>
                        <ul class="replicas">
                          {s.replicas.map((r) => (
                            <li key={r.id}>
                              #{r.index} v{r.version} <Badge value={r.state} /> {r.serving && <Badge value="serving" />}
                              {r.reason && <span class="reason"> {r.reason}</span>}
                              {r.http_endpoint && <code class="endpoint"> {r.http_endpoint}</code>}
                            </li>
                          ))}
                        </ul>
                      </div>
                    ))}
                  </div>
                ))}
              </div>
            )}
            <h2>Recent events</h2>
            {events.length === 0 ? (
              <Empty>No events yet.</Empty>
            ) : (
              <ol class="events" data-testid="events">
                {events.map((e, i) => (
                  <li key={`${e.at}-${i}`}>
                    <time dateTime={e.at} title={formatTime(e.at)}>
                      {formatAgo(e.at)}
                    </time>{' '}
                    <Badge value={e.kind} /> {e.message}
                    {e.worker_id && !e.message.includes(e.worker_id) && <span class="muted"> (worker {e.worker_id})</span>}
                  </li>
                ))}
              </ol>
            )}
          </>
        )}
      </Loaded>
    </section>
  );
}
