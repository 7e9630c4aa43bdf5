//! One module per fuzz target: `run(data)` feeds a parser arbitrary bytes and checks what it
//! accepted beyond "it did not panic" (a round trip, a second decoder that must agree, declared
//! sizes that must add up).
//!
//! Shared by the `cargo fuzz` binaries (through the `tessera-fuzz` library) and the main
//! workspace's e2e test binary, which includes this directory by path and replays
//! `fuzz/seeds/<target>/` and `fuzz/regressions/<target>/` through [`TARGETS`] on stable Rust.
//! So the code here names only crates both have: the three Tessera crates, `bytes`, `prost`,
//! `serde_json`, `tokio`, `base64`, `ed25519-dalek` and `tempfile`.

pub mod archive;
pub mod bytes_tensor;
pub mod gateway_grpc;
pub mod gateway_http1;
pub mod grpc_infer;
pub mod http_infer;
mod infer;
mod model_config;
pub mod model_config_json;
pub mod model_config_pbtxt;
pub mod onnx;
pub mod runner_wire;
pub mod tokens;

/// A target's body: feeds it one input, panics when an assertion fails.
pub type Run = fn(&[u8]);

/// Every target by name: `fuzz_targets/<name>.rs`, `fuzz/seeds/<name>/`, `fuzz/regressions/<name>/`.
pub const TARGETS: &[(&str, Run)] = &[
    ("model_config_pbtxt", model_config_pbtxt::run),
    ("model_config_json", model_config_json::run),
    ("http_infer", http_infer::run),
    ("grpc_infer", grpc_infer::run),
    ("bytes_tensor", bytes_tensor::run),
    ("archive", archive::run),
    ("onnx", onnx::run),
    ("tokens", tokens::run),
    ("runner_wire", runner_wire::run),
    ("gateway_http1", gateway_http1::run),
    ("gateway_grpc", gateway_grpc::run),
];
