//! The closed sets of states the control plane stores and shows: a replica's, a deployment's
//! and a version's. Each has one wire name (lower case, as stored in the registry and sent in
//! the API), and the OpenAPI document lists them as enums (the `utoipa` feature). A worker
//! reports its replicas' states as the agent protocol's enum; [`ReplicaState::reported`] is
//! what each means here.
//!
//! A deployment's and a version's state are derived from the replicas, never stored a second
//! time: [`VersionState::of`] says how for a version, and the control plane's
//! `deployments::state::deployment_state` for a deployment (it needs the deployment's rows).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::agent;

/// Defines `as_str`, `ALL`, `Display`, `FromStr` and `TryFrom<String>` (registry rows decode
/// through it) for a state enum from its variants' wire names.
macro_rules! wire_names {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every state, in lifecycle order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The wire (and stored) name.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $ty {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, String> {
                Self::ALL
                    .iter()
                    .copied()
                    .find(|v| v.as_str() == s)
                    .ok_or_else(|| format!("unknown {} '{s}'", stringify!($ty)))
            }
        }

        impl TryFrom<String> for $ty {
            type Error = String;

            fn try_from(s: String) -> Result<Self, String> {
                s.parse()
            }
        }
    };
}

/// Where a replica is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum ReplicaState {
    /// No slice can take it yet (`reason` says why).
    Pending,
    /// Placed on a worker's slice; the worker has not started loading it.
    Scheduled,
    /// Its worker is loading the model.
    Loading,
    /// Loaded and answering requests.
    Ready,
    /// The load or the runner failed (`reason` says why); it serves nothing.
    Failed,
    /// Replaced: finishing its requests before it is removed.
    Draining,
}

wire_names!(ReplicaState {
    Pending => "pending",
    Scheduled => "scheduled",
    Loading => "loading",
    Ready => "ready",
    Failed => "failed",
    Draining => "draining",
});

impl ReplicaState {
    /// Whether a replica in this state with the scheduler's `serving` flag set takes
    /// unversioned requests: only a ready one does. The flag is the scheduler's intent (it
    /// stays set while a serving replica fails and is moved); what is shown is this.
    pub fn serves(self, serving_flag: bool) -> bool {
        serving_flag && self == ReplicaState::Ready
    }

    /// The stored state a worker's report stands for; `None` for what is not stored from a
    /// report (`draining` is the control plane's decision, never a worker's, and unknown values).
    pub fn reported(state: i32) -> Option<Self> {
        match agent::ReplicaState::try_from(state).ok()? {
            agent::ReplicaState::Loading => Some(ReplicaState::Loading),
            agent::ReplicaState::Ready => Some(ReplicaState::Ready),
            agent::ReplicaState::Failed => Some(ReplicaState::Failed),
            agent::ReplicaState::Draining | agent::ReplicaState::Unspecified => None,
        }
    }
}

impl agent::LoadFailureKind {
    /// The word a failed replica's reason starts with; `None` when the worker named no kind.
    pub fn word(self) -> Option<&'static str> {
        match self {
            agent::LoadFailureKind::Unspecified => None,
            agent::LoadFailureKind::Fetch => Some("fetch"),
            agent::LoadFailureKind::Artifact => Some("artifact"),
            agent::LoadFailureKind::Configuration => Some("configuration"),
            agent::LoadFailureKind::Runtime => Some("runtime"),
            agent::LoadFailureKind::Resources => Some("resources"),
        }
    }
}

/// A failed replica's reason as stored and shown: the worker's words after the kind of failure
/// it reported (`configuration: output 'x' has no valid data_type`), or alone when it named
/// none (an older worker, a runner in a crash loop) or an unknown one.
pub fn failure_reason(kind: i32, reason: &str) -> String {
    match agent::LoadFailureKind::try_from(kind).ok().and_then(agent::LoadFailureKind::word) {
        Some(word) => format!("{word}: {reason}"),
        None => reason.to_string(),
    }
}

/// A deployment's state, from its stable replicas of the target version.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum DeploymentState {
    /// A replica cannot be placed yet, or none exists yet.
    Pending,
    /// Replicas are being placed, loaded or switched to.
    Progressing,
    /// Every wanted replica is ready and serving (or none are wanted).
    Ready,
    /// A replica of the target failed.
    Failed,
}

wire_names!(DeploymentState {
    Pending => "pending",
    Progressing => "progressing",
    Ready => "ready",
    Failed => "failed",
});

/// What a model version is doing, derived from the replicas that run it (ordered: a version
/// is in the furthest state any of its replicas puts it in).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum VersionState {
    /// Stored and checked; no replica runs it.
    Uploaded,
    /// Replicas of it are placed or loading (or failed, or draining), none serving.
    Deployed,
    /// A ready replica of it takes requests.
    Serving,
}

wire_names!(VersionState {
    Uploaded => "uploaded",
    Deployed => "deployed",
    Serving => "serving",
});

impl VersionState {
    /// The state of a version run by `replicas` (each replica's state and `serving` flag).
    pub fn of(replicas: impl IntoIterator<Item = (ReplicaState, bool)>) -> Self {
        replicas.into_iter().fold(VersionState::Uploaded, |state, (r, serving)| {
            if r.serves(serving) { VersionState::Serving } else { state.max(VersionState::Deployed) }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failure_reasons_name_the_kind_the_worker_reported() {
        let configuration = agent::LoadFailureKind::Configuration as i32;
        assert_eq!(failure_reason(configuration, "bad"), "configuration: bad");
        assert_eq!(failure_reason(agent::LoadFailureKind::Fetch as i32, "down"), "fetch: down");
        assert_eq!(failure_reason(0, "crash loop"), "crash loop", "unspecified adds nothing");
        assert_eq!(failure_reason(99, "newer worker"), "newer worker", "an unknown kind adds nothing");
    }

    #[test]
    fn wire_names_round_trip_and_match_serde() {
        for s in ReplicaState::ALL {
            assert_eq!(s.as_str().parse::<ReplicaState>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
        for s in DeploymentState::ALL {
            assert_eq!(s.as_str().parse::<DeploymentState>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
        for s in VersionState::ALL {
            assert_eq!(s.as_str().parse::<VersionState>(), Ok(*s));
            assert_eq!(serde_json::to_value(s).unwrap(), serde_json::json!(s.as_str()));
        }
        assert_eq!("weird".parse::<ReplicaState>(), Err("unknown ReplicaState 'weird'".to_string()));
        assert!(ReplicaState::try_from(String::from("Ready")).is_err(), "names are exact");
    }

    #[test]
    fn only_a_ready_replica_serves() {
        assert!(ReplicaState::Ready.serves(true));
        assert!(!ReplicaState::Ready.serves(false));
        for s in ReplicaState::ALL.iter().filter(|s| **s != ReplicaState::Ready) {
            assert!(!s.serves(true), "{s} with the serving flag set");
        }
    }

    #[test]
    fn a_version_serves_once_a_ready_serving_replica_runs_it() {
        use ReplicaState::*;
        assert_eq!(VersionState::of([]), VersionState::Uploaded);
        assert_eq!(VersionState::of([(Loading, false), (Scheduled, false)]), VersionState::Deployed);
        assert_eq!(VersionState::of([(Failed, true)]), VersionState::Deployed, "a failed replica serves nothing");
        assert_eq!(VersionState::of([(Ready, false)]), VersionState::Deployed, "ready, not switched to yet");
        assert_eq!(VersionState::of([(Loading, false), (Ready, true), (Failed, true)]), VersionState::Serving);
        assert_eq!(VersionState::of([(Ready, true), (Draining, false)]), VersionState::Serving);
    }
}
