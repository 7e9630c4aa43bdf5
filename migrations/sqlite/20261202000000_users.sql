-- Users of a tenant. API keys may belong to one (service keys and the bootstrap platform-admin
-- key belong to none); disabling a user revokes their keys in the same transaction. Users are
-- never deleted: audit events keep naming them.
-- Kept in step with migrations/postgres/ (same tables, same columns).

CREATE TABLE users (
    id          BLOB PRIMARY KEY,
    tenant_id   BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    email       TEXT NOT NULL,
    name        TEXT NOT NULL,
    role        TEXT NOT NULL,
    created_by  BLOB,
    created_at  TEXT NOT NULL,
    disabled_at TEXT,
    UNIQUE (tenant_id, email)
);
CREATE INDEX users_tenant ON users (tenant_id, created_at);

ALTER TABLE api_keys ADD COLUMN user_id BLOB REFERENCES users (id);
CREATE INDEX api_keys_user ON api_keys (user_id);

-- The user behind the acting key (absent for service keys and the system).
ALTER TABLE audit_events ADD COLUMN actor_user_id BLOB;
