//! The front's connection to one runner process: numbered calls, answers matched by id.
//!
//! Callers write their frame themselves (through the [`Outbox`]) and wait on a oneshot; one
//! reader task decodes the runner's frames and completes the calls. When the runner dies the
//! socket closes, the reader fails every call still waiting (their callers answer 503 naming
//! the model), and [`RunnerConn::closed`] resolves for the supervisor.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio_util::sync::CancellationToken;

use super::outbox::Outbox;
use super::shm::FrontShm;
use super::wire::{FromRunner, ToRunner, WireError, split_frame};
use crate::engine::stats::ModelStats;

/// Calls waiting for their answer, by id. The reader removes and completes them.
type Calls = Mutex<HashMap<u64, Waiter>>;

/// Where unasked statistics of each loaded version go; shared by a slot's successive
/// connections, registered by the front's handle of each version.
pub type StatsSinks = Mutex<HashMap<(String, i64), Weak<ModelStats>>>;

/// Who waits for an answer, and where its statistics go.
struct Waiter {
    /// `None` once the caller withdrew: the answer still brings statistics to add.
    reply: Option<oneshot::Sender<FromRunner>>,
    /// The statistics of the version an inference ran on.
    stats: Option<Arc<ModelStats>>,
}

/// Why a call got no answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CallError {
    /// The call never reached the runner: its socket was already broken. Safe to send again
    /// to the runner that replaces it.
    NotSent,
    /// The runner is gone (crashed, killed, or closed its socket) after the call was sent.
    RunnerGone,
}

/// A live connection to a runner.
pub struct RunnerConn {
    outbox: Arc<Outbox>,
    calls: Calls,
    next_id: AtomicU64,
    /// Cancelled when the connection ends, for whatever reason.
    closed: CancellationToken,
    sinks: Arc<StatsSinks>,
    /// The runner's shared-memory arenas, when it has them.
    shm: Option<Arc<FrontShm>>,
}

impl RunnerConn {
    /// Starts the reader and flush tasks over `stream` (large tensors through `shm` when
    /// given); `label` names the runner in logs.
    pub fn start(stream: UnixStream, label: String, sinks: Arc<StatsSinks>, shm: Option<Arc<FrontShm>>) -> Arc<Self> {
        // An idle front thread watches the runner's answers as it watches client connections,
        // so a lone request's answer is picked up without a wake-up.
        crate::serve::net::busy_poll::watch(&stream);
        let stream = Arc::new(stream);
        let outbox = Outbox::new(stream.clone());
        let conn = Arc::new(Self {
            outbox: outbox.clone(),
            calls: Mutex::new(HashMap::new()),
            next_id: AtomicU64::new(1),
            closed: CancellationToken::new(),
            sinks,
            shm,
        });
        tokio::spawn(outbox.flush_task());
        tokio::spawn(reader_task(conn.clone(), stream, label));
        conn
    }

    /// Sends `call` and waits for its answer; an answer's statistics delta is added to `stats`
    /// before the caller sees it (or when a withdrawn inference finishes anyway). Dropping the
    /// future withdraws the call: an inference not yet run is cancelled in the runner.
    pub async fn call(&self, call: &ToRunner, stats: Option<&Arc<ModelStats>>) -> Result<FromRunner, CallError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        self.calls.lock().insert(id, Waiter { reply: Some(tx), stats: stats.cloned() });
        let mut pending = PendingCall { conn: self, id, cancel: matches!(call, ToRunner::Infer(_)) };
        if !self.outbox.send(|buf| call.encode(id, buf, self.shm.as_deref())) {
            pending.cancel = false;
            // The socket is broken: nothing more can go through this connection.
            self.shutdown();
            return Err(CallError::NotSent);
        }
        let answer = rx.await.map_err(|_| CallError::RunnerGone);
        pending.cancel = false;
        answer
    }

    /// Sends a notice nothing answers (frame id 0); false when the socket is broken.
    pub fn notify(&self, notice: &ToRunner) -> bool {
        self.outbox.send(|buf| notice.encode(0, buf, None))
    }

    /// Resolves when the connection has ended.
    pub async fn closed(&self) {
        self.closed.cancelled().await;
    }

    /// Whether the connection has ended.
    pub fn is_closed(&self) -> bool {
        self.closed.is_cancelled()
    }

    /// Ends the connection: the runner sees its socket close and exits.
    pub fn shutdown(&self) {
        self.outbox.close();
        self.fail_all();
    }

    fn fail_all(&self) {
        // Dropping the senders fails every waiting call with RunnerGone.
        self.calls.lock().clear();
        self.closed.cancel();
    }
}

/// A call on its way; dropped early (the client left), it withdraws itself.
struct PendingCall<'a> {
    conn: &'a RunnerConn,
    id: u64,
    cancel: bool,
}

impl Drop for PendingCall<'_> {
    fn drop(&mut self) {
        let mut calls = self.conn.calls.lock();
        if !self.cancel {
            calls.remove(&self.id);
            return;
        }
        // The answer still comes (cancelled or run); keep the entry for its statistics.
        let Some(waiter) = calls.get_mut(&self.id) else { return };
        waiter.reply = None;
        drop(calls);
        let id = self.id;
        self.conn.outbox.send(|buf| ToRunner::Cancel.encode(id, buf, None));
    }
}

/// Reads the runner's frames and completes calls until the socket closes or lies.
async fn reader_task(conn: Arc<RunnerConn>, stream: Arc<UnixStream>, label: String) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let end = loop {
        match read_some(&stream, &mut buf).await {
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) => break Some(e.to_string()),
        }
        if let Err(e) = complete_calls(&conn, &mut buf) {
            break Some(e.to_string());
        }
    };
    match end {
        None => tracing::debug!(runner = %label, "runner connection closed"),
        Some(error) => tracing::warn!(runner = %label, %error, "runner connection failed"),
    }
    conn.outbox.close();
    conn.fail_all();
}

/// Reads what the socket has into `buf`; 0 at end of stream.
pub async fn read_some(stream: &UnixStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    loop {
        stream.readable().await?;
        if buf.capacity() - buf.len() < 16 * 1024 {
            buf.reserve(64 * 1024);
        }
        match stream.try_read_buf(buf) {
            Ok(n) => return Ok(n),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        }
    }
}

fn complete_calls(conn: &RunnerConn, buf: &mut BytesMut) -> Result<(), WireError> {
    while let Some((kind, id, body)) = split_frame(buf)? {
        let answer = FromRunner::decode(kind, body, conn.shm.as_deref())?;
        match &answer {
            FromRunner::Stats { key, version, stats } => {
                let sink = conn.sinks.lock().get(&(key.clone(), *version)).and_then(Weak::upgrade);
                if let Some(sink) = sink {
                    sink.add(stats);
                }
                continue;
            }
            FromRunner::Released => continue,
            _ => {}
        }
        let Some(waiter) = conn.calls.lock().remove(&id) else { continue };
        if let (FromRunner::Answer { stats, .. }, Some(sink)) = (&answer, &waiter.stats) {
            sink.add(stats);
        }
        // A call withdrawn meanwhile has no one waiting; its answer is dropped.
        if let Some(reply) = waiter.reply {
            let _ = reply.send(answer);
        }
    }
    Ok(())
}
