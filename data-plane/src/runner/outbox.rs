//! Writing frames to a runner's socket from many tasks without a writer-task hop.
//!
//! A sender appends its frame under a short lock and, when nothing is waiting to be flushed,
//! writes it straight to the non-blocking socket from its own task: at low load a call costs
//! one `write`, no task wake-up. Whatever the socket does not take now (a full buffer, a large
//! tensor) is left to the flush task, which waits for the socket to be writable; later senders
//! then only append, so frames never interleave.

use std::sync::Arc;

use bytes::{Buf, BytesMut};
use parking_lot::Mutex;
use tokio::net::UnixStream;
use tokio::sync::Notify;

/// Frames waiting for the socket.
#[derive(Default)]
struct Pending {
    buf: BytesMut,
    /// The flush task owns the writing until `buf` is empty.
    flushing: bool,
    /// The socket failed; nothing more is sent.
    broken: bool,
}

/// The write half of a runner connection, shared by every sender.
pub struct Outbox {
    stream: Arc<UnixStream>,
    /// Senders append under it; held only for an append and one non-blocking write.
    pending: Mutex<Pending>,
    /// Senders notify when they leave bytes behind; the flush task waits on it.
    wake: Notify,
}

impl Outbox {
    /// An outbox over `stream`; start [`Outbox::flush_task`] beside it.
    pub fn new(stream: Arc<UnixStream>) -> Arc<Self> {
        Arc::new(Self { stream, pending: Mutex::new(Pending::default()), wake: Notify::new() })
    }

    /// Appends one frame written by `encode` and sends what the socket takes now. Returns
    /// false when the connection is broken (the frame is dropped).
    pub fn send(&self, encode: impl FnOnce(&mut BytesMut)) -> bool {
        let mut p = self.pending.lock();
        if p.broken {
            return false;
        }
        encode(&mut p.buf);
        if p.flushing {
            return true;
        }
        while !p.buf.is_empty() {
            match self.stream.try_write(&p.buf) {
                Ok(n) => p.buf.advance(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    p.flushing = true;
                    self.wake.notify_one();
                    break;
                }
                Err(_) => {
                    p.broken = true;
                    p.buf.clear();
                    return false;
                }
            }
        }
        true
    }

    /// Marks the connection broken: later sends are refused.
    pub fn close(&self) {
        let mut p = self.pending.lock();
        p.broken = true;
        p.buf.clear();
        drop(p);
        self.wake.notify_one();
    }

    /// Writes what senders left behind whenever the socket can take it; ends when the
    /// connection breaks or closes.
    pub async fn flush_task(self: Arc<Self>) {
        loop {
            self.wake.notified().await;
            loop {
                if self.pending.lock().broken {
                    return;
                }
                if self.stream.writable().await.is_err() {
                    self.close();
                    return;
                }
                let mut p = self.pending.lock();
                match self.stream.try_write(&p.buf) {
                    Ok(n) => p.buf.advance(n),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(_) => {
                        drop(p);
                        self.close();
                        return;
                    }
                }
                if p.buf.is_empty() {
                    p.flushing = false;
                    break;
                }
            }
        }
    }
}
