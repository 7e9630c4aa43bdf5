// The console's write paths in a real browser against a real `tessera dev`: registering a model
// and uploading versions (with progress), aliases promoted and rolled back, a deployment
// created, scaled and deleted (confirmed), API keys created (secret shown once) and revoked,
// actors named in the audit trail, platform admins setting quotas and prices, and a viewer
// who sees none of it. Each test saves a screenshot under web/test-results/ (`w*`).

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { call, launchBrowser, openPage, screenshot, signIn, startDev, type Dev } from './harness';

let dev: Dev;
let browser: Browser;
let context: BrowserContext | undefined;
let errors: string[] = [];
/** Console errors a test expects: the browser logs every refused request. */
let expected: RegExp | null = null;
let onnx: string;
let garbage: string;
let config: string;

const model = 'adder';

beforeAll(async () => {
  dev = await startDev();
  browser = await launchBrowser();
  onnx = join(dev.dataDir, 'models/simple.onnx');
  // Not ONNX, and large enough (4 MiB) that a throttled upload shows its progress.
  garbage = join(dev.dataDir, 'not-a-model.onnx');
  writeFileSync(garbage, Buffer.alloc(4 * 1024 * 1024, 7));
  const v1 = await call<{ config: unknown }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/models/simple/versions/1`);
  config = JSON.stringify(v1.config ?? {});
  expect(readFileSync(onnx).length).toBeGreaterThan(0);
});

afterAll(async () => {
  await browser?.close();
  await dev?.stop();
});

afterEach(async () => {
  await context?.close();
  context = undefined;
  const unexpected = errors.filter((e) => !expected || !expected.test(e));
  expected = null;
  expect(unexpected, 'the console logged errors').toEqual([]);
});

async function page(key: string, path = '/'): Promise<Page> {
  const opened = await openPage(browser, 1280, 900);
  context = opened.context;
  errors = opened.errors;
  await signIn(opened.page, dev, key, path);
  return opened.page;
}

/** Uploads `file` from the open model page, with the demo model's config. */
async function upload(p: Page, file: string): Promise<void> {
  const form = p.getByTestId('upload');
  await form.locator('input[type=file]').setInputFiles(file);
  await form.getByLabel(/Model config/).fill(config);
  await form.getByRole('button', { name: 'Upload' }).click();
}

describe('console writes', () => {
  it('registers a model and uploads versions with progress; a refused upload leaves nothing', async () => {
    const p = await page(dev.adminKey);
    await p.getByText('New model').click();
    await p.getByLabel('Name').fill(model);
    await p.getByLabel('Description').fill('uploaded from the console');
    await p.getByRole('button', { name: 'Create model' }).click();
    await p.getByRole('heading', { name: `Model ${model}` }).waitFor();
    await p.getByText('No versions yet').waitFor();

    // Throttle the upload so the progress bar is seen moving, then the API's refusal.
    const cdp = await context!.newCDPSession(p);
    await cdp.send('Network.enable');
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: 1024 * 1024 });
    expected = /422|Unprocessable/;
    await upload(p, garbage);
    const bar = p.getByTestId('upload').locator('progress');
    await expect.poll(async () => Number(await bar.getAttribute('value')), { timeout: 20_000, interval: 100 }).toBeGreaterThan(0);
    expect(Number(await bar.getAttribute('value'))).toBeLessThan(100);
    await screenshot(p, 'w01-upload-progress');
    await p.getByText(/Upload refused/).waitFor({ timeout: 60_000 });
    expect(await p.getByRole('alert').textContent()).toMatch(/422/);
    await cdp.send('Network.emulateNetworkConditions', { offline: false, latency: 0, downloadThroughput: -1, uploadThroughput: -1 });
    const versions = await call<{ versions: unknown[] }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/models/${model}/versions`);
    expect(versions.versions).toHaveLength(0);

    await upload(p, onnx);
    await p.getByText('Version 1 uploaded').waitFor({ timeout: 30_000 });
    await p.locator('[data-testid=versions] tr[data-version="1"]').waitFor();
    await upload(p, onnx);
    await p.getByText('Version 2 uploaded').waitFor({ timeout: 30_000 });
    await expect.poll(() => p.getByTestId('versions').locator('tbody tr').count()).toBe(2);
    // The uploader is named: the tenant-admin key of tessera dev, by its name.
    const keys = await call<{ api_keys: { prefix: string; name: string }[] }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/api-keys`);
    const mine = keys.api_keys.find((k) => dev.adminKey.startsWith(k.prefix));
    expect(mine, 'the admin key is listed').toBeDefined();
    expect(await p.locator('[data-testid=versions] tr[data-version="2"]').textContent()).toContain(mine?.name);
    await screenshot(p, 'w02-uploaded');
  });

  it('promotes a version to a new alias, moves it and rolls it back', async () => {
    const p = await page(dev.adminKey, `/t/${dev.tenant}/models/${model}`);
    await p.getByTestId('versions').waitFor();
    await p.getByLabel('Promote to alias').fill('production');
    await p.locator('[data-testid=versions] tr[data-version="1"]').getByRole('button', { name: 'Promote' }).click();
    const dialog = p.getByRole('dialog');
    expect(await dialog.textContent()).toContain('(a new alias)');
    await dialog.getByRole('button', { name: 'Promote' }).click();
    await expect.poll(() => p.getByTestId('alias-production-version').textContent()).toBe('1');
    await p.locator('[data-testid=versions] tr[data-version="2"]').getByRole('button', { name: 'Promote' }).click();
    await p.getByRole('dialog').getByRole('button', { name: 'Promote' }).click();
    await expect.poll(() => p.getByTestId('alias-production-version').textContent()).toBe('2');
    await p.getByRole('button', { name: 'Roll back to 1' }).click();
    expect(await p.getByRole('dialog').textContent()).toContain('instead of version 2');
    await screenshot(p, 'w03-alias-rollback-confirm');
    await p.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
    await expect.poll(() => p.getByTestId('alias-production-version').textContent()).toBe('1');
  });

  it('creates a deployment that becomes ready, with snippets to call it; a taken name shows the API’s refusal', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Deployments' }).click();
    const form = p.getByRole('form', { name: 'Create a deployment' });
    await p.getByText('New deployment').click();
    await form.getByLabel('Model').selectOption(model);
    await form.getByLabel('Follows').selectOption('alias');
    // The model's aliases load after it is picked; the field fills in when they arrive.
    await expect.poll(() => form.getByLabel('Alias', { exact: true }).inputValue()).toBe('production');
    expected = /409|Conflict/;
    await form.getByLabel('Name', { exact: true }).fill('simple');
    await form.getByRole('button', { name: 'Deploy' }).click();
    await form.getByRole('alert').waitFor();
    expect(await form.getByRole('alert').textContent()).toMatch(/409/);
    await form.getByLabel('Name', { exact: true }).fill(model);
    await form.getByRole('button', { name: 'Deploy' }).click();
    await p.getByRole('heading', { name: `Deployment ${model}` }).waitFor();
    const facts = p.locator('dl.facts').first();
    await expect.poll(() => facts.textContent(), { timeout: 120_000, interval: 1_000 }).toMatch(/Serving version1/);
    expect(await facts.textContent()).toContain(`alias production → v1`);
    const tabs = p.getByTestId('snippets');
    expect(await tabs.getByRole('tab').allTextContents()).toEqual(['curl', 'tritonclient HTTP', 'tritonclient gRPC', 'tessera CLI']);
    expect(await p.getByTestId('snippet-curl').textContent()).toContain(`/v2/models/${model}/infer`);
    await tabs.getByRole('tab', { name: 'tritonclient gRPC' }).click();
    expect(await p.getByTestId('snippet-python-grpc').textContent()).toContain('"authorization"');
    await tabs.getByRole('tab', { name: 'tessera CLI' }).click();
    expect(await p.getByTestId('snippet-cli').textContent()).toContain(`tessera infer --model ${model}`);
    await screenshot(p, 'w04-deployment-created');
  });

  it('scales the deployment to two replicas and deletes it after confirming', async () => {
    const p = await page(dev.adminKey, `/t/${dev.tenant}/deployments/${model}`);
    const scale = p.getByTestId('scale');
    await scale.waitFor();
    await scale.getByLabel('Replicas').fill('2');
    await scale.getByRole('button', { name: 'Scale' }).click();
    await p.getByText('Scaling to 2 replicas.').waitFor();
    const ready = p.locator('ul.replicas li', { hasText: 'ready' });
    await expect.poll(() => ready.count(), { timeout: 120_000, interval: 1_000 }).toBe(2);
    await screenshot(p, 'w05-scaled');
    await p.getByRole('button', { name: 'Delete deployment' }).click();
    const dialog = p.getByRole('dialog');
    expect(await dialog.getByRole('heading').textContent()).toBe(`Delete deployment ${model}?`);
    await screenshot(p, 'w06-delete-confirm');
    await dialog.getByRole('button', { name: 'Delete' }).click();
    await p.getByRole('heading', { name: 'Deployments' }).waitFor();
    await expect.poll(() => p.getByRole('link', { name: model, exact: true }).count()).toBe(0);
    const left = await call<{ deployments: { name: string }[] }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/deployments`);
    expect(left.deployments.map((d) => d.name)).not.toContain(model);
  });

  it('creates an API key whose secret shows once, then revokes it after confirming', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'API keys' }).click();
    const form = p.getByRole('form', { name: 'Create an API key' });
    await form.getByLabel('Name').fill('ci pipeline');
    await form.getByLabel('Role').selectOption('viewer');
    await form.getByRole('button', { name: 'Create key' }).click();
    const secret = (await p.getByTestId('new-key-secret').textContent()) ?? '';
    expect(secret).toMatch(/^tsk_/);
    expect(await p.getByTestId('new-key').textContent()).toContain('not shown again');
    await p.getByRole('button', { name: 'Copy secret' }).waitFor();
    await screenshot(p, 'w07-key-secret-once');
    // The secret works, and disappears once acknowledged; the list never shows it.
    await call(dev, secret, 'GET', `/v1/tenants/${dev.tenant}/models`);
    await p.getByRole('button', { name: 'I have stored it' }).click();
    expect(await p.getByTestId('new-key').count()).toBe(0);
    const row = p.locator('[data-testid=keys] tr[data-key="ci pipeline"]');
    await row.waitFor();
    expect(await row.textContent()).toContain('active');
    expect(await p.content()).not.toContain(secret);

    await row.getByRole('button', { name: 'Revoke' }).click();
    const dialog = p.getByRole('dialog');
    expect(await dialog.textContent()).toContain('ci pipeline');
    await screenshot(p, 'w08-key-revoke-confirm');
    await dialog.getByRole('button', { name: 'Revoke' }).click();
    await expect.poll(() => row.textContent()).toContain('revoked');
    await expect(call(dev, secret, 'GET', `/v1/tenants/${dev.tenant}/models`)).rejects.toThrow(/401/);
  });

  it('names actors in the audit trail by key and user', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Audit trail' }).click();
    await p.getByLabel('Action').fill('api_key.revoke');
    await p.getByRole('button', { name: 'Filter' }).click();
    const actor = p.locator('[data-testid=audit] tbody tr').first().getByTestId('actor');
    await actor.waitFor();
    expect(await actor.textContent()).toMatch(/key “.+”/);
    await screenshot(p, 'w09-audit-actors');
  });

  it('lets a platform admin set a tenant’s quotas and the prices', async () => {
    const p = await page(dev.platformKey, `/t/${dev.tenant}/quotas`);
    const form = p.getByRole('form', { name: 'Change quotas' });
    await form.waitFor();
    await form.getByLabel('Replicas').fill('12');
    await form.getByRole('button', { name: 'Save quotas' }).click();
    await form.getByText(`Quotas of ${dev.tenant} saved.`).waitFor();
    const limit = p.getByTestId('quotas').locator('tbody tr', { hasText: /^replicas/ }).locator('td').nth(2);
    await expect.poll(() => limit.textContent()).toBe('12');
    await screenshot(p, 'w10-quotas-set');
    const quotas = await call<{ limits: { replicas: number } }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/quotas`);
    expect(quotas.limits.replicas).toBe(12);

    await p.getByRole('link', { name: 'Prices' }).click();
    await p.getByRole('button', { name: 'Add entry' }).waitFor();
    const before = await p.locator('[data-testid=prices] tbody tr').count();
    await p.getByRole('button', { name: 'Add entry' }).click();
    const n = before + 1;
    await p.getByLabel(`Cents per slice-hour, row ${n}`).fill('250');
    await p.getByLabel(`Cents per 1000 inferences, row ${n}`).fill('1.5');
    await p.getByLabel(`Effective from, row ${n}`).fill('2030-01-01T00:00');
    await p.getByRole('button', { name: 'Save prices' }).click();
    await p.getByRole('dialog').getByRole('button', { name: 'Save prices' }).click();
    await p.getByText('The price schedule is saved').waitFor();
    const prices = await call<{ prices: { per_slice_hour_cents: number; effective_from: string }[] }>(dev, dev.adminKey, 'GET', '/v1/prices');
    expect(prices.prices).toContainEqual(expect.objectContaining({ per_slice_hour_cents: 250, effective_from: '2030-01-01T00:00:00Z' }));
    await screenshot(p, 'w11-prices-set');
  });

  it('gives a viewer no write controls', async () => {
    const created = await call<{ key: string }>(dev, dev.adminKey, 'POST', `/v1/tenants/${dev.tenant}/api-keys`, { name: 'read only', role: 'viewer' });
    const p = await page(created.key);
    expect(await p.getByRole('link', { name: 'API keys' }).count()).toBe(0);
    expect(await p.getByText('New model').count()).toBe(0);
    await p.getByRole('link', { name: 'simple', exact: true }).click();
    await p.getByTestId('versions').waitFor();
    expect(await p.getByTestId('upload').count()).toBe(0);
    await p.getByRole('link', { name: 'Deployments' }).click();
    await p.getByRole('link', { name: 'simple', exact: true }).first().click();
    await p.getByTestId('snippets').waitFor();
    expect(await p.getByTestId('scale').count()).toBe(0);
    expect(await p.getByRole('button', { name: 'Delete deployment' }).count()).toBe(0);
    await screenshot(p, 'w12-viewer-deployment');
  });
});
