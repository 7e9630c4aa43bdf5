-- How many times the scheduler moved a replica off a worker where its runner kept dying. A
-- model that kills every runner would otherwise bounce between workers forever; after a few
-- moves it stays where it is (its worker keeps restarting the runner with backoff) and says so.
-- Back to 0 once the replica is ready.
ALTER TABLE replicas ADD COLUMN crash_moves INTEGER NOT NULL DEFAULT 0;
