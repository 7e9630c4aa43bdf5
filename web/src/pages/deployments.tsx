// Deployments: the list, and one deployment's traffic split (stable and canary side by side,
// with controls to weight, promote and roll back the canary), its replicas per worker and slice
// and its recent placement events.

import { useEffect, useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { formatAgo, formatBytes, formatCount, formatPercent, formatRate, formatTime } from '../format';
import { tenantPath } from '../router';
import type { Session } from '../session';
import {
  countStates,
  parseWeight,
  rangeQuery,
  replicasByWorker,
  trafficLabel,
  versionStats,
  type Deployment,
  type VersionStats,
} from '../shape';
import { Badge, ConfirmDialog, CopyButton, Empty, Link, Loaded, PageHeader, useLoad } from '../ui';
import { callSnippets } from '../snippets';
import { captureLabel } from '../captures';
import { CreateDeployment, DeploymentControls } from './deploywrite';

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

/** The deployments, and the models a deployer could deploy. */
async function loadDeployments(tenant: string, withModels: boolean) {
  const path = { tenant };
  const [deployments, models] = await Promise.all([
    ok(api.GET('/v1/tenants/{tenant}/deployments', { params: { path } })),
    withModels ? ok(api.GET('/v1/tenants/{tenant}/models', { params: { path, query: { limit: 200 } } })).then((m) => m.models) : Promise.resolve([]),
  ]);
  return { deployments: deployments.deployments, models };
}

export function DeploymentsPage(props: { session: Session; tenant: string }) {
  const { tenant } = props;
  const canDeploy = props.session.abilities.deploy;
  const [load, reload] = useLoad(() => loadDeployments(tenant, canDeploy), [tenant, canDeploy]);
  useEvery(10_000, reload);
  return (
    <section>
      <PageHeader title="Deployments">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="deployments">
        {({ deployments, models }) => (
          <>
          {canDeploy && <CreateDeployment tenant={tenant} models={models} deployed={deployments.map((d) => d.model)} onCreated={reload} />}
          {deployments.length === 0 ? (
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
                    <th>Traffic</th>
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
                        <td>{trafficLabel(d.traffic)}</td>
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
          )}
          </>
        )}
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

export function DeploymentPage(props: { session: Session; tenant: string; name: string }) {
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
              <dt>Capture</dt>
              <dd>
                {captureLabel(d.capture)}
                {props.session.abilities.readCaptures && (
                  <>
                    {' '}
                    (<Link href={`${tenantPath(tenant, 'captures')}?deployment=${encodeURIComponent(d.name)}`}>captured requests</Link>)
                  </>
                )}
              </dd>
              <dt>Updated</dt>
              <dd title={formatTime(d.updated_at)}>{formatAgo(d.updated_at)}</dd>
            </dl>
            {props.session.abilities.deploy && <DeploymentControls key={d.id} tenant={tenant} deployment={d} onChanged={reload} />}
            <EndpointPanel tenant={tenant} deployment={d} />
            <TrafficPanel tenant={tenant} deployment={d} canChange={props.session.abilities.moveAliases} onChanged={reload} />
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
                              #{r.index} v{r.version} {r.canary && <Badge value="canary" />} <Badge value={r.state} /> {r.serving && <Badge value="serving" />}
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

/** A change to the canary the person asked for, confirmed in a dialog. */
type CanaryAction = { kind: 'promote' | 'rollback'; version: number } | { kind: 'start'; version: number; weight: number };

/** Per-version request rate, error rate and latency over the last hour, for the split's versions. */
async function loadStats(tenant: string, model: string, versions: number[]): Promise<VersionStats[]> {
  const range = rangeQuery('1h', new Date());
  return Promise.all(
    versions.map(async (version) => {
      const query = { ...range, model, version };
      const { points } = await ok(api.GET('/v1/tenants/{tenant}/metrics', { params: { path: { tenant }, query } }));
      return versionStats(version, points);
    }),
  );
}

/** Where applications call the model (the gateways), with snippets ready to paste. */
function EndpointPanel(props: { tenant: string; deployment: Deployment }) {
  const e = props.deployment.endpoint;
  const [shown, setShown] = useState(0);
  if (!e) {
    return (
      <>
        <h2>How to call this deployment</h2>
        <Empty>The control plane was started without <code>--gateway-url</code>, so it does not know where applications reach the gateways.</Empty>
      </>
    );
  }
  const snippets = callSnippets(e, props.tenant, location.origin);
  const current = snippets[Math.min(shown, snippets.length - 1)];
  return (
    <>
      <h2>How to call this deployment</h2>
      <dl class="facts">
        <dt>HTTP</dt>
        <dd>
          <code>{e.http}</code>
        </dd>
        {e.grpc ? (
          <>
            <dt>gRPC</dt>
            <dd>
              <code>{e.grpc}</code> (model <code>{e.model}</code>; send the key as lower-case <code>authorization</code> metadata)
            </dd>
          </>
        ) : null}
      </dl>
      <p class="muted">Set <code>TESSERA_KEY</code> to an API key of this tenant (an inference key is enough).</p>
      <div class="tabs" role="tablist" aria-label="Snippets" data-testid="snippets">
        {snippets.map((s, i) => (
          <button type="button" role="tab" key={s.id} aria-selected={s === current} onClick={() => setShown(i)}>
            {s.label}
          </button>
        ))}
      </div>
      <div class="snippet-wrap" role="tabpanel">
        <pre class="snippet" data-testid={`snippet-${current.id}`}>{current.text}</pre>
        <CopyButton text={current.text} />
      </div>
    </>
  );
}

/** The split between the stable version and the canary, each with its replicas and last hour's
 *  traffic side by side; deployers set the canary's weight, promote it, roll it back or start one. */
function TrafficPanel(props: { tenant: string; deployment: Deployment; canChange: boolean; onChanged: () => void }) {
  const { tenant, deployment: d } = props;
  const versions = d.traffic.map((t) => t.version);
  const [stats, reloadStats] = useLoad(() => loadStats(tenant, d.model, versions), [tenant, d.model, versions.join(',')]);
  const [weight, setWeight] = useState(String(d.canary?.weight ?? 10));
  const [startVersion, setStartVersion] = useState('');
  const [action, setAction] = useState<CanaryAction | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  useEffect(() => setWeight(String(d.canary?.weight ?? 10)), [d.canary?.weight]);
  const why = props.canChange ? undefined : 'Needs the deployer role';
  const path = { tenant, deployment: d.name };
  const parsed = parseWeight(weight);

  const run = async (what: () => Promise<unknown>, done: string) => {
    setBusy(true);
    setError(null);
    setNotice(null);
    try {
      await what();
      setNotice(done);
      setAction(null);
      props.onChanged();
      reloadStats();
    } catch (e) {
      setError(messageOf(e));
    } finally {
      setBusy(false);
    }
  };
  const setCanaryWeight = () =>
    parsed !== null &&
    run(
      () => ok(api.PATCH('/v1/tenants/{tenant}/deployments/{deployment}/canary', { params: { path }, body: { weight: parsed } })),
      `The canary now gets ${parsed}% of traffic.`,
    );
  const confirm = () => {
    if (!action) return;
    if (action.kind === 'start') {
      const body = { version: action.version, weight: action.weight };
      return run(
        () => ok(api.PUT('/v1/tenants/{tenant}/deployments/{deployment}/canary', { params: { path }, body })),
        `Version ${action.version} starts as a canary with ${action.weight}% of traffic once a replica is ready.`,
      );
    }
    const route =
      action.kind === 'promote'
        ? api.POST('/v1/tenants/{tenant}/deployments/{deployment}/canary/promote', { params: { path } })
        : api.POST('/v1/tenants/{tenant}/deployments/{deployment}/canary/rollback', { params: { path } });
    const done =
      action.kind === 'promote'
        ? `Version ${action.version} rolls out to the stable replicas; the canary keeps its share until they serve it.`
        : `The canary is rolled back: version ${action.version}'s replicas drain.`;
    return run(() => ok(route), done);
  };
  const stat = (v: number) => (stats.state === 'ok' ? stats.data.find((s) => s.version === v) : undefined);
  const startParsed = Number(startVersion);
  const canStart = Number.isInteger(startParsed) && startParsed >= 1 && startParsed !== d.version && parsed !== null;

  return (
    <>
      <h2>Traffic</h2>
      {notice && (
        <p class="state notice" role="status">
          {notice}
        </p>
      )}
      {error && !action && (
        <p class="state error" role="alert">
          {error}
        </p>
      )}
      <div class="table-wrap">
        <table data-testid="traffic">
          <thead>
            <tr>
              <th>Version</th>
              <th>Weight</th>
              <th>Ready replicas</th>
              <th>Requests/s</th>
              <th>Error rate</th>
              <th>p50</th>
              <th>p95</th>
              <th>Requests (1 h)</th>
            </tr>
          </thead>
          <tbody>
            {d.traffic.map((t) => {
              const s = stat(t.version);
              const ms = (v: number | null | undefined) => (v == null ? '–' : `${v.toFixed(1)} ms`);
              return (
                <tr key={`${t.version}-${t.canary}`} data-version={t.version}>
                  <td>
                    v{t.version} <Badge value={t.canary ? 'canary' : 'stable'} />
                  </td>
                  <td class="num" data-testid={`weight-${t.version}`}>
                    {t.weight}%{t.canary && t.ready_replicas === 0 && <span class="muted"> (once a replica is ready)</span>}
                  </td>
                  <td class="num">
                    {t.ready_replicas}/{t.replicas}
                  </td>
                  <td class="num">{s ? formatRate(s.requestRate) : '–'}</td>
                  <td class="num">{s?.errorShare != null ? formatPercent(s.errorShare) : '–'}</td>
                  <td class="num">{ms(s?.p50Ms)}</td>
                  <td class="num">{ms(s?.p95Ms)}</td>
                  <td class="num">{s ? `${formatCount(s.requests)} (${formatCount(s.failures)} failed)` : '–'}</td>
                </tr>
              );
            })}
          </tbody>
        </table>
      </div>
      <div class="toolbar inline" data-testid="canary-controls">
        <label>
          Canary weight{' '}
          <input type="number" min={1} max={99} size={4} value={weight} disabled={!props.canChange} onInput={(e) => setWeight((e.target as HTMLInputElement).value)} />
          %
        </label>
        {d.canary ? (
          <>
            <button type="button" disabled={!props.canChange || busy || parsed === null || parsed === d.canary.weight} title={why} onClick={setCanaryWeight}>
              Set weight
            </button>
            <button type="button" disabled={!props.canChange || busy} title={why} onClick={() => d.canary && setAction({ kind: 'promote', version: d.canary.version })}>
              Promote v{d.canary.version}
            </button>
            <button type="button" disabled={!props.canChange || busy} title={why} onClick={() => d.canary && setAction({ kind: 'rollback', version: d.canary.version })}>
              Roll back
            </button>
          </>
        ) : (
          <>
            <label>
              Canary version{' '}
              <input type="number" min={1} size={4} value={startVersion} disabled={!props.canChange} onInput={(e) => setStartVersion((e.target as HTMLInputElement).value)} />
            </label>
            <button
              type="button"
              disabled={!props.canChange || busy || !canStart}
              title={why ?? (canStart ? undefined : 'Choose a version other than the deployment\'s and a weight from 1 to 99')}
              onClick={() => parsed !== null && setAction({ kind: 'start', version: startParsed, weight: parsed })}
            >
              Start canary
            </button>
          </>
        )}
        {weight !== '' && parsed === null && <span class="reason">weight must be a whole percent from 1 to 99</span>}
      </div>
      {action && (
        <ConfirmDialog
          title={action.kind === 'promote' ? `Promote version ${action.version}?` : action.kind === 'rollback' ? 'Roll back the canary?' : `Start a canary of version ${action.version}?`}
          confirmLabel={action.kind === 'promote' ? 'Promote' : action.kind === 'rollback' ? 'Roll back' : 'Start canary'}
          busy={busy}
          error={error}
          onConfirm={confirm}
          onCancel={() => setAction(null)}
        >
          {action.kind === 'promote' && (
            <p>
              Version {action.version} becomes the deployment's version: the stable replicas load it beside the old ones and switch when all are ready.
              {d.alias ? ` The deployment stops following alias ${d.alias}.` : ''}
            </p>
          )}
          {action.kind === 'rollback' && <p>Version {d.traffic[0]?.version} takes all traffic at once; version {action.version}'s replicas drain.</p>}
          {action.kind === 'start' && (
            <p>
              Version {action.version} loads on its own replica beside the stable ones and gets {action.weight}% of unversioned traffic once ready.
            </p>
          )}
        </ConfirmDialog>
      )}
    </>
  );
}
