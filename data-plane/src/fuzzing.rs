//! Entry points into the request decoders the serving layer keeps private, for the fuzz targets
//! in `fuzz/` and their replay in the main workspace's tests. Not an API: nothing else calls
//! these, and they may change with the decoders.

use bytes::Bytes;
use tessera_protocol::inference::ModelInferRequest;

use crate::engine::infer::InferRequest;
use crate::error::Result;
use crate::gateway::sticky::SequenceId;

/// Decodes a KServe v2 HTTP infer body as `POST /v2/models/{model}/infer` does: its JSON
/// header, and the binary tail `Inference-Header-Content-Length` (`header_length`) splits off.
pub fn decode_http_infer(body: &Bytes, header_length: Option<&str>) -> Result<InferRequest> {
    crate::serve::http::codec::decode_body(body, header_length).map(|(request, _)| request)
}

/// Converts a gRPC `ModelInferRequest` into an engine request as `ModelInfer` does.
pub fn grpc_infer_request(request: ModelInferRequest) -> Result<InferRequest> {
    crate::serve::grpc::convert::infer_request(request).map(|(request, _)| request)
}

/// What the gateway reads from a unary gRPC call's framed body before it forwards the call:
/// the model's name, its version and the sequence id (`grpc_encoding`: the call's
/// `grpc-encoding` header, for a compressed message; `limit`: the largest message read).
pub fn gateway_grpc_target(
    framed: &[u8],
    grpc_encoding: Option<&'static str>,
    limit: usize,
) -> Result<(String, Option<i64>, Option<SequenceId>)> {
    let mut headers = http::HeaderMap::new();
    if let Some(encoding) = grpc_encoding {
        headers.insert("grpc-encoding", http::HeaderValue::from_static(encoding));
    }
    let target = crate::gateway::grpc::target_of(framed, &headers, limit)?;
    Ok((target.name, target.version, target.sequence))
}
