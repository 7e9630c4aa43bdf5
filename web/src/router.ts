// Client-side routes: the control plane answers every non-API path with index.html, and the
// console reads the path. Tenant pages live under `/t/<tenant>/`, platform pages under `/admin/`.

/** A page and its parameters. */
export type Route =
  | { page: 'home' }
  | { page: 'models'; tenant: string }
  | { page: 'model'; tenant: string; model: string }
  | { page: 'deployments'; tenant: string }
  | { page: 'deployment'; tenant: string; deployment: string }
  | { page: 'metrics'; tenant: string }
  | { page: 'usage'; tenant: string }
  | { page: 'audit'; tenant: string }
  | { page: 'quotas'; tenant: string }
  | { page: 'keys'; tenant: string }
  | { page: 'captures'; tenant: string }
  | { page: 'tenants' }
  | { page: 'prices' }
  | { page: 'workers' }
  | { page: 'not-found'; path: string };

const TENANT_PAGES = ['models', 'deployments', 'metrics', 'usage', 'audit', 'quotas', 'keys', 'captures'] as const;

/** The route of a path (`/t/demo/models/simple` -> model page). */
export function parseRoute(path: string): Route {
  const parts = path.split('/').filter(Boolean).map(safeDecode);
  if (parts.length === 0) return { page: 'home' };
  if (parts[0] === 'admin' && parts.length === 2 && (parts[1] === 'tenants' || parts[1] === 'workers' || parts[1] === 'prices')) {
    return { page: parts[1] };
  }
  if (parts[0] === 't' && parts.length >= 3) {
    const [, tenant, section, name] = parts;
    if (parts.length === 3 && (TENANT_PAGES as readonly string[]).includes(section)) {
      return { page: section as (typeof TENANT_PAGES)[number], tenant };
    }
    if (parts.length === 4 && section === 'models') return { page: 'model', tenant, model: name };
    if (parts.length === 4 && section === 'deployments') return { page: 'deployment', tenant, deployment: name };
  }
  return { page: 'not-found', path };
}

function safeDecode(s: string): string {
  try {
    return decodeURIComponent(s);
  } catch {
    return s;
  }
}

/** The path of a tenant page: `tenantPath('demo', 'models', 'simple')` -> `/t/demo/models/simple`. */
export function tenantPath(tenant: string, ...rest: string[]): string {
  return ['', 't', tenant, ...rest].map(encodeURIComponent).join('/');
}

const listeners = new Set<() => void>();

/** Goes to `path` (with its query) without reloading. */
export function navigate(path: string, replace = false): void {
  if (replace) history.replaceState(null, '', path);
  else history.pushState(null, '', path);
  window.scrollTo(0, 0);
  listeners.forEach((f) => f());
}

/** Calls `f` whenever the location changes; returns the unsubscribe function. */
export function onRouteChange(f: () => void): () => void {
  listeners.add(f);
  const pop = () => f();
  window.addEventListener('popstate', pop);
  return () => {
    listeners.delete(f);
    window.removeEventListener('popstate', pop);
  };
}

/** Search parameters of the current location. */
export function query(): URLSearchParams {
  return new URLSearchParams(location.search);
}

/** Replaces the current location's search parameters (keeps history tidy: no new entry). */
export function setQuery(params: Record<string, string | undefined>): void {
  const q = query();
  for (const [k, v] of Object.entries(params)) {
    if (v === undefined || v === '') q.delete(k);
    else q.set(k, v);
  }
  const s = q.toString();
  history.replaceState(null, '', `${location.pathname}${s ? `?${s}` : ''}`);
}
