//! Wire protocol of Tessera: the KServe v2 / Triton gRPC service and model
//! configuration protobufs (generated with prost + tonic), the gRPC health
//! service, tensor datatypes, and conversions between Triton's config formats
//! (`config.pbtxt` text format and JSON) and [`inference::ModelConfig`].
//! It also holds what both planes need on the wire below gRPC and HTTP: [`tls`] and the bounds
//! on stalled peers ([`stall`]), and the
//! contracts both planes read: credentials ([`auth`]) and their revocation ([`revocation`]), the model-archive layout
//! ([`archive`]) and the replica, deployment and version states ([`states`]).

pub mod archive;
pub mod auth;
pub mod datatype;
pub mod model_config;
pub mod revocation;
pub mod stall;
pub mod states;
pub mod tls;
pub mod usage;

use std::sync::LazyLock;

pub use datatype::{DataType, ShapeError, element_count};
pub use model_config::ConfigFormatError;

/// Generated types of the `inference` package (Triton's `GRPCInferenceService` and `ModelConfig`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod inference {
    include!(concat!(env!("OUT_DIR"), "/inference.rs"));
}

/// Generated types of the standard `grpc.health.v1` health-checking service.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod health {
    include!(concat!(env!("OUT_DIR"), "/grpc.health.v1.rs"));
}

/// Generated types of Tessera's control plane <-> worker agent protocol (`tessera.agent.v1`).
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod agent {
    include!(concat!(env!("OUT_DIR"), "/tessera.agent.v1.rs"));
}

/// How a worker's reason for a failed replica starts when the runner process hosting it keeps
/// dying (a crash loop); the control plane then places the replica on another worker.
pub const CRASH_LOOP_REASON: &str = "runner crash loop: ";

/// Encoded `FileDescriptorSet` of every proto file in this crate.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/file_descriptor_set.bin"));

static DESCRIPTOR_POOL: LazyLock<prost_reflect::DescriptorPool> = LazyLock::new(|| {
    prost_reflect::DescriptorPool::decode(FILE_DESCRIPTOR_SET)
        .expect("the descriptor set is produced by protox at build time and is always valid")
});

/// Reflection pool over this crate's protobuf definitions.
pub fn descriptor_pool() -> &'static prost_reflect::DescriptorPool {
    &DESCRIPTOR_POOL
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_describes_the_triton_services() {
        let pool = descriptor_pool();
        let service = pool.get_service_by_name("inference.GRPCInferenceService").expect("service is compiled in");
        assert_eq!(service.methods().len(), 20);
        let stream = service.methods().find(|m| m.name() == "ModelStreamInfer").expect("ModelStreamInfer exists");
        assert!(stream.is_client_streaming() && stream.is_server_streaming());
        assert!(pool.get_service_by_name("grpc.health.v1.Health").is_some());
        assert!(pool.get_message_by_name("inference.ModelConfig").is_some());
    }

    #[test]
    fn generated_code_has_server_and_client() {
        use inference::grpc_inference_service_client::GrpcInferenceServiceClient;
        use inference::grpc_inference_service_server::GrpcInferenceServiceServer;
        fn is_type<T>() {}
        is_type::<GrpcInferenceServiceClient<tonic::transport::Channel>>();
        is_type::<health::health_server::HealthServer<()>>();
        let _ = GrpcInferenceServiceServer::<()>::from_arc;
        assert_eq!(health::health_check_response::ServingStatus::ServiceUnknown as i32, 3);
    }

    #[test]
    fn raw_contents_round_trip_on_the_wire() {
        use prost::Message as _;
        let request = inference::ModelInferRequest {
            model_name: "m".into(),
            raw_input_contents: vec![bytes::Bytes::from_static(&[1, 2, 3])],
            ..Default::default()
        };
        let encoded = request.encode_to_vec();
        // Field 1 (model_name, length-delimited) then field 7 (raw_input_contents).
        assert_eq!(&encoded[..3], &[0x0a, 0x01, b'm']);
        assert_eq!(encoded[3], (7 << 3) | 2);
        let decoded = inference::ModelInferRequest::decode(encoded.as_slice()).expect("our own encoding decodes");
        assert_eq!(decoded, request);
    }
}
