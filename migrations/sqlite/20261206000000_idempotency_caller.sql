-- Idempotency records belong to the caller (credential and role), not only the tenant: a replay
-- must never hand one credential the answer another one got (a new API key's secret to a viewer).
-- Kept in step with migrations/postgres/. SQLite cannot change a primary key in place, so the
-- table is made anew; rows stored before had no caller and could only be replayed to the wrong one.
DROP TABLE idempotency_keys;
CREATE TABLE idempotency_keys (
    tenant_id     BLOB NOT NULL,
    caller        TEXT NOT NULL,
    key           TEXT NOT NULL,
    fingerprint   TEXT NOT NULL,
    status_code   INTEGER,
    response_body BLOB,
    created_at    TEXT NOT NULL,
    PRIMARY KEY (tenant_id, caller, key)
);
CREATE INDEX idempotency_keys_created ON idempotency_keys (created_at);
