// Data shaping: API documents into what the pages draw. Pure functions: unit-tested.

import type { components } from './api/schema';

type S = components['schemas'];
export type Model = S['Model'];
export type Deployment = S['Deployment'];
export type Replica = S['ReplicaStatus'];
export type MetricsPoint = S['MetricsPoint'];
export type Invoice = S['Invoice'];
export type InvoiceLine = S['InvoiceLine'];
export type Quotas = S['Quotas'];
export type AuditEvent = S['AuditEvent'];
export type TrafficShare = S['TrafficShare'];

/** A column the models table sorts by. */
export type ModelSortKey = 'name' | 'latest_version' | 'updated_at';
/** Sort direction. */
export type SortDir = 'asc' | 'desc';

/** Models whose name or description contains `query` (any case), sorted by `key`. */
export function filterAndSortModels(models: Model[], query: string, key: ModelSortKey, dir: SortDir): Model[] {
  const q = query.trim().toLowerCase();
  const kept = q
    ? models.filter((m) => m.name.toLowerCase().includes(q) || m.description.toLowerCase().includes(q))
    : models.slice();
  const sign = dir === 'asc' ? 1 : -1;
  kept.sort((a, b) => {
    const primary = compareBy(a, b, key);
    return primary !== 0 ? sign * primary : a.name.localeCompare(b.name);
  });
  return kept;
}

function compareBy(a: Model, b: Model, key: ModelSortKey): number {
  switch (key) {
    case 'name':
      return a.name.localeCompare(b.name);
    case 'latest_version':
      return a.latest_version - b.latest_version;
    case 'updated_at':
      return Date.parse(a.updated_at) - Date.parse(b.updated_at);
  }
}

/** Replicas of one slice. */
export interface SliceGroup {
  slice: string | null;
  replicas: Replica[];
}

/** Replicas of one worker (`worker` null: not placed yet), by slice. */
export interface WorkerGroup {
  worker: string | null;
  slices: SliceGroup[];
}

/** A deployment's replicas grouped by worker, then slice; placed workers by id, unplaced last. */
export function replicasByWorker(replicas: Replica[]): WorkerGroup[] {
  const workers = new Map<string | null, Map<string | null, Replica[]>>();
  for (const r of replicas) {
    const w = r.worker_id ?? null;
    const slices = workers.get(w) ?? new Map<string | null, Replica[]>();
    workers.set(w, slices);
    const s = r.slice_id ?? null;
    slices.set(s, [...(slices.get(s) ?? []), r]);
  }
  const byIdNullLast = (a: string | null, b: string | null) =>
    a === b ? 0 : a === null ? 1 : b === null ? -1 : a.localeCompare(b);
  return [...workers.entries()]
    .sort(([a], [b]) => byIdNullLast(a, b))
    .map(([worker, slices]) => ({
      worker,
      slices: [...slices.entries()]
        .sort(([a], [b]) => byIdNullLast(a, b))
        .map(([slice, rs]) => ({ slice, replicas: rs.slice().sort((x, y) => x.index - y.index || x.version - y.version) })),
    }));
}

/** Counts of replicas by state, e.g. `{ready: 2, loading: 1}`. */
export function countStates(replicas: Replica[]): Record<string, number> {
  const counts: Record<string, number> = {};
  for (const r of replicas) counts[r.state] = (counts[r.state] ?? 0) + 1;
  return counts;
}

/** A deployment's split in one line: `v1 90% · v2 10% canary` (`v1 100%` without a canary). */
export function trafficLabel(traffic: TrafficShare[]): string {
  return traffic.map((t) => `v${t.version} ${t.weight}%${t.canary ? ' canary' : ''}`).join(' · ');
}

/** A canary weight typed by a person: a whole percent from 1 to 99, else null. */
export function parseWeight(text: string): number | null {
  const t = text.trim();
  if (!/^\d{1,2}$/.test(t)) return null;
  const n = Number(t);
  return n >= 1 && n <= 99 ? n : null;
}

/** One version's traffic over a range, to compare a canary with the stable version. */
export interface VersionStats {
  version: number;
  /** Requests answered or failed. */
  requests: number;
  failures: number;
  /** Mean requests per second over the range's steps. */
  requestRate: number;
  /** Failed share of the requests; null without requests. */
  errorShare: number | null;
  /** Latency percentiles in milliseconds, weighted by each step's requests; null without any. */
  p50Ms: number | null;
  p95Ms: number | null;
}

/** Sums `GET /metrics` points of one version into [`VersionStats`]. */
export function versionStats(version: number, points: MetricsPoint[]): VersionStats {
  let requests = 0;
  let failures = 0;
  const latency = { p50: 0, p95: 0, weight: 0 };
  for (const p of points) {
    requests += p.requests + p.failures;
    failures += p.failures;
    if (p.p50_us != null && p.p95_us != null && p.requests > 0) {
      latency.p50 += p.p50_us * p.requests;
      latency.p95 += p.p95_us * p.requests;
      latency.weight += p.requests;
    }
  }
  const mean = points.length ? points.reduce((n, p) => n + p.request_rate, 0) / points.length : 0;
  const ms = (sum: number) => (latency.weight ? sum / latency.weight / 1000 : null);
  return {
    version,
    requests,
    failures,
    requestRate: mean,
    errorShare: requests ? failures / requests : null,
    p50Ms: ms(latency.p50),
    p95Ms: ms(latency.p95),
  };
}

/** A time range the metrics page offers. */
export type RangeKey = '15m' | '1h' | '6h' | '24h' | '7d';

/** The ranges, with labels. */
export const RANGES: { key: RangeKey; label: string }[] = [
  { key: '15m', label: 'Last 15 minutes' },
  { key: '1h', label: 'Last hour' },
  { key: '6h', label: 'Last 6 hours' },
  { key: '24h', label: 'Last 24 hours' },
  { key: '7d', label: 'Last 7 days' },
];

const RANGE_MS: Record<RangeKey, number> = {
  '15m': 15 * 60_000,
  '1h': 3_600_000,
  '6h': 6 * 3_600_000,
  '24h': 86_400_000,
  '7d': 7 * 86_400_000,
};

/** Query of `GET /metrics` for a range ending now: minute steps up to a day, hours beyond; `to`
 *  is the end of the current step so the step in progress shows. */
export function rangeQuery(range: RangeKey, now: Date): { from: string; to: string; step: 'minute' | 'hour' } {
  const step = RANGE_MS[range] > 86_400_000 ? 'hour' : 'minute';
  const stepMs = step === 'hour' ? 3_600_000 : 60_000;
  const to = Math.floor(now.getTime() / stepMs) * stepMs + stepMs;
  const from = to - RANGE_MS[range];
  return { from: new Date(from).toISOString(), to: new Date(to).toISOString(), step };
}

/** Chart series from metrics points: x in epoch ms; latencies in milliseconds; null where a step
 *  had no traffic (latency, batch size) so lines break instead of dropping to zero. */
export interface MetricsSeries {
  times: number[];
  requestRate: number[];
  errorRate: number[];
  p50: (number | null)[];
  p95: (number | null)[];
  p99: (number | null)[];
  batch: (number | null)[];
  totalRequests: number;
  totalFailures: number;
}

/** Shapes `GET /metrics` points (oldest first) into [`MetricsSeries`]. */
export function metricsSeries(points: MetricsPoint[]): MetricsSeries {
  const ms = (us: number | null | undefined) => (us === null || us === undefined ? null : us / 1000);
  return {
    times: points.map((p) => Date.parse(p.start)),
    requestRate: points.map((p) => p.request_rate),
    errorRate: points.map((p) => p.error_rate),
    p50: points.map((p) => ms(p.p50_us)),
    p95: points.map((p) => ms(p.p95_us)),
    p99: points.map((p) => ms(p.p99_us)),
    batch: points.map((p) => p.mean_batch_size ?? null),
    totalRequests: points.reduce((n, p) => n + p.requests + p.failures, 0),
    totalFailures: points.reduce((n, p) => n + p.failures, 0),
  };
}

/** Invoice lines of one model, with their subtotal. */
export interface InvoiceGroup {
  model: string;
  lines: InvoiceLine[];
  subtotalCents: number;
}

/** An invoice's lines grouped by model (in the invoice's order), each with its subtotal. */
export function invoiceByModel(invoice: Invoice): InvoiceGroup[] {
  const groups: InvoiceGroup[] = [];
  for (const line of invoice.lines) {
    let g = groups.find((x) => x.model === line.model);
    if (!g) {
      g = { model: line.model, lines: [], subtotalCents: 0 };
      groups.push(g);
    }
    g.lines.push(line);
    g.subtotalCents += line.amount_cents;
  }
  return groups;
}

/** `YYYY-MM` of `now` (UTC), and the `count - 1` months before it, newest first. */
export function recentPeriods(now: Date, count: number): string[] {
  const periods: string[] = [];
  let y = now.getUTCFullYear();
  let m = now.getUTCMonth();
  for (let i = 0; i < count; i++) {
    periods.push(`${y}-${String(m + 1).padStart(2, '0')}`);
    m -= 1;
    if (m < 0) {
      m = 11;
      y -= 1;
    }
  }
  return periods;
}

/** One row of the quotas table. */
export interface QuotaRow {
  name: string;
  limit: number;
  used: number | null;
  unit: 'count' | 'bytes' | 'cents' | 'per_second';
  share: number | null;
}

/** Quotas with their current use; `share` is use over limit (null where not measured or the
 *  limit is 0). `spentCents` is the month's invoice total so far, when known. Slices per
 *  profile follow the scalar limits. */
export function quotaRows(q: Quotas, spentCents: number | null = null): QuotaRow[] {
  const row = (name: string, limit: number, used: number | null, unit: QuotaRow['unit']): QuotaRow => ({
    name,
    limit,
    used,
    unit,
    share: used === null || limit <= 0 ? null : used / limit,
  });
  const rows = [
    row('models', q.limits.models, q.usage.models, 'count'),
    row('versions', q.limits.versions, q.usage.versions, 'count'),
    row('storage', q.limits.storage_bytes, q.usage.storage_bytes, 'bytes'),
    row('replicas', q.limits.replicas, q.usage.replicas, 'count'),
    row('requests per second', q.limits.requests_per_second, null, 'per_second'),
    row('monthly spend', q.limits.monthly_spend_cents, spentCents, 'cents'),
  ];
  const slices = Object.entries(q.limits.slices ?? {}).sort(([a], [b]) => a.localeCompare(b));
  for (const [profile, limit] of slices) rows.push(row(`slices: ${profile}`, limit, null, 'count'));
  return rows;
}

/** Top-level fields that differ between an audit event's `before` and `after`. */
export function changedFields(before: unknown, after: unknown): string[] {
  const b = isObject(before) ? before : {};
  const a = isObject(after) ? after : {};
  const keys = new Set([...Object.keys(b), ...Object.keys(a)]);
  return [...keys].filter((k) => JSON.stringify(b[k]) !== JSON.stringify(a[k])).sort();
}

function isObject(v: unknown): v is Record<string, unknown> {
  return typeof v === 'object' && v !== null && !Array.isArray(v);
}

/** Claims of a Tessera access token that the console uses. */
export interface Claims {
  sub: string;
  tenant: string;
  tenant_name: string;
  role: string;
  exp: number;
  iat: number;
}

/** The claims of a JWT (payload only: the server verifies signatures, the console only reads
 *  who it is). Throws on a malformed token. */
export function decodeClaims(jwt: string): Claims {
  const parts = jwt.split('.');
  if (parts.length !== 3) throw new Error('malformed token');
  const b64 = parts[1].replace(/-/g, '+').replace(/_/g, '/');
  const padded = b64 + '='.repeat((4 - (b64.length % 4)) % 4);
  const json = new TextDecoder().decode(Uint8Array.from(atob(padded), (c) => c.charCodeAt(0)));
  const c = JSON.parse(json) as Partial<Claims>;
  if (typeof c.tenant_name !== 'string' || typeof c.role !== 'string' || typeof c.exp !== 'number') {
    throw new Error('token without tenant, role or expiry');
  }
  return c as Claims;
}

/** An API key's state: revoked, expired or active. */
export function keyState(k: S['ApiKey'], now: Date = new Date()): 'revoked' | 'expired' | 'active' {
  if (k.revoked_at) return 'revoked';
  if (k.expires_at && new Date(k.expires_at) <= now) return 'expired';
  return 'active';
}

/** An API key's own limits at the gateways, briefly (`20/s, 4 in flight`); `null` when it has
 *  none and only its tenant's apply. */
export function keyLimits(l: S['KeyLimits']): string | null {
  const parts: string[] = [];
  const [rate, inFlight] = [l.requests_per_second ?? 0, l.concurrent_requests ?? 0];
  if (rate > 0) parts.push(`${rate}/s`);
  if (inFlight > 0) parts.push(`${inFlight} in flight`);
  return parts.length > 0 ? parts.join(', ') : null;
}

/** Who acted, for people: the user's email and the key's name when known, else the key id's
 *  start (a deleted key), else the email of a single sign-on user, else `system`. */
export function actorLabel(a: { actor_key_id?: string | null; actor_key_name?: string | null; actor_user_email?: string | null }): string {
  // A console user signed in through single sign-on acts without a key.
  if (!a.actor_key_id) return a.actor_user_email ? `${a.actor_user_email} (single sign-on)` : 'system';
  const key = a.actor_key_name ? `key “${a.actor_key_name}”` : `key ${a.actor_key_id.slice(0, 8)}`;
  return a.actor_user_email ? `${a.actor_user_email} (${key})` : key;
}
