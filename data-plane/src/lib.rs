//! Tessera's data plane: the model repository, ONNX Runtime backend, and the KServe v2 HTTP and
//! gRPC inference servers behind `tessera serve`.

pub mod auth;
pub mod engine;
pub mod error;
pub mod runner;
pub mod serve;
pub mod tools;
pub mod worker;

pub use serve::server::{BoundAddrs, ServeConfig, run};
