// The signed-in session, one of two kinds:
// - an API key exchanged for an access token (`POST /v1/auth/token`), held in memory only (never
//   in localStorage or cookies); the key stays in memory too, to renew the token before it
//   expires; reloading the page signs out;
// - single sign-on through the tenant's OpenID provider: the server keeps the session and the
//   browser an HttpOnly cookie, so a reload stays signed in (`resumeSso` asks
//   `GET /v1/auth/session`); state-changing requests carry the session's CSRF token.

import { api, configureClient, ok } from './api/client';
import { abilitiesOf, ROLES, type Abilities, type Role } from './roles';
import { decodeClaims, type Claims } from './shape';

/** A signed-in session. */
export interface Session {
  /** The bearer token (empty for single sign-on: the cookie carries the session). */
  token: string;
  claims: Claims;
  role: Role;
  abilities: Abilities;
  /** How the user signed in. */
  kind: 'api-key' | 'sso';
  /** The CSRF token state-changing requests send (single sign-on only). */
  csrf?: string;
  /** The signed-in user's email (single sign-on only). */
  email?: string;
}

let current: Session | null = null;
let apiKey: string | null = null;
let renewTimer: ReturnType<typeof setTimeout> | undefined;
let signOutReason: string | null = null;
const listeners = new Set<() => void>();

configureClient(
  () => current?.token || null,
  () => signOut('Your session ended; sign in again.'),
  () => current?.csrf ?? null,
);

/** The session, if signed in. */
export function session(): Session | null {
  return current;
}

/** Why the last session ended, when it did not end by the user's choice. */
export function lastSignOutReason(): string | null {
  return signOutReason;
}

/** Calls `f` on every sign-in and sign-out; returns the unsubscribe function. */
export function onSessionChange(f: () => void): () => void {
  listeners.add(f);
  return () => listeners.delete(f);
}

async function exchange(key: string): Promise<Session> {
  const res = await ok(api.POST('/v1/auth/token', { headers: { Authorization: `Bearer ${key}` } }));
  const claims = decodeClaims(res.access_token);
  const role = claims.role as Role;
  if (!ROLES.includes(role)) throw new Error(`unknown role ${claims.role}`);
  return { token: res.access_token, claims, role, abilities: abilitiesOf(role), kind: 'api-key' };
}

/** The URL that starts single sign-on to `tenant` and comes back to `returnTo`. */
export function ssoLoginUrl(tenant: string, returnTo: string): string {
  return `/v1/auth/oidc/${encodeURIComponent(tenant.trim())}/login?return_to=${encodeURIComponent(returnTo)}`;
}

/** Picks up a single sign-on session the browser's cookie holds (after the provider sent the
 *  user back, or after a reload). Resolves to whether there is one. */
export async function resumeSso(): Promise<boolean> {
  // The session cookie is HttpOnly; its companion `tessera_sso=1` says there may be one, so
  // API-key users never send a request bound to fail.
  if (!document.cookie.split(';').some((c) => c.trim() === 'tessera_sso=1')) return false;
  const res = await fetch('/v1/auth/session', { credentials: 'same-origin' }).catch(() => null);
  if (!res) return false;
  if (!res.ok) {
    const body = (await res.json().catch(() => null)) as { error?: { message?: string } } | null;
    signOutReason = body?.error?.message ?? 'Your single sign-on session ended; sign in again.';
    document.cookie = 'tessera_sso=; Path=/; Max-Age=0; SameSite=Lax';
    return false;
  }
  const s = (await res.json()) as { tenant: string; email: string; role: string; csrf_token: string; expires_at: string; created_at: string };
  const role = s.role as Role;
  if (!ROLES.includes(role)) return false;
  const claims: Claims = {
    sub: '',
    tenant: '',
    tenant_name: s.tenant,
    role,
    exp: Math.floor(Date.parse(s.expires_at) / 1000),
    iat: Math.floor(Date.parse(s.created_at) / 1000),
  };
  signOutReason = null;
  current = { token: '', claims, role, abilities: abilitiesOf(role), kind: 'sso', csrf: s.csrf_token, email: s.email };
  listeners.forEach((f) => f());
  return true;
}

/** Exchanges an API key for a token and starts the session. */
export async function signIn(key: string): Promise<Session> {
  const s = await exchange(key.trim());
  if (!s.abilities.read) {
    throw new Error('This key may only run inference; the console needs a viewer key or higher.');
  }
  apiKey = key.trim();
  signOutReason = null;
  start(s);
  return s;
}

function start(s: Session): void {
  current = s;
  clearTimeout(renewTimer);
  // Renew a minute before expiry (or halfway through a very short token).
  const left = s.claims.exp * 1000 - Date.now();
  const delay = Math.max(5_000, Math.min(left - 60_000, left / 2));
  renewTimer = setTimeout(renew, delay);
  listeners.forEach((f) => f());
}

async function renew(): Promise<void> {
  if (!apiKey) return;
  try {
    start(await exchange(apiKey));
  } catch {
    signOut('Your session expired and could not be renewed; sign in again.');
  }
}

/** Ends the session and forgets the token and key; a single sign-on session is revoked on the
 *  server too (its cookie cleared). */
export function signOut(reason: string | null = null): void {
  if (!current && !apiKey) return;
  if (current?.kind === 'sso' && reason === null) {
    const headers = { 'X-CSRF-Token': current.csrf ?? '' };
    void fetch('/v1/auth/logout', { method: 'POST', credentials: 'same-origin', headers }).catch(() => undefined);
  }
  current = null;
  apiKey = null;
  signOutReason = reason;
  clearTimeout(renewTimer);
  listeners.forEach((f) => f());
}
