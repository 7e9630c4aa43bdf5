// Captured requests: the pure parts of the captures page — capture file names, download paths
// and file names, what a downloaded file holds, and the capture-settings and retention forms.
// Unit-tested in captures.test.ts.

import type { components } from './api/schema';

/** A deployment's capture settings as the API has them. */
export type CaptureSettings = components['schemas']['CaptureSettings'];

/** A capture file name split into its parts: `YYYY-MM-DD/<worker>-<batch>.jsonl`. */
export interface CaptureName {
  date: string;
  worker: string;
  batch: string;
}

/** A batch id is a UUID (36 characters) at the end of the file's name. */
const BATCH_LEN = 36;

/** The parts of a capture file's name; `null` for a name not in the API's form. */
export function splitCaptureName(name: string): CaptureName | null {
  const m = /^(\d{4}-\d{2}-\d{2})\/([A-Za-z0-9._-]+)\.jsonl$/.exec(name);
  if (!m) return null;
  const stem = m[2];
  // Worker ids may hold `-` themselves: the batch is the fixed-length tail.
  if (stem.length < BATCH_LEN + 2 || stem[stem.length - BATCH_LEN - 1] !== '-') return { date: m[1], worker: stem, batch: '' };
  return { date: m[1], worker: stem.slice(0, stem.length - BATCH_LEN - 1), batch: stem.slice(stem.length - BATCH_LEN) };
}

/** The API path that downloads a capture file, each segment escaped (the name's `/` is the
 *  boundary between its date and file segments). */
export function capturePath(tenant: string, deployment: string, name: string): string {
  const [date, file] = splitOnce(name, '/');
  const seg = encodeURIComponent;
  return `/v1/tenants/${seg(tenant)}/deployments/${seg(deployment)}/captures/${seg(date)}/${seg(file)}`;
}

function splitOnce(s: string, sep: string): [string, string] {
  const i = s.indexOf(sep);
  return i < 0 ? [s, ''] : [s.slice(0, i), s.slice(i + 1)];
}

/** The file name a download is saved as: `<deployment>_<date>_<file>`, with nothing a file
 *  system could take as a folder. */
export function downloadName(deployment: string, name: string): string {
  return `${deployment}_${name}`.replace(/[^A-Za-z0-9._-]+/g, '_');
}

/** What a capture file holds, counted from its JSON Lines. */
export interface CaptureSummary {
  /** Lines that are records. */
  records: number;
  /** Versions seen, ascending. */
  versions: number[];
  /** Models seen, sorted. */
  models: string[];
  /** Records of failed requests. */
  errors: number;
  /** Records cut down to their tensors' shapes. */
  truncated: number;
  /** Earliest and latest `received_at_ms`, or null without records. */
  firstMs: number | null;
  lastMs: number | null;
  /** Lines that are not JSON objects (none in a file the control plane wrote). */
  unreadable: number;
}

/** Counts the records of a capture file's text. */
export function summarizeCapture(text: string): CaptureSummary {
  const versions = new Set<number>();
  const models = new Set<string>();
  const s: CaptureSummary = { records: 0, versions: [], models: [], errors: 0, truncated: 0, firstMs: null, lastMs: null, unreadable: 0 };
  for (const line of text.split('\n')) {
    if (line.trim() === '') continue;
    const r = parseObject(line);
    if (!r) {
      s.unreadable += 1;
      continue;
    }
    s.records += 1;
    if (typeof r.version === 'number') versions.add(r.version);
    if (typeof r.model === 'string') models.add(r.model);
    if (r.status === 'error') s.errors += 1;
    if (r.truncated === true) s.truncated += 1;
    if (typeof r.received_at_ms === 'number') {
      s.firstMs = s.firstMs === null ? r.received_at_ms : Math.min(s.firstMs, r.received_at_ms);
      s.lastMs = s.lastMs === null ? r.received_at_ms : Math.max(s.lastMs, r.received_at_ms);
    }
  }
  s.versions = [...versions].sort((a, b) => a - b);
  s.models = [...models].sort();
  return s;
}

function parseObject(line: string): Record<string, unknown> | null {
  try {
    const v: unknown = JSON.parse(line);
    return typeof v === 'object' && v !== null && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
  } catch {
    return null;
  }
}

/** Versions as a cell: `v3`, `v2, v3`, or `–`. */
export function versionsLabel(versions: number[]): string {
  return versions.length ? versions.map((v) => `v${v}`).join(', ') : '–';
}

/** The capture form as typed. */
export interface CaptureDraft {
  enabled: boolean;
  /** Percent of requests, 0 to 100, as typed. */
  samplePercent: string;
  inputs: boolean;
  outputs: boolean;
  metadata: boolean;
  /** Largest record in KiB, 1 to 1024, as typed. */
  maxRecordKiB: string;
}

/** The API's defaults, for a deployment that never set capture. */
export const CAPTURE_DEFAULTS: Required<CaptureSettings> = {
  enabled: false,
  sample_rate: 1,
  inputs: true,
  outputs: true,
  metadata: true,
  max_record_bytes: 64 * 1024,
};

/** The form of a deployment's settings (the defaults where none are set). */
export function captureDraft(s: CaptureSettings | null | undefined): CaptureDraft {
  const v = { ...CAPTURE_DEFAULTS, ...(s ?? {}) };
  return {
    enabled: v.enabled,
    samplePercent: String(Number((v.sample_rate * 100).toFixed(4))),
    inputs: v.inputs,
    outputs: v.outputs,
    metadata: v.metadata,
    maxRecordKiB: String(Number((v.max_record_bytes / 1024).toFixed(3))),
  };
}

/** The settings to send, or why the form cannot be sent (the API checks the same ranges). */
export function captureBody(d: CaptureDraft): { ok: true; value: Required<CaptureSettings> } | { ok: false; error: string } {
  const percent = Number(d.samplePercent.trim());
  if (d.samplePercent.trim() === '' || !Number.isFinite(percent) || percent < 0 || percent > 100) {
    return { ok: false, error: 'Sample rate must be a percent from 0 to 100.' };
  }
  const kib = Number(d.maxRecordKiB.trim());
  if (d.maxRecordKiB.trim() === '' || !Number.isFinite(kib) || kib < 1 || kib > 1024) {
    return { ok: false, error: 'Largest record must be from 1 to 1024 KiB.' };
  }
  return {
    ok: true,
    value: {
      enabled: d.enabled,
      sample_rate: Number((percent / 100).toFixed(6)),
      inputs: d.inputs,
      outputs: d.outputs,
      metadata: d.metadata,
      max_record_bytes: Math.round(kib * 1024),
    },
  };
}

/** One line saying what a deployment captures: `off`, or `10% of requests: inputs, outputs`. */
export function captureLabel(s: CaptureSettings | null | undefined): string {
  if (!s || !s.enabled) return 'off';
  const v = { ...CAPTURE_DEFAULTS, ...s };
  const parts = [v.inputs && 'inputs', v.outputs && 'outputs', v.metadata && 'parameters'].filter(Boolean);
  const rate = `${Number((v.sample_rate * 100).toFixed(4))}% of requests`;
  return `${rate}: ${parts.length ? parts.join(', ') : 'no tensors or parameters'}, records up to ${Number((v.max_record_bytes / 1024).toFixed(3))} KiB`;
}

/** Retention days as typed: a whole number from 1 to 3650, `''` for the default, or `undefined`
 *  when it is neither. */
export function parseRetentionDays(text: string): number | null | undefined {
  const t = text.trim();
  if (t === '') return null;
  if (!/^\d+$/.test(t)) return undefined;
  const n = Number(t);
  return n >= 1 && n <= 3650 ? n : undefined;
}
