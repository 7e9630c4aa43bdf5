-- Requests a gateway refused under the tenant's rate or concurrency limit. Gateways report them
-- as usage records of slice profile `gateway` (under the model the client named, version 0 when
-- it named none) with every other counter zero; workers report 0.
ALTER TABLE usage_records ADD COLUMN throttled BIGINT NOT NULL DEFAULT 0;
