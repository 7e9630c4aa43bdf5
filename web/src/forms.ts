// Parsing what people type into the console's write forms into API request bodies: each
// returns the body, or a message naming the field that is wrong. Pure functions: unit-tested.

import type { components } from './api/schema';

type S = components['schemas'];

/** A parsed form: the value, or what is wrong with it. */
export type Parsed<T> = { ok: true; value: T } | { ok: false; error: string };

const NAME = /^[a-z0-9][a-z0-9_.-]{0,62}$/;
const PROFILE = /^(cpu|gpu|mig-[a-z0-9.]{1,32})$/;

/** A whole number from `min` to `max`, or null (blank, fractional, out of range). */
export function parseWhole(text: string, min: number, max: number): number | null {
  const t = text.trim();
  if (!/^\d+$/.test(t)) return null;
  const n = Number(t);
  return Number.isSafeInteger(n) && n >= min && n <= max ? n : null;
}

/** What a new deployment follows: an alias, one version, or the latest version. */
export type DeployTarget = { kind: 'alias'; alias: string } | { kind: 'version'; version: string } | { kind: 'latest' };

/** The fields of the create-deployment form, as typed. */
export interface DeploymentForm {
  name: string;
  model: string;
  target: DeployTarget;
  profile: string;
  replicas: string;
}

/** The body of `POST /deployments` from the form. */
export function deploymentBody(f: DeploymentForm): Parsed<S['DeploymentCreate']> {
  const name = f.name.trim();
  if (!NAME.test(name)) return fail('Name: lower-case letters, digits, “.”, “_” or “-”, starting with a letter or digit (at most 63).');
  if (f.model === '') return fail('Model: choose a model.');
  const profile = f.profile.trim() || 'cpu';
  if (!PROFILE.test(profile)) return fail('Profile: cpu, gpu or mig-<profile> (e.g. mig-1g.10gb).');
  const replicas = parseWhole(f.replicas, 0, 64);
  if (replicas === null) return fail('Replicas: a whole number from 0 to 64.');
  const body: S['DeploymentCreate'] = { name, model: f.model, profile, replicas };
  if (f.target.kind === 'alias') {
    if (f.target.alias.trim() === '') return fail('Alias: choose the alias to follow.');
    body.alias = f.target.alias.trim();
  } else if (f.target.kind === 'version') {
    const version = parseWhole(f.target.version, 1, Number.MAX_SAFE_INTEGER);
    if (version === null) return fail('Version: a version number from 1.');
    body.version = version;
  }
  return { ok: true, value: body };
}

/** The model configuration typed next to an upload: blank (the model's own), or a JSON object. */
export function parseConfig(text: string): Parsed<Record<string, unknown> | null> {
  if (text.trim() === '') return { ok: true, value: null };
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (e) {
    return fail(`Config: not JSON (${e instanceof Error ? e.message : String(e)}).`);
  }
  if (typeof v !== 'object' || v === null || Array.isArray(v)) return fail('Config: must be a JSON object, e.g. {"max_batch_size": 8}.');
  return { ok: true, value: v as Record<string, unknown> };
}

/** The packaging of an uploaded file, from its name: `.tar`, `.zip`, else ONNX. */
export function formatOfFile(name: string): S['ArtifactFormat'] {
  const n = name.toLowerCase();
  if (n.endsWith('.tar')) return 'tar';
  if (n.endsWith('.zip')) return 'zip';
  return 'onnx';
}

/** Whole percent of an upload sent so far (0 while the size is unknown). */
export function uploadPercent(loaded: number, total: number): number {
  if (!(total > 0)) return 0;
  return Math.max(0, Math.min(100, Math.floor((loaded / total) * 100)));
}

/** The quota fields of the edit form, as typed (all counts; storage in bytes). */
export type QuotaForm = Record<'models' | 'versions' | 'storage_bytes' | 'replicas' | 'requests_per_second' | 'concurrent_requests' | 'monthly_spend_cents', string> & {
  /** Slices per profile, one `profile=count` a line. */
  slices: string;
};

/** The form's starting values from the current limits. */
export function quotaForm(l: S['QuotaLimits']): QuotaForm {
  return {
    models: String(l.models),
    versions: String(l.versions),
    storage_bytes: String(l.storage_bytes),
    replicas: String(l.replicas),
    requests_per_second: String(l.requests_per_second),
    concurrent_requests: String(l.concurrent_requests ?? 0),
    monthly_spend_cents: String(l.monthly_spend_cents),
    slices: Object.entries(l.slices)
      .map(([p, n]) => `${p}=${n}`)
      .join('\n'),
  };
}

/** The body of `PUT /quotas` from the form. */
export function quotaBody(f: QuotaForm): Parsed<S['QuotaLimits']> {
  const counts = {} as Record<Exclude<keyof QuotaForm, 'slices'>, number>;
  for (const key of ['models', 'versions', 'storage_bytes', 'replicas', 'requests_per_second', 'concurrent_requests', 'monthly_spend_cents'] as const) {
    const n = parseWhole(f[key], 0, Number.MAX_SAFE_INTEGER);
    if (n === null) return fail(`${key}: a whole number, 0 or more.`);
    counts[key] = n;
  }
  const slices: Record<string, number> = {};
  for (const line of f.slices.split('\n').map((l) => l.trim()).filter(Boolean)) {
    const [profile, count, ...rest] = line.split('=').map((s) => s.trim());
    const n = count === undefined ? null : parseWhole(count, 0, Number.MAX_SAFE_INTEGER);
    if (rest.length || !PROFILE.test(profile) || n === null) return fail(`slices: “${line}” is not profile=count (e.g. cpu=8).`);
    slices[profile] = n;
  }
  return { ok: true, value: { ...counts, slices } };
}

/** One price entry as typed. */
export interface PriceForm {
  slice_profile: string;
  per_slice_hour_cents: string;
  per_1000_inferences_cents: string;
  /** `YYYY-MM-DDTHH:MM` (a `datetime-local` input, read as UTC). */
  effective_from: string;
}

/** A price entry as the form starts it. */
export function priceForm(p: S['Price']): PriceForm {
  return {
    slice_profile: p.slice_profile,
    per_slice_hour_cents: String(p.per_slice_hour_cents),
    per_1000_inferences_cents: String(p.per_1000_inferences_cents),
    effective_from: p.effective_from.slice(0, 16),
  };
}

/** The body of `PUT /v1/prices` from the rows of the form. */
export function pricesBody(rows: PriceForm[]): Parsed<S['Prices']> {
  const prices: S['Price'][] = [];
  for (const [i, r] of rows.entries()) {
    const where = `Row ${i + 1}`;
    const profile = r.slice_profile.trim();
    if (!PROFILE.test(profile)) return fail(`${where}: profile must be cpu, gpu or mig-<profile>.`);
    const hour = parseCents(r.per_slice_hour_cents);
    const thousand = parseCents(r.per_1000_inferences_cents);
    if (hour === null || thousand === null) return fail(`${where}: prices are cents, 0 or more (decimals allowed).`);
    if (!/^\d{4}-\d\d-\d\dT\d\d:\d\d$/.test(r.effective_from)) return fail(`${where}: choose when the price takes effect.`);
    prices.push({ slice_profile: profile, per_slice_hour_cents: hour, per_1000_inferences_cents: thousand, effective_from: `${r.effective_from}:00Z` });
  }
  return { ok: true, value: { prices } };
}

function parseCents(text: string): number | null {
  const t = text.trim();
  if (!/^\d+(\.\d{1,6})?$/.test(t)) return null;
  return Number(t);
}

function fail<T>(error: string): Parsed<T> {
  return { ok: false, error };
}
