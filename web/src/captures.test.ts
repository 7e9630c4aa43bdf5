import { describe, expect, it } from 'vitest';
import {
  captureBody,
  captureDraft,
  captureLabel,
  capturePath,
  downloadName,
  parseRetentionDays,
  splitCaptureName,
  summarizeCapture,
  versionsLabel,
} from './captures';
import { abilitiesOf } from './roles';
import { parseRoute } from './router';

const batch = '0193a1b2-c3d4-7e5f-8a9b-0c1d2e3f4a5b';

describe('capture file names', () => {
  it('split into date, worker and batch, with dashes in the worker id', () => {
    expect(splitCaptureName(`2026-12-02/dev-worker-1-${batch}.jsonl`)).toEqual({ date: '2026-12-02', worker: 'dev-worker-1', batch });
    expect(splitCaptureName('2026-12-02/w.jsonl')).toEqual({ date: '2026-12-02', worker: 'w', batch: '' });
    expect(splitCaptureName('../x.jsonl')).toBeNull();
    expect(splitCaptureName('2026-12-02/a/b.jsonl')).toBeNull();
  });

  it('make escaped download paths and flat file names', () => {
    expect(capturePath('demo', 'my model', `2026-12-02/w-${batch}.jsonl`)).toBe(`/v1/tenants/demo/deployments/my%20model/captures/2026-12-02/w-${batch}.jsonl`);
    expect(capturePath('demo', 'd', '2026-12-02/..%2Fx.jsonl')).toBe('/v1/tenants/demo/deployments/d/captures/2026-12-02/..%252Fx.jsonl');
    expect(downloadName('simple', `2026-12-02/w-${batch}.jsonl`)).toBe(`simple_2026-12-02_w-${batch}.jsonl`);
    expect(downloadName('a b/c', '2026-12-02/w.jsonl')).toBe('a_b_c_2026-12-02_w.jsonl');
  });
});

describe('summarizeCapture', () => {
  it('counts records, versions, models, failures and the time span', () => {
    const lines = [
      { model: 'simple', version: 2, status: 'ok', truncated: false, received_at_ms: 2000 },
      { model: 'simple', version: 1, status: 'error', truncated: true, received_at_ms: 1000 },
      { model: 'simple', version: 2, status: 'ok', received_at_ms: 3000 },
    ].map((r) => JSON.stringify(r));
    const s = summarizeCapture(`${lines.join('\n')}\n\nnot json\n[1]\n`);
    expect(s).toEqual({ records: 3, versions: [1, 2], models: ['simple'], errors: 1, truncated: 1, firstMs: 1000, lastMs: 3000, unreadable: 2 });
    expect(versionsLabel(s.versions)).toBe('v1, v2');
  });

  it('reads an empty file as no records', () => {
    const s = summarizeCapture('');
    expect(s.records).toBe(0);
    expect(s.firstMs).toBeNull();
    expect(versionsLabel(s.versions)).toBe('–');
  });
});

describe('capture settings form', () => {
  it('starts from the API defaults and round-trips', () => {
    const d = captureDraft(null);
    expect(d).toEqual({ enabled: false, samplePercent: '100', inputs: true, outputs: true, metadata: true, maxRecordKiB: '64' });
    const set = { enabled: true, sample_rate: 0.125, inputs: false, outputs: true, metadata: false, max_record_bytes: 2048 };
    const back = captureBody(captureDraft(set));
    expect(back).toEqual({ ok: true, value: set });
  });

  it('refuses what the API refuses', () => {
    const d = captureDraft({ enabled: true });
    expect(captureBody({ ...d, samplePercent: '101' }).ok).toBe(false);
    expect(captureBody({ ...d, samplePercent: '' }).ok).toBe(false);
    expect(captureBody({ ...d, samplePercent: 'x' }).ok).toBe(false);
    expect(captureBody({ ...d, maxRecordKiB: '0.5' }).ok).toBe(false);
    expect(captureBody({ ...d, maxRecordKiB: '1025' }).ok).toBe(false);
    expect(captureBody({ ...d, samplePercent: '0', maxRecordKiB: '1024' })).toEqual({
      ok: true,
      value: { enabled: true, sample_rate: 0, inputs: true, outputs: true, metadata: true, max_record_bytes: 1024 * 1024 },
    });
  });

  it('says what is captured in one line', () => {
    expect(captureLabel(null)).toBe('off');
    expect(captureLabel({ enabled: false, sample_rate: 1 })).toBe('off');
    expect(captureLabel({ enabled: true, sample_rate: 0.1, metadata: false })).toBe('10% of requests: inputs, outputs, records up to 64 KiB');
    expect(captureLabel({ enabled: true, inputs: false, outputs: false, metadata: false })).toBe('100% of requests: no tensors or parameters, records up to 64 KiB');
  });

  it('takes retention as whole days or the default', () => {
    expect(parseRetentionDays(' 7 ')).toBe(7);
    expect(parseRetentionDays('')).toBeNull();
    for (const bad of ['0', '3651', '1.5', '-3', 'week']) expect(parseRetentionDays(bad)).toBeUndefined();
  });
});

describe('who sees captures', () => {
  it('has a page per tenant', () => {
    expect(parseRoute('/t/demo/captures')).toEqual({ page: 'captures', tenant: 'demo' });
  });

  it('viewers read them, deployers change the settings, tenant admins the retention', () => {
    expect(abilitiesOf('inference').readCaptures).toBe(false);
    expect(abilitiesOf('viewer')).toMatchObject({ readCaptures: true, deploy: false, manageKeys: false });
    expect(abilitiesOf('deployer')).toMatchObject({ readCaptures: true, deploy: true });
    expect(abilitiesOf('tenant-admin')).toMatchObject({ readCaptures: true, setRetention: true });
    expect(abilitiesOf('deployer').setRetention).toBe(false);
  });
});
