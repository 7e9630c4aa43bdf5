-- The slices a worker reports unhealthy (a critical Xid error or a lost GPU, seen through
-- NVML), as {"<slice id>": "<reason>"}: the scheduler places nothing on them and moves their
-- replicas. Each heartbeat carries the whole set; a restarted worker reports its slices healthy.
ALTER TABLE workers ADD COLUMN unhealthy_slices TEXT NOT NULL DEFAULT '{}';
