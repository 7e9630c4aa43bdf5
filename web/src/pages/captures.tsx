// Captured requests: a deployment's capture files (newest batches last, as the API pages them)
// with a download per file, the deployment's capture settings (deployers change them; workers
// apply a change without a rollout) and the tenant's retention (tenant admins change it).
// Records and versions of a file are counted from its JSON Lines when it is downloaded: the
// list itself holds only names, sizes and times.

import { useEffect, useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { fetchBlob, saveBlob } from '../api/download';
import {
  captureBody,
  captureDraft,
  captureLabel,
  capturePath,
  downloadName,
  parseRetentionDays,
  splitCaptureName,
  summarizeCapture,
  versionsLabel,
  type CaptureDraft,
  type CaptureSummary,
} from '../captures';
import { formatBytes, formatCount, formatTime } from '../format';
import { query, setQuery, tenantPath } from '../router';
import type { Session } from '../session';
import type { Deployment } from '../shape';
import { Badge, Empty, ErrorBox, Link, Loaded, PageHeader, useLoad } from '../ui';

/** Files per page. */
const PAGE_SIZE = 25;

export function CapturesPage(props: { session: Session; tenant: string }) {
  const { session: s, tenant } = props;
  if (!s.abilities.readCaptures) {
    return (
      <section>
        <PageHeader title="Captures" />
        <p>Captured requests need a viewer key or higher.</p>
      </section>
    );
  }
  return <Captures session={s} tenant={tenant} />;
}

function Captures(props: { session: Session; tenant: string }) {
  const { session: s, tenant } = props;
  const [load, reload] = useLoad(
    () => ok(api.GET('/v1/tenants/{tenant}/deployments', { params: { path: { tenant } } })).then((r) => r.deployments),
    [tenant],
  );
  const [chosen, setChosen] = useState(query().get('deployment') ?? '');
  // Refresh reloads the files too, not only the deployments.
  const [tick, setTick] = useState(0);
  const refresh = () => {
    reload();
    setTick((t) => t + 1);
  };
  const choose = (name: string) => {
    setChosen(name);
    setQuery({ deployment: name });
  };
  return (
    <section>
      <PageHeader title="Captures">
        <button type="button" onClick={refresh}>
          Refresh
        </button>
      </PageHeader>
      <RetentionPanel tenant={tenant} canChange={s.abilities.setRetention} />
      <Loaded load={load} retry={reload} what="deployments">
        {(deployments) => {
          if (deployments.length === 0) {
            return <Empty>No deployments in tenant {tenant}, so nothing is captured.</Empty>;
          }
          // Without a choice, the first deployment that captures, else the first.
          const d = deployments.find((x) => x.name === chosen) ?? deployments.find((x) => x.capture?.enabled) ?? deployments[0];
          return (
            <>
              <div class="toolbar inline">
                <label>
                  Deployment{' '}
                  <select value={d.name} onChange={(e) => choose((e.target as HTMLSelectElement).value)} data-testid="capture-deployment">
                    {deployments.map((x) => (
                      <option key={x.id} value={x.name}>
                        {x.name} ({x.capture?.enabled ? 'capturing' : 'capture off'})
                      </option>
                    ))}
                  </select>
                </label>
                <Link href={tenantPath(tenant, 'deployments', d.name)}>Open deployment</Link>
              </div>
              <SettingsPanel key={d.id} tenant={tenant} deployment={d} canChange={s.abilities.deploy} onSaved={reload} />
              <FilesPanel key={d.id} tenant={tenant} deployment={d} tick={tick} />
            </>
          );
        }}
      </Loaded>
    </section>
  );
}

/** How long the tenant's capture files are kept; tenant admins set it. */
function RetentionPanel(props: { tenant: string; canChange: boolean }) {
  const { tenant } = props;
  const [load, reload] = useLoad(() => ok(api.GET('/v1/tenants/{tenant}/capture-retention', { params: { path: { tenant } } })), [tenant]);
  const [draft, setDraft] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  const save = async (e: Event) => {
    e.preventDefault();
    const days = parseRetentionDays(draft ?? '');
    if (days === undefined) return setError('Retention must be a whole number of days from 1 to 3650, or empty for the default.');
    setBusy(true);
    setError(null);
    try {
      const r = await ok(api.PUT('/v1/tenants/{tenant}/capture-retention', { params: { path: { tenant } }, body: { days } }));
      setNotice(`Capture files are now kept ${r.effective_days} days.`);
      setDraft(null);
      reload();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <Loaded load={load} retry={reload} what="capture retention">
      {(r) => (
        <form class="form-card" onSubmit={save} aria-label="Capture retention" data-testid="retention">
          <p>
            Files are kept <b>{r.effective_days} days</b>
            {r.days == null ? ` (the default)` : ` (this tenant's setting; the default is ${r.default_days})`}, then deleted.
          </p>
          {props.canChange && (
            <div class="form-row">
              <label>
                Keep for (days){' '}
                <input
                  name="retention-days"
                  inputMode="numeric"
                  size={5}
                  placeholder={String(r.default_days)}
                  value={draft ?? (r.days == null ? '' : String(r.days))}
                  onInput={(e) => setDraft((e.target as HTMLInputElement).value)}
                />
              </label>
              <button type="submit" disabled={busy || draft === null}>
                {busy ? 'Saving…' : 'Save retention'}
              </button>
            </div>
          )}
          {notice && (
            <p class="state notice" role="status">
              {notice}
            </p>
          )}
          {error && <ErrorBox message={error} />}
        </form>
      )}
    </Loaded>
  );
}

/** The deployment's capture settings; deployers change them (PATCH, no rollout). */
function SettingsPanel(props: { tenant: string; deployment: Deployment; canChange: boolean; onSaved: () => void }) {
  const { tenant, deployment: d } = props;
  const [draft, setDraft] = useState<CaptureDraft>(() => captureDraft(d.capture));
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [notice, setNotice] = useState<string | null>(null);
  // The form follows the stored settings when they change (after a save, or someone else's).
  const stored = JSON.stringify(d.capture ?? null);
  useEffect(() => setDraft(captureDraft(d.capture)), [stored]);
  const set = (change: Partial<CaptureDraft>) => setDraft({ ...draft, ...change });
  const save = async (e: Event) => {
    e.preventDefault();
    const body = captureBody(draft);
    if (!body.ok) return setError(body.error);
    setBusy(true);
    setError(null);
    try {
      const path = { tenant, deployment: d.name };
      await ok(api.PATCH('/v1/tenants/{tenant}/deployments/{deployment}', { params: { path }, body: { capture: body.value } }));
      setNotice(body.value.enabled ? 'Capture settings saved: workers apply them with their next assignments, without a rollout.' : 'Capture is off.');
      props.onSaved();
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  const check = (key: 'enabled' | 'inputs' | 'outputs' | 'metadata', label: string) => (
    <label>
      <input type="checkbox" name={`capture-${key}`} checked={draft[key]} onChange={(e) => set({ [key]: (e.target as HTMLInputElement).checked })} /> {label}
    </label>
  );
  return (
    <div class="form-card" data-testid="capture-settings">
      <h2>Capture settings of {d.name}</h2>
      <p>
        <Badge value={d.capture?.enabled ? 'capturing' : 'off'} /> <span data-testid="capture-label">{captureLabel(d.capture)}</span>
      </p>
      {props.canChange ? (
        <form onSubmit={save} aria-label="Change capture settings">
          <div class="form-row">
            {check('enabled', 'Capture requests')}
            <label>
              Sample rate (%){' '}
              <input name="sample-percent" inputMode="decimal" size={5} value={draft.samplePercent} onInput={(e) => set({ samplePercent: (e.target as HTMLInputElement).value })} />
            </label>
            {check('inputs', 'Inputs')}
            {check('outputs', 'Outputs')}
            {check('metadata', 'Parameters')}
            <label>
              Largest record (KiB){' '}
              <input name="max-record-kib" inputMode="decimal" size={5} value={draft.maxRecordKiB} onInput={(e) => set({ maxRecordKiB: (e.target as HTMLInputElement).value })} />
            </label>
            <button type="submit" class="primary" disabled={busy}>
              {busy ? 'Saving…' : 'Save capture settings'}
            </button>
          </div>
        </form>
      ) : (
        <p class="muted">Changing capture needs the deployer role.</p>
      )}
      {notice && (
        <p class="state notice" role="status">
          {notice}
        </p>
      )}
      {error && <ErrorBox message={error} />}
    </div>
  );
}

/** One page of the deployment's capture files, with the cursors of the pages before it. */
function FilesPanel(props: { tenant: string; deployment: Deployment; tick: number }) {
  const { tenant, deployment: d } = props;
  // cursors[i] opens page i; the first page has none.
  const [cursors, setCursors] = useState<(string | undefined)[]>([undefined]);
  const cursor = cursors[cursors.length - 1];
  const [load, reload] = useLoad(
    () =>
      ok(
        api.GET('/v1/tenants/{tenant}/deployments/{deployment}/captures', {
          params: { path: { tenant, deployment: d.name }, query: { limit: PAGE_SIZE, cursor } },
        }),
      ),
    [tenant, d.name, cursor],
  );
  const [summaries, setSummaries] = useState<Record<string, CaptureSummary>>({});
  const [busy, setBusy] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);
  useEffect(() => setError(null), [cursor]);
  useEffect(() => {
    if (props.tick) reload();
  }, [props.tick]);
  const download = async (name: string) => {
    setBusy(name);
    setError(null);
    try {
      const blob = await fetchBlob(capturePath(tenant, d.name, name));
      saveBlob(blob, downloadName(d.name, name));
      // Files are batches of about 1 MiB: counting their lines is cheap.
      const summary = summarizeCapture(await blob.text());
      setSummaries((s) => ({ ...s, [name]: summary }));
    } catch (e) {
      setError(`Could not download ${name}: ${messageOf(e)}`);
    } finally {
      setBusy(null);
    }
  };
  const page = cursors.length;
  return (
    <>
      <h2>Capture files</h2>
      {error && <ErrorBox message={error} />}
      <Loaded load={load} retry={reload} what="capture files">
        {({ files, next_cursor }) =>
          files.length === 0 && page === 1 ? (
            <Empty>
              No capture files for {d.name} yet.{' '}
              {d.capture?.enabled ? 'Files appear a few seconds after requests are captured.' : 'Turn capture on to record requests.'}
            </Empty>
          ) : (
            <>
              <div class="table-wrap">
                <table data-testid="captures">
                  <thead>
                    <tr>
                      <th>Written</th>
                      <th>Date</th>
                      <th>Worker</th>
                      <th>Model</th>
                      <th>Versions</th>
                      <th class="num">Records</th>
                      <th class="num">Size</th>
                      <th />
                    </tr>
                  </thead>
                  <tbody>
                    {files.map((f) => {
                      const parts = splitCaptureName(f.name);
                      const sum = summaries[f.name];
                      const counted = 'Download the file to count its records';
                      return (
                        <tr key={f.name} data-name={f.name}>
                          <td>{formatTime(f.last_modified)}</td>
                          <td>{parts?.date ?? '–'}</td>
                          <td>
                            <code title={parts?.batch ? `batch ${parts.batch}` : f.name}>{parts?.worker ?? f.name}</code>
                          </td>
                          <td>{sum ? sum.models.join(', ') || d.model : d.model}</td>
                          <td data-testid="versions" title={sum ? undefined : counted}>
                            {sum ? versionsLabel(sum.versions) : <span class="muted">–</span>}
                          </td>
                          <td class="num" data-testid="records" title={sum ? undefined : counted}>
                            {sum ? `${formatCount(sum.records)}${sum.errors ? ` (${formatCount(sum.errors)} failed)` : ''}` : <span class="muted">–</span>}
                          </td>
                          <td class="num">{formatBytes(f.size_bytes)}</td>
                          <td>
                            <button type="button" onClick={() => download(f.name)} disabled={busy !== null} aria-label={`Download ${f.name}`}>
                              {busy === f.name ? 'Downloading…' : 'Download'}
                            </button>
                          </td>
                        </tr>
                      );
                    })}
                  </tbody>
                </table>
              </div>
              <div class="toolbar inline" data-testid="capture-pages">
                <span class="muted">
                  Page {page}, oldest first{next_cursor ? '' : ' (the last)'}
                </span>
                <button type="button" disabled={page === 1} onClick={() => setCursors([undefined])}>
                  First page
                </button>
                <button type="button" disabled={page === 1} onClick={() => setCursors(cursors.slice(0, -1))}>
                  Previous page
                </button>
                <button type="button" disabled={!next_cursor} onClick={() => next_cursor && setCursors([...cursors, next_cursor])}>
                  Next page
                </button>
              </div>
            </>
          )
        }
      </Loaded>
    </>
  );
}
