-- Control-plane registry: tenants, API keys, models, versions, aliases, quotas,
-- idempotency records, audit chain and JWT signing keys.
-- Kept in step with migrations/postgres/ (same tables; SQLite storage types: BLOB uuids, TEXT times).

CREATE TABLE tenants (
    id           BLOB PRIMARY KEY,
    name         TEXT NOT NULL UNIQUE,
    display_name TEXT NOT NULL,
    is_platform  BOOLEAN NOT NULL DEFAULT 0,
    created_at   TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);

CREATE TABLE api_keys (
    id           BLOB PRIMARY KEY,
    tenant_id    BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    prefix       TEXT NOT NULL UNIQUE,
    secret_hash  TEXT NOT NULL,
    name         TEXT NOT NULL,
    role         TEXT NOT NULL,
    created_by   BLOB,
    created_at   TEXT NOT NULL,
    expires_at   TEXT,
    revoked_at   TEXT,
    last_used_at TEXT
);
CREATE INDEX api_keys_tenant ON api_keys (tenant_id, created_at);

CREATE TABLE tenant_quotas (
    tenant_id               BLOB PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    max_models              INTEGER NOT NULL,
    max_versions            INTEGER NOT NULL,
    max_storage_bytes       INTEGER NOT NULL,
    max_replicas            INTEGER NOT NULL,
    max_requests_per_second INTEGER NOT NULL,
    max_monthly_spend_cents INTEGER NOT NULL,
    max_slices              TEXT NOT NULL,
    updated_at              TEXT NOT NULL
);

CREATE TABLE models (
    id          BLOB PRIMARY KEY,
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    name        TEXT NOT NULL,
    description TEXT NOT NULL,
    next_version INTEGER NOT NULL,
    created_by  BLOB,
    created_at  TEXT NOT NULL,
    updated_at  TEXT NOT NULL,
    UNIQUE (tenant_id, name)
);

CREATE TABLE model_versions (
    id           BLOB PRIMARY KEY,
    tenant_id    BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    model_id     BLOB NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    version      INTEGER NOT NULL,
    artifact_key TEXT NOT NULL,
    sha256       TEXT NOT NULL,
    size_bytes   INTEGER NOT NULL,
    format       TEXT NOT NULL,
    config       TEXT,
    status       TEXT NOT NULL,
    created_by   BLOB,
    created_at   TEXT NOT NULL,
    UNIQUE (model_id, version)
);
CREATE INDEX model_versions_tenant ON model_versions (tenant_id);

-- An alias pins its version: the foreign key refuses deleting a version an alias points at
-- (the API checks first and answers 409; the key is the backstop).
CREATE TABLE model_aliases (
    model_id   BLOB NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    tenant_id  BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    alias      TEXT NOT NULL,
    version    INTEGER NOT NULL,
    updated_by BLOB,
    updated_at TEXT NOT NULL,
    PRIMARY KEY (model_id, alias),
    FOREIGN KEY (model_id, version) REFERENCES model_versions (model_id, version)
);

-- Presigned upload sessions: created by the presign call, closed by the completion call.
CREATE TABLE uploads (
    id           BLOB PRIMARY KEY,
    tenant_id    BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    model_id     BLOB NOT NULL REFERENCES models (id) ON DELETE CASCADE,
    artifact_key TEXT NOT NULL,
    format       TEXT NOT NULL,
    created_by   BLOB,
    created_at   TEXT NOT NULL,
    expires_at   TEXT NOT NULL,
    completed_at TEXT
);

-- Idempotency-Key records: the first response to a (tenant, key) is replayed to retries.
-- status_code is NULL while the first request is still running.
CREATE TABLE idempotency_keys (
    tenant_id     BLOB NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    status_code   INTEGER,
    response_body BLOB,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);

-- Audit events form one hash chain per tenant: hash = sha256(prev_hash || canonical event).
-- No foreign key to tenants: the trail outlives what it describes.
CREATE TABLE audit_events (
    id            BLOB PRIMARY KEY,
    tenant_id     BLOB NOT NULL,
    seq           INTEGER NOT NULL,
    actor_key_id  BLOB,
    action        TEXT NOT NULL,
    resource_type TEXT NOT NULL,
    resource_id   TEXT NOT NULL,
    before_state  TEXT,
    after_state   TEXT,
    request_id    TEXT NOT NULL,
    client_addr   TEXT,
    created_at    TEXT NOT NULL,
    prev_hash     TEXT NOT NULL,
    hash          TEXT NOT NULL,
    UNIQUE (tenant_id, seq)
);

-- The head of each tenant's chain; updating it first serialises appends per tenant.
CREATE TABLE audit_heads (
    tenant_id BLOB PRIMARY KEY,
    seq       INTEGER NOT NULL,
    hash      TEXT NOT NULL
);

-- Ed25519 keys that sign access tokens. The newest unretired key signs; retired keys stay
-- published in the JWKS until every token they signed has expired.
CREATE TABLE signing_keys (
    kid         TEXT PRIMARY KEY,
    private_der BLOB NOT NULL,
    public_key  BLOB NOT NULL,
    created_at  TEXT NOT NULL,
    retired_at  TEXT
);
