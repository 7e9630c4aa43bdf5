// Models: every model of the tenant, searchable and sortable.

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { formatAgo, formatTime } from '../format';
import { navigate, query, setQuery, tenantPath } from '../router';
import type { Session } from '../session';
import { filterAndSortModels, type Model, type ModelSortKey, type SortDir } from '../shape';
import { Empty, ErrorBox, Link, Loaded, PageHeader, useLoad } from '../ui';

/** Every model of a tenant (following pages; at most 2,000). */
async function allModels(tenant: string): Promise<Model[]> {
  const models: Model[] = [];
  let cursor: string | undefined;
  for (let page = 0; page < 10; page++) {
    const res = await ok(api.GET('/v1/tenants/{tenant}/models', { params: { path: { tenant }, query: { limit: 200, cursor } } }));
    models.push(...res.models);
    if (!res.next_cursor) break;
    cursor = res.next_cursor;
  }
  return models;
}

export function ModelsPage(props: { session: Session; tenant: string }) {
  const [load, reload] = useLoad(() => allModels(props.tenant), [props.tenant]);
  const q = query();
  const [search, setSearch] = useState(q.get('q') ?? '');
  const [sort, setSort] = useState<{ key: ModelSortKey; dir: SortDir }>({
    key: (q.get('sort') as ModelSortKey) || 'name',
    dir: q.get('dir') === 'desc' ? 'desc' : 'asc',
  });
  const onSearch = (v: string) => {
    setSearch(v);
    setQuery({ q: v });
  };
  const sortBy = (key: ModelSortKey) => {
    const dir: SortDir = sort.key === key && sort.dir === 'asc' ? 'desc' : 'asc';
    setSort({ key, dir });
    setQuery({ sort: key, dir });
  };
  const header = (key: ModelSortKey, label: string) => (
    <th aria-sort={sort.key === key ? (sort.dir === 'asc' ? 'ascending' : 'descending') : 'none'}>
      <button type="button" class="sort" onClick={() => sortBy(key)}>
        {label} {sort.key === key ? (sort.dir === 'asc' ? '▲' : '▼') : ''}
      </button>
    </th>
  );
  return (
    <section>
      <PageHeader title="Models">
        <label class="search">
          <span class="visually-hidden">Search models</span>
          <input type="search" placeholder="Search by name or description" value={search} onInput={(e) => onSearch((e.target as HTMLInputElement).value)} />
        </label>
        <button type="button" onClick={reload}>
          Refresh
        </button>
      </PageHeader>
      {props.session.abilities.deploy && <NewModel tenant={props.tenant} />}
      <Loaded load={load} retry={reload} what="models">
        {(models) => {
          if (models.length === 0) return <Empty>No models yet. Push one with <code>tessera models push model.onnx --model NAME</code>.</Empty>;
          const shown = filterAndSortModels(models, search, sort.key, sort.dir);
          if (shown.length === 0) return <Empty>No model matches “{search}”.</Empty>;
          return (
            <div class="table-wrap">
              <table>
                <caption class="visually-hidden">Models of {props.tenant}</caption>
                <thead>
                  <tr>
                    {header('name', 'Name')}
                    <th>Description</th>
                    {header('latest_version', 'Latest version')}
                    {header('updated_at', 'Updated')}
                  </tr>
                </thead>
                <tbody>
                  {shown.map((m) => (
                    <tr key={m.id}>
                      <td>
                        <Link href={tenantPath(props.tenant, 'models', m.name)}>{m.name}</Link>
                      </td>
                      <td>{m.description || <span class="muted">–</span>}</td>
                      <td class="num">{m.latest_version || <span class="muted">none</span>}</td>
                      <td title={formatTime(m.updated_at)}>{formatAgo(m.updated_at)}</td>
                    </tr>
                  ))}
                </tbody>
              </table>
            </div>
          );
        }}
      </Loaded>
    </section>
  );
}

/** Registers a model (deployers), then opens it to upload its first version. */
function NewModel(props: { tenant: string }) {
  const [name, setName] = useState('');
  const [description, setDescription] = useState('');
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const submit = async (e: Event) => {
    e.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const m = await ok(api.POST('/v1/tenants/{tenant}/models', { params: { path: { tenant: props.tenant } }, body: { name: name.trim(), description } }));
      navigate(tenantPath(props.tenant, 'models', m.name));
    } catch (err) {
      setError(messageOf(err));
    } finally {
      setBusy(false);
    }
  };
  return (
    <details class="form-card">
      <summary>New model</summary>
      <form onSubmit={submit} aria-label="Register a model">
        <div class="form-row">
          <label>
            Name <input name="model-name" value={name} required title="lower-case letters, digits, “.”, “_” or “-”" onInput={(e) => setName((e.target as HTMLInputElement).value)} />
          </label>
          <label>
            Description <input name="model-description" value={description} size={40} onInput={(e) => setDescription((e.target as HTMLInputElement).value)} />
          </label>
          <button type="submit" class="primary" disabled={busy}>
            {busy ? 'Creating…' : 'Create model'}
          </button>
        </div>
        {error && <ErrorBox message={error} />}
      </form>
    </details>
  );
}
