//! Tessera's data plane: the model repository, ONNX Runtime backend, and the KServe v2 HTTP and
//! gRPC inference servers behind `tessera serve`.

pub mod accept;
pub mod auth;
pub mod bench;
pub mod busy_poll;
pub mod engine;
pub mod error;
pub mod grpc;
pub mod http;
pub mod listen;
pub mod metrics;
pub mod onnx_builder;
pub mod rewake;
pub mod runner;
pub mod server;
pub mod usage;
pub mod worker;

pub use server::{BoundAddrs, ServeConfig, run};
