import { describe, expect, it } from 'vitest';
import {
  changedFields,
  countStates,
  decodeClaims,
  filterAndSortModels,
  invoiceByModel,
  keyLimits,
  metricsSeries,
  quotaRows,
  rangeQuery,
  recentPeriods,
  parseWeight,
  replicasByWorker,
  trafficLabel,
  versionStats,
  type Invoice,
  type MetricsPoint,
  type Model,
  type Replica,
} from './shape';
import { abilitiesOf, atLeast } from './roles';
import { parseRoute, tenantPath } from './router';
import { alignedData, isolatedPoints, lastValue, niceScale, seriesMax } from './chartmath';

const model = (name: string, latest: number, updated: string, description = ''): Model => ({
  id: name,
  name,
  description,
  latest_version: latest,
  created_at: updated,
  updated_at: updated,
});

describe('filterAndSortModels', () => {
  const models = [
    model('resnet', 3, '2026-11-01T00:00:00Z', 'image classifier'),
    model('bert', 7, '2026-11-03T00:00:00Z'),
    model('simple', 1, '2026-11-02T00:00:00Z', 'demo adder'),
  ];
  it('searches names and descriptions, any case', () => {
    expect(filterAndSortModels(models, 'IMAGE', 'name', 'asc').map((m) => m.name)).toEqual(['resnet']);
    expect(filterAndSortModels(models, 'e', 'name', 'asc').map((m) => m.name)).toEqual(['bert', 'resnet', 'simple']);
  });
  it('sorts by version and time both ways', () => {
    expect(filterAndSortModels(models, '', 'latest_version', 'desc').map((m) => m.name)).toEqual(['bert', 'resnet', 'simple']);
    expect(filterAndSortModels(models, '', 'updated_at', 'asc').map((m) => m.name)).toEqual(['resnet', 'simple', 'bert']);
  });
  it('does not reorder its input', () => {
    filterAndSortModels(models, '', 'name', 'desc');
    expect(models[0].name).toBe('resnet');
  });
});

const replica = (index: number, worker: string | null, slice: string | null, state: Replica['state'] = 'ready'): Replica => ({
  id: `r${index}-${worker}`,
  index,
  version: 1,
  worker_id: worker,
  slice_id: slice,
  state,
  serving: state === 'ready',
  canary: false,
  updated_at: '2026-11-30T00:00:00Z',
});

describe('replicasByWorker', () => {
  it('groups by worker then slice, unplaced last', () => {
    const groups = replicasByWorker([
      replica(2, 'w-b', 'cpu-0'),
      replica(0, null, null, 'pending'),
      replica(1, 'w-a', 'cpu-1'),
      replica(3, 'w-a', 'cpu-0'),
    ]);
    expect(groups.map((g) => g.worker)).toEqual(['w-a', 'w-b', null]);
    expect(groups[0].slices.map((s) => s.slice)).toEqual(['cpu-0', 'cpu-1']);
    expect(groups[2].slices[0].replicas[0].state).toBe('pending');
  });
  it('counts states', () => {
    expect(countStates([replica(0, 'w', 's'), replica(1, 'w', 's', 'loading'), replica(2, 'w', 's')])).toEqual({ ready: 2, loading: 1 });
  });
});

describe('metrics', () => {
  const point = (start: string, requests: number, failures: number, p50: number | null): MetricsPoint => ({
    start,
    requests,
    failures,
    request_rate: (requests + failures) / 60,
    error_rate: failures / 60,
    throttled: 0,
    p50_us: p50,
    p95_us: p50 === null ? null : p50 * 2,
    p99_us: p50 === null ? null : p50 * 3,
    mean_batch_size: p50 === null ? null : 1.5,
  });
  it('turns points into series with gaps where there was no traffic', () => {
    const s = metricsSeries([point('2026-11-30T12:00:00Z', 60, 6, 1500), point('2026-11-30T12:01:00Z', 0, 0, null)]);
    expect(s.times).toEqual([Date.parse('2026-11-30T12:00:00Z'), Date.parse('2026-11-30T12:01:00Z')]);
    expect(s.requestRate).toEqual([1.1, 0]);
    expect(s.p50).toEqual([1.5, null]);
    expect(s.p99).toEqual([4.5, null]);
    expect(s.batch).toEqual([1.5, null]);
    expect(s.totalRequests).toBe(66);
    expect(s.totalFailures).toBe(6);
  });
  it('builds the query of a range: minutes up to a day, the current step included', () => {
    const now = new Date('2026-11-30T12:34:56Z');
    expect(rangeQuery('1h', now)).toEqual({ from: '2026-11-30T11:35:00.000Z', to: '2026-11-30T12:35:00.000Z', step: 'minute' });
    expect(rangeQuery('7d', now)).toEqual({ from: '2026-11-23T13:00:00.000Z', to: '2026-11-30T13:00:00.000Z', step: 'hour' });
  });
});

describe('invoices and periods', () => {
  const inv: Invoice = {
    tenant: 'demo',
    period: '2026-11',
    currency: 'USD',
    total_cents: 175,
    gpu_seconds: 0,
    status: 'open',
    lines: [
      { model: 'a', slice_profile: 'cpu', kind: 'slice_hours', quantity: 2, unit: 'slice_hour', unit_price_cents: 50, amount_cents: 100 },
      { model: 'a', slice_profile: 'cpu', kind: 'inferences', quantity: 5, unit: '1000_inferences', unit_price_cents: 10, amount_cents: 50 },
      { model: 'b', slice_profile: 'cpu', kind: 'inferences', quantity: 2.5, unit: '1000_inferences', unit_price_cents: 10, amount_cents: 25 },
    ],
  };
  it('groups lines by model with subtotals that add up to the total', () => {
    const groups = invoiceByModel(inv);
    expect(groups.map((g) => [g.model, g.lines.length, g.subtotalCents])).toEqual([
      ['a', 2, 150],
      ['b', 1, 25],
    ]);
    expect(groups.reduce((n, g) => n + g.subtotalCents, 0)).toBe(inv.total_cents);
  });
  it('lists recent months across a year boundary', () => {
    expect(recentPeriods(new Date('2026-02-15T00:00:00Z'), 4)).toEqual(['2026-02', '2026-01', '2025-12', '2025-11']);
  });
});

describe('quotas and audit', () => {
  it('reads a key\'s own limits briefly, or none', () => {
    expect(keyLimits({ requests_per_second: 20, concurrent_requests: 4 })).toBe('20/s, 4 in flight');
    expect(keyLimits({ requests_per_second: 0, concurrent_requests: 2 })).toBe('2 in flight');
    expect(keyLimits({ requests_per_second: 0, concurrent_requests: 0 })).toBeNull();
  });
  it('pairs limits with use', () => {
    const rows = quotaRows({
      limits: { models: 10, versions: 100, storage_bytes: 1000, replicas: 0, requests_per_second: 50, concurrent_requests: 0, monthly_spend_cents: 0, slices: { gpu: 1, cpu: 8 } },
      usage: { models: 5, versions: 10, storage_bytes: 250, replicas: 2 },
    });
    expect(rows.find((r) => r.name === 'models')?.share).toBe(0.5);
    expect(rows.find((r) => r.name === 'storage')?.share).toBe(0.25);
    expect(rows.find((r) => r.name === 'replicas')?.share).toBeNull();
    expect(rows.slice(-2).map((r) => r.name)).toEqual(['slices: cpu', 'slices: gpu']);
    expect(rows.find((r) => r.name === 'monthly spend')?.used).toBeNull();
  });
  it('measures monthly spend against its limit when the invoice is known', () => {
    const limits = { models: 1, versions: 1, storage_bytes: 1, replicas: 1, requests_per_second: 1, concurrent_requests: 0, monthly_spend_cents: 1000, slices: {} };
    const usage = { models: 0, versions: 0, storage_bytes: 0, replicas: 0 };
    expect(quotaRows({ limits, usage }, 250).find((r) => r.name === 'monthly spend')).toMatchObject({ used: 250, share: 0.25 });
  });
  it('names the fields an event changed', () => {
    expect(changedFields({ version: 1, alias: 'p' }, { version: 2, alias: 'p' })).toEqual(['version']);
    expect(changedFields(null, { name: 'x' })).toEqual(['name']);
    expect(changedFields(null, null)).toEqual([]);
  });
});

describe('tokens and roles', () => {
  const b64url = (o: object) => Buffer.from(JSON.stringify(o)).toString('base64url');
  it('reads the claims of a token', () => {
    const claims = { sub: 'k', tenant: 't', tenant_name: 'demo', role: 'viewer', iat: 1, exp: 2 };
    expect(decodeClaims(`${b64url({ alg: 'EdDSA' })}.${b64url(claims)}.sig`)).toEqual(claims);
  });
  it('refuses malformed tokens', () => {
    expect(() => decodeClaims('abc')).toThrow();
    expect(() => decodeClaims(`x.${b64url({ sub: 'k' })}.y`)).toThrow();
  });
  it('orders roles', () => {
    expect(atLeast('tenant-admin', 'deployer')).toBe(true);
    expect(atLeast('viewer', 'deployer')).toBe(false);
    expect(abilitiesOf('viewer')).toEqual({ read: true, moveAliases: false, deploy: false, readAudit: false, readCaptures: true, setRetention: false, manageKeys: false, platform: false });
    expect(abilitiesOf('deployer')).toMatchObject({ deploy: true, manageKeys: false });
    expect(abilitiesOf('tenant-admin')).toMatchObject({ deploy: true, manageKeys: true, platform: false });
    expect(abilitiesOf('inference').read).toBe(false);
    expect(abilitiesOf('platform-admin').platform).toBe(true);
  });
});

describe('routes', () => {
  it('parses tenant and admin pages', () => {
    expect(parseRoute('/')).toEqual({ page: 'home' });
    expect(parseRoute('/t/demo/models')).toEqual({ page: 'models', tenant: 'demo' });
    expect(parseRoute('/t/demo/models/simple')).toEqual({ page: 'model', tenant: 'demo', model: 'simple' });
    expect(parseRoute('/t/demo/deployments/simple')).toEqual({ page: 'deployment', tenant: 'demo', deployment: 'simple' });
    expect(parseRoute('/admin/workers')).toEqual({ page: 'workers' });
    expect(parseRoute('/t/demo/nope')).toEqual({ page: 'not-found', path: '/t/demo/nope' });
  });
  it('round-trips names through paths', () => {
    expect(tenantPath('demo', 'models', 'a b')).toBe('/t/demo/models/a%20b');
    expect(parseRoute(tenantPath('demo', 'models', 'a b'))).toEqual({ page: 'model', tenant: 'demo', model: 'a b' });
  });
});

describe('chart math', () => {
  it('rounds scales up to nice numbers', () => {
    expect(niceScale(0)).toEqual({ max: 1, ticks: [0, 0.25, 0.5, 0.75, 1] });
    expect(niceScale(7.3).max).toBe(8);
    expect(niceScale(87).max).toBe(100);
    expect(niceScale(0.013).ticks).toEqual([0, 0.005, 0.01, 0.015, 0.02]);
  });
  it('finds the largest value, ignoring gaps', () => expect(seriesMax([[1, null, 3], [2]])).toBe(3));
  it('aligns series on seconds for uPlot, gaps kept', () => {
    expect(alignedData([1_000, 61_000], [[5, null], [1]])).toEqual([[1, 61], [5, null], [1, null]]);
    expect(alignedData([], [])).toEqual([[]]);
  });
  it('finds the points a line cannot show', () => {
    expect(isolatedPoints([null, 2, null, 3, 4, null, 5])).toEqual([1, 6]);
    expect(isolatedPoints([])).toEqual([]);
  });
  it('finds the latest value past trailing gaps', () => {
    expect(lastValue([1, 2, null])).toBe(2);
    expect(lastValue([null])).toBe(null);
  });
});

describe('canary', () => {
  it('labels the split', () => {
    const stable = { version: 1, weight: 90, canary: false, ready_replicas: 2, replicas: 2 };
    const canary = { version: 2, weight: 10, canary: true, ready_replicas: 0, replicas: 1 };
    expect(trafficLabel([stable, canary])).toBe('v1 90% · v2 10% canary');
    expect(trafficLabel([{ ...stable, weight: 100 }])).toBe('v1 100%');
  });
  it('takes whole weights from 1 to 99 only', () => {
    expect(parseWeight(' 25 ')).toBe(25);
    for (const bad of ['0', '100', '-5', '2.5', '', 'ten']) expect(parseWeight(bad)).toBeNull();
  });
  it('sums a version\'s points, weighting latency by requests', () => {
    const point = (requests: number, failures: number, p50: number | null, p95: number | null): MetricsPoint => ({
      start: '2026-11-30T00:00:00Z',
      requests,
      failures,
      request_rate: (requests + failures) / 60,
      error_rate: failures / 60,
      throttled: 0,
      p50_us: p50,
      p95_us: p95,
    });
    const s = versionStats(2, [point(30, 0, 1000, 2000), point(90, 30, 3000, 6000), point(0, 0, null, null)]);
    expect([s.version, s.requests, s.failures]).toEqual([2, 150, 30]);
    expect(s.errorShare).toBeCloseTo(0.2);
    expect(s.requestRate).toBeCloseTo(150 / 60 / 3);
    expect(s.p50Ms).toBeCloseTo(2.5);
    expect(s.p95Ms).toBeCloseTo(5);
    expect(versionStats(1, [])).toMatchObject({ requests: 0, errorShare: null, p50Ms: null, requestRate: 0 });
  });
});
