// Scales and data for the uPlot charts. Pure functions: unit-tested.

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

/** Indexes of values with no value on either side: a line cannot show them, a marker does. */
export function isolatedPoints(ys: (number | null)[]): number[] {
  const has = (i: number) => i >= 0 && i < ys.length && ys[i] !== null && Number.isFinite(ys[i]);
  return ys.map((_, i) => i).filter((i) => has(i) && !has(i - 1) && !has(i + 1));
}

/** uPlot's aligned data: x in seconds (its time scale's unit), then one array per series. */
export function alignedData(timesMs: number[], series: (number | null)[][]): [number[], ...(number | null)[][]] {
  return [timesMs.map((t) => t / 1000), ...series.map((s) => timesMs.map((_, i) => (s[i] === undefined ? null : s[i])))];
}

/** The last value of a series that is not a gap. */
export function lastValue(values: (number | null)[]): number | null {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}
