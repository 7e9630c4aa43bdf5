//! Checks shared by the two model-config targets.

use prost::Message;
use tessera_data_plane::engine::device::{Device, ExecutionTarget};
use tessera_data_plane::engine::model_spec::{IoInfo, ModelIo, complete_and_check};
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;
use tessera_protocol::model_config::{from_json, model_filename, to_json_value};

/// What a parsed config must survive: its JSON form (what the config endpoint serves and the
/// control plane stores) parses back to the same config, the control plane's check never lets
/// through a model file name a worker refuses, and a worker's load check returns rather than
/// panics.
pub fn check_parsed(config: &ModelConfig) {
    let json = to_json_value(config).to_string();
    let again = from_json(&json).unwrap_or_else(|e| panic!("the JSON form does not parse back: {e}\n{json}"));
    // Equal as values (maps in any order); a float field holding NaN is never equal to itself,
    // so such a config is compared encoded instead.
    assert!(
        *config == again || config.encode_to_vec() == again.encode_to_vec(),
        "the JSON form changes the config\n{json}"
    );
    if tessera_control_plane::model_config::check("config", config).is_ok() {
        model_filename(config, "model.onnx").expect("the control plane accepts only file names a worker uses");
    }
    let _ = complete_and_check(config.clone(), "m", &io(), &ExecutionTarget { cores: 2, device: Device::Host });
}

/// A model with a batchable FP32 input and output, as a worker's load check sees the ONNX file.
fn io() -> ModelIo {
    let info = |name: &str| IoInfo { name: name.into(), datatype: Some(DataType::Fp32), shape: vec![-1, 4] };
    ModelIo { inputs: vec![info("INPUT0")], outputs: vec![info("OUTPUT0")] }
}
