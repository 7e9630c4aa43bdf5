-- Where an alias pointed before its last move, so it can be rolled back in one step
-- (`tessera aliases rollback`) by any deployer, without reading the audit trail (tenant admins
-- only). NULL: the alias has never moved. Not a foreign key: the version may since have been
-- deleted, and a rollback to it is then refused as any move to a missing version is.
ALTER TABLE model_aliases ADD COLUMN previous_version BIGINT NULL;
