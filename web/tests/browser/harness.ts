// Test harness: a real `tessera dev` on free ports in a temporary data directory, Debian's
// chromium through playwright-core, and typed helpers that seed data through the REST API
// and the worker's KServe v2 endpoint.

import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium, type Browser, type BrowserContext, type Page } from 'playwright-core';

const here = dirname(fileURLToPath(import.meta.url));
/** web/ */
export const WEB_DIR = resolve(here, '../..');
/** Where each test leaves its screenshot (git-ignored). */
export const RESULTS_DIR = join(WEB_DIR, 'test-results');
const READY_LINE = 'tessera dev is ready (Ctrl-C stops it)';

/** A running `tessera dev`. */
export interface Dev {
  url: string;
  workerUrl: string;
  tenant: string;
  adminKey: string;
  inferenceKey: string;
  platformKey: string;
  dataDir: string;
  stop: () => Promise<void>;
}

function binary(): string {
  const target = process.env.CARGO_TARGET_DIR ?? join(process.env.HOME ?? '/root', '.cache/tessera/target');
  return process.env.TESSERA_BIN ?? join(target, 'debug/tessera');
}

/** Starts `tessera dev` on port 0 everywhere, serving web/dist, and waits for its banner;
 *  `env` adds variables (the control plane reads its flags from `TESSERA_*`). */
export async function startDev(env: Record<string, string> = {}): Promise<Dev> {
  const dataDir = mkdtempSync(join(tmpdir(), 'tessera-web-'));
  const args = ['dev', '--data-dir', dataDir, '--listen', '127.0.0.1:0', '--http-port', '0', '--grpc-port', '0', '--metrics-port', '0', '--console-dir', join(WEB_DIR, 'dist')];
  const child = spawn(binary(), args, { env: { ...process.env, RUST_LOG: process.env.RUST_LOG ?? 'warn', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  let out = '';
  let err = '';
  child.stderr.on('data', (d: Buffer) => {
    err = (err + d.toString()).slice(-20_000);
  });
  const banner = await new Promise<string>((ok, fail) => {
    const timer = setTimeout(() => fail(new Error(`tessera dev not ready after 300 s\n${out}\n${err}`)), 300_000);
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      if (out.includes(READY_LINE)) {
        clearTimeout(timer);
        ok(out);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      fail(new Error(`tessera dev exited (${code}) before it was ready\n${out}\n${err}`));
    });
  });
  const grab = (re: RegExp, what: string) => {
    const m = banner.match(re);
    if (!m) throw new Error(`no ${what} in the banner:\n${banner}`);
    return m[1];
  };
  const secrets = JSON.parse(readFileSync(join(dataDir, 'secrets.json'), 'utf8')) as { platform_admin_key: string };
  return {
    url: grab(/REST API\s+(http:\/\/\S+)\/v1/, 'REST API URL'),
    workerUrl: `http://${grab(/KServe v2 HTTP (\S+),/, 'worker HTTP address')}`,
    tenant: grab(/^\s*tenant\s+(\S+)$/m, 'tenant'),
    adminKey: grab(/tenant-admin key\s+(tsk_\S+)/, 'tenant-admin key'),
    inferenceKey: grab(/inference key\s+(tsk_\S+)/, 'inference key'),
    platformKey: secrets.platform_admin_key,
    dataDir,
    stop: () => stopProcess(child, dataDir),
  };
}

async function stopProcess(child: ChildProcess, dataDir: string): Promise<void> {
  if (child.exitCode === null) {
    const exited = new Promise((ok) => child.once('exit', ok));
    child.kill('SIGINT');
    const timer = setTimeout(() => child.kill('SIGKILL'), 30_000);
    await exited;
    clearTimeout(timer);
  }
  rmSync(dataDir, { recursive: true, force: true });
}

/** A JSON call to the control plane; throws with the status and body unless 2xx. */
export async function call<T = unknown>(dev: Dev, key: string, method: string, path: string, body?: unknown, headers: Record<string, string> = {}): Promise<T> {
  const init: RequestInit = { method, headers: { Authorization: `Bearer ${key}`, ...headers } };
  if (body instanceof Uint8Array) init.body = new Blob([new Uint8Array(body)]);
  else if (body !== undefined) {
    init.body = JSON.stringify(body);
    (init.headers as Record<string, string>)['Content-Type'] = 'application/json';
  }
  const res = await fetch(`${dev.url}${path}`, init);
  const text = await res.text();
  if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${text}`);
  return (text ? JSON.parse(text) : undefined) as T;
}

/** Sends `n` demo inference requests (and `bad` malformed ones) to the worker; returns the
 *  number answered 200. */
export async function sendTraffic(dev: Dev, model: string, n: number, bad = 0): Promise<number> {
  const a = Array.from({ length: 16 }, (_, i) => i + 1);
  const good = { inputs: [
    { name: 'INPUT0', datatype: 'INT32', shape: [1, 16], data: a },
    { name: 'INPUT1', datatype: 'INT32', shape: [1, 16], data: a.map(() => 1) },
  ] };
  const wrong = { inputs: [{ name: 'INPUT0', datatype: 'INT32', shape: [1, 3], data: [1, 2, 3] }] };
  let ok = 0;
  const send = async (body: unknown) => {
    const res = await fetch(`${dev.workerUrl}/v2/models/${model}/infer`, {
      method: 'POST',
      headers: { Authorization: `Bearer ${dev.inferenceKey}`, 'Content-Type': 'application/json' },
      body: JSON.stringify(body),
    });
    await res.arrayBuffer();
    if (res.ok) ok += 1;
  };
  for (let i = 0; i < n; i += 8) await Promise.all(Array.from({ length: Math.min(8, n - i) }, () => send(good)));
  for (let i = 0; i < bad; i++) await send(wrong);
  return ok;
}

/** Polls `probe` every second until it returns a value other than undefined, or throws `what`
 *  after `ms`. */
export async function eventually<T>(what: string, ms: number, probe: () => Promise<T | undefined>): Promise<T> {
  const end = Date.now() + ms;
  let last: unknown;
  while (Date.now() < end) {
    try {
      const v = await probe();
      if (v !== undefined) return v;
    } catch (e) {
      last = e;
    }
    await new Promise((r) => setTimeout(r, 1000));
  }
  throw new Error(`${what} did not happen within ${ms / 1000} s${last ? ` (last error: ${String(last)})` : ''}`);
}

/** Debian's chromium, headless, on a fresh profile. */
export async function launchBrowser(): Promise<Browser> {
  return chromium.launch({
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    args: ['--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run', '--disable-background-networking', '--disable-component-update', '--disable-sync'],
  });
}

/** A page that records console errors and uncaught exceptions (tests assert there are none). */
export async function openPage(browser: Browser, width = 1280, height = 900): Promise<{ context: BrowserContext; page: Page; errors: string[] }> {
  const context = await browser.newContext({ viewport: { width, height } });
  const page = await context.newPage();
  const errors: string[] = [];
  page.on('console', (m) => {
    if (m.type() === 'error') errors.push(`console: ${m.text()}`);
  });
  page.on('pageerror', (e) => errors.push(`page error: ${e.message}`));
  return { context, page, errors };
}

/** Opens `path` and signs in through the form, with the keyboard only (the token lives in
 *  the page's memory: a reload or `goto` signs out again, so deep links sign in here). */
export async function signIn(page: Page, dev: Dev, key: string, path = '/'): Promise<void> {
  await page.goto(`${dev.url}${path}`);
  await page.getByLabel('API key').waitFor();
  await page.keyboard.type(key); // the field has focus on load
  await page.keyboard.press('Enter');
  await page.getByTestId('who').waitFor();
}

/** Saves a full-page screenshot as web/test-results/<name>.png; returns its path. */
export async function screenshot(page: Page, name: string): Promise<string> {
  mkdirSync(RESULTS_DIR, { recursive: true });
  const path = join(RESULTS_DIR, `${name}.png`);
  await page.screenshot({ path, fullPage: true });
  return path;
}

/** A real OpenID provider (tests/oidc/provider.mjs, the `oidc-provider` package) on a loopback
 *  port, whose client may redirect to `redirectUri`. */
export interface OidcProvider {
  issuer: string;
  /** Makes the token endpoint's ID tokens name audience `aud` ('' restores the right one). */
  setIdTokenAudience: (aud: string) => Promise<void>;
  stop: () => Promise<void>;
}

const PROVIDER_DIR = resolve(WEB_DIR, '../tests/oidc');

export async function startOidcProvider(redirectUri: string, clientId: string, clientSecret: string, accounts: Record<string, { groups: string[] }>): Promise<OidcProvider> {
  if (!existsSync(join(PROVIDER_DIR, 'node_modules', 'oidc-provider'))) {
    execFileSync('npm', ['ci', '--no-audit', '--no-fund'], { cwd: PROVIDER_DIR, stdio: 'inherit' });
  }
  const args = [join(PROVIDER_DIR, 'provider.mjs'), '--client-id', clientId, '--client-secret', clientSecret, '--redirect-uri', redirectUri, '--accounts', JSON.stringify(accounts)];
  const child = spawn(process.execPath, args, { stdio: ['ignore', 'pipe', 'pipe'] });
  let err = '';
  child.stderr.on('data', (d: Buffer) => {
    err = (err + d.toString()).slice(-10_000);
  });
  const issuer = await new Promise<string>((ok, fail) => {
    let out = '';
    const timer = setTimeout(() => fail(new Error(`the OpenID provider did not start\n${err}`)), 30_000);
    child.stdout.on('data', (d: Buffer) => {
      out += d.toString();
      const line = out.split('\n')[0];
      if (out.includes('\n')) {
        clearTimeout(timer);
        ok((JSON.parse(line) as { issuer: string }).issuer);
      }
    });
    child.on('exit', (code) => {
      clearTimeout(timer);
      fail(new Error(`the OpenID provider exited (${code})\n${err}`));
    });
  });
  return {
    issuer,
    setIdTokenAudience: async (aud) => {
      const res = await fetch(`${issuer}/__test/id-token-audience?aud=${encodeURIComponent(aud)}`, { method: 'POST' });
      if (!res.ok) throw new Error(`provider test control: ${res.status}`);
    },
    stop: async () => {
      if (child.exitCode !== null) return;
      const exited = new Promise((ok) => child.once('exit', ok));
      child.kill('SIGTERM');
      await exited;
    },
  };
}
