// API keys: a tenant's keys (never their secrets), creating one (its secret shown once, with a
// copy button) and revoking one after a confirmation that names it. Tenant admins only.

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import type { components } from '../api/schema';
import { formatAgo, formatTime } from '../format';
import { grantableRoles, type Role } from '../roles';
import type { Session } from '../session';
import { keyLimits, keyState } from '../shape';
import { Badge, ConfirmDialog, CopyButton, Empty, ErrorBox, Loaded, PageHeader, useLoad } from '../ui';

type ApiKey = components['schemas']['ApiKey'];
type User = components['schemas']['User'];

async function loadKeys(tenant: string) {
  const path = { tenant };
  const [keys, users] = await Promise.all([
    ok(api.GET('/v1/tenants/{tenant}/api-keys', { params: { path } })),
    ok(api.GET('/v1/tenants/{tenant}/users', { params: { path } })),
  ]);
  return { keys: keys.api_keys, users: users.users };
}

export function KeysPage(props: { session: Session; tenant: string }) {
  if (!props.session.abilities.manageKeys) {
    return (
      <section>
        <PageHeader title="API keys" />
        <p>Managing API keys needs a tenant-admin key.</p>
      </section>
    );
  }
  return <Keys session={props.session} tenant={props.tenant} />;
}

function Keys(props: { session: Session; tenant: string }) {
  const { tenant } = props;
  const [load, reload] = useLoad(() => loadKeys(tenant), [tenant]);
  const [created, setCreated] = useState<{ name: string; secret: string } | null>(null);
  const [revoking, setRevoking] = useState<ApiKey | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);

  const revoke = async () => {
    if (!revoking) return;
    setBusy(true);
    setError(null);
    try {
      await ok(api.DELETE('/v1/tenants/{tenant}/api-keys/{key_id}', { params: { path: { tenant, key_id: revoking.id } } }));
      setNotice(`Key “${revoking.name}” is revoked: it stopped working at once.`);
      setRevoking(null);
      reload();
    } catch (e) {
      setError(messageOf(e));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section>
      <PageHeader title="API keys">
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      {created && <SecretOnce name={created.name} secret={created.secret} onDone={() => setCreated(null)} />}
      {notice && (
        <p class="state notice" role="status">
          {notice}
        </p>
      )}
      <Loaded load={load} retry={reload} what="API keys">
        {({ keys, users }) => (
          <>
            <CreateKeyForm
              session={props.session}
              tenant={tenant}
              users={users}
              onCreated={(name, secret) => {
                setNotice(null);
                setCreated({ name, secret });
                reload();
              }}
            />
            <KeyTable keys={keys} users={users} selfId={props.session.claims.sub} onRevoke={(k) => (setError(null), setRevoking(k))} />
          </>
        )}
      </Loaded>
      {revoking && (
        <ConfirmDialog title={`Revoke key “${revoking.name}”?`} confirmLabel="Revoke" danger busy={busy} error={error} onConfirm={revoke} onCancel={() => setRevoking(null)}>
          <p>
            Key <b>{revoking.name}</b> (<code>{revoking.prefix}…</code>, {revoking.role}) stops working at once; tokens already issued for it
            run out within minutes. This cannot be undone.
          </p>
          {revoking.id === props.session.claims.sub && (
            <p>
              <b>You are signed in with this key:</b> the console signs you out once your session's token runs out.
            </p>
          )}
        </ConfirmDialog>
      )}
    </section>
  );
}

/** The new key's secret, shown once: the API never returns it again. */
function SecretOnce(props: { name: string; secret: string; onDone: () => void }) {
  return (
    <div class="secret-once" role="alert" data-testid="new-key">
      <h2>Key “{props.name}” created</h2>
      <p>
        <b>Copy the secret now: it is not shown again.</b> Store it like a password; if it is lost, revoke the key and create another.
      </p>
      <p class="secret-row">
        <code data-testid="new-key-secret">{props.secret}</code> <CopyButton text={props.secret} label="Copy secret" />
      </p>
      <button type="button" onClick={props.onDone}>
        I have stored it
      </button>
    </div>
  );
}

function CreateKeyForm(props: { session: Session; tenant: string; users: User[]; onCreated: (name: string, secret: string) => void }) {
  const roles = grantableRoles(props.session.role, props.tenant === 'platform');
  const [name, setName] = useState('');
  const [role, setRole] = useState<Role>(roles.includes('inference') ? 'inference' : roles[0]);
  const [userId, setUserId] = useState('');
  const [expires, setExpires] = useState('');
  const [rate, setRate] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    if (name.trim() === '') return setError('Name: give the key a label, e.g. “ci pipeline”.');
    const perSecond = rate.trim() === '' ? 0 : Number(rate);
    if (!Number.isInteger(perSecond) || perSecond < 0) {
      return setError('Requests per second: a whole number, or empty for only the tenant’s limit.');
    }
    setBusy(true);
    setError(null);
    try {
      const body = {
        name: name.trim(),
        role,
        user_id: userId || undefined,
        expires_at: expires ? new Date(`${expires}T00:00:00Z`).toISOString() : undefined,
        limits: perSecond > 0 ? { requests_per_second: perSecond, concurrent_requests: 0 } : undefined,
      };
      const res = await ok(api.POST('/v1/tenants/{tenant}/api-keys', { params: { path: { tenant: props.tenant } }, body }));
      setName('');
      setRate('');
      props.onCreated(res.api_key.name, res.key);
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  const active = props.users.filter((u) => !u.disabled);
  return (
    <form class="form-card" onSubmit={submit} aria-label="Create an API key">
      <h2>Create a key</h2>
      <div class="form-row">
        <label>
          Name <input name="key-name" value={name} maxLength={100} required onInput={(e) => setName((e.target as HTMLInputElement).value)} />
        </label>
        <label>
          Role{' '}
          <select name="key-role" value={role} onChange={(e) => setRole((e.target as HTMLSelectElement).value as Role)}>
            {roles.map((r) => (
              <option key={r} value={r}>
                {r}
              </option>
            ))}
          </select>
        </label>
        <label>
          User{' '}
          <select name="key-user" value={userId} onChange={(e) => setUserId((e.target as HTMLSelectElement).value)}>
            <option value="">none (a service key)</option>
            {active.map((u) => (
              <option key={u.id} value={u.id}>
                {u.email} ({u.role})
              </option>
            ))}
          </select>
        </label>
        <label>
          Expires <input type="date" name="key-expires" value={expires} onInput={(e) => setExpires((e.target as HTMLInputElement).value)} />
        </label>
        <label title="The key's own requests-per-second limit at the gateway, beside the tenant's; empty: only the tenant's">
          Requests/s{' '}
          <input name="key-rate" inputMode="numeric" placeholder="tenant's" size={8} value={rate} onInput={(e) => setRate((e.target as HTMLInputElement).value)} />
        </label>
        <button type="submit" class="primary" disabled={busy}>
          {busy ? 'Creating…' : 'Create key'}
        </button>
      </div>
      {error && <ErrorBox message={error} />}
    </form>
  );
}

function KeyTable(props: { keys: ApiKey[]; users: User[]; selfId: string; onRevoke: (k: ApiKey) => void }) {
  if (props.keys.length === 0) return <Empty>No keys.</Empty>;
  const email = new Map(props.users.map((u) => [u.id, u.email]));
  const name = new Map(props.keys.map((k) => [k.id, k.name]));
  return (
    <div class="table-wrap">
      <table data-testid="keys">
        <thead>
          <tr>
            <th>Name</th>
            <th>Prefix</th>
            <th>Role</th>
            <th>User</th>
            <th>State</th>
            <th>Created</th>
            <th>Created by</th>
            <th>Last used</th>
            <th>Expires</th>
            <th>Limits</th>
            <th>Actions</th>
          </tr>
        </thead>
        <tbody>
          {props.keys.map((k) => {
            const state = keyState(k);
            return (
              <tr key={k.id} data-key={k.name}>
                <td>
                  <b>{k.name}</b> {k.id === props.selfId && <span class="muted">(this session)</span>}
                </td>
                <td>
                  <code>{k.prefix}…</code>
                </td>
                <td>{k.role}</td>
                <td>{k.user_id ? (email.get(k.user_id) ?? <code>{k.user_id.slice(0, 8)}</code>) : <span class="muted">service key</span>}</td>
                <td>
                  <Badge value={state} />
                </td>
                <td title={formatTime(k.created_at)}>{formatAgo(k.created_at)}</td>
                <td>{k.created_by ? (name.get(k.created_by) ?? <span class="muted">another tenant's key</span>) : <span class="muted">system</span>}</td>
                <td>{k.last_used_at ? <span title={formatTime(k.last_used_at)}>{formatAgo(k.last_used_at)}</span> : <span class="muted">never</span>}</td>
                <td>{k.expires_at ? formatTime(k.expires_at) : <span class="muted">never</span>}</td>
                <td>{keyLimits(k.limits) ?? <span class="muted">tenant's</span>}</td>
                <td>
                  {state === 'active' && (
                    <button type="button" class="danger" onClick={() => props.onRevoke(k)}>
                      Revoke
                    </button>
                  )}
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}
