-- The assignment generation a worker reports it has applied: a replica counts as serving only
-- once its worker applied the set that made it serve (no "ready" before traffic can reach it).
ALTER TABLE workers ADD COLUMN applied_generation BIGINT NOT NULL DEFAULT 0;
