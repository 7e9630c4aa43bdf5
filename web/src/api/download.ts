// Downloads of files the API serves (capture files): an authenticated fetch — the bearer token
// of an API-key session, or the cookie of a single sign-on session (a GET needs no CSRF token;
// anything else carries it) — read into a Blob and saved through a temporary object URL, so
// the token never appears in a link.

import { ApiError, apiError, bearer, csrfToken } from './client';

/** Fetches `path` (same origin) as a Blob; an error status becomes an [`ApiError`] (a 401
 *  ends the session, as for every call). */
export async function fetchBlob(path: string, method = 'GET'): Promise<Blob> {
  const headers: Record<string, string> = {};
  const token = bearer();
  if (token) headers.Authorization = `Bearer ${token}`;
  const csrf = csrfToken();
  if (csrf && !['GET', 'HEAD', 'OPTIONS'].includes(method)) headers['X-CSRF-Token'] = csrf;
  let res: Response;
  try {
    res = await fetch(path, { method, headers, credentials: 'same-origin' });
  } catch (e) {
    throw new ApiError(0, 'network', `The control plane did not answer (${e instanceof Error ? e.message : String(e)}).`);
  }
  if (!res.ok) {
    const body: unknown = await res.json().catch(() => undefined);
    throw apiError(res.status, res.statusText, body);
  }
  return res.blob();
}

/** Offers `blob` to the user as a file named `name`. */
export function saveBlob(blob: Blob, name: string): void {
  const url = URL.createObjectURL(blob);
  const a = document.createElement('a');
  a.href = url;
  a.download = name;
  a.rel = 'noopener';
  document.body.appendChild(a);
  a.click();
  a.remove();
  // The click starts the download synchronously; the URL can go once the event loop turns.
  setTimeout(() => URL.revokeObjectURL(url), 0);
}
