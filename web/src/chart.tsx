// A hand-rolled SVG line chart: time on x, one or more series on y, gaps where a value is null.

import { formatAxisTime, formatTick } from './format';
import { isolatedPoints, linear, linePath, niceScale, seriesMax, tickIndexes } from './chartmath';

/** One line of a chart. */
export interface Line {
  label: string;
  values: (number | null)[];
  color: string;
}

const W = 560;
const H = 200;
const PAD = { left: 48, right: 12, top: 12, bottom: 28 };

/** A line chart of `lines` over `times` (epoch ms), `unit` on the y axis label. */
export function LineChart(props: { title: string; unit: string; times: number[]; lines: Line[]; format: (v: number) => string }) {
  const { times, lines } = props;
  const scale = niceScale(seriesMax(lines.map((l) => l.values)));
  const t0 = times[0] ?? 0;
  const t1 = times[times.length - 1] ?? 1;
  const x = linear(t0, t1, PAD.left, W - PAD.right);
  const y = linear(0, scale.max, H - PAD.bottom, PAD.top);
  const xs = times.map(x);
  const latest = lines.map((l) => lastValue(l.values));
  const summary = lines.map((l, i) => `${l.label} latest ${latest[i] === null ? 'none' : props.format(latest[i] as number)}`);
  return (
    <figure class="chart" data-testid={`chart-${props.title}`}>
      <figcaption>
        <span class="chart-title">
          {props.title} <span class="muted">({props.unit})</span>
        </span>
        <span class="legend">
          {lines.map((l, i) => (
            <span class="legend-item" key={l.label}>
              <span class="swatch" style={{ background: l.color }} aria-hidden="true" />
              {l.label} <b>{latest[i] === null ? '–' : props.format(latest[i] as number)}</b>
            </span>
          ))}
        </span>
      </figcaption>
      <svg viewBox={`0 0 ${W} ${H}`} role="img" aria-label={`${props.title} (${props.unit}): ${summary.join('; ')}`}>
        {scale.ticks.map((t) => (
          <g key={t}>
            <line class="grid" x1={PAD.left} x2={W - PAD.right} y1={y(t)} y2={y(t)} />
            <text class="axis" x={PAD.left - 6} y={y(t) + 4} text-anchor="end">
              {formatTick(t)}
            </text>
          </g>
        ))}
        {tickIndexes(times.length, 5).map((i, k, all) => (
          <text key={i} class="axis" x={xs[i]} y={H - 8} text-anchor={k === 0 ? 'start' : k === all.length - 1 ? 'end' : 'middle'}>
            {formatAxisTime(times[i], t1 - t0)}
          </text>
        ))}
        {lines.map((l) => (
          <path
            key={l.label}
            class="series"
            d={linePath(xs, l.values.map((v) => (v === null ? null : y(v))))}
            stroke={l.color}
            data-series={l.label}
          />
        ))}
        {lines.map((l) =>
          isolatedPoints(l.values).map((i) => <circle key={`${l.label}-${i}`} class="point" cx={xs[i]} cy={y(l.values[i] as number)} r={3.5} fill={l.color} />),
        )}
      </svg>
    </figure>
  );
}

function lastValue(values: (number | null)[]): number | null {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null) return values[i];
  return null;
}
