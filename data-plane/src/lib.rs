//! Tessera's data plane: the model repository, ONNX Runtime backend, and the KServe v2 HTTP and
//! gRPC inference servers behind `tessera serve`, `tessera worker` and `tessera runner`.
//!
//! In wings that show the process model: [`engine`] (models, batchers, instances; no network),
//! [`serve`] (the endpoints and their connections, over the engine), [`worker`] (the control
//! plane's agent and the usage meter), [`runner`] (a tenant's engine in a process of its own),
//! [`gateway`] (one endpoint for every tenant, in front of the workers), [`trace`] (request
//! tracing) and [`tools`]. [`auth`] and [`error`] are shared by the worker and the serving layer.

pub mod auth;
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod gateway;
pub mod logging;
pub mod runner;
pub mod serve;
pub mod spans;
pub mod tools;
pub mod trace;
pub mod worker;

pub use serve::server::{BoundAddrs, ServeConfig, run};
