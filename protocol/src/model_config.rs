//! Triton model configuration formats: `config.pbtxt` (protobuf text format)
//! and the JSON form served by `GET /v2/models/{model}/config`, both converted
//! to and from the generated [`ModelConfig`] through prost-reflect.

use prost_reflect::{DeserializeOptions, DynamicMessage, MessageDescriptor, SerializeOptions};

use crate::descriptor_pool;
use crate::inference::ModelConfig;

/// Full protobuf name of [`ModelConfig`].
const MODEL_CONFIG_NAME: &str = "inference.ModelConfig";

/// Why a model configuration could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigFormatError {
    /// The protobuf text (`config.pbtxt`) is malformed or names unknown fields or values.
    #[error("invalid model config text at line {line}, column {column}: {reason}")]
    Text {
        /// 1-based line of the problem (the last line for an unexpected end of input).
        line: usize,
        /// 1-based column (in characters) of the problem.
        column: usize,
        /// What is wrong.
        reason: String,
    },
    /// The JSON is malformed, has unknown fields or values of the wrong type.
    #[error("invalid model config JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The parsed message could not be converted to the generated type.
    #[error("model config could not be converted: {0}")]
    Convert(#[from] prost::DecodeError),
}

fn model_config_descriptor() -> MessageDescriptor {
    descriptor_pool()
        .get_message_by_name(MODEL_CONFIG_NAME)
        .expect("inference.ModelConfig is defined in the compiled-in model_config.proto")
}

/// Parses a Triton `config.pbtxt` (protobuf text format).
pub fn from_pbtxt(text: &str) -> Result<ModelConfig, ConfigFormatError> {
    let (normalized, inserted) = insert_list_colons(text);
    let message = DynamicMessage::parse_text_format(model_config_descriptor(), &normalized)
        .map_err(|err| text_error(text, &normalized, &inserted, &err))?;
    Ok(message.transcode_to::<ModelConfig>()?)
}

/// Parses Triton's JSON form of a model config (proto or lowerCamelCase field
/// names, enum names or numbers, 64-bit integers as numbers or strings);
/// unknown fields are rejected.
pub fn from_json(text: &str) -> Result<ModelConfig, ConfigFormatError> {
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let message = DynamicMessage::deserialize_with_options(
        model_config_descriptor(),
        &mut deserializer,
        &DeserializeOptions::new().deny_unknown_fields(true),
    )?;
    deserializer.end()?;
    Ok(message.transcode_to::<ModelConfig>()?)
}

/// Renders a config the way Triton's `GET /v2/models/{model}/config` does:
/// proto field names, every scalar, list and map field printed (defaults
/// included), enums by name, 64-bit integers as JSON numbers; message fields
/// and oneof members only when set.
pub fn to_json_value(cfg: &ModelConfig) -> serde_json::Value {
    let mut message = DynamicMessage::new(model_config_descriptor());
    message.transcode_from(cfg).expect("a ModelConfig encoded by prost always decodes against its own descriptor");
    let options = SerializeOptions::new()
        .use_proto_field_name(true)
        .skip_default_fields(false)
        .stringify_64_bit_integers(false)
        .use_enum_numbers(false);
    message
        .serialize_with_options(serde_json::value::Serializer, &options)
        .expect("serializing into serde_json::Value cannot fail: all map keys are strings")
}

/// The platform string of an ensemble config.
pub const ENSEMBLE_PLATFORM: &str = "ensemble";

/// Whether `config` describes an ensemble (Triton's `platform: "ensemble"`, or an
/// `ensemble_scheduling` section): a model with no file, whose steps run other models.
pub fn is_ensemble(config: &ModelConfig) -> bool {
    use crate::inference::model_config::SchedulingChoice;
    config.platform == ENSEMBLE_PLATFORM
        || matches!(config.scheduling_choice, Some(SchedulingChoice::EnsembleScheduling(_)))
}

/// [`is_ensemble`] for a config in its JSON form (as the control plane stores it and sends it to
/// workers; field names in either protobuf JSON spelling).
pub fn is_ensemble_json(config: &serde_json::Value) -> bool {
    config.get("platform").and_then(serde_json::Value::as_str) == Some(ENSEMBLE_PLATFORM)
        || config.get("ensemble_scheduling").is_some()
        || config.get("ensembleScheduling").is_some()
}

/// The `(model name, model version)` each step of an ensemble config runs, in step order
/// (`-1`: the newest version); empty for any other config.
pub fn ensemble_steps(config: &ModelConfig) -> Vec<(&str, i64)> {
    use crate::inference::model_config::SchedulingChoice;
    match &config.scheduling_choice {
        Some(SchedulingChoice::EnsembleScheduling(e)) => {
            e.step.iter().map(|s| (s.model_name.as_str(), s.model_version)).collect()
        }
        _ => Vec::new(),
    }
}

/// The model file name a config names in `default_model_filename`, or `fallback` when it names
/// none. It is joined to a version directory, so only a plain file name is accepted: a path
/// (`../other/1/model.onnx`, `/etc/...`) would load a file from outside the model, on a worker
/// possibly another tenant's.
pub fn model_filename<'a>(config: &'a ModelConfig, fallback: &'a str) -> Result<&'a str, String> {
    let name = config.default_model_filename.as_str();
    if name.is_empty() {
        return Ok(fallback);
    }
    if name == "." || name == ".." || name.contains(['/', '\\', '\0']) {
        return Err(format!("default_model_filename must be a file name in the version directory, not '{name}'"));
    }
    Ok(name)
}

/// The model tensors the server fills or consumes itself, never a client: the sequence
/// batcher's control inputs and state inputs and outputs (`sequence_batching`), and the inputs
/// `batch_input` computes. A config lists them there, not under `input` or `output`; workers
/// leave them out of what clients send and see, and uploads do not ask the config to list them.
pub fn server_provided_tensors(config: &ModelConfig) -> Vec<String> {
    use crate::inference::model_config::SchedulingChoice;
    let mut names = Vec::new();
    if let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice {
        names.extend(sb.control_input.iter().map(|c| c.name.clone()));
        names.extend(sb.state.iter().flat_map(|s| [s.input_name.clone(), s.output_name.clone()]));
    }
    names.extend(config.batch_input.iter().flat_map(|b| b.target_name.iter().cloned()));
    names
}

/// Rewrites `field [ {...} ]` as `field: [ {...} ]`.
///
/// The text-format spec (and protobuf's C++ parser, which Triton uses) lets a
/// list of messages follow its field name without a colon, and every Triton
/// `config.pbtxt` is written that way (`input [ ... ]`), but prost-reflect
/// 0.16 requires the colon. A colon is inserted after each identifier in
/// field-name position (not preceded by `:`) that is followed by `[`, outside
/// strings and comments. Returns the new text and the byte offsets (in the new
/// text) of the inserted colons.
fn insert_list_colons(text: &str) -> (String, Vec<usize>) {
    let bytes = text.as_bytes();
    let mut out = String::with_capacity(text.len() + 16);
    let mut inserted = Vec::new();
    let mut after_colon = false;
    let mut i = 0;
    while i < bytes.len() {
        let start = i;
        let b = bytes[i];
        match b {
            b'#' => {
                i = skip_comment(bytes, i);
                out.push_str(&text[start..i]);
                continue;
            }
            b'"' | b'\'' => {
                i = skip_string(bytes, i);
                after_colon = false;
            }
            b if b.is_ascii_whitespace() => {
                i += 1;
                out.push_str(&text[start..i]);
                continue;
            }
            b if b.is_ascii_alphabetic() || b == b'_' => {
                while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'_') {
                    i += 1;
                }
                out.push_str(&text[start..i]);
                if !after_colon && next_significant(bytes, i) == Some(b'[') {
                    inserted.push(out.len());
                    out.push(':');
                }
                after_colon = false;
                continue;
            }
            b if b.is_ascii_digit() || b == b'.' => {
                i += 1;
                while i < bytes.len() {
                    let c = bytes[i];
                    let exponent_sign = (c == b'+' || c == b'-') && matches!(bytes[i - 1], b'e' | b'E');
                    if c.is_ascii_alphanumeric() || c == b'_' || c == b'.' || exponent_sign {
                        i += 1;
                    } else {
                        break;
                    }
                }
                after_colon = false;
            }
            _ => {
                // Any other byte: punctuation or part of a multi-byte character.
                i += text[i..].chars().next().map_or(1, char::len_utf8);
                after_colon = b == b':';
            }
        }
        out.push_str(&text[start..i]);
    }
    (out, inserted)
}

/// Index just past a `#` comment starting at `i` (the newline is kept).
fn skip_comment(bytes: &[u8], mut i: usize) -> usize {
    while i < bytes.len() && bytes[i] != b'\n' {
        i += 1;
    }
    i
}

/// Index just past a quoted string starting at `i` (or at the end of its
/// line if it is unterminated, leaving the error to the parser).
fn skip_string(bytes: &[u8], i: usize) -> usize {
    let quote = bytes[i];
    let mut j = i + 1;
    while j < bytes.len() {
        match bytes[j] {
            b'\\' => j += 2,
            b'\n' => return j,
            c if c == quote => return j + 1,
            _ => j += 1,
        }
    }
    bytes.len()
}

/// The next byte that is not whitespace or inside a comment.
fn next_significant(bytes: &[u8], mut i: usize) -> Option<u8> {
    while i < bytes.len() {
        match bytes[i] {
            b'#' => i = skip_comment(bytes, i),
            b if b.is_ascii_whitespace() => i += 1,
            b => return Some(b),
        }
    }
    None
}

/// Turns a text-format error into one naming the line and column of the
/// original text.
fn text_error(
    original: &str,
    normalized: &str,
    inserted: &[usize],
    err: &prost_reflect::text_format::ParseError,
) -> ConfigFormatError {
    let offset = miette::Diagnostic::labels(err)
        .and_then(|mut labels| labels.next())
        .map_or(normalized.len(), |label| label.offset());
    let shift = inserted.iter().filter(|&&at| at < offset).count();
    let (line, column) = line_column(original, offset.saturating_sub(shift));
    ConfigFormatError::Text { line, column, reason: err.to_string() }
}

/// 1-based line and column (in characters) of a byte offset into `text`.
fn line_column(text: &str, offset: usize) -> (usize, usize) {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    let before = &text[..offset];
    let line = before.matches('\n').count() + 1;
    let line_start = before.rfind('\n').map_or(0, |i| i + 1);
    let column = before[line_start..].chars().count() + 1;
    (line, column)
}

#[cfg(test)]
mod tests {

    use serde_json::json;

    #[test]
    fn ensemble_configs_are_told_apart_in_json_too() {
        assert!(is_ensemble_json(&json!({ "platform": "ensemble", "name": "e" })));
        assert!(is_ensemble_json(&json!({ "ensemble_scheduling": { "step": [] } })));
        assert!(is_ensemble_json(&json!({ "ensembleScheduling": { "step": [] } })));
        assert!(!is_ensemble_json(&json!({ "platform": "onnxruntime_onnx", "max_batch_size": 8 })));
        assert!(!is_ensemble_json(&json!({})));
    }

    use super::*;
    use crate::inference::{
        DataType, model_config::SchedulingChoice, model_instance_group::Kind, model_version_policy::PolicyChoice,
    };

    const REALISTIC: &str = r#"
# A typical ONNX Runtime model.
name: "resnet"
backend: "onnxruntime"
max_batch_size: 8
input [
  {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "logits"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    label_filename: "labels.txt"
  }
]
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
}
instance_group [ { count: 2 kind: KIND_CPU } ]
version_policy: { specific: { versions: [ 1, 3 ] } }
parameters {
  key: "intra_op_thread_count"
  value: { string_value: "1" }
}
"#;

    fn realistic() -> ModelConfig {
        from_pbtxt(REALISTIC).expect("the realistic config parses")
    }

    #[test]
    fn parses_realistic_pbtxt() {
        let cfg = realistic();
        assert_eq!(cfg.name, "resnet");
        assert_eq!(cfg.backend, "onnxruntime");
        assert_eq!(cfg.max_batch_size, 8);
        assert_eq!(cfg.input.len(), 1);
        assert_eq!(cfg.input[0].name, "input");
        assert_eq!(cfg.input[0].data_type(), DataType::TypeFp32);
        assert_eq!(cfg.input[0].dims, vec![3, 224, 224]);
        assert_eq!(cfg.output[0].dims, vec![1000]);
        assert_eq!(cfg.output[0].label_filename, "labels.txt");
        let Some(SchedulingChoice::DynamicBatching(db)) = &cfg.scheduling_choice else {
            panic!("expected dynamic batching, got {:?}", cfg.scheduling_choice);
        };
        assert_eq!(db.preferred_batch_size, vec![4, 8]);
        assert_eq!(db.max_queue_delay_microseconds, 100);
        assert_eq!(cfg.instance_group.len(), 1);
        assert_eq!(cfg.instance_group[0].count, 2);
        assert_eq!(cfg.instance_group[0].kind(), Kind::Cpu);
        let policy = cfg.version_policy.as_ref().and_then(|p| p.policy_choice.as_ref());
        let Some(PolicyChoice::Specific(specific)) = policy else {
            panic!("expected a specific version policy, got {policy:?}");
        };
        assert_eq!(specific.versions, vec![1, 3]);
        assert_eq!(cfg.parameters.get("intra_op_thread_count").map(|p| p.string_value.as_str()), Some("1"));
    }

    #[test]
    fn json_round_trip() {
        let cfg = realistic();
        let value = to_json_value(&cfg);
        let back = from_json(&value.to_string()).expect("our own JSON parses");
        assert_eq!(back, cfg);
    }

    #[test]
    fn json_shape_matches_triton() {
        let value = to_json_value(&realistic());
        // Proto field names, numbers for 64-bit integers, enums by name.
        assert_eq!(value["max_batch_size"], json!(8));
        assert_eq!(value["input"][0]["dims"], json!([3, 224, 224]));
        assert_eq!(value["input"][0]["data_type"], json!("TYPE_FP32"));
        assert_eq!(value["input"][0]["format"], json!("FORMAT_NCHW"));
        assert_eq!(value["input"][0]["is_shape_tensor"], json!(false));
        assert_eq!(value["output"][0]["label_filename"], json!("labels.txt"));
        assert_eq!(value["dynamic_batching"]["max_queue_delay_microseconds"], json!(100));
        assert_eq!(value["dynamic_batching"]["preferred_batch_size"], json!([4, 8]));
        assert_eq!(value["dynamic_batching"]["priority_queue_policy"], json!({}));
        assert_eq!(value["instance_group"][0]["kind"], json!("KIND_CPU"));
        assert_eq!(value["instance_group"][0]["gpus"], json!([]));
        assert_eq!(value["version_policy"], json!({ "specific": { "versions": [1, 3] } }));
        assert_eq!(value["parameters"], json!({ "intra_op_thread_count": { "string_value": "1" } }));
        // Defaults are printed.
        assert_eq!(value["platform"], json!(""));
        assert_eq!(value["batch_input"], json!([]));
        assert_eq!(value["metric_tags"], json!({}));
        // Unset oneof members and messages are not.
        assert!(value.get("sequence_batching").is_none());
        assert!(value.get("ensemble_scheduling").is_none());
        assert!(value.get("optimization").is_none());
    }

    #[test]
    fn bad_text_names_the_problem() {
        let err = from_pbtxt("name: \"m\"\nmax_batch_size: 8\nbogus_field: 3\n").expect_err("unknown field must fail");
        let msg = err.to_string();
        assert!(msg.contains("bogus_field"), "{msg}");
        assert!(msg.contains("line 3, column 1"), "{msg}");

        let err = from_pbtxt("input [ { data_type: TYPE_FLOAT } ]").expect_err("bad enum");
        let msg = err.to_string();
        assert!(msg.contains("TYPE_FLOAT"), "{msg}");
        assert!(msg.contains("line 1, column 22"), "{msg}");

        let err = from_pbtxt("max_batch_size: \"eight\"").expect_err("wrong type");
        assert!(err.to_string().contains("line 1"), "{err}");

        let err = from_pbtxt("dynamic_batching {").expect_err("unterminated");
        assert!(err.to_string().contains("end of input"), "{err}");
    }

    #[test]
    fn json_dims_as_numbers_or_strings() {
        for dims in [json!(["16"]), json!([16])] {
            let text = json!({
                "name": "m",
                "max_batch_size": "4",
                "input": [{ "name": "x", "data_type": "TYPE_INT64", "dims": dims }],
            })
            .to_string();
            let cfg = from_json(&text).expect("dims parse");
            assert_eq!(cfg.input[0].dims, vec![16]);
            assert_eq!(cfg.input[0].data_type(), DataType::TypeInt64);
            assert_eq!(cfg.max_batch_size, 4);
        }
    }

    #[test]
    fn json_accepts_camel_case_and_rejects_unknown_fields() {
        let cfg =
            from_json(r#"{"maxBatchSize": 2, "instanceGroup": [{"kind": "KIND_GPU"}]}"#).expect("json names parse");
        assert_eq!(cfg.max_batch_size, 2);
        assert_eq!(cfg.instance_group[0].kind(), Kind::Gpu);

        let err = from_json(r#"{"name": "m", "nope": 1}"#).expect_err("unknown field");
        assert!(err.to_string().contains("nope"), "{err}");

        let err = from_json(r#"{"name": "m"} trailing"#).expect_err("trailing data");
        assert!(matches!(err, ConfigFormatError::Json(_)), "{err}");

        let err = from_json(r#"{"input": [{"data_type": "TYPE_NOPE"}]}"#).expect_err("bad enum");
        assert!(err.to_string().contains("TYPE_NOPE"), "{err}");
    }

    #[test]
    fn colons_are_inserted_only_before_message_lists() {
        let (text, inserted) = insert_list_colons("a [ {} ] b: [1] c { d [ {} ] } # e [\n'f [' g\n  [ {} ]");
        assert_eq!(text, "a: [ {} ] b: [1] c { d: [ {} ] } # e [\n'f [' g:\n  [ {} ]");
        assert_eq!(inserted.len(), 3);
        assert_eq!(insert_list_colons("kind: KIND_CPU dims: [1]").0, "kind: KIND_CPU dims: [1]");
    }

    #[test]
    fn accepts_empty_lists_and_colon_forms() {
        let cfg = from_pbtxt("input: [ { name: \"x\" dims: [] } ]\noutput { name: \"y\" }")
            .expect("colon and empty list forms parse");
        assert!(cfg.input[0].dims.is_empty());
        assert_eq!(cfg.output[0].name, "y");
    }

    proptest::proptest! {
        #[test]
        fn pbtxt_parsing_never_panics(text in "[a-z_\\[\\]{}:<>#'\"\\\\ \n0-9.eé-]{0,64}") {
            let (normalized, inserted) = insert_list_colons(&text);
            proptest::prop_assert_eq!(normalized.len(), text.len() + inserted.len());
            let _ = from_pbtxt(&text);
        }

        #[test]
        fn json_parsing_never_panics(text in "\\PC{0,64}") {
            let _ = from_json(&text);
        }
    }

    #[test]
    fn line_column_handles_multibyte_and_bounds() {
        assert_eq!(line_column("ab\ncd", 4), (2, 2));
        assert_eq!(line_column("é\nx", 1), (1, 1));
        assert_eq!(line_column("x", 99), (1, 2));
    }

    #[test]
    fn model_filename_is_a_plain_file_name() {
        let with = |name: &str| ModelConfig { default_model_filename: name.into(), ..Default::default() };
        assert_eq!(model_filename(&with(""), "model.onnx"), Ok("model.onnx"));
        assert_eq!(model_filename(&with("net.onnx"), "model.onnx"), Ok("net.onnx"));
        for bad in ["../other/1/model.onnx", "/etc/model.onnx", "a/b.onnx", "..", ".", "a\\b", "nul\0"] {
            let err = model_filename(&with(bad), "model.onnx").expect_err(bad);
            assert!(err.contains("default_model_filename"), "{err}");
        }
    }

    #[test]
    fn the_server_provides_sequence_controls_states_and_batch_inputs() {
        let config = from_pbtxt(
            r#"max_batch_size: 4
            sequence_batching {
              control_input [ { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ]
              state [ { input_name: "S_IN" output_name: "S_OUT" data_type: TYPE_FP32 dims: [ 1 ] } ]
            }
            batch_input [ { kind: BATCH_ELEMENT_COUNT target_name: [ "COUNT" ] data_type: TYPE_FP32 source_input: [ "X" ] } ]"#,
        )
        .expect("config parses");
        assert_eq!(server_provided_tensors(&config), ["START", "S_IN", "S_OUT", "COUNT"]);
        assert!(server_provided_tensors(&ModelConfig::default()).is_empty());
    }
}
