// Sign-in: single sign-on through the tenant's OpenID provider (the server keeps the session),
// or an API key exchanged for an access token (the key is not stored anywhere).

import { useState } from 'preact/hooks';
import { messageOf } from '../api/client';
import { signIn, ssoLoginUrl } from '../session';
import { ErrorBox } from '../ui';

/** Why the last single sign-on failed, as the control plane put it in `?sso_error=`. */
export function ssoError(): string | null {
  return new URLSearchParams(location.search).get('sso_error');
}

export function SignIn(props: { reason: string | null }) {
  const [tenant, setTenant] = useState('');
  const ssoFailure = ssoError();
  const startSso = (e: Event) => {
    e.preventDefault();
    const back = location.pathname === '/' ? '/' : location.pathname;
    location.assign(ssoLoginUrl(tenant, back));
  };
  const [key, setKey] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      await signIn(key);
    } catch (err) {
      setError(messageOf(err));
      setBusy(false);
    }
  };
  return (
    <main class="signin" id="main">
      <form onSubmit={startSso} aria-labelledby="signin-title" data-testid="sso-form">
        <h1 id="signin-title">Tessera console</h1>
        {props.reason && <p class="state notice">{props.reason}</p>}
        <p>Sign in with your organisation's single sign-on: name your tenant.</p>
        <label for="sso-tenant">Tenant</label>
        <input
          id="sso-tenant"
          name="tenant"
          autoComplete="organization"
          placeholder="acme"
          value={tenant}
          onInput={(e) => setTenant((e.target as HTMLInputElement).value)}
          required
        />
        {ssoFailure && <ErrorBox message={ssoFailure.charAt(0).toUpperCase() + ssoFailure.slice(1)} />}
        <button type="submit" class="primary" disabled={tenant.trim() === ''}>
          Continue with SSO
        </button>
      </form>
      <form onSubmit={submit}>
        <p>Or sign in with an API key. It is exchanged for a short-lived access token kept only in this tab.</p>
        <label for="api-key">API key</label>
        <input
          id="api-key"
          name="api-key"
          type="password"
          autoComplete="off"
          placeholder="tsk_…"
          value={key}
          onInput={(e) => setKey((e.target as HTMLInputElement).value)}
          required
          autofocus
        />
        {error && <ErrorBox message={`Sign-in failed: ${error}`} />}
        <button type="submit" class="primary" disabled={busy || key.trim() === ''}>
          {busy ? 'Signing in…' : 'Sign in'}
        </button>
      </form>
    </main>
  );
}
