-- A version's signature, learned from its ONNX graph and config at upload: inputs and outputs
-- (name, KServe datatype, shape), max_batch_size and platform, as JSON. NULL for versions
-- uploaded before signatures were stored (a worker still learns them when it loads one).
ALTER TABLE model_versions ADD COLUMN signature JSONB NULL;
