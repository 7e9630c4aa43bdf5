import { describe, expect, it } from 'vitest';
import { deploymentBody, formatOfFile, parseConfig, parseWhole, priceForm, pricesBody, quotaBody, quotaForm, uploadPercent, type DeploymentForm } from './forms';
import { grantableRoles } from './roles';
import { actorLabel, keyState } from './shape';

const form = (over: Partial<DeploymentForm> = {}): DeploymentForm => ({
  name: 'simple',
  model: 'simple',
  target: { kind: 'latest' },
  profile: 'cpu',
  replicas: '1',
  ...over,
});

describe('deployment form', () => {
  it('builds the body for each kind of target', () => {
    expect(deploymentBody(form())).toEqual({ ok: true, value: { name: 'simple', model: 'simple', profile: 'cpu', replicas: 1 } });
    expect(deploymentBody(form({ target: { kind: 'alias', alias: ' production ' } }))).toMatchObject({ ok: true, value: { alias: 'production' } });
    expect(deploymentBody(form({ target: { kind: 'version', version: '3' }, replicas: '0' }))).toMatchObject({ ok: true, value: { version: 3, replicas: 0 } });
    expect(deploymentBody(form({ profile: '' }))).toMatchObject({ ok: true, value: { profile: 'cpu' } });
  });
  it('names the field that is wrong', () => {
    const error = (f: DeploymentForm) => {
      const r = deploymentBody(f);
      return r.ok ? '' : r.error.split(':')[0];
    };
    expect(error(form({ name: 'Bad Name' }))).toBe('Name');
    expect(error(form({ model: '' }))).toBe('Model');
    expect(error(form({ replicas: '65' }))).toBe('Replicas');
    expect(error(form({ replicas: '1.5' }))).toBe('Replicas');
    expect(error(form({ profile: 'tpu' }))).toBe('Profile');
    expect(error(form({ target: { kind: 'alias', alias: '' } }))).toBe('Alias');
    expect(error(form({ target: { kind: 'version', version: '0' } }))).toBe('Version');
  });
  it('reads whole numbers only', () => {
    expect(parseWhole(' 7 ', 0, 64)).toBe(7);
    expect(parseWhole('-1', 0, 64)).toBe(null);
    expect(parseWhole('', 0, 64)).toBe(null);
    expect(parseWhole('1e3', 0, 5000)).toBe(null);
  });
});

describe('upload form', () => {
  it('reads a config as a JSON object or nothing', () => {
    expect(parseConfig('  ')).toEqual({ ok: true, value: null });
    expect(parseConfig('{"max_batch_size": 8}')).toEqual({ ok: true, value: { max_batch_size: 8 } });
    expect(parseConfig('[1]').ok).toBe(false);
    const bad = parseConfig('{nope');
    expect(bad.ok === false && bad.error.startsWith('Config: not JSON')).toBe(true);
  });
  it('guesses the packaging from the file name', () => {
    expect(formatOfFile('model.onnx')).toBe('onnx');
    expect(formatOfFile('Repo.TAR')).toBe('tar');
    expect(formatOfFile('repo.zip')).toBe('zip');
  });
  it('turns bytes sent into a whole percent', () => {
    expect(uploadPercent(0, 0)).toBe(0);
    expect(uploadPercent(1, 3)).toBe(33);
    expect(uploadPercent(5, 4)).toBe(100);
  });
});

describe('quota form', () => {
  const limits = { models: 10, versions: 50, storage_bytes: 1024, replicas: 4, requests_per_second: 0, concurrent_requests: 0, monthly_spend_cents: 0, slices: { cpu: 8, 'mig-1g.10gb': 2 } };
  it('round-trips the limits', () => {
    expect(quotaBody(quotaForm(limits))).toEqual({ ok: true, value: limits });
  });
  it('refuses bad counts and slice lines', () => {
    expect(quotaBody({ ...quotaForm(limits), replicas: 'many' })).toEqual({ ok: false, error: 'replicas: a whole number, 0 or more.' });
    expect(quotaBody({ ...quotaForm(limits), slices: 'cpu:8' }).ok).toBe(false);
    expect(quotaBody({ ...quotaForm(limits), slices: 'tpu=1' }).ok).toBe(false);
  });
});

describe('price form', () => {
  const price = { slice_profile: 'cpu', per_slice_hour_cents: 12.5, per_1000_inferences_cents: 0.000001, effective_from: '2026-12-01T00:00:00Z' };
  it('round-trips a schedule', () => {
    expect(pricesBody([priceForm(price)])).toEqual({ ok: true, value: { prices: [price] } });
  });
  it('names the row that is wrong', () => {
    expect(pricesBody([priceForm(price), { ...priceForm(price), per_slice_hour_cents: '-1' }])).toEqual({
      ok: false,
      error: 'Row 2: prices are cents, 0 or more (decimals allowed).',
    });
    expect(pricesBody([{ ...priceForm(price), per_slice_hour_cents: '0.0000001' }]).ok).toBe(false);
    expect(pricesBody([{ ...priceForm(price), effective_from: '' }]).ok).toBe(false);
  });
});

describe('keys and actors', () => {
  const key = {
    id: 'k',
    prefix: 'tsk_ab',
    name: 'ci',
    role: 'viewer' as const,
    created_at: '2026-01-01T00:00:00Z',
    limits: { requests_per_second: 0, concurrent_requests: 0 },
  };
  it('tells active, expired and revoked keys apart', () => {
    const now = new Date('2026-06-01T00:00:00Z');
    expect(keyState(key, now)).toBe('active');
    expect(keyState({ ...key, expires_at: '2026-05-01T00:00:00Z' }, now)).toBe('expired');
    expect(keyState({ ...key, revoked_at: '2026-05-01T00:00:00Z' }, now)).toBe('revoked');
  });
  it('offers only roles up to the creator’s', () => {
    expect(grantableRoles('tenant-admin', false)).toEqual(['inference', 'viewer', 'deployer', 'tenant-admin']);
    expect(grantableRoles('platform-admin', false)).not.toContain('platform-admin');
    expect(grantableRoles('platform-admin', true)).toContain('platform-admin');
  });
  it('names actors by user and key', () => {
    const id = '0190aaaa-bbbb-7ccc-8ddd-eeeeffff0000';
    expect(actorLabel({ actor_key_id: null })).toBe('system');
    expect(actorLabel({ actor_key_id: id })).toBe('key 0190aaaa');
    expect(actorLabel({ actor_key_id: id, actor_key_name: 'ci' })).toBe('key “ci”');
    expect(actorLabel({ actor_key_id: id, actor_key_name: 'laptop', actor_user_email: 'ada@example.com' })).toBe('ada@example.com (key “laptop”)');
    expect(actorLabel({ actor_key_id: null, actor_user_email: 'ada@example.com' })).toBe('ada@example.com (single sign-on)');
  });
});
