import { describe, expect, it } from 'vitest';
import {
  formatAgo,
  formatAxisTime,
  formatBytes,
  formatCents,
  formatCount,
  formatMicros,
  formatPercent,
  formatQuantity,
  formatRate,
  formatTick,
  formatTime,
  shortSha,
} from './format';

describe('formatBytes', () => {
  it('keeps whole bytes below a KiB', () => expect(formatBytes(512)).toBe('512 B'));
  it('uses binary units with one decimal', () => {
    expect(formatBytes(1536)).toBe('1.5 KiB');
    expect(formatBytes(5.3 * 1024 * 1024)).toBe('5.3 MiB');
    expect(formatBytes(4 * 1024 ** 3)).toBe('4.0 GiB');
  });
  it('drops decimals from three digits on', () => expect(formatBytes(300 * 1024)).toBe('300 KiB'));
  it('shows non-numbers as a dash', () => expect(formatBytes(Number.NaN)).toBe('–'));
});

describe('formatMicros', () => {
  it('picks µs, ms or s', () => {
    expect(formatMicros(850)).toBe('850 µs');
    expect(formatMicros(12_345)).toBe('12.3 ms');
    expect(formatMicros(1_500)).toBe('1.5 ms');
    expect(formatMicros(1_200_000)).toBe('1.20 s');
  });
  it('shows a missing value as a dash', () => {
    expect(formatMicros(null)).toBe('–');
    expect(formatMicros(undefined)).toBe('–');
  });
});

describe('rates, counts and shares', () => {
  it('formats rates', () => {
    expect(formatRate(0)).toBe('0/s');
    expect(formatRate(0.25)).toBe('0.25/s');
    expect(formatRate(12.5)).toBe('12.5/s');
    expect(formatRate(1234.4)).toBe('1,234/s');
  });
  it('formats counts and percentages', () => {
    expect(formatCount(1234567)).toBe('1,234,567');
    expect(formatPercent(0.125)).toBe('12.5 %');
    expect(formatPercent(1)).toBe('100 %');
  });
  it('formats quantities with bounded decimals', () => {
    expect(formatQuantity(1.23456789)).toBe('1.2346');
    expect(formatQuantity(2)).toBe('2');
    expect(formatQuantity(1234.5, 1)).toBe('1,234.5');
  });
  it('formats axis ticks compactly', () => {
    expect(formatTick(0)).toBe('0');
    expect(formatTick(0.5)).toBe('0.5');
    expect(formatTick(1500)).toBe('1.5k');
    expect(formatTick(3_000_000)).toBe('3M');
  });
});

describe('formatCents', () => {
  it('shows dollars with two decimals', () => {
    expect(formatCents(12345)).toBe('$123.45');
    expect(formatCents(0)).toBe('$0.00');
    expect(formatCents(-250)).toBe('-$2.50');
  });
  it('keeps fractional cents of unit prices', () => expect(formatCents(0.5)).toBe('$0.005'));
  it('names other currencies', () => expect(formatCents(100, 'EUR')).toBe('EUR 1.00'));
});

describe('times', () => {
  it('shows UTC to the second', () => expect(formatTime('2026-11-30T12:05:09.123Z')).toBe('2026-11-30 12:05:09 UTC'));
  it('passes unparsable text through and shows missing as a dash', () => {
    expect(formatTime('soon')).toBe('soon');
    expect(formatTime(null)).toBe('–');
  });
  it('says how long ago', () => {
    const now = new Date('2026-11-30T12:00:00Z');
    expect(formatAgo('2026-11-30T11:59:50Z', now)).toBe('just now');
    expect(formatAgo('2026-11-30T11:55:00Z', now)).toBe('5 min ago');
    expect(formatAgo('2026-11-30T09:00:00Z', now)).toBe('3 h ago');
    expect(formatAgo('2026-11-28T12:00:00Z', now)).toBe('2 d ago');
  });
  it('labels axis times by span', () => {
    const t = Date.parse('2026-11-30T08:07:00Z');
    expect(formatAxisTime(t, 3_600_000)).toBe('08:07');
    expect(formatAxisTime(t, 7 * 86_400_000)).toBe('11-30 08:07');
  });
  it('shortens a sha256', () => expect(shortSha('a'.repeat(64))).toBe('aaaaaaaaaaaa'));
});
