// Deployment writes: creating one (model, what it follows, profile, replicas), scaling one and
// deleting one after a confirmation that names it. Deployers and up; the API's refusal (a
// quota, a name taken) is shown as it comes.

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { deploymentBody, parseWhole, type DeployTarget } from '../forms';
import { navigate, tenantPath } from '../router';
import type { Deployment, Model } from '../shape';
import { ConfirmDialog, ErrorBox, useLoad } from '../ui';

async function aliasesOf(tenant: string, model: string): Promise<string[]> {
  if (!model) return [];
  const res = await ok(api.GET('/v1/tenants/{tenant}/models/{model}/aliases', { params: { path: { tenant, model } } }));
  return res.aliases.map((a) => a.alias);
}

/** The create-deployment form. */
export function CreateDeployment(props: { tenant: string; models: Model[]; deployed: string[]; onCreated: () => void }) {
  const free = props.models.filter((m) => !props.deployed.includes(m.name) && m.latest_version > 0);
  const [model, setModel] = useState(free[0]?.name ?? '');
  const [name, setName] = useState(free[0]?.name ?? '');
  const [kind, setKind] = useState<DeployTarget['kind']>('latest');
  const [alias, setAlias] = useState('');
  const [version, setVersion] = useState('');
  const [profile, setProfile] = useState('cpu');
  const [replicas, setReplicas] = useState('1');
  // The model's aliases, offered when following one (none shown if they cannot be read).
  const [aliasLoad] = useLoad(() => aliasesOf(props.tenant, model).catch(() => []), [props.tenant, model]);
  const aliases = aliasLoad.state === 'ok' ? aliasLoad.data : [];
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const pick = (m: string) => {
    // The name follows the model until someone types another.
    if (name === '' || name === model) setName(m);
    setModel(m);
    setAlias('');
  };
  const chosenAlias = alias || aliases[0] || '';
  const target: DeployTarget = kind === 'alias' ? { kind, alias: chosenAlias } : kind === 'version' ? { kind, version } : { kind };
  const submit = async (e: Event) => {
    e.preventDefault();
    const body = deploymentBody({ name, model, target, profile, replicas });
    if (!body.ok) return setError(body.error);
    setBusy(true);
    setError(null);
    try {
      const d = await ok(api.POST('/v1/tenants/{tenant}/deployments', { params: { path: { tenant: props.tenant } }, body: body.value }));
      props.onCreated();
      navigate(tenantPath(props.tenant, 'deployments', d.name));
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  if (free.length === 0) {
    return <p class="muted">Every model with a version is deployed; upload a version of another model to deploy it.</p>;
  }
  return (
    <details class="form-card" open={props.deployed.length === 0}>
      <summary>New deployment</summary>
      <form onSubmit={submit} aria-label="Create a deployment">
        <div class="form-row">
          <label>
            Model{' '}
            <select name="model" value={model} onChange={(e) => pick((e.target as HTMLSelectElement).value)}>
              {free.map((m) => (
                <option key={m.id} value={m.name}>
                  {m.name} (latest v{m.latest_version})
                </option>
              ))}
            </select>
          </label>
          <label>
            Name <input name="deployment-name" value={name} onInput={(e) => setName((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            Follows{' '}
            <select name="target" value={kind} onChange={(e) => setKind((e.target as HTMLSelectElement).value as DeployTarget['kind'])}>
              <option value="latest">the latest version (pinned now)</option>
              <option value="alias">an alias</option>
              <option value="version">one version</option>
            </select>
          </label>
          {kind === 'alias' && (
            <label>
              Alias{' '}
              <input name="alias" list="deploy-aliases" value={chosenAlias} size={12} onInput={(e) => setAlias((e.target as HTMLInputElement).value)} />
              <datalist id="deploy-aliases">
                {aliases.map((a) => (
                  <option key={a} value={a} />
                ))}
              </datalist>
            </label>
          )}
          {kind === 'version' && (
            <label>
              Version <input name="version" inputMode="numeric" size={5} value={version} onInput={(e) => setVersion((e.target as HTMLInputElement).value)} />
            </label>
          )}
          <label>
            Profile <input name="profile" value={profile} size={10} onInput={(e) => setProfile((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            Replicas <input name="replicas" inputMode="numeric" size={3} value={replicas} onInput={(e) => setReplicas((e.target as HTMLInputElement).value)} />
          </label>
          <button type="submit" class="primary" disabled={busy}>
            {busy ? 'Deploying…' : 'Deploy'}
          </button>
        </div>
        {error && <ErrorBox message={error} />}
      </form>
    </details>
  );
}

/** Scale and delete controls of one deployment. */
export function DeploymentControls(props: { tenant: string; deployment: Deployment; onChanged: () => void }) {
  const d = props.deployment;
  const [replicas, setReplicas] = useState(String(d.replicas));
  const [deleting, setDeleting] = useState(false);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const path = { tenant: props.tenant, deployment: d.name };
  const wanted = parseWhole(replicas, 0, 64);
  const scale = async (e: Event) => {
    e.preventDefault();
    if (wanted === null) return setError('Replicas: a whole number from 0 to 64.');
    setBusy(true);
    setError(null);
    setNotice(null);
    try {
      await ok(api.PATCH('/v1/tenants/{tenant}/deployments/{deployment}', { params: { path }, body: { replicas: wanted } }));
      setNotice(wanted === 0 ? 'Scaled to zero: the replicas drain.' : `Scaling to ${wanted} replica${wanted === 1 ? '' : 's'}.`);
      props.onChanged();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  const remove = async () => {
    setBusy(true);
    setError(null);
    try {
      await ok(api.DELETE('/v1/tenants/{tenant}/deployments/{deployment}', { params: { path } }));
      navigate(tenantPath(props.tenant, 'deployments'));
    } catch (err) {
      setError(messageOf(err));
      setBusy(false);
    }
  };
  return (
    <>
      <form class="toolbar inline" onSubmit={scale} aria-label="Scale the deployment" data-testid="scale">
        <label>
          Replicas <input name="replicas" inputMode="numeric" size={3} value={replicas} onInput={(e) => setReplicas((e.target as HTMLInputElement).value)} />
        </label>
        <button type="submit" disabled={busy || wanted === null || wanted === d.replicas}>
          Scale
        </button>
        <button type="button" class="danger" disabled={busy} onClick={() => (setError(null), setDeleting(true))}>
          Delete deployment
        </button>
        {notice && (
          <span class="state notice" role="status">
            {notice}
          </span>
        )}
      </form>
      {error && !deleting && <ErrorBox message={error} />}
      {deleting && (
        <ConfirmDialog title={`Delete deployment ${d.name}?`} confirmLabel="Delete" danger busy={busy} error={error} onConfirm={remove} onCancel={() => setDeleting(false)}>
          <p>
            Deployment <b>{d.name}</b> stops serving model <b>{d.model}</b>: its {d.replicas} replica{d.replicas === 1 ? '' : 's'} unload and requests to it
            fail. The model and its versions stay.
          </p>
        </ConfirmDialog>
      )}
    </>
  );
}
