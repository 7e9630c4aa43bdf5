// Formatting of the values the API returns, for display. Pure functions: unit-tested.

const BYTE_UNITS = ['B', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB'];

/** `1536` -> `1.5 KiB`; whole bytes below 1 KiB. */
export function formatBytes(bytes: number): string {
  if (!Number.isFinite(bytes)) return '–';
  let value = Math.abs(bytes);
  let unit = 0;
  while (value >= 1024 && unit < BYTE_UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const sign = bytes < 0 ? '-' : '';
  if (unit === 0) return `${sign}${value} B`;
  return `${sign}${value >= 100 ? value.toFixed(0) : value.toFixed(1)} ${BYTE_UNITS[unit]}`;
}

/** A latency in microseconds: `850 µs`, `12.3 ms`, `1.20 s`; `–` for none. */
export function formatMicros(us: number | null | undefined): string {
  if (us === null || us === undefined || !Number.isFinite(us)) return '–';
  if (us < 1000) return `${Math.round(us)} µs`;
  if (us < 1_000_000) return `${trim(us / 1000)} ms`;
  return `${(us / 1_000_000).toFixed(2)} s`;
}

/** Three significant digits at most, without trailing zeros. */
function trim(v: number): string {
  const digits = v >= 100 ? 0 : v >= 10 ? 1 : 2;
  return String(Number(v.toFixed(digits)));
}

/** A rate per second: `0`, `0.25/s`, `12.5/s`, `1,234/s`. */
export function formatRate(perSecond: number): string {
  if (!Number.isFinite(perSecond) || perSecond === 0) return '0/s';
  if (perSecond >= 1000) return `${Math.round(perSecond).toLocaleString('en-US')}/s`;
  return `${trim(perSecond)}/s`;
}

/** A count with thousands separators. */
export function formatCount(n: number): string {
  return Number.isFinite(n) ? Math.round(n).toLocaleString('en-US') : '–';
}

/** Cents as dollars: `12345` -> `$123.45`; fractional cents (unit prices) keep up to 4 places. */
export function formatCents(cents: number, currency = 'USD'): string {
  const symbol = currency === 'USD' ? '$' : `${currency} `;
  const sign = cents < 0 ? '-' : '';
  const dollars = Math.abs(cents) / 100;
  const whole = Number.isInteger(Math.abs(cents));
  const text = whole
    ? dollars.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 2 })
    : dollars.toLocaleString('en-US', { minimumFractionDigits: 2, maximumFractionDigits: 6 });
  return `${sign}${symbol}${text}`;
}

/** A quantity with at most `places` decimals, trailing zeros dropped. */
export function formatQuantity(q: number, places = 4): string {
  return Number.isFinite(q) ? Number(q.toFixed(places)).toLocaleString('en-US', { maximumFractionDigits: places }) : '–';
}

/** A share as a percentage: `0.125` -> `12.5 %`. */
export function formatPercent(share: number): string {
  if (!Number.isFinite(share)) return '–';
  return `${trim(share * 100)} %`;
}

/** The first 12 hex digits of a sha256, enough to tell versions apart. */
export function shortSha(sha: string): string {
  return sha.length > 12 ? sha.slice(0, 12) : sha;
}

/** An RFC 3339 time as `2026-11-30 12:05:09 UTC` (UTC: what the API and invoices use). */
export function formatTime(iso: string | null | undefined): string {
  if (!iso) return '–';
  const d = new Date(iso);
  if (Number.isNaN(d.getTime())) return iso;
  return `${d.toISOString().slice(0, 19).replace('T', ' ')} UTC`;
}

/** How long ago `iso` was, relative to `now`: `just now`, `5 min ago`, `3 h ago`, `2 d ago`. */
export function formatAgo(iso: string, now: Date = new Date()): string {
  const seconds = Math.round((now.getTime() - new Date(iso).getTime()) / 1000);
  if (!Number.isFinite(seconds)) return '–';
  if (seconds < 0) return 'in the future';
  if (seconds < 45) return 'just now';
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86_400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86_400)} d ago`;
}

/** A chart axis label for a time: `HH:MM` within a day's range, `MM-DD HH:MM` beyond. */
export function formatAxisTime(ms: number, spanMs: number): string {
  const iso = new Date(ms).toISOString();
  return spanMs <= 86_400_000 ? iso.slice(11, 16) : `${iso.slice(5, 10)} ${iso.slice(11, 16)}`;
}

/** A short number for axis ticks: `0`, `0.5`, `12`, `1.2k`, `3M`. */
export function formatTick(v: number): string {
  const a = Math.abs(v);
  if (a >= 1e6) return `${trim(v / 1e6)}M`;
  if (a >= 1e3) return `${trim(v / 1e3)}k`;
  return trim(v);
}
