-- Single sign-on for console users: each tenant's OpenID Connect issuer, the sign-ins in
-- flight (state, nonce, PKCE verifier; single use), and the console sessions they open.
-- Kept in step with migrations/postgres/ (same tables, same columns).

-- One issuer per tenant. `client_secret` is needed in clear to call the token endpoint; the
-- API never returns it. `scopes` is space-separated; `role_mapping` is a JSON object from a
-- value of `role_claim` (a group) to a role name.
CREATE TABLE oidc_issuers (
    tenant_id       BLOB PRIMARY KEY REFERENCES tenants (id) ON DELETE CASCADE,
    issuer          TEXT NOT NULL,
    client_id       TEXT NOT NULL,
    client_secret   TEXT NOT NULL,
    scopes          TEXT NOT NULL,
    email_claim     TEXT NOT NULL,
    role_claim      TEXT,
    role_mapping    TEXT NOT NULL,
    default_role    TEXT,
    provision_users BOOLEAN NOT NULL,
    created_at      TEXT NOT NULL,
    updated_at      TEXT NOT NULL
);

-- A sign-in between the redirect to the provider and its callback, keyed by the hash of its
-- `state`. Kept in the registry so any control-plane replica can finish it; `used_at` makes
-- it single use.
CREATE TABLE oidc_logins (
    state_hash    TEXT PRIMARY KEY,
    tenant_id     BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    nonce         TEXT NOT NULL,
    code_verifier TEXT NOT NULL,
    redirect_uri  TEXT NOT NULL,
    return_to     TEXT NOT NULL,
    created_at    TEXT NOT NULL,
    expires_at    TEXT NOT NULL,
    used_at       TEXT
);
CREATE INDEX oidc_logins_created ON oidc_logins (created_at);

-- Console sessions: the cookie holds a random token, stored here only as its sha256. A session
-- ends at `expires_at` (absolute), after the idle timeout since `last_seen_at`, when revoked
-- (sign-out), or when its user is disabled.
CREATE TABLE console_sessions (
    id           BLOB PRIMARY KEY,
    token_hash   TEXT NOT NULL UNIQUE,
    csrf_token   TEXT NOT NULL,
    tenant_id    BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    user_id      BLOB NOT NULL REFERENCES users (id),
    role         TEXT NOT NULL,
    created_at   TEXT NOT NULL,
    last_seen_at TEXT NOT NULL,
    expires_at   TEXT NOT NULL,
    revoked_at   TEXT
);
CREATE INDEX console_sessions_user ON console_sessions (user_id);
