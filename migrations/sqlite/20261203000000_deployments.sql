-- Deployments, their replicas, the workers that run them and placement events.
-- Kept in step with migrations/postgres/ (same tables; SQLite storage types: BLOB uuids, TEXT times).

-- Workers register over the agent session; the id is chosen by the worker and kept across
-- restarts. `generation` numbers the worker's assignment set: it only grows, and every change
-- to the replicas placed on the worker bumps it, which is how sessions notice changes.
CREATE TABLE workers (
    id                TEXT PRIMARY KEY,
    http_endpoint     TEXT NOT NULL,
    grpc_endpoint     TEXT NOT NULL,
    metrics_endpoint  TEXT NOT NULL,
    slices            TEXT NOT NULL,
    labels            TEXT NOT NULL,
    version           TEXT NOT NULL,
    state             TEXT NOT NULL,
    generation        INTEGER NOT NULL,
    registered_at     TEXT NOT NULL,
    last_heartbeat_at TEXT NOT NULL
);

-- `version` is the target version (pinned, or what `alias` pointed at when last resolved).
-- `spec_generation` grows with every change that needs new replicas besides the version
-- (profile, instances, batching, memory).
CREATE TABLE deployments (
    id               BLOB PRIMARY KEY,
    tenant_id        BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    model_id         BLOB NOT NULL REFERENCES models (id),
    version          INTEGER NOT NULL,
    alias            TEXT,
    profile          TEXT NOT NULL,
    replicas         INTEGER NOT NULL,
    instance_count   INTEGER NOT NULL,
    max_batch_size   INTEGER,
    dynamic_batching TEXT,
    memory_bytes     INTEGER,
    spec_generation  INTEGER NOT NULL,
    created_by       BLOB,
    created_at       TEXT NOT NULL,
    updated_at       TEXT NOT NULL,
    UNIQUE (tenant_id, name),
    UNIQUE (tenant_id, model_id)
);

-- One replica of a deployment at one version and spec generation. `worker_id`/`slice_id` are
-- NULL while pending; `serving` says whether unversioned requests reach it. `profile`, `memory_bytes`
-- and `config` (the model config the worker loads, rendered at creation) are fixed for the replica's life,
-- so a rollout's old replicas keep what they were started with.
CREATE TABLE replicas (
    id              BLOB PRIMARY KEY,
    tenant_id       BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    deployment_id   BLOB NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    replica_index   INTEGER NOT NULL,
    version         INTEGER NOT NULL,
    spec_generation INTEGER NOT NULL,
    profile         TEXT NOT NULL,
    memory_bytes    INTEGER NOT NULL,
    config          TEXT NOT NULL,
    worker_id       TEXT,
    slice_id        TEXT,
    state           TEXT NOT NULL,
    reason          TEXT,
    serving         BOOLEAN NOT NULL,
    drain_until     TEXT,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);
CREATE INDEX replicas_deployment ON replicas (deployment_id);
CREATE INDEX replicas_worker ON replicas (worker_id);

-- Placement decisions and replica state changes, shown by the events endpoint.
CREATE TABLE deployment_events (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    tenant_id     BLOB NOT NULL,
    deployment_id BLOB NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    at            TEXT NOT NULL,
    kind          TEXT NOT NULL,
    replica_id    BLOB,
    worker_id     TEXT,
    message       TEXT NOT NULL
);
CREATE INDEX deployment_events_deployment ON deployment_events (deployment_id, seq);

-- Workers fetch artifacts by key; only registered artifacts may be fetched.
CREATE INDEX model_versions_artifact ON model_versions (artifact_key);
