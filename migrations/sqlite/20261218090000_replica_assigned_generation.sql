-- The worker generation at which a replica's deployment last changed its assignments on that
-- worker (placed, moved, switched to serving, a sibling added or removed). A deployment is
-- ready once its replicas' workers applied that generation, not the worker's latest: a worker's
-- generation also moves for other deployments (another tenant's replica placed beside it) and
-- for changes that need no rollout (capture settings), and those must not read as progressing.
ALTER TABLE replicas ADD COLUMN assigned_generation INTEGER NOT NULL DEFAULT 0;
-- Replicas placed before this column existed wait, as before, for their worker's latest set.
UPDATE replicas SET assigned_generation = COALESCE(
    (SELECT generation FROM workers WHERE workers.id = replicas.worker_id), 0);
