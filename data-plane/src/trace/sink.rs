//! Where finished traces go: a writer thread for Triton's trace file, or the OpenTelemetry
//! exporter task. Both take traces through a bounded queue without waiting, so a slow disk or
//! collector never slows a request down; a trace that finds the queue full is dropped and
//! counted.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use super::record::Finished;

/// The process's trace sink; cloning shares it.
#[derive(Debug, Clone)]
pub enum Sink {
    /// Triton mode: to the trace file's writer thread.
    File(crossbeam_channel::Sender<Finished>, Arc<AtomicU64>),
    /// OpenTelemetry mode: to the exporter task.
    Otel(tokio::sync::mpsc::Sender<Finished>, Arc<AtomicU64>),
    /// No destination configured (Triton mode without `--trace-config triton,file=`), so no
    /// request is ever sampled.
    None,
}

impl Sink {
    /// Hands a finished trace over without waiting.
    pub fn submit(&self, trace: Finished) {
        let dropped = match self {
            Self::File(tx, dropped) => tx.try_send(trace).is_err().then_some(dropped),
            Self::Otel(tx, dropped) => tx.try_send(trace).is_err().then_some(dropped),
            Self::None => None,
        };
        if let Some(dropped) = dropped {
            // One line for the first drop and then every thousandth, not one per request.
            if dropped.fetch_add(1, Ordering::Relaxed).is_multiple_of(1000) {
                tracing::warn!("trace queue full or its writer stopped: traces dropped");
            }
        }
    }
}
