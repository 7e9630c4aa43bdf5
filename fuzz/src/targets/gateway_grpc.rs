//! The gateway's read of a unary gRPC call (`tessera_data_plane::gateway::grpc`): the model's
//! name and version and the sequence id, from the first message of the framed body, walked
//! without decoding it.
//!
//! Input: a selector byte (its low two bits pick the `grpc-encoding` header: none, gzip,
//! deflate, or one not supported), then the framed body. Whatever the bytes, the read ends in
//! a target or an error. A target names a model and, if any, a positive version; a frame
//! flagged neither uncompressed (0) nor compressed (1) is refused, as the worker would. And where
//! the message is uncompressed and prost (the workers' decoder) decodes it, the gateway must
//! read what prost reads: the same name and version, or the refusal a client's missing name or
//! bad version earns, and the sequence id the worker will see. A call the gateway refuses as
//! malformed or routes by another model than its worker reads would fail or land wrongly.

use prost::Message;
use tessera_data_plane::fuzzing::gateway_grpc_target;
use tessera_data_plane::gateway::sticky::SequenceId;
use tessera_protocol::inference::ModelInferRequest;
use tessera_protocol::inference::infer_parameter::ParameterChoice;

/// The largest message read (small, so decompression past it is exercised).
const LIMIT: usize = 1 << 16;

/// Reads `data` as the selector says.
pub fn run(data: &[u8]) {
    let Some((selector, framed)) = data.split_first() else { return };
    let encoding = [None, Some("gzip"), Some("deflate"), Some("snappy")][usize::from(selector & 3)];
    let read = gateway_grpc_target(framed, encoding, LIMIT);
    if let Ok((name, version, _)) = &read {
        assert!(!name.is_empty(), "a target names a model");
        assert!(version.is_none_or(|v| v > 0), "a version is positive");
    }
    if framed.first().is_some_and(|flag| *flag > 1) {
        assert!(read.is_err(), "a compression flag other than 0 or 1 is refused, as the worker would");
    }
    let Some(message) = uncompressed_message(framed) else {
        if framed.first() == Some(&0) {
            assert!(read.is_err(), "a body without a whole first message is refused");
        }
        return;
    };
    let Ok(decoded) = ModelInferRequest::decode(message) else { return };
    let expected_version = match decoded.model_version.as_str() {
        "" => Some(None),
        v => v.parse::<i64>().ok().filter(|v| *v > 0).map(Some),
    };
    match (read, expected_version) {
        (Ok((name, version, sequence)), Some(expected)) if !decoded.model_name.is_empty() => {
            assert_eq!(name, decoded.model_name, "the model the worker reads");
            assert_eq!(version, expected, "the version the worker reads");
            assert_eq!(sequence, sequence_id(&decoded), "the sequence id the worker reads");
        }
        (Err(_), None) => {}
        (Err(_), Some(_)) if decoded.model_name.is_empty() => {}
        (read, expected) => {
            panic!("prost reads model {:?} version {expected:?}; the gateway read {read:?}", decoded.model_name)
        }
    }
}

/// The first message of a framed body whose frame says it is not compressed, if whole.
fn uncompressed_message(framed: &[u8]) -> Option<&[u8]> {
    let (&0, rest) = framed.split_first()? else { return None };
    let len = u32::from_be_bytes(rest.get(..4)?.try_into().ok()?) as usize;
    rest.get(4..4 + len)
}

/// The sequence id a worker takes from a decoded request: a non-zero number, or a non-empty
/// string.
fn sequence_id(request: &ModelInferRequest) -> Option<SequenceId> {
    match request.parameters.get("sequence_id")?.parameter_choice.as_ref()? {
        ParameterChoice::Int64Param(n) => u64::try_from(*n).ok().filter(|n| *n != 0).map(SequenceId::Num),
        ParameterChoice::Uint64Param(n) => Some(*n).filter(|n| *n != 0).map(SequenceId::Num),
        ParameterChoice::StringParam(s) if !s.is_empty() => Some(SequenceId::Str(s.clone())),
        _ => None,
    }
}
