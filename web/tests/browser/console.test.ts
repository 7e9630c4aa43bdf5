// The console in a real browser against a real `tessera dev`: sign in, models, versions,
// moving an alias and its audit entry, deployments, charts from real traffic (uPlot, values on
// hover), invoices, roles, a narrow window. Each test saves a screenshot under web/test-results/.

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { call, eventually, launchBrowser, openPage, screenshot, sendTraffic, signIn, startDev, type Dev } from './harness';

let dev: Dev;
let browser: Browser;
let context: BrowserContext | undefined;
let errors: string[] = [];

const model = 'simple';

beforeAll(async () => {
  dev = await startDev();
  browser = await launchBrowser();
  const t = `/v1/tenants/${dev.tenant}`;
  // Seed through the REST API: a second version of the demo model (same bytes and config as
  // version 1) and a second model, so there is something to promote, search and sort.
  const v1 = await call<{ config: unknown }>(dev, dev.adminKey, 'GET', `${t}/models/${model}/versions/1`);
  const versions = await call<{ versions: unknown[] }>(dev, dev.adminKey, 'GET', `${t}/models/${model}/versions`);
  if (versions.versions.length < 2) {
    const bytes = new Uint8Array(readFileSync(join(dev.dataDir, 'models/simple.onnx')));
    await call(dev, dev.adminKey, 'POST', `${t}/models/${model}/versions?format=onnx`, bytes, {
      'Content-Type': 'application/octet-stream',
      'X-Model-Config': JSON.stringify(v1.config ?? {}),
    });
  }
  await call(dev, dev.adminKey, 'POST', `${t}/models`, { name: 'classifier', description: 'an image classifier (no versions yet)' });
});

afterAll(async () => {
  await browser?.close();
  await dev?.stop();
});

afterEach(async () => {
  await context?.close();
  context = undefined;
  expect(errors, 'the console logged errors').toEqual([]);
});

async function page(key: string, width = 1280, height = 900, path = '/'): Promise<Page> {
  const opened = await openPage(browser, width, height);
  context = opened.context;
  errors = opened.errors;
  await signIn(opened.page, dev, key, path);
  return opened.page;
}

describe('console', () => {
  it('signs in with a key and lists, searches and sorts models', async () => {
    const p = await page(dev.adminKey);
    await expect.poll(() => p.getByTestId('who').textContent()).toContain('tenant-admin');
    const rows = p.locator('main table tbody tr');
    await rows.first().waitFor();
    expect(await rows.allTextContents()).toHaveLength(2);
    await p.getByRole('button', { name: /Latest version/ }).click();
    await p.getByRole('button', { name: /Latest version/ }).click();
    await expect.poll(async () => (await rows.first().textContent()) ?? '').toContain(model);
    await p.getByPlaceholder('Search by name or description').fill('image');
    await expect.poll(() => rows.count()).toBe(1);
    expect(await rows.first().textContent()).toContain('classifier');
    await screenshot(p, '01-models-search');
    expect(await p.evaluate(() => Object.keys(localStorage).length + document.cookie.length)).toBe(0);
  });

  it('opens a model and shows its versions and aliases', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: model, exact: true }).click();
    const versions = p.getByTestId('versions');
    await versions.waitFor();
    expect(await versions.locator('tbody tr').count()).toBe(2);
    const v1 = versions.locator('tr[data-version="1"]');
    expect(await v1.textContent()).toMatch(/[0-9a-f]{12}/);
    expect(await v1.textContent()).toContain('onnx');
    expect(await p.getByTestId('alias-production-version').textContent()).toBe('1');
    // The newest version's signature, learned at upload: the demo model's INT32 tensors.
    const signature = p.getByTestId('signature-2');
    await signature.waitFor();
    const text = (await signature.textContent()) ?? '';
    expect(text).toContain('INPUT0');
    expect(text).toContain('INT32');
    expect(text).toContain('[-1, 16]');
    await v1.getByText('JSON').click();
    await screenshot(p, '02-model-versions');
  });

  it('moves an alias after confirming, and the audit trail shows it', async () => {
    const p = await page(dev.adminKey, 1280, 900, `/t/${dev.tenant}/models/${model}`);
    await p.getByTestId('aliases').waitFor();
    await p.locator('tr[data-alias="production"]').getByRole('button', { name: 'Move' }).click();
    const dialog = p.getByRole('dialog');
    await dialog.waitFor();
    expect(await dialog.textContent()).toContain('instead of version 1');
    await screenshot(p, '03-alias-confirm');
    await dialog.getByRole('button', { name: 'Promote' }).click();
    await expect.poll(() => p.getByTestId('alias-production-version').textContent()).toBe('2');
    const mover = p.locator('tr[data-alias="production"] select');
    expect(await mover.inputValue()).toBe('1');
    await screenshot(p, '04-alias-moved');
    await p.getByRole('link', { name: 'Audit trail' }).click();
    await p.getByLabel('Action').fill('alias.set');
    await p.getByRole('button', { name: 'Filter' }).click();
    const entry = p.locator('tr[data-action="alias.set"]').first();
    await entry.waitFor();
    expect(await entry.textContent()).toContain('version: 1 → 2');
    expect(await p.getByTestId('chain').textContent()).toContain('Chain intact');
    await screenshot(p, '05-audit-alias-set');
    // Roll back from the model page, confirmed in the dialog.
    await p.getByRole('link', { name: 'Models' }).click();
    await p.getByRole('link', { name: model, exact: true }).click();
    await p.getByRole('button', { name: 'Roll back to 1' }).click();
    await p.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
    await expect.poll(() => p.getByTestId('alias-production-version').textContent()).toBe('1');
  });

  it('shows the deployment with replicas per worker and slice, and its events', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Deployments' }).click();
    await p.getByRole('link', { name: model, exact: true }).first().click();
    await p.getByTestId('worker-group').first().waitFor();
    expect(await p.getByTestId('worker-group').first().textContent()).toMatch(/Slice \S+/);
    await p.getByTestId('events').waitFor();
    expect(await p.getByTestId('events').textContent()).toContain('placed');
    await screenshot(p, '06-deployment');
  });

  it('draws charts from real inference traffic', async () => {
    const t = `/v1/tenants/${dev.tenant}`;
    await eventually('the rolled-back deployment to serve version 1', 120_000, async () => {
      const d = await call<{ state: string; serving_version?: number | null; replica_status: { state: string }[] }>(dev, dev.adminKey, 'GET', `${t}/deployments/${model}`);
      return d.state === 'ready' && d.serving_version === 1 && d.replica_status.every((r) => r.state === 'ready') ? true : undefined;
    });
    expect(await sendTraffic(dev, model, 40, 3)).toBe(40);
    await eventually('metered requests to reach the control plane', 60_000, async () => {
      const m = await call<{ points: { requests: number }[] }>(dev, dev.adminKey, 'GET', `${t}/metrics?model=${model}`);
      return m.points.reduce((n, x) => n + x.requests, 0) >= 40 ? true : undefined;
    });
    const p = await page(dev.adminKey, 1280, 900, `/t/${dev.tenant}/metrics?model=${model}&range=15m`);
    const chart = p.getByTestId('chart-Request rate');
    await chart.locator('canvas').waitFor();
    expect(await p.getByTestId('metrics-summary').textContent()).toMatch(/4\d requests, [1-9]\d* failed/);
    // uPlot's legend: the time, then one entry per series.
    const latency = p.getByTestId('chart-Latency').locator('.u-legend .u-series .u-label');
    expect(await latency.allTextContents()).toEqual(['time', 'p50', 'p95', 'p99']);
    // Hovering the plot shows the values under the cursor in the legend.
    const over = chart.locator('.u-over');
    const box = await over.boundingBox();
    if (!box) throw new Error('the request-rate plot has no area');
    await p.mouse.move(box.x + box.width - 2, box.y + box.height / 2);
    const values = chart.locator('.u-legend .u-series .u-value');
    await expect.poll(async () => (await values.allTextContents())[0]).toMatch(/^\d\d:\d\d$/);
    expect((await values.allTextContents())[1]).toMatch(/\d/);
    await screenshot(p, '07-metrics-charts');
  });

  it('starts a canary on the deployment page, weights it and rolls it back', async () => {
    const p = await page(dev.adminKey, 1280, 900, `/t/${dev.tenant}/deployments/${model}`);
    const traffic = p.getByTestId('traffic');
    await traffic.waitFor();
    expect(await p.getByTestId('weight-1').textContent()).toBe('100%');
    await p.getByLabel('Canary version').fill('2');
    await p.getByLabel('Canary weight').fill('10');
    await p.getByRole('button', { name: 'Start canary' }).click();
    await p.getByRole('dialog').getByRole('button', { name: 'Start canary' }).click();
    await expect.poll(() => p.getByTestId('weight-2').textContent(), { timeout: 10_000 }).toContain('10%');
    // The canary's replica loads on the dev worker and serves: its row counts it ready.
    await expect.poll(() => traffic.locator('tr[data-version="2"]').textContent(), { timeout: 120_000, interval: 1_000 }).toContain('1/1');
    expect(await p.getByTestId('weight-1').textContent()).toBe('90%');
    await p.getByLabel('Canary weight').fill('25');
    await p.getByRole('button', { name: 'Set weight' }).click();
    await expect.poll(() => p.getByTestId('weight-2').textContent()).toBe('25%');
    expect(await p.getByTestId('weight-1').textContent()).toBe('75%');
    await screenshot(p, '07b-canary');
    await p.getByRole('button', { name: 'Roll back' }).click();
    await p.getByRole('dialog').getByRole('button', { name: 'Roll back' }).click();
    await expect.poll(() => p.getByTestId('weight-1').textContent()).toBe('100%');
    expect(await p.getByTestId('weight-2').count()).toBe(0);
  });

  it('shows the month’s invoice from metered usage and prices', async () => {
    const now = new Date();
    const monthStart = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1)).toISOString().replace('.000Z', 'Z');
    await call(dev, dev.platformKey, 'PUT', '/v1/prices', {
      prices: [{ slice_profile: 'cpu', per_slice_hour_cents: 1000, per_1000_inferences_cents: 5000, effective_from: monthStart }],
    });
    await sendTraffic(dev, model, 16);
    const t = `/v1/tenants/${dev.tenant}`;
    await eventually('an invoice with a non-zero total', 60_000, async () => {
      const inv = await call<{ total_cents: number }>(dev, dev.adminKey, 'GET', `${t}/invoices`);
      return inv.total_cents > 0 ? true : undefined;
    });
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Usage & invoices' }).click();
    await p.getByTestId('invoice').waitFor();
    expect(await p.getByTestId('invoice').textContent()).toContain('Inferences');
    expect(await p.getByTestId('invoice-total').textContent()).toMatch(/^\$\d+\.\d\d$/);
    await p.getByTestId('usage').waitFor();
    await screenshot(p, '08-invoice');
  });

  it('shows quotas with current use', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Quotas' }).click();
    await p.getByTestId('quotas').waitFor();
    expect(await p.getByTestId('quotas').textContent()).toContain('models');
    await screenshot(p, '09-quotas');
  });

  it('gives a viewer read-only pages: promote disabled, no audit trail', async () => {
    const created = await call<{ key: string }>(dev, dev.adminKey, 'POST', `/v1/tenants/${dev.tenant}/api-keys`, { name: 'console viewer', role: 'viewer' });
    const p = await page(created.key);
    expect(await p.getByRole('link', { name: 'Audit trail' }).count()).toBe(0);
    await p.getByRole('link', { name: model, exact: true }).click();
    await p.getByTestId('versions').waitFor();
    expect(await p.getByTestId('versions').getByRole('button', { name: 'Promote' }).first().isDisabled()).toBe(true);
    await screenshot(p, '10-viewer');
  });

  it('shows platform admins the tenants and the workers with their slices', async () => {
    const p = await page(dev.platformKey);
    await p.getByRole('link', { name: 'Workers' }).click();
    await p.getByTestId('worker').first().waitFor();
    expect(await p.getByTestId('worker').first().textContent()).toContain('cpu');
    // The slice holding the demo replica names its tenant.
    expect(await p.getByTestId('worker').first().textContent()).toContain(dev.tenant);
    // Every slice shows its health (the dev worker's CPU slices are all healthy).
    const health = await p.getByTestId('slice-health').allTextContents();
    expect(health.length).toBeGreaterThan(0);
    expect(health.every((h) => h === 'healthy')).toBe(true);
    await screenshot(p, '11-workers');
    await p.getByRole('link', { name: 'Tenants' }).click();
    await p.getByTestId('tenants').waitFor();
    expect(await p.getByTestId('tenants').textContent()).toContain(dev.tenant);
    await screenshot(p, '12-tenants');
  });

  it('works in a narrow window, the menu opening from a button', async () => {
    const p = await page(dev.adminKey, 390, 844);
    expect(await p.getByRole('link', { name: 'Deployments' }).isVisible()).toBe(false);
    await p.getByRole('button', { name: 'Menu' }).click();
    await p.getByRole('link', { name: 'Deployments' }).click();
    await p.getByRole('heading', { name: 'Deployments' }).waitFor();
    const overflow = await p.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    expect(overflow).toBeLessThanOrEqual(0);
    await screenshot(p, '13-narrow');
  });

  it('refuses a wrong key with a message', async () => {
    const opened = await openPage(browser);
    context = opened.context;
    const p = opened.page;
    await p.goto(dev.url);
    await p.getByLabel('API key').fill('tsk_not_a_key');
    await p.getByRole('button', { name: 'Sign in' }).click();
    await p.getByRole('alert').waitFor();
    expect(await p.getByRole('alert').textContent()).toContain('401');
    await screenshot(p, '14-signin-refused');
    // The refused token exchange is the one expected console error (a 401 resource load).
    errors = opened.errors.filter((e) => !e.includes('401'));
  });
});
