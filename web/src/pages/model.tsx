// One model: its versions and its aliases, with promote and roll back (confirmed first).

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import type { components } from '../api/schema';
import { formatAgo, formatBytes, formatTime, shortSha } from '../format';
import { tenantPath } from '../router';
import type { Session } from '../session';
import { Badge, ConfirmDialog, Empty, Link, Loaded, PageHeader, useLoad } from '../ui';
import { UploadVersion } from './upload';

type Version = components['schemas']['ModelVersion'];
type Alias = components['schemas']['Alias'];
type Signature = components['schemas']['Signature'];

/** A pending alias move, waiting for confirmation. */
interface Move {
  alias: string;
  from: number | null;
  to: number;
  kind: 'promote' | 'rollback';
}

/** Key id -> who it is, for the "by" columns: only tenant admins may list keys, others see
 *  the id's start. */
export type KeyNames = Map<string, string>;

async function keyNames(tenant: string, canList: boolean): Promise<KeyNames> {
  if (!canList) return new Map();
  const path = { tenant };
  const [keys, users] = await Promise.all([
    ok(api.GET('/v1/tenants/{tenant}/api-keys', { params: { path } })),
    ok(api.GET('/v1/tenants/{tenant}/users', { params: { path } })),
  ]);
  const email = new Map(users.users.map((u) => [u.id, u.email]));
  return new Map(keys.api_keys.map((k) => [k.id, k.user_id && email.has(k.user_id) ? `${email.get(k.user_id)} (${k.name})` : k.name]));
}

/** Who a key is: its name (and user) when known, else its id's start. */
export function whoIs(names: KeyNames, id: string | null | undefined) {
  if (!id) return <span class="muted">–</span>;
  const name = names.get(id);
  return name ? <span title={id}>{name}</span> : <code title={id}>{id.slice(0, 8)}</code>;
}

async function loadModel(tenant: string, model: string, canListKeys: boolean) {
  const path = { tenant, model };
  const [m, versions, aliases, names] = await Promise.all([
    ok(api.GET('/v1/tenants/{tenant}/models/{model}', { params: { path } })),
    allVersions(tenant, model),
    ok(api.GET('/v1/tenants/{tenant}/models/{model}/aliases', { params: { path } })),
    // Names are a nicety: the page still shows when the keys cannot be read.
    keyNames(tenant, canListKeys).catch(() => new Map<string, string>()),
  ]);
  return { model: m, versions, aliases: aliases.aliases, names };
}

async function allVersions(tenant: string, model: string): Promise<Version[]> {
  const out: Version[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < 10; page++) {
    const res = await ok(
      api.GET('/v1/tenants/{tenant}/models/{model}/versions', { params: { path: { tenant, model }, query: { limit: 200, cursor } } }),
    );
    out.push(...res.versions);
    if (!res.next_cursor) break;
    cursor = res.next_cursor;
  }
  return out;
}

export function ModelPage(props: { session: Session; tenant: string; model: string }) {
  const { tenant, model } = props;
  const abilities = props.session.abilities;
  const [load, reload] = useLoad(() => loadModel(tenant, model, abilities.manageKeys), [tenant, model]);
  const [move, setMove] = useState<Move | null>(null);
  const [busy, setBusy] = useState(false);
  const [moveError, setMoveError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const canMove = props.session.abilities.moveAliases;

  const confirm = async () => {
    if (!move) return;
    setBusy(true);
    setMoveError(null);
    try {
      await ok(
        api.PUT('/v1/tenants/{tenant}/models/{model}/aliases/{alias}', {
          params: { path: { tenant, model, alias: move.alias } },
          body: { version: move.to },
        }),
      );
      setNotice(`${move.alias} now points at version ${move.to}.`);
      setMove(null);
      reload();
    } catch (e) {
      setMoveError(messageOf(e));
    } finally {
      setBusy(false);
    }
  };
  const ask = (m: Move) => {
    setMoveError(null);
    setNotice(null);
    setMove(m);
  };

  return (
    <section>
      <p class="crumbs">
        <Link href={tenantPath(tenant, 'models')}>Models</Link> / {model}
      </p>
      <PageHeader title={`Model ${model}`}>
        <Link href={`${tenantPath(tenant, 'metrics')}?model=${encodeURIComponent(model)}`} class="button">
          Metrics
        </Link>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      {notice && (
        <p class="state notice" role="status">
          {notice}
        </p>
      )}
      <Loaded load={load} retry={reload} what={`model ${model}`}>
        {({ model: m, versions, aliases, names }) => (
          <>
            {m.description && <p>{m.description}</p>}
            <h2>Aliases</h2>
            <AliasTable aliases={aliases} versions={versions} names={names} canMove={canMove} onMove={ask} />
            <h2>Versions</h2>
            <VersionTable versions={versions} aliases={aliases} names={names} canMove={canMove} onPromote={ask} />
            <LatestSignature versions={versions} />
            {abilities.deploy && (
              <UploadVersion
                tenant={tenant}
                model={model}
                onUploaded={(v) => {
                  setNotice(`Version ${v.version} uploaded (${v.size_bytes} bytes, sha256 ${v.sha256.slice(0, 12)}…).`);
                  reload();
                }}
              />
            )}
          </>
        )}
      </Loaded>
      {move && (
        <ConfirmDialog
          title={move.kind === 'rollback' ? `Roll back ${move.alias}?` : `Promote version ${move.to}?`}
          confirmLabel={move.kind === 'rollback' ? 'Roll back' : 'Promote'}
          busy={busy}
          error={moveError}
          onConfirm={confirm}
          onCancel={() => setMove(null)}
        >
          <p>
            Alias <b>{move.alias}</b> will point at version <b>{move.to}</b>
            {move.from !== null ? ` instead of version ${move.from}` : ' (a new alias)'}. Deployments that follow it roll out
            the new version.
          </p>
        </ConfirmDialog>
      )}
    </section>
  );
}

function AliasTable(props: { aliases: Alias[]; versions: Version[]; names: KeyNames; canMove: boolean; onMove: (m: Move) => void }) {
  if (props.aliases.length === 0) return <Empty>No aliases. Promote a version below to create one.</Empty>;
  const numbers = props.versions.map((v) => v.version).sort((a, b) => b - a);
  const why = props.canMove ? undefined : 'Needs the deployer role';
  return (
    <div class="table-wrap">
      <table data-testid="aliases">
        <thead>
          <tr>
            <th>Alias</th>
            <th>Version</th>
            <th>Moved</th>
            <th>Moved by</th>
            <th>Actions</th>
          </tr>
        </thead>
        <tbody>
          {props.aliases.map((a) => {
            const previous = numbers.find((n) => n < a.version);
            return (
              <tr key={a.alias} data-alias={a.alias}>
                <td>
                  <b>{a.alias}</b>
                </td>
                <td class="num" data-testid={`alias-${a.alias}-version`}>
                  {a.version}
                </td>
                <td title={formatTime(a.updated_at)}>{formatAgo(a.updated_at)}</td>
                <td>{whoIs(props.names, a.updated_by)}</td>
                <td class="actions">
                  <AliasMover alias={a} numbers={numbers} disabled={!props.canMove} title={why} onMove={props.onMove} />
                  <button
                    type="button"
                    disabled={!props.canMove || previous === undefined}
                    title={why ?? (previous === undefined ? 'No older version' : undefined)}
                    onClick={() => previous !== undefined && props.onMove({ alias: a.alias, from: a.version, to: previous, kind: 'rollback' })}
                  >
                    Roll back{previous !== undefined ? ` to ${previous}` : ''}
                  </button>
                </td>
              </tr>
            );
          })}
        </tbody>
      </table>
    </div>
  );
}

function AliasMover(props: { alias: Alias; numbers: number[]; disabled: boolean; title?: string; onMove: (m: Move) => void }) {
  const others = props.numbers.filter((n) => n !== props.alias.version);
  const [chosen, setChosen] = useState<number | undefined>(others[0]);
  // After the alias moves, a choice that became its current version falls back to another.
  const target = chosen !== undefined && others.includes(chosen) ? chosen : others[0];
  const id = `move-${props.alias.alias}`;
  if (others.length === 0) return null;
  return (
    <span class="mover">
      <label for={id} class="visually-hidden">
        Version for {props.alias.alias}
      </label>
      <select id={id} disabled={props.disabled} value={target} onChange={(e) => setChosen(Number((e.target as HTMLSelectElement).value))}>
        {others.map((n) => (
          <option key={n} value={n}>
            version {n}
          </option>
        ))}
      </select>
      <button
        type="button"
        disabled={props.disabled || target === undefined}
        title={props.title}
        onClick={() => target !== undefined && props.onMove({ alias: props.alias.alias, from: props.alias.version, to: target, kind: target < props.alias.version ? 'rollback' : 'promote' })}
      >
        Move
      </button>
    </span>
  );
}

function VersionTable(props: { versions: Version[]; aliases: Alias[]; names: KeyNames; canMove: boolean; onPromote: (m: Move) => void }) {
  const [aliasName, setAliasName] = useState(props.aliases[0]?.alias ?? 'production');
  if (props.versions.length === 0) return <Empty>No versions yet. Upload one below or with <code>tessera models push</code>.</Empty>;
  const pointing = (v: number) => props.aliases.filter((a) => a.version === v).map((a) => a.alias);
  const current = props.aliases.find((a) => a.alias === aliasName);
  return (
    <>
      <div class="toolbar inline">
        <label>
          Promote to alias{' '}
          <input
            list="alias-names"
            value={aliasName}
            size={14}
            onInput={(e) => setAliasName((e.target as HTMLInputElement).value.trim())}
            disabled={!props.canMove}
          />
        </label>
        <datalist id="alias-names">
          {props.aliases.map((a) => (
            <option key={a.alias} value={a.alias} />
          ))}
        </datalist>
      </div>
      <div class="table-wrap">
        <table data-testid="versions">
          <thead>
            <tr>
              <th>Version</th>
              <th>Status</th>
              <th>sha256</th>
              <th>Size</th>
              <th>Format</th>
              <th>Config</th>
              <th>Signature</th>
              <th>Uploaded by</th>
              <th>Created</th>
              <th>Aliases</th>
              <th>Actions</th>
            </tr>
          </thead>
          <tbody>
            {props.versions.map((v) => (
              <tr key={v.version} data-version={v.version}>
                <td class="num">{v.version}</td>
                <td>
                  <Badge value={v.status} />
                </td>
                <td>
                  <code title={v.sha256}>{shortSha(v.sha256)}</code>
                </td>
                <td class="num">{formatBytes(v.size_bytes)}</td>
                <td>{v.format}</td>
                <td>
                  <ConfigCell config={v.config} />
                </td>
                <td>
                  {v.signature ? (
                    <details>
                      <summary>
                        {v.signature.inputs.length} in, {v.signature.outputs.length} out
                      </summary>
                      <SignatureList signature={v.signature} />
                    </details>
                  ) : (
                    <span class="muted">not recorded</span>
                  )}
                </td>
                <td>{whoIs(props.names, v.created_by)}</td>
                <td title={formatTime(v.created_at)}>{formatAgo(v.created_at)}</td>
                <td>{pointing(v.version).map((a) => <Badge key={a} value={a} />)}</td>
                <td>
                  <button
                    type="button"
                    disabled={!props.canMove || aliasName === '' || current?.version === v.version}
                    title={props.canMove ? undefined : 'Needs the deployer role'}
                    onClick={() =>
                      props.onPromote({
                        alias: aliasName,
                        from: current?.version ?? null,
                        to: v.version,
                        kind: current && v.version < current.version ? 'rollback' : 'promote',
                      })
                    }
                  >
                    Promote
                  </button>
                </td>
              </tr>
            ))}
          </tbody>
        </table>
      </div>
    </>
  );
}

/** The newest version's signature, shown open: what a request to the model carries. */
function LatestSignature(props: { versions: Version[] }) {
  const latest = props.versions.find((v) => v.signature);
  if (!latest?.signature) return null;
  return (
    <>
      <h2>Signature of version {latest.version}</h2>
      <SignatureTable signature={latest.signature} version={latest.version} />
    </>
  );
}

/** Inputs and outputs (name, datatype, shape; -1 is any size), max batch size and platform. */
function SignatureTable(props: { signature: Signature; version: number }) {
  const s = props.signature;
  const rows = [
    ...s.inputs.map((t) => ({ role: 'input', ...t })),
    ...s.outputs.map((t) => ({ role: 'output', ...t })),
  ];
  return (
    <div class="table-wrap">
      <table data-testid={`signature-${props.version}`}>
        <caption>
          max batch size {s.max_batch_size === 0 ? '0 (no batching)' : s.max_batch_size} · platform <code>{s.platform}</code>
        </caption>
        <thead>
          <tr>
            <th>Role</th>
            <th>Name</th>
            <th>Datatype</th>
            <th>Shape</th>
          </tr>
        </thead>
        <tbody>
          {rows.map((t) => (
            <tr key={`${t.role}-${t.name}`}>
              <td>{t.role}</td>
              <td>
                <code>{t.name}</code>
              </td>
              <td>{t.datatype}</td>
              <td>
                <code>[{t.shape.join(', ')}]</code>
              </td>
            </tr>
          ))}
        </tbody>
      </table>
    </div>
  );
}

/** A version's signature in a table cell: one line per tensor. */
function SignatureList(props: { signature: Signature }) {
  const s = props.signature;
  const line = (role: string, t: Signature['inputs'][number]) => (
    <li key={`${role}-${t.name}`}>
      {role} <code>{t.name}</code> {t.datatype} <code>[{t.shape.join(', ')}]</code>
    </li>
  );
  return (
    <ul class="signature">
      {s.inputs.map((t) => line('in', t))}
      {s.outputs.map((t) => line('out', t))}
      <li>max batch {s.max_batch_size}</li>
    </ul>
  );
}

function ConfigCell(props: { config: unknown }) {
  if (props.config === null || props.config === undefined) return <span class="muted">from the model</span>;
  return (
    <details>
      <summary>JSON</summary>
      <pre class="config">{JSON.stringify(props.config, null, 2)}</pre>
    </details>
  );
}

