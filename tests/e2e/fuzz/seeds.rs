//! The fuzz targets' seed inputs: a few real examples per target, made here so they stay
//! readable, reviewable and in step with the formats (`seeds_are_generated` checks the files).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use bytes::{Bytes, BytesMut};
use ed25519_dalek::{Signer, SigningKey};
use prost::Message;
use tessera_data_plane::engine::cuda_ipc::{CudaIo, CudaRef, CudaRegionRef, IpcHandle};
use tessera_data_plane::engine::infer::{ParamValue, ValidInferRequest};
use tessera_data_plane::engine::load_error::LoadError;
use tessera_data_plane::engine::model_spec::{IoInfo, ModelIo};
use tessera_data_plane::engine::stats::Tally;
use tessera_data_plane::engine::tensor::{InputTensor, OutputTensor};
use tessera_data_plane::error::{Error, ErrorKind};
use tessera_data_plane::runner::wire::{FromRunner, InferCall, LoadCall, ToRunner};
use tessera_data_plane::trace::{Event, Trace};
use tessera_protocol::DataType;
use tessera_protocol::archive::test_support::{gzip, tar_of, zip_of};
use tessera_protocol::inference::model_infer_request::{InferInputTensor, InferRequestedOutputTensor};
use tessera_protocol::inference::{InferParameter, InferTensorContents, ModelInferRequest, infer_parameter};

/// Every seed: (target, file name, contents).
pub fn all() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let text = |target, file, s: &str| (target, file, s.as_bytes().to_vec());
    let mut seeds = vec![
        text("model_config_pbtxt", "simple.pbtxt", SIMPLE_PBTXT),
        text("model_config_pbtxt", "batching.pbtxt", BATCHING_PBTXT),
        text("model_config_pbtxt", "strings.pbtxt", STRINGS_PBTXT),
        text("model_config_json", "simple.json", &served_json(SIMPLE_PBTXT)),
        text("model_config_json", "batching.json", &served_json(BATCHING_PBTXT)),
        text("model_config_json", "camel_case.json", CAMEL_CASE_JSON),
        text("http_infer", "json.json", HTTP_JSON),
        ("http_infer", "binary.bin", http_binary()),
        ("http_infer", "mixed.bin", http_mixed()),
        ("grpc_infer", "raw.bin", grpc_raw().encode_to_vec()),
        ("grpc_infer", "typed.bin", grpc_typed().encode_to_vec()),
        ("bytes_tensor", "empty.bin", Vec::new()),
        ("bytes_tensor", "three.bin", bytes_elements(&[b"a", b"bc", b""])),
        ("bytes_tensor", "truncated.bin", bytes_elements(&[b"abcdef"])[..7].to_vec()),
        (
            "archive",
            "model_dir.tar",
            [&[0][..], &tar_of(&[("m/config.pbtxt", SIMPLE_PBTXT.as_bytes()), ("m/1/model.onnx", &onnx_model())], &[])]
                .concat(),
        ),
        ("archive", "root.tar.gz", [&[0][..], &gzip(&tar_of(&[("model.onnx", &onnx_model())], &[]))].concat()),
        (
            "archive",
            "model_dir.zip",
            [&[1][..], &zip_of(&[("m/config.pbtxt", SIMPLE_PBTXT.as_bytes()), ("m/1/model.onnx", &onnx_model())], &[])]
                .concat(),
        ),
        ("onnx", "identity.onnx", onnx_model()),
        ("runner_wire", "from_runner.bin", [&[0][..], &from_runner_frames()].concat()),
        ("runner_wire", "to_runner.bin", [&[1][..], &to_runner_frames()].concat()),
        ("gateway_http1", "request.bin", [&[0][..], GATEWAY_REQUEST.as_bytes()].concat()),
        ("gateway_http1", "answer.bin", [&[1][..], GATEWAY_ANSWER.as_bytes()].concat()),
        ("gateway_http1", "chunked.bin", [&[2][..], GATEWAY_CHUNKED.as_bytes()].concat()),
        (
            "gateway_grpc",
            "versioned.bin",
            [&[0][..], &grpc_framed(0, &gateway_grpc_request().encode_to_vec())].concat(),
        ),
        ("gateway_grpc", "group.bin", [&[0][..], &grpc_framed(0, &with_unknown_group(&grpc_raw()))].concat()),
        (
            "gateway_grpc",
            "gzip.bin",
            [&[1][..], &grpc_framed(1, &gzip(&gateway_grpc_request().encode_to_vec()))].concat(),
        ),
    ];
    seeds.extend(token_seeds());
    seeds
}

/// A model request head as the gateway's lean path reads it, its body after.
const GATEWAY_REQUEST: &str = "POST /v2/models/simple/infer HTTP/1.1\r\nHost: gw\r\n\
Authorization: Bearer k\r\nInference-Header-Content-Length: 2\r\nContent-Length: 6\r\n\r\n{}abcd";
/// A worker's answer head.
const GATEWAY_ANSWER: &str =
    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 2\r\nconnection: keep-alive\r\n\r\n{}";
/// A chunked answer body with trailers.
const GATEWAY_CHUNKED: &str = "5\r\nhello\r\n3;x=y\r\nabc\r\n0\r\ngrpc-status: 0\r\n\r\n";

const SIMPLE_PBTXT: &str = r#"name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
"#;

const BATCHING_PBTXT: &str = r#"# A tuned deployment: batching, instances, priorities.
max_batch_size: 32
default_model_filename: "net.onnx"
version_policy: { latest: { num_versions: 2 } }
dynamic_batching {
  preferred_batch_size: [ 4, 8 ]
  max_queue_delay_microseconds: 100
  priority_levels: 2
  default_priority_level: 1
  default_queue_policy { timeout_action: REJECT default_timeout_microseconds: 5000 max_queue_size: 64 }
}
instance_group [ { count: 2 kind: KIND_CPU } ]
parameters { key: "intra_op_thread_count" value: { string_value: "2" } }
"#;

const STRINGS_PBTXT: &str = r#"name: 'text'
backend: "onnxruntime"
input [ { name: "TEXT" data_type: TYPE_STRING dims: [ -1 ] optional: true } ]
output [ { name: "SCORE" data_type: TYPE_FP32 dims: [ 1 ] label_filename: "labels.txt" } ]
model_warmup [ { name: "w" batch_size: 1 inputs { key: "TEXT" value: { data_type: TYPE_STRING dims: [ 1 ] zero_data: true } } } ]
"#;

const CAMEL_CASE_JSON: &str = r#"{"name":"m","maxBatchSize":4,"input":[{"name":"x","dataType":"TYPE_FP32","dims":["3",-1]}],
"output":[{"name":"y","dataType":"TYPE_FP32","dims":[3]}],"dynamicBatching":{"maxQueueDelayMicroseconds":"50"}}"#;

/// A config's JSON as the config endpoint serves it.
fn served_json(pbtxt: &str) -> String {
    let config = tessera_protocol::model_config::from_pbtxt(pbtxt).expect("a seed config parses");
    tessera_protocol::model_config::to_json_value(&config).to_string()
}

// The inference seeds address the fuzz targets' model: INT (INT32 [-1,4]), FP (FP32 [-1,-1]),
// HALF (FP16 [-1,2]), TEXT (BYTES [-1,-1]) and FLAG (BOOL [-1,1]), batching up to 8.

const HTTP_JSON: &str = r#"{"id":"7","parameters":{"timeout":1000,"binary_data_output":false},
"inputs":[{"name":"INT","shape":[2,4],"datatype":"INT32","data":[[1,2,3,4],[5,6,7,-8]]},
{"name":"FP","shape":[2,2],"datatype":"FP32","data":[1.5,NaN,-Infinity,2e3]},
{"name":"TEXT","shape":[2,1],"datatype":"BYTES","data":["a","b\u00e9"]},
{"name":"FLAG","shape":[2,1],"datatype":"BOOL","data":[true,false]}],
"outputs":[{"name":"OUT","parameters":{"binary_data":true}}]}"#;

/// Little-endian bytes of `values`.
fn le<const N: usize, T: Copy>(values: &[T], to: fn(T) -> [u8; N]) -> Vec<u8> {
    values.iter().flat_map(|v| to(*v)).collect()
}

/// The fuzz model's five inputs for one row: (name, datatype, shape, bytes).
fn one_row() -> Vec<(&'static str, DataType, Vec<i64>, Vec<u8>)> {
    vec![
        ("INT", DataType::Int32, vec![1, 4], le(&[1i32, 2, 3, 4], i32::to_le_bytes)),
        ("FP", DataType::Fp32, vec![1, 3], le(&[0.5f32, f32::NAN, -1.0], f32::to_le_bytes)),
        ("HALF", DataType::Fp16, vec![1, 2], vec![0x00, 0x3c, 0x00, 0xc0]),
        ("TEXT", DataType::Bytes, vec![1, 2], bytes_elements(&[b"hi", b""])),
        ("FLAG", DataType::Bool, vec![1, 1], vec![1]),
    ]
}

/// `#<json length>\n<json><tail>`, every input in the tail.
fn http_binary() -> Vec<u8> {
    let mut tail = Vec::new();
    let inputs: Vec<serde_json::Value> = one_row()
        .into_iter()
        .map(|(name, datatype, shape, data)| {
            tail.extend_from_slice(&data);
            serde_json::json!({"name": name, "datatype": datatype.as_wire(), "shape": shape,
                "parameters": {"binary_data_size": data.len()}})
        })
        .collect();
    let json = serde_json::json!({"inputs": inputs, "parameters": {"priority": 0, "sequence_id": "s"}}).to_string();
    [format!("#{}\n{json}", json.len()).as_bytes(), &tail].concat()
}

/// JSON data for most inputs, the binary tail for FP16 (which has no JSON form).
fn http_mixed() -> Vec<u8> {
    let half = [0x00u8, 0x3c, 0x00, 0x40];
    let json = r#"{"inputs":[{"name":"INT","shape":[1,4],"datatype":"INT32","data":[1,2,3,4]},
{"name":"FP","shape":[1,1],"datatype":"FP32","data":[Inf]},
{"name":"HALF","shape":[1,2],"datatype":"FP16","parameters":{"binary_data_size":4}},
{"name":"TEXT","shape":[1,1],"datatype":"BYTES","data":["x"]},
{"name":"FLAG","shape":[1,1],"datatype":"BOOL","data":[false]}]}"#;
    [format!("#{}\n{json}", json.len()).as_bytes(), &half].concat()
}

fn grpc_raw() -> ModelInferRequest {
    let rows = one_row();
    ModelInferRequest {
        model_name: "fuzz".into(),
        id: "r".into(),
        parameters: [(
            "timeout".to_string(),
            InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::Uint64Param(10)) },
        )]
        .into(),
        inputs: rows
            .iter()
            .map(|(name, datatype, shape, _)| InferInputTensor {
                name: name.to_string(),
                datatype: datatype.as_wire().into(),
                shape: shape.clone(),
                ..Default::default()
            })
            .collect(),
        outputs: vec![InferRequestedOutputTensor { name: "OUT".into(), ..Default::default() }],
        raw_input_contents: rows.into_iter().map(|(.., data)| Bytes::from(data)).collect(),
        ..Default::default()
    }
}

/// A unary call's message as the gateway reads it: a version and a sequence id among tensors.
fn gateway_grpc_request() -> ModelInferRequest {
    let mut request = grpc_raw();
    request.model_version = "2".into();
    // One parameter: a map of several would encode in a different order on each run.
    request.parameters = [(
        "sequence_id".to_string(),
        InferParameter { parameter_choice: Some(infer_parameter::ParameterChoice::StringParam("s1".into())) },
    )]
    .into();
    request
}

/// `request` encoded after an unknown group (field 99, holding a string), which prost skips.
fn with_unknown_group(request: &ModelInferRequest) -> Vec<u8> {
    [&[0x9b, 0x06, 0x0a, 0x01, b'x', 0x9c, 0x06][..], &request.encode_to_vec()].concat()
}

/// A gRPC message frame: the compressed flag, the length, the message.
fn grpc_framed(compressed: u8, message: &[u8]) -> Vec<u8> {
    let len = u32::try_from(message.len()).expect("a seed is small");
    [&[compressed][..], &len.to_be_bytes(), message].concat()
}

fn grpc_typed() -> ModelInferRequest {
    let input = |name: &str, datatype: &str, shape: Vec<i64>, contents| InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        contents: Some(contents),
        ..Default::default()
    };
    ModelInferRequest {
        inputs: vec![
            input(
                "INT",
                "INT32",
                vec![1, 4],
                InferTensorContents { int_contents: vec![1, -2, 3, 4], ..Default::default() },
            ),
            input(
                "FP",
                "FP32",
                vec![1, 2],
                InferTensorContents { fp32_contents: vec![0.25, 8.0], ..Default::default() },
            ),
            input(
                "TEXT",
                "BYTES",
                vec![1, 2],
                InferTensorContents { bytes_contents: vec![b"a".to_vec(), Vec::new()], ..Default::default() },
            ),
            input("FLAG", "BOOL", vec![1, 1], InferTensorContents { bool_contents: vec![true], ..Default::default() }),
            input("SMALL", "UINT8", vec![2], InferTensorContents { uint_contents: vec![7, 255], ..Default::default() }),
        ],
        ..Default::default()
    }
}

/// A serialized BYTES buffer.
fn bytes_elements(elements: &[&[u8]]) -> Vec<u8> {
    elements.iter().flat_map(|e| [&(e.len() as u32).to_le_bytes()[..], e].concat()).collect()
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push(v as u8 | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(number: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// The smallest complete ONNX model the control plane accepts: one Identity node.
fn onnx_model() -> Vec<u8> {
    let mut node = Vec::new();
    len_field(1, b"x", &mut node);
    len_field(2, b"y", &mut node);
    len_field(4, b"Identity", &mut node);
    let mut graph = Vec::new();
    len_field(1, &node, &mut graph);
    len_field(2, b"g", &mut graph);
    len_field(11, &[0x0a, 0x01, b'x'], &mut graph);
    len_field(12, &[0x0a, 0x01, b'y'], &mut graph);
    let mut model = vec![0x08, 0x08]; // ir_version 8
    len_field(2, b"tessera", &mut model); // producer_name
    len_field(8, &[0x10, 0x0d], &mut model); // opset_import { version: 13 }
    len_field(7, &graph, &mut model);
    model
}

fn tensor(name: &str, datatype: DataType, shape: Vec<i64>, data: Vec<u8>) -> OutputTensor {
    OutputTensor { name: name.into(), datatype, shape, data: data.into() }
}

/// One of each frame a runner sends, as one stream.
fn from_runner_frames() -> Vec<u8> {
    let tally = Tally { counters: vec![1, 0, 2], batches: vec![(1, [1, 10, 20, 30])] };
    let io = |name: &str, datatype| IoInfo { name: name.into(), datatype, shape: vec![-1, 4] };
    let answers = [
        FromRunner::Loaded(ModelIo { inputs: vec![io("INT", Some(DataType::Int32))], outputs: vec![io("OUT", None)] }),
        FromRunner::Answer {
            result: Ok(vec![
                tensor("OUT", DataType::Fp32, vec![1, 2], le(&[1.0f32, 2.0], f32::to_le_bytes)),
                tensor("TEXT", DataType::Bytes, vec![2], bytes_elements(&[b"ab", b"c"])),
            ]),
            stats: tally.clone(),
            steps: vec![(Event::QueueStart, 1_000), (Event::ComputeStart, 2_000), (Event::ComputeEnd, 9_000)],
        },
        FromRunner::Answer {
            result: Err(Error::new(ErrorKind::Unavailable, "queue full")),
            stats: tally.clone(),
            steps: Vec::new(),
        },
        FromRunner::Failed(Error::new(ErrorKind::InvalidArg, "bad model")),
        FromRunner::LoadFailed(LoadError::configuration("output 'x' has no valid data_type")),
        FromRunner::Stats { key: "t/m".into(), version: 1, stats: tally },
        FromRunner::Pong { rss_bytes: 1 << 20 },
        FromRunner::Done,
        FromRunner::Released,
    ];
    let mut out = BytesMut::new();
    for (id, answer) in answers.iter().enumerate() {
        answer.encode(id as u64, &mut out, None);
    }
    out.to_vec()
}

/// One of each frame the front sends, as one stream.
fn to_runner_frames() -> Vec<u8> {
    let config = tessera_protocol::model_config::from_pbtxt(BATCHING_PBTXT).expect("a seed config parses");
    let request = ValidInferRequest {
        id: "q".into(),
        parameters: [("timeout".to_string(), ParamValue::Uint(5)), ("tag".to_string(), ParamValue::Str("x".into()))]
            .into(),
        priority: 1,
        timeout_us: 5,
        batch_size: 1,
        inputs: vec![
            Some(InputTensor {
                name: "INT".into(),
                datatype: DataType::Int32,
                shape: vec![1, 4],
                data: le(&[1i32, 2, 3, 4], i32::to_le_bytes).into(),
            }),
            None,
        ],
        outputs: vec![0],
        cuda: Default::default(),
        trace: Trace::collecting(),
    };
    let calls = [
        ToRunner::Load(Box::new(LoadCall {
            key: "t/m".into(),
            name: "m".into(),
            version: 1,
            file: "/cache/m/1/model.onnx".into(),
            config,
        })),
        ToRunner::Infer(InferCall { key: "t/m".into(), version: 1, request }),
        ToRunner::Infer(InferCall { key: "t/m".into(), version: 1, request: cuda_request() }),
        ToRunner::Unload { key: "t/m".into(), version: 1 },
        ToRunner::Cancel,
        ToRunner::Ping,
        ToRunner::CudaRelease { id: 1 },
    ];
    let mut out = BytesMut::new();
    for (id, call) in calls.iter().enumerate() {
        call.encode(id as u64 + 1, &mut out, None);
    }
    out.to_vec()
}

/// A request whose input and output are in CUDA regions: references, no bytes.
fn cuda_request() -> ValidInferRequest {
    let at = |id: u64, name: &str| {
        let region =
            CudaRegionRef { id, name: name.into(), handle: IpcHandle([id as u8; 64]), device_id: 0, byte_size: 64 };
        CudaRef { region: std::sync::Arc::new(region), offset: 16, byte_size: 16, lease: None }
    };
    ValidInferRequest {
        id: "c".into(),
        parameters: Default::default(),
        priority: 0,
        timeout_us: 0,
        batch_size: 1,
        inputs: vec![
            Some(InputTensor { name: "INT".into(), datatype: DataType::Int32, shape: vec![1, 4], data: Bytes::new() }),
            None,
        ],
        outputs: vec![0],
        cuda: CudaIo { inputs: vec![("INT".into(), at(1, "in"))], outputs: vec![("OUT".into(), at(2, "out"))] },
        trace: Default::default(),
    }
}

/// The fuzz targets' signing key (see `targets::tokens`).
fn signing_key() -> SigningKey {
    SigningKey::from_bytes(&[7; 32])
}

const TOKEN_HEADER: &str = r#"{"typ":"JWT","alg":"EdDSA","kid":"fuzz-key"}"#;

/// Claims as the control plane issues them, valid until 2100.
fn claims(exp: i64) -> String {
    serde_json::json!({
        "iss": "tessera-fuzz", "aud": "tessera-workers", "sub": "key-1",
        "tenant": "0190a5f4-6a4e-7c3b-9d2e-1f0a2b3c4d5e", "tenant_name": "demo", "role": "deployer",
        "iat": 1_700_000_000, "nbf": 1_700_000_000, "exp": exp, "jti": "j",
    })
    .to_string()
}

fn token_seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    let signed_input =
        |payload: &str| [&[1, TOKEN_HEADER.len() as u8][..], TOKEN_HEADER.as_bytes(), payload.as_bytes()].concat();
    let input = format!("{}.{}", URL_SAFE_NO_PAD.encode(TOKEN_HEADER), URL_SAFE_NO_PAD.encode(claims(4_102_444_800)));
    let token = format!("{input}.{}", URL_SAFE_NO_PAD.encode(signing_key().sign(input.as_bytes()).to_bytes()));
    vec![
        ("tokens", "api_key.txt", b"\0tsk_abcdefghijkl_ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopq".to_vec()),
        ("tokens", "token.txt", [b"\0", token.as_bytes()].concat()),
        ("tokens", "signed.bin", signed_input(&claims(4_102_444_800))),
        ("tokens", "expired.bin", signed_input(&claims(1_700_000_600))),
    ]
}
