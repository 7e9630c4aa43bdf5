// The console's shell: sign-in, navigation by role, and the page for the current path.

import { render } from 'preact';
import { useEffect, useState } from 'preact/hooks';
import { api, ok } from './api/client';
import { navigate, onRouteChange, parseRoute, tenantPath, type Route } from './router';
import { lastSignOutReason, onSessionChange, resumeSso, session, signOut, type Session } from './session';
import { Link, useLoad } from './ui';
import { SignIn } from './pages/signin';
import { ModelsPage } from './pages/models';
import { ModelPage } from './pages/model';
import { DeploymentsPage, DeploymentPage } from './pages/deployments';
import { MetricsPage } from './pages/metrics';
import { UsagePage } from './pages/usage';
import { AuditPage } from './pages/audit';
import { QuotasPage } from './pages/quotas';
import { TenantsPage, WorkersPage } from './pages/admin';
import { PricesPage } from './pages/prices';
import { KeysPage } from './pages/keys';
import { CapturesPage } from './pages/captures';
import './style.css';

function useRoute(): Route {
  const [route, setRoute] = useState(() => parseRoute(location.pathname));
  useEffect(() => onRouteChange(() => setRoute(parseRoute(location.pathname))), []);
  return route;
}

function useSession(): Session | null {
  const [s, setS] = useState(session());
  useEffect(() => onSessionChange(() => setS(session())), []);
  return s;
}

function App() {
  const s = useSession();
  const route = useRoute();
  if (!s) return <SignIn reason={lastSignOutReason()} />;
  return <Shell session={s} route={route} />;
}

/** The tenant a page is about: the route's, else the caller's own. */
function tenantOf(route: Route, s: Session): string {
  return 'tenant' in route ? route.tenant : s.claims.tenant_name;
}

function Shell(props: { session: Session; route: Route }) {
  const { session: s, route } = props;
  const tenant = tenantOf(route, s);
  useEffect(() => {
    if (route.page === 'home') navigate(s.abilities.platform ? '/admin/tenants' : tenantPath(s.claims.tenant_name, 'models'), true);
  }, [route.page]);
  const [menuOpen, setMenuOpen] = useState(false);
  useEffect(() => setMenuOpen(false), [route]);
  return (
    <div class="shell">
      <a class="skip" href="#main">
        Skip to content
      </a>
      <header class="topbar">
        <span class="brand">Tessera</span>
        {s.abilities.platform ? <TenantPicker tenant={tenant} route={route} /> : <span class="tenant">tenant {tenant}</span>}
        <button type="button" class="menu-toggle" aria-expanded={menuOpen} aria-controls="nav" onClick={() => setMenuOpen(!menuOpen)}>
          Menu
        </button>
        <span class="who" data-testid="who">
          {s.email ? `${s.email} · ` : ''}
          {s.claims.tenant_name} · <b>{s.role}</b>
        </span>
        <button type="button" onClick={() => signOut()}>
          Sign out
        </button>
      </header>
      <nav id="nav" class={menuOpen ? 'nav open' : 'nav'} aria-label="Sections">
        <NavLinks session={s} tenant={tenant} route={route} />
      </nav>
      <main id="main" tabIndex={-1}>
        <Page session={s} route={route} />
      </main>
    </div>
  );
}

function NavLinks(props: { session: Session; tenant: string; route: Route }) {
  const { session: s, tenant, route } = props;
  const item = (href: string, label: string, pages: string[]) => (
    <li>
      <Link href={href} current={pages.includes(route.page)}>
        {label}
      </Link>
    </li>
  );
  return (
    <ul>
      {item(tenantPath(tenant, 'models'), 'Models', ['models', 'model'])}
      {item(tenantPath(tenant, 'deployments'), 'Deployments', ['deployments', 'deployment'])}
      {s.abilities.readCaptures && item(tenantPath(tenant, 'captures'), 'Captures', ['captures'])}
      {item(tenantPath(tenant, 'metrics'), 'Metrics', ['metrics'])}
      {item(tenantPath(tenant, 'usage'), 'Usage & invoices', ['usage'])}
      {s.abilities.readAudit && item(tenantPath(tenant, 'audit'), 'Audit trail', ['audit'])}
      {item(tenantPath(tenant, 'quotas'), 'Quotas', ['quotas'])}
      {s.abilities.manageKeys && item(tenantPath(tenant, 'keys'), 'API keys', ['keys'])}
      {s.abilities.platform && item('/admin/tenants', 'Tenants', ['tenants'])}
      {s.abilities.platform && item('/admin/workers', 'Workers', ['workers'])}
      {s.abilities.platform && item('/admin/prices', 'Prices', ['prices'])}
    </ul>
  );
}

/** Platform admins look at any tenant: switching keeps the section. */
function TenantPicker(props: { tenant: string; route: Route }) {
  const [load] = useLoad(() => ok(api.GET('/v1/tenants')), []);
  const names = load.state === 'ok' ? load.data.tenants.map((t) => t.name) : [props.tenant];
  if (!names.includes(props.tenant)) names.push(props.tenant);
  const change = (e: Event) => {
    const next = (e.target as HTMLSelectElement).value;
    const section = 'tenant' in props.route ? props.route.page.replace(/^model$/, 'models').replace(/^deployment$/, 'deployments') : 'models';
    navigate(tenantPath(next, section));
  };
  return (
    <label class="tenant">
      tenant{' '}
      <select value={props.tenant} onChange={change} data-testid="tenant-picker">
        {names.map((n) => (
          <option key={n} value={n}>
            {n}
          </option>
        ))}
      </select>
    </label>
  );
}

function Page(props: { session: Session; route: Route }) {
  const { session: s, route } = props;
  switch (route.page) {
    case 'home':
      return null;
    case 'models':
      return <ModelsPage session={s} tenant={route.tenant} />;
    case 'model':
      return <ModelPage session={s} tenant={route.tenant} model={route.model} />;
    case 'deployments':
      return <DeploymentsPage session={s} tenant={route.tenant} />;
    case 'deployment':
      return <DeploymentPage session={s} tenant={route.tenant} name={route.deployment} />;
    case 'metrics':
      return <MetricsPage tenant={route.tenant} />;
    case 'usage':
      return <UsagePage tenant={route.tenant} />;
    case 'audit':
      return <AuditPage session={s} tenant={route.tenant} />;
    case 'quotas':
      return <QuotasPage session={s} tenant={route.tenant} />;
    case 'keys':
      return <KeysPage session={s} tenant={route.tenant} />;
    case 'captures':
      return <CapturesPage session={s} tenant={route.tenant} />;
    case 'tenants':
      return s.abilities.platform ? <TenantsPage /> : <NotAllowed />;
    case 'workers':
      return s.abilities.platform ? <WorkersPage /> : <NotAllowed />;
    case 'prices':
      return s.abilities.platform ? <PricesPage /> : <NotAllowed />;
    case 'not-found':
      return (
        <section>
          <h1>Not found</h1>
          <p>
            Nothing lives at <code>{route.path}</code>. <Link href="/">Go to the start page</Link>.
          </p>
        </section>
      );
  }
}

function NotAllowed() {
  return (
    <section>
      <h1>Platform admins only</h1>
      <p>This page needs a platform-admin key.</p>
    </section>
  );
}

const root = document.getElementById('app');
// A single sign-on session survives reloads: ask for it before the first paint, so a signed-in
// user never sees the sign-in page flash.
if (root) void resumeSso().finally(() => render(<App />, root));
