// A line chart drawn by uPlot: time on x, one or more series on y from zero, gaps where a value
// is null; the legend names every series and shows its value under the cursor (the latest one
// when the cursor is elsewhere).

import { useEffect, useRef } from 'preact/hooks';
import uPlot from 'uplot';
import 'uplot/dist/uPlot.min.css';
import { formatAxisTime, formatTick } from './format';
import { alignedData, isolatedPoints, lastValue, niceScale, seriesMax } from './chartmath';

/** One line of a chart. */
export interface Line {
  label: string;
  values: (number | null)[];
  color: string;
}

const HEIGHT = 200;

/** A line chart of `lines` over `times` (epoch ms), `unit` on the y axis label. */
export function LineChart(props: { title: string; unit: string; times: number[]; lines: Line[]; format: (v: number) => string }) {
  const box = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  const { times, lines, format } = props;
  const shape = lines.map((l) => `${l.label}:${l.color}`).join('|');
  const data = alignedData(times, lines.map((l) => l.values));

  // The plot is made once per set of series; new points only replace its data.
  useEffect(() => {
    const el = box.current;
    if (!el) return;
    const span = () => (times[times.length - 1] ?? 0) - (times[0] ?? 0);
    const opts: uPlot.Options = {
      width: Math.max(200, el.clientWidth),
      height: HEIGHT,
      scales: { x: { time: true }, y: { range: (u) => [0, niceScale(seriesMax(u.data.slice(1) as (number | null)[][])).max] } },
      axes: [
        { stroke: '#64748b', grid: { stroke: '#e2e8f0' }, values: (_u, splits) => splits.map((s) => formatAxisTime(s * 1000, span())) },
        { stroke: '#64748b', grid: { stroke: '#e2e8f0' }, size: 52, values: (_u, splits) => splits.map((s) => formatTick(s)) },
      ],
      legend: { live: true },
      series: [
        { label: 'time', value: (_u, v) => (v == null ? '–' : new Date(v * 1000).toISOString().slice(11, 16)) },
        ...lines.map((l) => ({
          label: l.label,
          stroke: l.color,
          width: 2,
          spanGaps: false,
          value: (_u: uPlot, v: number | null) => (v == null ? '–' : format(v)),
          // A value with gaps on both sides has no line to show it: mark it.
          points: { show: true, size: 6, fill: l.color, filter: (u: uPlot, si: number) => isolatedPoints(u.data[si] as (number | null)[]) },
        })),
      ],
    };
    const p = new uPlot(opts, data as uPlot.AlignedData, el);
    plot.current = p;
    const resize = new ResizeObserver(() => p.setSize({ width: Math.max(200, el.clientWidth), height: HEIGHT }));
    resize.observe(el);
    return () => {
      resize.disconnect();
      p.destroy();
      plot.current = null;
    };
  }, [shape]);

  useEffect(() => {
    plot.current?.setData(data as uPlot.AlignedData);
  }, [JSON.stringify(data)]);

  const latest = lines.map((l) => lastValue(l.values));
  const summary = lines.map((l, i) => `${l.label} latest ${latest[i] === null ? 'none' : format(latest[i] as number)}`);
  return (
    <figure class="chart" data-testid={`chart-${props.title}`} aria-label={`${props.title} (${props.unit}): ${summary.join('; ')}`}>
      <figcaption>
        <span class="chart-title">
          {props.title} <span class="muted">({props.unit})</span>
        </span>
        <span class="muted latest">
          latest:{' '}
          {lines.map((l, i) => (
            <span key={l.label}>
              {l.label} <b>{latest[i] === null ? '–' : format(latest[i] as number)}</b>{' '}
            </span>
          ))}
        </span>
      </figcaption>
      <div ref={box} class="plot" />
    </figure>
  );
}
