//! The states the control plane stores and shows. A replica's, a deployment's and a version's
//! are the contract with the workers and live in [`tessera_protocol::states`]; a worker's
//! liveness is the control plane's own.

pub use tessera_protocol::states::{DeploymentState, ReplicaState, VersionState};

use crate::kinds::wire_enum;

wire_enum! {
    /// Whether a worker is heard from.
    pub enum WorkerState {
        /// It sends heartbeats.
        Ready = "ready",
        /// No heartbeat for `--worker-lost-after-ms`: its replicas are placed elsewhere.
        Lost = "lost",
    }
}
