// The audit trail: events newest first with filters, and whether the hash chain holds.

import { useState } from 'preact/hooks';
import { api, messageOf, ok } from '../api/client';
import { formatTime, shortSha } from '../format';
import { query, setQuery } from '../router';
import type { Session } from '../session';
import { actorLabel, changedFields, type AuditEvent } from '../shape';
import { Empty, ErrorBox, Loaded, PageHeader, useLoad } from '../ui';

interface Filters {
  action: string;
  resource_type: string;
  resource_id: string;
}

const FIELDS: { key: keyof Filters; label: string; placeholder: string }[] = [
  { key: 'action', label: 'Action', placeholder: 'alias.set' },
  { key: 'resource_type', label: 'Resource type', placeholder: 'model_alias' },
  { key: 'resource_id', label: 'Resource', placeholder: 'simple@production' },
];

export function AuditPage(props: { session: Session; tenant: string }) {
  if (!props.session.abilities.readAudit) {
    return (
      <section>
        <PageHeader title="Audit trail" />
        <p>The audit trail needs a tenant-admin key.</p>
      </section>
    );
  }
  return <AuditTrail tenant={props.tenant} />;
}

function AuditTrail(props: { tenant: string }) {
  const { tenant } = props;
  const q = query();
  const initial: Filters = { action: q.get('action') ?? '', resource_type: q.get('resource_type') ?? '', resource_id: q.get('resource_id') ?? '' };
  const [draft, setDraft] = useState<Filters>(initial);
  const [filters, setFilters] = useState<Filters>(initial);
  const [older, setOlder] = useState<{ events: AuditEvent[]; cursor: string | null; error: string | null }>({ events: [], cursor: null, error: null });

  const fetchPage = (cursor?: string) =>
    ok(
      api.GET('/v1/audit', {
        params: {
          query: {
            tenant,
            limit: 50,
            cursor,
            // Free text here; the API refuses (422) what is not one of its enum values.
            action: (filters.action || undefined) as AuditEvent['action'] | undefined,
            resource_type: (filters.resource_type || undefined) as AuditEvent['resource_type'] | undefined,
            resource_id: filters.resource_id || undefined,
          },
        },
      }),
    );
  const [page, reload] = useLoad(() => {
    setOlder({ events: [], cursor: null, error: null });
    return fetchPage();
  }, [tenant, filters]);
  const [verify, reverify] = useLoad(() => ok(api.GET('/v1/audit/verify', { params: { query: { tenant } } })), [tenant]);

  const apply = (e: Event) => {
    e.preventDefault();
    setFilters(draft);
    setQuery({ ...draft });
  };
  const more = async (cursor: string) => {
    try {
      const next = await fetchPage(cursor);
      setOlder((o) => ({ events: [...o.events, ...next.events], cursor: next.next_cursor ?? null, error: null }));
    } catch (e) {
      setOlder((o) => ({ ...o, error: messageOf(e) }));
    }
  };
  return (
    <section>
      <PageHeader title="Audit trail">
        <button
          type="button"
          onClick={() => {
            reload();
            reverify();
          }}
        >
          Refresh
        </button>
      </PageHeader>
      <Loaded load={verify} retry={reverify} what="the chain verification">
        {(v) =>
          v.ok ? (
            <p class="state good" data-testid="chain" role="status">
              Chain intact: {v.events_checked} events checked, every link holds.
            </p>
          ) : (
            <p class="state error" data-testid="chain" role="alert">
              Chain broken at event {v.first_break?.seq}: {v.first_break?.reason} ({v.events_checked} events checked before it).
            </p>
          )
        }
      </Loaded>
      <form class="filters" onSubmit={apply} aria-label="Filter events">
        {FIELDS.map((f) => (
          <label key={f.key}>
            {f.label}{' '}
            <input
              name={f.key}
              value={draft[f.key]}
              placeholder={f.placeholder}
              onInput={(e) => setDraft({ ...draft, [f.key]: (e.target as HTMLInputElement).value.trim() })}
            />
          </label>
        ))}
        <button type="submit" class="primary">
          Filter
        </button>
        <button
          type="button"
          onClick={() => {
            const none = { action: '', resource_type: '', resource_id: '' };
            setDraft(none);
            setFilters(none);
            setQuery(none);
          }}
        >
          Clear
        </button>
      </form>
      <Loaded load={page} retry={reload} what="audit events">
        {(p) => {
          const events = [...p.events, ...older.events];
          const cursor = older.events.length ? older.cursor : (p.next_cursor ?? null);
          if (events.length === 0) return <Empty>No events match.</Empty>;
          return (
            <>
              <div class="table-wrap">
                <table data-testid="audit">
                  <thead>
                    <tr>
                      <th>#</th>
                      <th>Time</th>
                      <th>Action</th>
                      <th>Resource</th>
                      <th>Actor</th>
                      <th>Change</th>
                      <th>Request</th>
                      <th>Hash</th>
                    </tr>
                  </thead>
                  <tbody>
                    {events.map((e) => (
                      <tr key={e.id} data-action={e.action}>
                        <td class="num">{e.seq}</td>
                        <td>{formatTime(e.created_at)}</td>
                        <td>
                          <code>{e.action}</code>
                        </td>
                        <td>
                          {e.resource_type} <code>{e.resource_id}</code>
                        </td>
                        <td data-testid="actor" title={e.actor_key_id ?? 'the control plane itself'}>
                          {actorLabel(e)}
                        </td>
                        <td>
                          <Change before={e.before} after={e.after} />
                        </td>
                        <td>
                          <code title={e.request_id}>{e.request_id.slice(0, 8)}</code>
                        </td>
                        <td>
                          <code title={`${e.hash} (previous ${e.prev_hash})`}>{shortSha(e.hash)}</code>
                        </td>
                      </tr>
                    ))}
                  </tbody>
                </table>
              </div>
              {older.error && <ErrorBox message={`Could not load older events: ${older.error}`} />}
              {cursor && (
                <button type="button" onClick={() => more(cursor)}>
                  Older events
                </button>
              )}
            </>
          );
        }}
      </Loaded>
    </section>
  );
}

function Change(props: { before: unknown; after: unknown }) {
  const fields = changedFields(props.before, props.after);
  if (fields.length === 0) return <span class="muted">–</span>;
  const show = (v: unknown) => (v === undefined ? '∅' : JSON.stringify(v));
  const pick = (o: unknown, k: string) => (typeof o === 'object' && o !== null ? (o as Record<string, unknown>)[k] : undefined);
  return (
    <ul class="change">
      {fields.slice(0, 4).map((k) => (
        <li key={k}>
          {k}: {show(pick(props.before, k))} → {show(pick(props.after, k))}
        </li>
      ))}
      {fields.length > 4 && <li class="muted">and {fields.length - 4} more</li>}
    </ul>
  );
}
