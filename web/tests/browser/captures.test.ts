// The Captures page in a real browser against a real `tessera dev`: a tenant admin turns capture
// on for the demo deployment from the console, inferences produce a capture file, and its
// download (an authenticated fetch saved as a file) holds those requests as JSON Lines; a viewer
// reads captures without controls to change anything, and another tenant sees none of them.
// Screenshots under web/test-results/ (`c*`).

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { readFileSync } from 'node:fs';
import { call, eventually, launchBrowser, openPage, screenshot, sendTraffic, signIn, startDev, type Dev } from './harness';

let dev: Dev;
let browser: Browser;
let context: BrowserContext | undefined;
let errors: string[] = [];
/** Console errors a test expects: the browser logs every refused request. */
let expected: RegExp | null = null;

const model = 'simple';

beforeAll(async () => {
  dev = await startDev();
  browser = await launchBrowser();
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

interface CapturedRecord {
  model: string;
  version: number;
  status: string;
  request: { inputs: { name: string; shape: number[]; data: number[] }[] };
  response: { outputs: { name: string; data: number[] }[] };
}

describe('console captures', () => {
  it('turns capture on, lists the file inferences make and downloads it as JSON Lines', async () => {
    const p = await page(dev.adminKey);
    await p.getByRole('link', { name: 'Captures' }).click();
    const settings = p.getByTestId('capture-settings');
    await settings.waitFor();
    expect(await settings.getByTestId('capture-label').textContent()).toBe('off');
    await p.getByText(`No capture files for ${model} yet`).waitFor();

    await settings.getByLabel('Capture requests').check();
    await settings.getByLabel('Sample rate (%)').fill('100');
    await settings.getByRole('button', { name: 'Save capture settings' }).click();
    await settings.getByText('Capture settings saved').waitFor();
    await expect.poll(() => settings.getByTestId('capture-label').textContent()).toContain('100% of requests');
    const stored = await call<{ capture: { enabled: boolean; sample_rate: number } }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/deployments/${model}`);
    expect(stored.capture).toMatchObject({ enabled: true, sample_rate: 1 });

    // The worker captures from its next assignment set on: send until a file shows.
    const rows = p.locator('[data-testid=captures] tbody tr');
    await eventually('a capture file in the list', 60_000, async () => {
      expect(await sendTraffic(dev, model, 4)).toBe(4);
      await p.getByRole('button', { name: 'Refresh' }).click();
      await p.waitForTimeout(500);
      return (await rows.count()) > 0 ? true : undefined;
    });
    const row = rows.first();
    expect(await row.locator('td').nth(3).textContent()).toBe(model);
    await screenshot(p, 'c01-capture-listed');

    const [download] = await Promise.all([p.waitForEvent('download'), row.getByRole('button', { name: /^Download/ }).click()]);
    const name = (await row.getAttribute('data-name')) ?? '';
    expect(download.suggestedFilename()).toBe(`${model}_${name.replace('/', '_')}`);
    const text = readFileSync(await download.path(), 'utf8');
    const lines = text.split('\n').filter((l) => l.trim() !== '');
    expect(lines.length).toBeGreaterThan(0);
    for (const line of lines) {
      const r = JSON.parse(line) as CapturedRecord;
      expect(r).toMatchObject({ model, version: 1, status: 'ok' });
      const [a, b] = r.request.inputs;
      expect(a.shape).toEqual([1, 16]);
      // The demo model adds and subtracts its inputs: OUTPUT0 = INPUT0 + INPUT1.
      const sum = r.response.outputs.find((o) => o.name === 'OUTPUT0');
      expect(sum?.data).toEqual(a.data.map((x, i) => x + b.data[i]));
    }
    // The row now says what the file held.
    await expect.poll(() => row.getByTestId('records').textContent()).toBe(String(lines.length));
    expect(await row.getByTestId('versions').textContent()).toBe('v1');
    // The same bytes as the API serves.
    const res = await fetch(`${dev.url}/v1/tenants/${dev.tenant}/deployments/${model}/captures/${name}`, { headers: { Authorization: `Bearer ${dev.adminKey}` } });
    expect(await res.text()).toBe(text);
    await screenshot(p, 'c02-capture-downloaded');
  });

  it('lets a viewer read captures without changing them, and shows another tenant none', async () => {
    const viewer = await call<{ key: string }>(dev, dev.adminKey, 'POST', `/v1/tenants/${dev.tenant}/api-keys`, { name: 'capture viewer', role: 'viewer' });
    const p = await page(viewer.key);
    await p.getByRole('link', { name: 'Captures' }).click();
    await p.locator('[data-testid=captures] tbody tr').first().waitFor();
    expect(await p.getByTestId('capture-label').textContent()).toContain('100% of requests');
    expect(await p.getByRole('button', { name: 'Save capture settings' }).count()).toBe(0);
    expect(await p.getByRole('button', { name: 'Save retention' }).count()).toBe(0);
    await p.getByText('Changing capture needs the deployer role').waitFor();
    await screenshot(p, 'c03-viewer-captures');
    await context?.close();

    await call(dev, dev.platformKey, 'POST', '/v1/tenants', { name: 'other' });
    const other = await call<{ key: string }>(dev, dev.platformKey, 'POST', '/v1/tenants/other/api-keys', { name: 'other admin', role: 'tenant-admin' });
    const q = await page(other.key);
    await q.getByRole('link', { name: 'Captures' }).click();
    await q.getByText('No deployments in tenant other').waitFor();
    // The demo tenant's captures are not found for it, in the console and through the API.
    expected = /404|Not Found/;
    await signIn(q, dev, other.key, `/t/${dev.tenant}/captures`);
    const refused = q.getByRole('alert').filter({ hasText: 'Could not load deployments' });
    await refused.waitFor();
    expect(await refused.textContent()).toMatch(/tenant not found \(404/);
    expect(await q.locator('[data-testid=captures]').count()).toBe(0);
    await expect(call(dev, other.key, 'GET', `/v1/tenants/${dev.tenant}/deployments/${model}/captures`)).rejects.toThrow(/404/);
    await screenshot(q, 'c04-other-tenant');
  });
});
