-- An API key's own limits, applied by gateways beside its tenant's quotas (the stricter wins);
-- 0 = only the tenant's.
ALTER TABLE api_keys ADD COLUMN max_requests_per_second BIGINT NOT NULL DEFAULT 0;
ALTER TABLE api_keys ADD COLUMN max_concurrent_requests BIGINT NOT NULL DEFAULT 0;
