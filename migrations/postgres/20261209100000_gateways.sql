-- Gateways with an open route stream, refreshed while it stays open: each gateway enforces
-- 1/N of every tenant's rate and concurrency limits, N being the gateways seen lately.
CREATE TABLE gateways (
    id           TEXT PRIMARY KEY,
    version      TEXT NOT NULL,
    last_seen_at TIMESTAMPTZ NOT NULL
);

-- Most inference requests in flight at once through the gateways; 0 = unlimited.
ALTER TABLE tenant_quotas ADD COLUMN max_concurrent_requests BIGINT NOT NULL DEFAULT 0;
