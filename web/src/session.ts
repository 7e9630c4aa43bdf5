// The signed-in session: an access token from `POST /v1/auth/token`, held in memory only (never
// in localStorage or cookies). The API key stays in memory too, to renew the token before it
// expires; reloading the page signs out.

import { api, configureClient, ok } from './api/client';
import { abilitiesOf, ROLES, type Abilities, type Role } from './roles';
import { decodeClaims, type Claims } from './shape';

/** A signed-in session. */
export interface Session {
  token: string;
  claims: Claims;
  role: Role;
  abilities: Abilities;
}

let current: Session | null = null;
let apiKey: string | null = null;
let renewTimer: ReturnType<typeof setTimeout> | undefined;
let signOutReason: string | null = null;
const listeners = new Set<() => void>();

configureClient(
  () => current?.token ?? null,
  () => signOut('Your session ended; sign in again.'),
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
  return { token: res.access_token, claims, role, abilities: abilitiesOf(role) };
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

/** Ends the session and forgets the token and key. */
export function signOut(reason: string | null = null): void {
  if (!current && !apiKey) return;
  current = null;
  apiKey = null;
  signOutReason = reason;
  clearTimeout(renewTimer);
  listeners.forEach((f) => f());
}
