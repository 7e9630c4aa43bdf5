// Scales and paths for the hand-rolled SVG charts. Pure functions: unit-tested.

/** A "nice" upper bound (1, 2, 2.5 or 5 times a power of ten) at or above `max`, and the ticks
 *  from 0 up to it. An all-zero or empty series gets 0..1. */
export function niceScale(max: number, tickCount = 4): { max: number; ticks: number[] } {
  if (!Number.isFinite(max) || max <= 0) return { max: 1, ticks: evenTicks(1, tickCount) };
  const rough = max / tickCount;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 2.5, 5, 10].map((f) => f * power).find((s) => s * tickCount >= max) ?? 10 * power;
  const top = step * tickCount;
  return { max: top, ticks: evenTicks(top, tickCount) };
}

function evenTicks(top: number, count: number): number[] {
  return Array.from({ length: count + 1 }, (_, i) => Number(((top * i) / count).toPrecision(12)));
}

/** The largest finite value of several series (0 when none). */
export function seriesMax(series: (number | null)[][]): number {
  let max = 0;
  for (const s of series) for (const v of s) if (v !== null && Number.isFinite(v) && v > max) max = v;
  return max;
}

/** An SVG path through the points; a null value breaks the line (the next point starts a new
 *  segment with `M`); a lone point between gaps becomes a tiny segment so it shows. */
export function linePath(xs: number[], ys: (number | null)[]): string {
  const parts: string[] = [];
  let open = false;
  for (let i = 0; i < xs.length; i++) {
    const y = ys[i];
    if (y === null || y === undefined || !Number.isFinite(y)) {
      open = false;
      continue;
    }
    const x = round(xs[i]);
    const yy = round(y);
    const nextMissing = i + 1 >= xs.length || ys[i + 1] === null || ys[i + 1] === undefined;
    if (!open && nextMissing) {
      parts.push(`M${x},${yy}h0.01`);
      continue;
    }
    parts.push(`${open ? 'L' : 'M'}${x},${yy}`);
    open = true;
  }
  return parts.join('');
}

/** Indexes of values with no value on either side: a line cannot show them, a marker does. */
export function isolatedPoints(ys: (number | null)[]): number[] {
  const has = (i: number) => i >= 0 && i < ys.length && ys[i] !== null && Number.isFinite(ys[i]);
  return ys.map((_, i) => i).filter((i) => has(i) && !has(i - 1) && !has(i + 1));
}

function round(v: number): number {
  return Math.round(v * 100) / 100;
}

/** Maps a domain interval onto a pixel interval. */
export function linear(d0: number, d1: number, r0: number, r1: number): (v: number) => number {
  const span = d1 - d0 || 1;
  return (v) => r0 + ((v - d0) / span) * (r1 - r0);
}

/** About `count` evenly spaced indexes into a series of `n` (first and last included). */
export function tickIndexes(n: number, count: number): number[] {
  if (n <= 0) return [];
  if (n <= count) return Array.from({ length: n }, (_, i) => i);
  const step = (n - 1) / (count - 1);
  return Array.from({ length: count }, (_, i) => Math.round(i * step));
}
