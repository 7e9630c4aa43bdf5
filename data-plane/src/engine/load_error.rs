//! Why a model version could not be loaded or installed, by kind.
//!
//! The message is the text users see (`tessera serve`'s repository index shows it unchanged,
//! as Triton would); the kind is for the worker, whose reconcile loop decides from it whether
//! and when to try again, and for the control plane, whose replica reasons and deployment
//! events name it.

use std::fmt;

/// What went wrong, as far as trying again is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LoadErrorKind {
    /// Something the version needs is not here yet: its artifact (a download failed, the
    /// control plane is unreachable) or, for an ensemble, a composing model still loading.
    /// Transient.
    Fetch,
    /// The artifact itself is bad: its sha256 or size does not match, the archive cannot be
    /// unpacked or holds no model. Worth one fresh fetch, then permanent.
    Artifact,
    /// The configuration cannot work: an invalid config, a config that does not match the
    /// graph, `KIND_GPU` without a GPU or without ONNX Runtime's GPU providers. Permanent until
    /// the version or its config changes.
    Configuration,
    /// ONNX Runtime could not create a session from the graph (or run its warmup). Permanent
    /// for this version.
    Runtime,
    /// Not enough of something right now: memory, the slice's capacity, GPU memory, disk, a
    /// runner process. Transient.
    Resources,
}

impl LoadErrorKind {
    /// Every kind, in declaration order.
    pub const ALL: [LoadErrorKind; 5] =
        [Self::Fetch, Self::Artifact, Self::Configuration, Self::Runtime, Self::Resources];

    /// The lower-case word replica reasons and events start with.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Fetch => "fetch",
            Self::Artifact => "artifact",
            Self::Configuration => "configuration",
            Self::Runtime => "runtime",
            Self::Resources => "resources",
        }
    }
}

impl fmt::Display for LoadErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A failed load or install: its kind and the message users see.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct LoadError {
    /// What went wrong, for the retry policy.
    pub kind: LoadErrorKind,
    /// Why, in words (no kind prefix).
    pub message: String,
}

impl LoadError {
    /// An error of `kind`.
    pub fn new(kind: LoadErrorKind, message: impl Into<String>) -> Self {
        Self { kind, message: message.into() }
    }

    /// A [`LoadErrorKind::Fetch`] error.
    pub fn fetch(message: impl Into<String>) -> Self {
        Self::new(LoadErrorKind::Fetch, message)
    }

    /// A [`LoadErrorKind::Artifact`] error.
    pub fn artifact(message: impl Into<String>) -> Self {
        Self::new(LoadErrorKind::Artifact, message)
    }

    /// A [`LoadErrorKind::Configuration`] error.
    pub fn configuration(message: impl Into<String>) -> Self {
        Self::new(LoadErrorKind::Configuration, message)
    }

    /// A [`LoadErrorKind::Runtime`] error.
    pub fn runtime(message: impl Into<String>) -> Self {
        Self::new(LoadErrorKind::Runtime, message)
    }

    /// A [`LoadErrorKind::Resources`] error.
    pub fn resources(message: impl Into<String>) -> Self {
        Self::new(LoadErrorKind::Resources, message)
    }

    /// A failure ONNX Runtime reported while creating or warming a session: running out of
    /// memory (host or GPU) is [`LoadErrorKind::Resources`], anything else
    /// [`LoadErrorKind::Runtime`].
    pub fn from_runtime(message: impl Into<String>) -> Self {
        let message = message.into();
        let lower = message.to_ascii_lowercase();
        let exhausted = OUT_OF_MEMORY.iter().any(|m| lower.contains(m));
        Self::new(if exhausted { LoadErrorKind::Resources } else { LoadErrorKind::Runtime }, message)
    }

    /// `<kind>: <message>`, as replica reasons say it.
    pub fn reason(&self) -> String {
        format!("{}: {}", self.kind, self.message)
    }
}

/// How ONNX Runtime, CUDA and the allocators say memory ran out (lower case).
const OUT_OF_MEMORY: &[&str] = &[
    "out of memory",
    "failed to allocate memory",
    "bad_alloc",
    "cuda_error_out_of_memory",
    "cudaerrormemoryallocation",
    "cublas_status_alloc_failed",
    "cudnn_status_alloc_failed",
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_is_what_users_see_and_the_reason_names_the_kind() {
        let e = LoadError::configuration("output 'x' has no valid data_type");
        assert_eq!(e.to_string(), "output 'x' has no valid data_type");
        assert_eq!(e.reason(), "configuration: output 'x' has no valid data_type");
        let words: Vec<&str> = LoadErrorKind::ALL.iter().map(|k| k.as_str()).collect();
        assert_eq!(words, ["fetch", "artifact", "configuration", "runtime", "resources"]);
    }

    #[test]
    fn runtime_failures_that_ran_out_of_memory_are_resources() {
        for oom in [
            "failed to load ONNX model m.onnx with CUDA: CUDA failure 2: out of memory",
            "Failed to allocate memory for requested buffer of size 123",
            "std::bad_alloc",
            "CUDNN_STATUS_ALLOC_FAILED",
        ] {
            assert_eq!(LoadError::from_runtime(oom).kind, LoadErrorKind::Resources, "{oom}");
        }
        let bad = LoadError::from_runtime("failed to load ONNX model m.onnx: Protobuf parsing failed");
        assert_eq!(bad.kind, LoadErrorKind::Runtime);
    }
}
