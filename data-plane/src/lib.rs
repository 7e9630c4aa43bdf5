//! Tessera's data plane: the model repository, ONNX Runtime backend, and the KServe v2 HTTP and
//! gRPC inference servers behind `tessera serve`.

pub mod accept;
pub mod auth;
pub mod backend;
pub mod bench;
pub mod busy_poll;
pub mod error;
pub mod grpc;
pub mod http;
pub mod infer;
pub mod listen;
pub mod manager;
pub mod metrics;
pub mod model;
pub mod model_spec;
pub mod onnx_builder;
pub mod priority;
pub mod repository;
pub mod rewake;
pub mod runner;
pub mod scheduler;
pub mod server;
pub mod stats;
pub mod tensor;
pub mod usage;
pub mod worker;

pub use server::{BoundAddrs, ServeConfig, run};
