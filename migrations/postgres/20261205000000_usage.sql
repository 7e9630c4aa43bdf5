-- Usage metering and billing: usage records as workers report them (and the hourly rows the
-- retention job folds old minutes into), the keys of folded records, and the price schedule.
-- Kept in step with migrations/sqlite/ (same tables, same columns).

-- One row per usage record key. `period_seconds` is 60 for records as reported and 3600 for
-- hourly rows made by the retention job; `period_start` is Unix seconds, a multiple of it.
-- Durations are integer microseconds so sums (and downsampling) stay exact. Histograms are JSON
-- arrays of bucket counts (tessera_protocol::usage bounds plus one overflow bucket).
CREATE TABLE usage_records (
    key               TEXT PRIMARY KEY,
    worker_id         TEXT NOT NULL,
    tenant_id         UUID NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    model_name        TEXT NOT NULL,
    version           BIGINT NOT NULL,
    slice_profile     TEXT NOT NULL,
    period_start      BIGINT NOT NULL,
    period_seconds    BIGINT NOT NULL,
    requests          BIGINT NOT NULL,
    failures          BIGINT NOT NULL,
    inferences        BIGINT NOT NULL,
    executions        BIGINT NOT NULL,
    compute_us        BIGINT NOT NULL,
    slice_us          BIGINT NOT NULL,
    bytes_in          BIGINT NOT NULL,
    bytes_out         BIGINT NOT NULL,
    latency_counts    JSONB NOT NULL,
    latency_sum_us    BIGINT NOT NULL,
    batch_size_counts JSONB NOT NULL,
    received_at       TIMESTAMPTZ NOT NULL
);
CREATE INDEX usage_records_tenant_period ON usage_records (tenant_id, period_start);
CREATE INDEX usage_records_period ON usage_records (period_seconds, period_start);

-- Keys of minute records folded into hourly rows: a late replay of one is still a duplicate.
CREATE TABLE usage_folded_keys (
    key          TEXT PRIMARY KEY,
    period_start BIGINT NOT NULL
);

-- The price schedule: per slice profile, prices in micro-cents (1e-6 cent) from `effective_from`
-- (Unix seconds, a whole minute) until the profile's next entry.
CREATE TABLE prices (
    slice_profile                         TEXT NOT NULL,
    effective_from                        BIGINT NOT NULL,
    per_slice_hour_micro_cents            BIGINT NOT NULL,
    per_1000_inferences_micro_cents       BIGINT NOT NULL,
    PRIMARY KEY (slice_profile, effective_from)
);
