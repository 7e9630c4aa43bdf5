// The typed API client: openapi-fetch over the types generated from openapi/openapi.json
// (`npm run gen`), so a changed API breaks `npm run build`. Every call carries the session's
// access token; errors become [`ApiError`] with the API's code and message.

import createClient from 'openapi-fetch';
import type { paths } from './schema';

/** An API failure: HTTP status plus the `{"error": {"code", "message"}}` body when there is one. */
export class ApiError extends Error {
  constructor(
    readonly status: number,
    readonly code: string,
    message: string,
  ) {
    super(message);
    this.name = 'ApiError';
  }
}

type TokenSource = () => string | null;
type Unauthorized = () => void;

let tokenSource: TokenSource = () => null;
let csrfSource: TokenSource = () => null;
let onUnauthorized: Unauthorized = () => {};

/** Wires the client to the session: where the bearer token comes from, what a 401 does, and
 *  (single sign-on) the CSRF token state-changing requests carry. */
export function configureClient(source: TokenSource, unauthorized: Unauthorized, csrf: TokenSource = () => null): void {
  tokenSource = source;
  onUnauthorized = unauthorized;
  csrfSource = csrf;
}

/** The session's CSRF token, for state-changing calls openapi-fetch cannot make (uploads). */
export function csrfToken(): string | null {
  return csrfSource();
}

/** The session's bearer token, for the calls openapi-fetch cannot make (upload progress). */
export function bearer(): string | null {
  return tokenSource();
}

/** What a non-2xx answer means: its status and the API's `{"error": {"code", "message"}}`;
 *  a 401 also ends the session. */
export function apiError(status: number, statusText: string, body: unknown): ApiError {
  const detail = errorDetail(body);
  if (status === 401) onUnauthorized();
  return new ApiError(status, detail.code, detail.message ?? `${status} ${statusText}`);
}

/** The client every page uses (same origin as the console). */
// Arrays travel comma-separated (`group_by=model,version`), as the document declares them
// (`style: form, explode: false`); openapi-fetch would repeat the parameter otherwise.
export const api = createClient<paths>({ baseUrl: location.origin, querySerializer: { array: { style: 'form', explode: false } } });

api.use({
  onRequest({ request }) {
    const token = tokenSource();
    if (token && !request.headers.has('Authorization')) request.headers.set('Authorization', `Bearer ${token}`);
    const csrf = csrfSource();
    if (csrf && !['GET', 'HEAD', 'OPTIONS'].includes(request.method)) request.headers.set('X-CSRF-Token', csrf);
    return request;
  },
});

interface Outcome<T> {
  data?: T;
  error?: unknown;
  response: Response;
}

/** The data of a call (undefined for a 204), or an [`ApiError`] thrown; a 401 also ends the
 *  session. */
export async function ok<T>(call: Promise<Outcome<T>>): Promise<T> {
  let outcome: Outcome<T>;
  try {
    outcome = await call;
  } catch (e) {
    throw new ApiError(0, 'network', `The control plane did not answer (${e instanceof Error ? e.message : String(e)}).`);
  }
  const { data, error, response } = outcome;
  // A 204 (deletions) has no body: openapi-fetch gives no data, and there is none to return.
  if (response.ok) return data as T;
  throw apiError(response.status, response.statusText, error);
}

function errorDetail(body: unknown): { code: string; message?: string } {
  if (typeof body === 'object' && body !== null && 'error' in body) {
    const e = (body as { error: unknown }).error;
    if (typeof e === 'object' && e !== null) {
      const { code, message } = e as { code?: unknown; message?: unknown };
      return { code: typeof code === 'string' ? code : 'error', message: typeof message === 'string' ? message : undefined };
    }
  }
  return { code: 'error' };
}

/** A message for any thrown value. */
export function messageOf(e: unknown): string {
  if (e instanceof ApiError) return e.status ? `${e.message} (${e.status} ${e.code})` : e.message;
  return e instanceof Error ? e.message : String(e);
}
