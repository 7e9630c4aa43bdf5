//! Checks on the Triton model configs the control plane stores with a version, from an
//! archive's `config.pbtxt`, the `X-Model-Config` header or a presigned upload's `config`.
//!
//! The protobuf types allow values no worker can use (a negative `max_batch_size`, a path as
//! `default_model_filename`); they are refused here, naming the field, rather than failing
//! (or worse, reaching outside the model directory) when a worker loads the version.

use tessera_protocol::inference::ModelConfig;
use tessera_protocol::inference::model_config::SchedulingChoice;

use crate::error::{Error, Result};

/// Largest batch size a config may name: the deployments API's own limit.
pub const MAX_BATCH_SIZE: i32 = i32::MAX;
/// Most model instances an instance group may ask for.
pub const MAX_INSTANCE_COUNT: i32 = 1024;

/// Parses a config given as JSON (Triton's form) and checks it, blaming `field`.
pub fn check_json(field: &str, value: &serde_json::Value) -> Result<()> {
    let parsed = tessera_protocol::model_config::from_json(&value.to_string())
        .map_err(|e| Error::invalid(field, format!("{field} is not a valid model config: {e}")))?;
    check(field, &parsed)
}

/// Checks the values of a parsed config, blaming `field` (where the config came from).
pub fn check(field: &str, config: &ModelConfig) -> Result<()> {
    let bad = |message: String| Error::invalid(field, format!("{field}: {message}"));
    // Workers join this name to the version directory: a path would reach outside it.
    tessera_protocol::model_config::model_filename(config, "model.onnx").map_err(bad)?;
    if !(0..=MAX_BATCH_SIZE).contains(&config.max_batch_size) {
        return Err(bad(format!("max_batch_size must be between 0 and {MAX_BATCH_SIZE}")));
    }
    if let Some(SchedulingChoice::DynamicBatching(db)) = &config.scheduling_choice {
        let ceiling = if config.max_batch_size > 0 { config.max_batch_size } else { MAX_BATCH_SIZE };
        if db.preferred_batch_size.iter().any(|n| !(1..=ceiling).contains(n)) {
            return Err(bad(format!(
                "dynamic_batching.preferred_batch_size entries must be between 1 and {ceiling} (max_batch_size)"
            )));
        }
    }
    if config.instance_group.iter().any(|g| !(0..=MAX_INSTANCE_COUNT).contains(&g.count)) {
        return Err(bad(format!("instance_group.count must be between 0 and {MAX_INSTANCE_COUNT}")));
    }
    let mut dims = config.input.iter().flat_map(|i| &i.dims).chain(config.output.iter().flat_map(|o| &o.dims));
    if dims.any(|d| *d < -1) {
        return Err(bad("dims must be -1 (any size) or at least 0".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn field_of(v: serde_json::Value) -> Option<String> {
        match check_json("X-Model-Config", &v) {
            Ok(()) => None,
            Err(Error::InvalidInput { field, message }) => {
                assert!(message.starts_with("X-Model-Config"), "{message}");
                field
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn sane_configs_pass() {
        for ok in [
            json!({}),
            json!({ "max_batch_size": 8 }),
            json!({ "maxBatchSize": 8, "dynamic_batching": { "preferred_batch_size": [4, 8] } }),
            json!({ "default_model_filename": "net.onnx", "instance_group": [{ "count": 2 }] }),
            json!({ "input": [{ "name": "x", "data_type": "TYPE_FP32", "dims": [-1, 3] }] }),
        ] {
            assert_eq!(field_of(ok.clone()), None, "{ok}");
        }
    }

    #[test]
    fn insane_values_are_refused() {
        for bad in [
            json!({ "default_model_filename": "../x" }),
            json!({ "default_model_filename": "a/b" }),
            json!({ "max_batch_size": -1 }),
            json!({ "max_batch_size": 4, "dynamic_batching": { "preferred_batch_size": [8] } }),
            json!({ "dynamic_batching": { "preferred_batch_size": [0] } }),
            json!({ "instance_group": [{ "count": -3 }] }),
            json!({ "output": [{ "name": "y", "dims": [-2] }] }),
            json!({ "max_batch_size": "many" }),
            json!({ "no_such_field": 1 }),
            json!({ "max_batch_size": 1_099_511_627_776_i64 }),
        ] {
            assert_eq!(field_of(bad.clone()).as_deref(), Some("X-Model-Config"), "{bad}");
        }
    }
}
