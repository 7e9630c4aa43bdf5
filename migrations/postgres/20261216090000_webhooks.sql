-- Webhooks: a tenant's HTTPS endpoints for events, and the outbox of deliveries to them.
-- `events` is the comma-separated list of event types the hook subscribes to. `secret` signs
-- deliveries (HMAC-SHA256); it is stored as the token signing keys are, since signing needs it
-- in clear, and it is shown only when created or rotated.
CREATE TABLE webhooks (
    id          UUID PRIMARY KEY,
    tenant_id   UUID NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    url         TEXT NOT NULL,
    description TEXT NOT NULL,
    events      TEXT NOT NULL,
    secret      TEXT NOT NULL,
    enabled     BOOLEAN NOT NULL,
    created_at  TIMESTAMPTZ NOT NULL,
    updated_at  TIMESTAMPTZ NOT NULL
);
CREATE INDEX webhooks_tenant ON webhooks (tenant_id, created_at);

-- One row per (event, hook) attempt series, written in the transaction of the change that
-- caused the event, so an event survives a control-plane kill. `seq` orders a hook's list;
-- `status` is pending, delivered or failed; the dispatcher picks pending rows whose
-- `next_attempt_at` has come. `replay_of` names the delivery a replay copies.
CREATE TABLE webhook_deliveries (
    seq              BIGSERIAL PRIMARY KEY,
    id               UUID NOT NULL UNIQUE,
    tenant_id        UUID NOT NULL,
    webhook_id       UUID NOT NULL REFERENCES webhooks (id) ON DELETE CASCADE,
    event_id         UUID NOT NULL,
    event_type       TEXT NOT NULL,
    payload          TEXT NOT NULL,
    status           TEXT NOT NULL,
    attempts         BIGINT NOT NULL DEFAULT 0,
    next_attempt_at  TIMESTAMPTZ,
    last_attempt_at  TIMESTAMPTZ,
    last_http_status BIGINT,
    last_error       TEXT,
    replay_of        UUID,
    created_at       TIMESTAMPTZ NOT NULL,
    delivered_at     TIMESTAMPTZ
);
CREATE INDEX webhook_deliveries_due ON webhook_deliveries (status, next_attempt_at);
CREATE INDEX webhook_deliveries_hook ON webhook_deliveries (webhook_id, seq);

-- A platform admin may let a tenant's hooks reach private, loopback and link-local addresses
-- (and use plain http); off by default against server-side request forgery.
ALTER TABLE tenants ADD COLUMN webhooks_allow_private BOOLEAN NOT NULL DEFAULT FALSE;
