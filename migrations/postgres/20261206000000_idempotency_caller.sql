-- Idempotency records belong to the caller (credential and role), not only the tenant: a replay
-- must never hand one credential the answer another one got (a new API key's secret to a viewer).
-- Kept in step with migrations/sqlite/.
-- Rows stored before this had no caller; they could only be replayed to the wrong one, so they go
-- (a record lives 24 hours; a retry across the upgrade runs again).
DELETE FROM idempotency_keys;
ALTER TABLE idempotency_keys ADD COLUMN caller TEXT NOT NULL;
ALTER TABLE idempotency_keys DROP CONSTRAINT idempotency_keys_pkey;
ALTER TABLE idempotency_keys ADD PRIMARY KEY (tenant_id, caller, key);
