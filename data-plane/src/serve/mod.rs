//! The serving layer: the KServe v2 HTTP and gRPC endpoints, the Prometheus endpoint, and the
//! listeners and connection handling under them (`net`), in front of the engine. `tessera serve`
//! runs it alone; `tessera worker` runs it with authentication and its usage meter as the facade's
//! usage hook.

pub mod capture;
pub mod exposition;
pub mod facade;
pub mod grpc;
pub mod http;
pub mod metrics;
pub mod net;
pub mod server;
pub mod shared_memory;
pub mod tenant_gate;
