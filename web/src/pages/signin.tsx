// Sign-in: an API key exchanged for an access token (the key is not stored anywhere).

import { useState } from 'preact/hooks';
import { messageOf } from '../api/client';
import { signIn } from '../session';
import { ErrorBox } from '../ui';

export function SignIn(props: { reason: string | null }) {
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
      <form onSubmit={submit} aria-labelledby="signin-title">
        <h1 id="signin-title">Tessera console</h1>
        <p>Sign in with an API key. It is exchanged for a short-lived access token kept only in this tab.</p>
        {props.reason && <p class="state notice">{props.reason}</p>}
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
