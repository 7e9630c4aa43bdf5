// Single sign-on in a real browser: a real `tessera dev` and a real OpenID provider (the npm
// `oidc-provider` package, tests/oidc/provider.mjs). The user names the tenant, signs in on the
// provider's own login page, uses the console (a write goes through with the session's CSRF
// token), reloads and stays signed in, and signs out; a token for another audience, a disabled
// user and an idle session are refused with their reasons on the sign-in page.

import { afterAll, afterEach, beforeAll, describe, expect, it } from 'vitest';
import type { Browser, BrowserContext, Page } from 'playwright-core';
import { call, launchBrowser, openPage, screenshot, startDev, startOidcProvider, type Dev, type OidcProvider } from './harness';

const CLIENT_ID = 'tessera-console';
const CLIENT_SECRET = 'browser-test-secret';
// Short enough to see a session expire in a test, long enough for the steps between requests.
const IDLE_SECS = 20;

let dev: Dev;
let provider: OidcProvider;
let browser: Browser;
let context: BrowserContext | undefined;
let errors: string[] = [];
// Requests the control plane refuses on purpose log a resource error in the browser.
let expected: RegExp | null = null;

beforeAll(async () => {
  dev = await startDev({ TESSERA_OIDC_ALLOW_HTTP_ISSUERS: 'true', TESSERA_SESSION_IDLE_TIMEOUT_SECS: String(IDLE_SECS) });
  provider = await startOidcProvider(`${dev.url}/v1/auth/oidc/callback`, CLIENT_ID, CLIENT_SECRET, {
    'ada@example.com': { groups: ['ml-admins'] },
    'ben@example.com': { groups: ['staff'] },
  });
  browser = await launchBrowser();
  await call(dev, dev.platformKey, 'PUT', `/v1/tenants/${dev.tenant}/oidc-issuer`, {
    issuer: provider.issuer,
    client_id: CLIENT_ID,
    client_secret: CLIENT_SECRET,
    scopes: ['openid', 'email', 'profile', 'groups'],
    role_claim: 'groups',
    role_mapping: { 'ml-admins': 'tenant-admin' },
    default_role: 'viewer',
    provision_users: true,
  });
});

afterAll(async () => {
  await browser?.close();
  await provider?.stop();
  await dev?.stop();
});

afterEach(async () => {
  await context?.close();
  context = undefined;
  const unexpected = errors.filter((e) => !(expected && expected.test(e)));
  expected = null;
  expect(unexpected, 'the console logged errors').toEqual([]);
});

async function fresh(): Promise<Page> {
  const opened = await openPage(browser);
  context = opened.context;
  errors = opened.errors;
  // The provider's development login page asks for a web font and a favicon, which are not
  // there offline; they are the provider's, not the console's, so they are answered empty.
  await context.route('https://fonts.googleapis.com/**', (r) => r.fulfill({ status: 200, contentType: 'text/css', body: '' }));
  await context.route(`${provider.issuer}/favicon.ico`, (r) => r.fulfill({ status: 204 }));
  return opened.page;
}

/** From the console's sign-in page through the provider's login form, back to the console.
 *  (When the provider still has a session of the user, it sends the browser straight back.) */
async function signInWithSso(p: Page, email: string, path = '/'): Promise<void> {
  await p.goto(`${dev.url}${path}`);
  await p.getByLabel('Tenant').fill(dev.tenant);
  await p.getByRole('button', { name: 'Continue with SSO' }).click();
  await p.waitForURL((u) => u.toString().startsWith(provider.issuer) || u.searchParams.has('sso_error'));
  if (!p.url().startsWith(provider.issuer)) return;
  await p.locator('input[name=login]').fill(email);
  await p.locator('input[name=password]').fill('any password');
  await p.getByRole('button', { name: 'Sign-in' }).click();
  await p.waitForURL((u) => u.toString().startsWith(dev.url));
}

describe('single sign-on', () => {
  it('signs in through the provider, writes with the CSRF token, survives a reload and signs out', async () => {
    const p = await fresh();
    await signInWithSso(p, 'ada@example.com', `/t/${dev.tenant}/models`);
    await p.getByTestId('who').waitFor();
    expect(await p.getByTestId('who').textContent()).toContain('ada@example.com');
    expect(await p.getByTestId('who').textContent()).toContain('tenant-admin');
    // The console cannot read the session cookie; the server holds the session.
    const cookies = await context!.cookies(dev.url);
    const session = cookies.find((c) => c.name === 'tessera_session');
    expect(session?.httpOnly && session.secure && session.sameSite === 'Lax').toBe(true);
    expect(await p.evaluate(() => document.cookie)).not.toContain('tessera_session');

    await p.getByText('New model').click();
    await p.getByLabel('Name').fill('from-sso');
    await p.getByLabel('Description').fill('registered by a single sign-on user');
    await p.getByRole('button', { name: 'Create model' }).click();
    await p.getByRole('heading', { name: 'Model from-sso' }).waitFor();
    await screenshot(p, 'sso01-signed-in');

    await p.reload();
    await p.getByTestId('who').waitFor();
    await p.getByRole('heading', { name: 'Model from-sso' }).waitFor();

    // The audit trail names the user.
    const audit = await call<{ events: { action: string; actor_user_email?: string }[] }>(dev, dev.adminKey, 'GET', '/v1/audit?action=model.create');
    expect(audit.events.some((e) => e.actor_user_email === 'ada@example.com')).toBe(true);

    await p.getByRole('button', { name: 'Sign out' }).click();
    await p.getByRole('button', { name: 'Continue with SSO' }).waitFor();
    await expect.poll(async () => (await context!.cookies(dev.url)).some((c) => c.name === 'tessera_session')).toBe(false);
    await p.reload();
    await p.getByRole('button', { name: 'Continue with SSO' }).waitFor();
  });

  it('refuses an ID token issued for another audience, with the reason', async () => {
    const p = await fresh();
    await provider.setIdTokenAudience('another-client');
    try {
      await signInWithSso(p, 'ada@example.com');
      await p.getByText(/Sign-in failed: .*wrong audience/).waitFor();
      await screenshot(p, 'sso02-wrong-audience');
    } finally {
      await provider.setIdTokenAudience('');
    }
  });

  it('signs out a user who is disabled, and refuses their next sign-in', async () => {
    const p = await fresh();
    await signInWithSso(p, 'ben@example.com');
    await p.getByTestId('who').waitFor();
    expect(await p.getByTestId('who').textContent()).toContain('viewer');
    const users = await call<{ users: { id: string; email: string }[] }>(dev, dev.adminKey, 'GET', `/v1/tenants/${dev.tenant}/users`);
    const ben = users.users.find((u) => u.email === 'ben@example.com');
    await call(dev, dev.adminKey, 'DELETE', `/v1/tenants/${dev.tenant}/users/${ben?.id}`);
    expected = /401|Unauthorized/;
    await p.reload();
    await p.getByText(/user was disabled/).waitFor();
    await signInWithSso(p, 'ben@example.com');
    await p.getByText(/Sign-in failed: .*ben@example.com is disabled/).waitFor();
    await screenshot(p, 'sso03-disabled');
  });

  it('ends a session left idle, saying so', async () => {
    const p = await fresh();
    await signInWithSso(p, 'ada@example.com');
    await p.getByTestId('who').waitFor();
    await new Promise((r) => setTimeout(r, (IDLE_SECS + 2) * 1000));
    expected = /401|Unauthorized/;
    await p.reload();
    await p.getByText(/expired after a time without use/).waitFor();
    await screenshot(p, 'sso04-expired');
  });
});
