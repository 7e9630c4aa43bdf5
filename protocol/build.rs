//! Compiles the protobuf definitions with `protox` (no system `protoc`), keeps
//! the descriptor set for runtime reflection and generates prost + tonic code.

use std::path::PathBuf;

use prost::Message as _;

const PROTOS: &[&str] =
    &["proto/model_config.proto", "proto/grpc_service.proto", "proto/health.proto", "proto/agent.proto"];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto");
    for proto in PROTOS {
        println!("cargo:rerun-if-changed={proto}");
    }

    let fds = protox::compile(PROTOS, ["proto"])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("file_descriptor_set.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .emit_rerun_if_changed(false)
        // Tensor payloads stay reference-counted slices of the received
        // buffer instead of being copied into fresh `Vec<u8>`s.
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .bytes(".tessera.agent.v1.ArtifactChunk.data")
        .compile_fds(fds)?;
    Ok(())
}
