-- Canary traffic split: a deployment may serve a second version beside its stable one.
-- `canary_version` is the canary's model version (NULL: no canary); `canary_weight` the percent
-- (1..99) of unversioned traffic sent to it and `canary_replicas` how many replicas of it run,
-- both 0 while there is no canary. The gateway's route table reads these three columns.
ALTER TABLE deployments ADD COLUMN canary_version BIGINT NULL;
ALTER TABLE deployments ADD COLUMN canary_weight BIGINT NOT NULL DEFAULT 0;
ALTER TABLE deployments ADD COLUMN canary_replicas BIGINT NOT NULL DEFAULT 0;
-- Whether a replica belongs to the canary: canary replicas are indexed and rolled apart from the
-- stable ones, and while a promotion rolls out both run the same version.
ALTER TABLE replicas ADD COLUMN canary BOOLEAN NOT NULL DEFAULT FALSE;
