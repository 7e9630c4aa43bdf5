-- Deployments, their replicas, the workers that run them and placement events.
-- Kept in step with migrations/sqlite/ (same tables, same columns).

-- Workers register over the agent session; the id is chosen by the worker and kept across
-- restarts. `generation` numbers the worker's assignment set: it only grows, and every change
-- to the replicas placed on the worker bumps it, which is how sessions notice changes.
CREATE TABLE workers (
    id                TEXT PRIMARY KEY,
    http_endpoint     TEXT NOT NULL,
    grpc_endpoint     TEXT NOT NULL,
    metrics_endpoint  TEXT NOT NULL,
    slices            JSONB NOT NULL,
    labels            JSONB NOT NULL,
    version           TEXT NOT NULL,
    state             TEXT NOT NULL,
    generation        BIGINT NOT NULL,
    registered_at     TIMESTAMPTZ NOT NULL,
    last_heartbeat_at TIMESTAMPTZ NOT NULL
);

-- `version` is the target version (pinned, or what `alias` pointed at when last resolved).
-- `spec_generation` grows with every change that needs new replicas besides the version
-- (profile, instances, batching, memory).
CREATE TABLE deployments (
    id               UUID PRIMARY KEY,
    tenant_id        UUID NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name             TEXT NOT NULL,
    model_id         UUID NOT NULL REFERENCES models (id),
    version          BIGINT NOT NULL,
    alias            TEXT,
    profile          TEXT NOT NULL,
    replicas         BIGINT NOT NULL,
    instance_count   BIGINT NOT NULL,
    max_batch_size   BIGINT,
    dynamic_batching JSONB,
    memory_bytes     BIGINT,
    spec_generation  BIGINT NOT NULL,
    created_by       UUID,
    created_at       TIMESTAMPTZ NOT NULL,
    updated_at       TIMESTAMPTZ NOT NULL,
    UNIQUE (tenant_id, name),
    UNIQUE (tenant_id, model_id)
);

-- One replica of a deployment at one version and spec generation. `worker_id`/`slice_id` are
-- NULL while pending; `serving` says whether unversioned requests reach it. `profile`, `memory_bytes`
-- and `config` (the model config the worker loads, rendered at creation) are fixed for the replica's life,
-- so a rollout's old replicas keep what they were started with.
CREATE TABLE replicas (
    id              UUID PRIMARY KEY,
    tenant_id       UUID NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    deployment_id   UUID NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    replica_index   BIGINT NOT NULL,
    version         BIGINT NOT NULL,
    spec_generation BIGINT NOT NULL,
    profile         TEXT NOT NULL,
    memory_bytes    BIGINT NOT NULL,
    config          JSONB NOT NULL,
    worker_id       TEXT,
    slice_id        TEXT,
    state           TEXT NOT NULL,
    reason          TEXT,
    serving         BOOLEAN NOT NULL,
    drain_until     TIMESTAMPTZ,
    created_at      TIMESTAMPTZ NOT NULL,
    updated_at      TIMESTAMPTZ NOT NULL
);
CREATE INDEX replicas_deployment ON replicas (deployment_id);
CREATE INDEX replicas_worker ON replicas (worker_id);

-- Placement decisions and replica state changes, shown by the events endpoint.
CREATE TABLE deployment_events (
    seq           BIGSERIAL PRIMARY KEY,
    tenant_id     UUID NOT NULL,
    deployment_id UUID NOT NULL REFERENCES deployments (id) ON DELETE CASCADE,
    at            TIMESTAMPTZ NOT NULL,
    kind          TEXT NOT NULL,
    replica_id    UUID,
    worker_id     TEXT,
    message       TEXT NOT NULL
);
CREATE INDEX deployment_events_deployment ON deployment_events (deployment_id, seq);

-- Workers fetch artifacts by key; only registered artifacts may be fetched.
CREATE INDEX model_versions_artifact ON model_versions (artifact_key);
