-- An ensemble version's composing model versions (its steps', and nested ensembles' steps'),
-- pinned when the ensemble version is uploaded, so an ensemble version never changes under its
-- callers. A composing version cannot be deleted while an ensemble version names it (the API
-- answers 409 first; the key is the backstop).
CREATE TABLE version_composing (
    version_id      BLOB NOT NULL REFERENCES model_versions (id) ON DELETE CASCADE,
    step_version_id BLOB NOT NULL REFERENCES model_versions (id),
    tenant_id       BLOB NOT NULL REFERENCES tenants (id) ON DELETE CASCADE,
    PRIMARY KEY (version_id, step_version_id)
);
CREATE INDEX version_composing_step ON version_composing (step_version_id);

-- The composing versions' artifact bytes: an ensemble's replica is sized by what it loads.
ALTER TABLE model_versions ADD COLUMN composing_bytes INTEGER NOT NULL DEFAULT 0;
