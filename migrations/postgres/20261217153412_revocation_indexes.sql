-- The revocation list is re-read every second by each control-plane replica: keys revoked and
-- users disabled within the last token lifetime. Partial indexes keep that read small however
-- many keys and users are active (only revoked and disabled rows are indexed).
CREATE INDEX api_keys_revoked_at ON api_keys (revoked_at) WHERE revoked_at IS NOT NULL;
CREATE INDEX users_disabled_at ON users (disabled_at) WHERE disabled_at IS NOT NULL;
