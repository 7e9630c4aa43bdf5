// Metrics: request rate, error rate, latency percentiles and batch size per model and version
// over a chosen range, from `GET /v1/tenants/{tenant}/metrics`.

import { useEffect, useState } from 'preact/hooks';
import { api, ok } from '../api/client';
import { LineChart } from '../chart';
import { formatCount, formatRate, formatTick } from '../format';
import { query, setQuery } from '../router';
import { metricsSeries, RANGES, rangeQuery, type RangeKey } from '../shape';
import { Empty, Loaded, PageHeader, useLoad } from '../ui';

const COLORS = { a: '#2563eb', b: '#dc2626', c: '#d97706', d: '#059669' };

export function MetricsPage(props: { tenant: string }) {
  const { tenant } = props;
  const q = query();
  const [model, setModel] = useState(q.get('model') ?? '');
  const [version, setVersion] = useState(q.get('version') ?? '');
  const [range, setRange] = useState<RangeKey>((q.get('range') as RangeKey) || '1h');
  useEffect(() => setQuery({ model, version, range }), [model, version, range]);

  const [models] = useLoad(() => ok(api.GET('/v1/tenants/{tenant}/models', { params: { path: { tenant }, query: { limit: 200 } } })), [tenant]);
  const [versions] = useLoad(
    () =>
      model
        ? ok(api.GET('/v1/tenants/{tenant}/models/{model}/versions', { params: { path: { tenant, model }, query: { limit: 200 } } }))
        : Promise.resolve({ versions: [] }),
    [tenant, model],
  );
  const [load, reload] = useLoad(() => {
    const r = rangeQuery(range, new Date());
    const params = { ...r, model: model || undefined, version: version ? Number(version) : undefined };
    return ok(api.GET('/v1/tenants/{tenant}/metrics', { params: { path: { tenant }, query: params } }));
  }, [tenant, model, version, range]);
  useEffect(() => {
    const id = setInterval(reload, 15_000);
    return () => clearInterval(id);
  }, [reload]);

  const modelNames = models.state === 'ok' ? models.data.models.map((m) => m.name) : [];
  const versionNumbers = versions.state === 'ok' ? versions.data.versions.map((v) => v.version) : [];
  return (
    <section>
      <PageHeader title="Metrics">
        <label>
          Model{' '}
          <select
            value={model}
            onChange={(e) => {
              setModel((e.target as HTMLSelectElement).value);
              setVersion('');
            }}
            data-testid="metrics-model"
          >
            <option value="">all models</option>
            {modelNames.map((n) => (
              <option key={n} value={n}>
                {n}
              </option>
            ))}
            {model && !modelNames.includes(model) && <option value={model}>{model}</option>}
          </select>
        </label>
        <label>
          Version{' '}
          <select value={version} disabled={!model} onChange={(e) => setVersion((e.target as HTMLSelectElement).value)}>
            <option value="">all versions</option>
            {versionNumbers.map((n) => (
              <option key={n} value={String(n)}>
                {n}
              </option>
            ))}
          </select>
        </label>
        <label>
          Range{' '}
          <select value={range} onChange={(e) => setRange((e.target as HTMLSelectElement).value as RangeKey)}>
            {RANGES.map((r) => (
              <option key={r.key} value={r.key}>
                {r.label}
              </option>
            ))}
          </select>
        </label>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      <Loaded load={load} retry={reload} what="metrics">
        {({ points }) => {
          const s = metricsSeries(points);
          if (s.totalRequests === 0) {
            return <Empty>No requests in this range{model ? ` for ${model}${version ? ` version ${version}` : ''}` : ''}. Send inference traffic and it shows here within a minute.</Empty>;
          }
          const ms = (v: number) => `${formatTick(v)} ms`;
          return (
            <>
              <p class="summary" data-testid="metrics-summary">
                {formatCount(s.totalRequests)} requests, {formatCount(s.totalFailures)} failed in this range.
              </p>
              <div class="charts">
                <LineChart
                  title="Request rate"
                  unit="req/s"
                  times={s.times}
                  format={formatRate}
                  lines={[{ label: 'requests', values: s.requestRate, color: COLORS.a }]}
                />
                <LineChart
                  title="Error rate"
                  unit="errors/s"
                  times={s.times}
                  format={formatRate}
                  lines={[{ label: 'errors', values: s.errorRate, color: COLORS.b }]}
                />
                <LineChart
                  title="Latency"
                  unit="ms"
                  times={s.times}
                  format={ms}
                  lines={[
                    { label: 'p50', values: s.p50, color: COLORS.d },
                    { label: 'p95', values: s.p95, color: COLORS.c },
                    { label: 'p99', values: s.p99, color: COLORS.b },
                  ]}
                />
                <LineChart
                  title="Batch size"
                  unit="mean rows"
                  times={s.times}
                  format={formatTick}
                  lines={[{ label: 'mean batch', values: s.batch, color: COLORS.a }]}
                />
              </div>
            </>
          );
        }}
      </Loaded>
    </section>
  );
}
