-- Request/response capture. `deployments.capture` holds a deployment's capture settings as set
-- through the API (`{"enabled", "sample_rate", "inputs", "outputs", "metadata",
-- "max_record_bytes"}`); NULL: never set (capture off). Workers get them with the assignments.
ALTER TABLE deployments ADD COLUMN capture TEXT NULL;
-- Days a tenant's capture files are kept; NULL: the control plane's default
-- (`--capture-retention-days`). The leader's sweep deletes older files.
ALTER TABLE tenants ADD COLUMN capture_retention_days INTEGER NULL;
