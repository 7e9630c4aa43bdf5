//! Checks on the Triton model configs the control plane stores with a version, from an
//! archive's `config.pbtxt`, the `X-Model-Config` header or a presigned upload's `config`.
//!
//! The protobuf types allow values no worker can use (a negative `max_batch_size`, a path as
//! `default_model_filename`); they are refused here, naming the field, rather than failing
//! (or worse, reaching outside the model directory) when a worker loads the version.

use tessera_protocol::inference::ModelConfig;
use tessera_protocol::inference::model_config::SchedulingChoice;
use tessera_protocol::inference::model_instance_group::Kind;

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
    if tessera_protocol::model_config::is_ensemble(config) {
        check_ensemble(config).map_err(bad)?;
    }
    Ok(())
}

/// What an ensemble's config must say for a worker to plan it: the ensemble platform and no
/// backend, its steps, each naming a model and a version (`-1`: the newest).
fn check_ensemble(config: &ModelConfig) -> std::result::Result<(), String> {
    let platform = tessera_protocol::model_config::ENSEMBLE_PLATFORM;
    if !config.backend.is_empty() || !matches!(config.platform.as_str(), "" | "ensemble") {
        return Err(format!(
            "an ensemble has platform \"{platform}\" and no backend, but the config names backend '{}' / platform '{}'",
            config.backend, config.platform
        ));
    }
    let steps = tessera_protocol::model_config::ensemble_steps(config);
    if steps.is_empty() {
        return Err("an ensemble needs an ensemble_scheduling section with at least one step".into());
    }
    for (i, (model, version)) in steps.into_iter().enumerate() {
        if model.is_empty() {
            return Err(format!("ensemble step {i} names no model_name"));
        }
        if version < -1 {
            return Err(format!(
                "ensemble step {i} (model '{model}') has model_version {version}; use -1 or a version"
            ));
        }
    }
    Ok(())
}

/// What a config asks of the device its instances run on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceAsk {
    /// Nothing (`KIND_AUTO`, `KIND_MODEL` or no instance groups): the profile decides.
    Any,
    /// A GPU: the named `KIND_GPU` group or `gpu_execution_accelerator`.
    Gpu(String),
    /// The CPU: a `KIND_CPU` group.
    Cpu,
}

/// What `config` asks of the device: a GPU if any group is `KIND_GPU` or it names a GPU
/// execution accelerator, else the CPU if a group is `KIND_CPU`, else nothing.
pub fn device_ask(config: &ModelConfig) -> DeviceAsk {
    let kinds = || config.instance_group.iter().map(|g| Kind::try_from(g.kind));
    if kinds().any(|k| k == Ok(Kind::Gpu)) {
        return DeviceAsk::Gpu("KIND_GPU".into());
    }
    let accelerators = config.optimization.as_ref().and_then(|o| o.execution_accelerators.as_ref());
    if let Some(a) = accelerators.and_then(|a| a.gpu_execution_accelerator.first()) {
        return DeviceAsk::Gpu(format!("gpu_execution_accelerator '{}'", a.name));
    }
    if kinds().any(|k| k == Ok(Kind::Cpu)) { DeviceAsk::Cpu } else { DeviceAsk::Any }
}

/// Refuses a deployment profile that contradicts the version's config, naming both: replicas
/// render their instance kind from the profile (`KIND_CPU` on `cpu`, `KIND_GPU` on `gpu` and
/// `mig-*`), and a GPU model must not be run on CPU (nor a CPU model on a GPU) unnoticed.
pub fn check_profile(config: &ModelConfig, profile: &str) -> Result<()> {
    let message = match (device_ask(config), profile == "cpu") {
        (DeviceAsk::Gpu(what), true) => format!(
            "model config asks for {what} but the deployment's profile is cpu; deploy with profile gpu or mig-<profile>"
        ),
        (DeviceAsk::Cpu, false) => format!(
            "model config asks for KIND_CPU but the deployment's profile is {profile}; deploy with profile cpu, or \
             upload a version whose instance_group asks for KIND_GPU (or names no kind)"
        ),
        _ => return Ok(()),
    };
    Err(Error::invalid("profile", message))
}

/// [`check_profile`] for a config stored as JSON; a config that does not parse (stored before
/// configs were checked) is left to the worker to refuse.
pub fn check_profile_json(config: Option<&serde_json::Value>, profile: &str) -> Result<()> {
    match config.and_then(|c| tessera_protocol::model_config::from_json(&c.to_string()).ok()) {
        Some(parsed) => check_profile(&parsed, profile),
        None => Ok(()),
    }
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

    fn profile_error(config: serde_json::Value, profile: &str) -> Option<String> {
        match check_profile_json(Some(&config), profile) {
            Ok(()) => None,
            Err(Error::InvalidInput { field, message }) => {
                assert_eq!(field.as_deref(), Some("profile"));
                Some(message)
            }
            Err(e) => panic!("{e}"),
        }
    }

    #[test]
    fn profiles_that_contradict_the_config_are_refused_naming_both() {
        let gpu = json!({ "instance_group": [{ "kind": "KIND_GPU", "count": 1 }] });
        assert_eq!(
            profile_error(gpu.clone(), "cpu").as_deref(),
            Some(
                "model config asks for KIND_GPU but the deployment's profile is cpu; deploy with profile gpu or \
                 mig-<profile>"
            )
        );
        assert_eq!(profile_error(gpu, "mig-1g.10gb"), None);
        let trt = json!({ "optimization": { "execution_accelerators": {
            "gpu_execution_accelerator": [{ "name": "tensorrt" }] } } });
        let message = profile_error(trt.clone(), "cpu").expect("refused");
        assert!(message.contains("gpu_execution_accelerator 'tensorrt'"), "{message}");
        assert_eq!(profile_error(trt, "gpu"), None);
        let cpu = json!({ "instanceGroup": [{ "kind": "KIND_CPU" }] });
        let message = profile_error(cpu.clone(), "gpu").expect("refused");
        assert!(message.contains("KIND_CPU but the deployment's profile is gpu"), "{message}");
        assert_eq!(profile_error(cpu, "cpu"), None);
        for any in [json!({}), json!({ "instance_group": [{ "count": 2 }] }), json!({ "max_batch_size": 4 })] {
            assert_eq!(profile_error(any.clone(), "cpu"), None, "{any}");
            assert_eq!(profile_error(any.clone(), "gpu"), None, "{any}");
        }
        assert!(check_profile_json(None, "cpu").is_ok());
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
