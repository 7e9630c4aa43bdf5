//! Bounds on waits for a peer that stops taking part: a client that reads none of its answer
//! (reliability.md F10, slow read), or a worker that stops sending one. Both planes' listeners
//! and the gateway use them.
//!
//! They suit waits that usually end at once (a write the socket takes, the rest of an answer
//! already read): such a wait arms no timer, and only a peer that makes one go on costs one,
//! which its [`Stall`] keeps for its next wait. A request body, whose first frame a call
//! usually does wait for, is watched by its connection's coarser clock instead (the data
//! plane's `serve::net::body_clock`), which costs a waiting call no timer at all.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// How long a client may take none of its answer before its connection is closed (nginx's
/// `send_timeout` rule: measured between two writes, not over the whole answer).
pub const ANSWER_STALL: Duration = Duration::from_secs(30);

/// A timer for one thing that waits again and again (a connection's writes, a body's frames):
/// elapsed once a wait has gone on for `limit` with no progress between.
#[derive(Debug)]
pub struct Stall {
    limit: Duration,
    /// Made on the first wait that did not end at once.
    timer: Option<Pin<Box<Sleep>>>,
    /// Whether the timer is counting down the wait in progress.
    waiting: bool,
}

impl Stall {
    /// A timer for waits of at most `limit`.
    pub fn new(limit: Duration) -> Self {
        Self { limit, timer: None, waiting: false }
    }

    /// The longest wait.
    pub fn limit(&self) -> Duration {
        self.limit
    }

    /// Called when the thing waited for is not ready: `Ready` once it has not been through
    /// `limit`, else `Pending` with `cx` woken when it will have been.
    fn poll_elapsed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        let limit = self.limit;
        if !std::mem::replace(&mut self.waiting, true) {
            let deadline = Instant::now() + limit;
            match self.timer.as_mut() {
                Some(timer) => timer.as_mut().reset(deadline),
                None => self.timer = Some(Box::pin(tokio::time::sleep_until(deadline))),
            }
        }
        match self.timer.as_mut() {
            Some(timer) => timer.as_mut().poll(cx),
            None => Poll::Pending,
        }
    }

    /// Called when the thing waited for made progress: the next wait starts afresh.
    fn progressed(&mut self) {
        self.waiting = false;
    }

    /// Polls `poll` under this timer: its value, or `None` once it has waited `limit`.
    pub fn poll<T>(&mut self, cx: &mut Context<'_>, poll: Poll<T>) -> Poll<Option<T>> {
        match poll {
            Poll::Ready(value) => {
                self.progressed();
                Poll::Ready(Some(value))
            }
            Poll::Pending => self.poll_elapsed(cx).map(|()| None),
        }
    }
}

/// A connection whose writes fail with `TimedOut` once one has waited its [`Stall`]'s limit
/// with nothing taken: hyper, which serves the listeners, has no bound of its own on a client
/// that stops reading, and would hold the connection, and the answer it buffers, for as long as
/// the client keeps it open. Reads pass through.
#[derive(Debug)]
pub struct WriteStall<IO> {
    io: IO,
    stall: Stall,
}

impl<IO> WriteStall<IO> {
    /// `io` whose writes may each wait at most `limit`.
    pub fn new(io: IO, limit: Duration) -> Self {
        Self { io, stall: Stall::new(limit) }
    }

    /// The longest a write may wait.
    pub fn limit(&self) -> Duration {
        self.stall.limit()
    }

    /// The connection inside.
    pub fn into_inner(self) -> IO {
        self.io
    }

    /// `polled`, or `TimedOut` once its wait went on too long.
    fn bounded<T>(&mut self, cx: &mut Context<'_>, polled: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let limit = self.stall.limit();
        self.stall.poll(cx, polled).map(|done| {
            done.unwrap_or_else(|| {
                tracing::debug!(stall_s = limit.as_secs_f64(), "a client took none of its answer; connection closed");
                Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the client took none of its answer for {} s", limit.as_secs()),
                ))
            })
        })
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for WriteStall<IO> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for WriteStall<IO> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write(cx, buf);
        this.bounded(cx, polled)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_write_vectored(cx, bufs);
        this.bounded(cx, polled)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_flush(cx);
        this.bounded(cx, polled)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.io).poll_shutdown(cx);
        this.bounded(cx, polled)
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_wait_that_makes_progress_starts_afresh_and_one_that_does_not_ends() {
        let mut stall = Stall::new(Duration::from_secs(30));
        let mut cx = Context::from_waker(std::task::Waker::noop());
        // Ready at once: no timer.
        assert_eq!(stall.poll(&mut cx, Poll::Ready(1)), Poll::Ready(Some(1)));
        assert!(stall.timer.is_none(), "a wait that ended at once armed a timer");
        // Waits of 20 s each, with progress between, never elapse.
        for _ in 0..5 {
            assert_eq!(stall.poll(&mut cx, Poll::<()>::Pending), Poll::Pending);
            tokio::time::advance(Duration::from_secs(20)).await;
            assert_eq!(stall.poll(&mut cx, Poll::<()>::Pending), Poll::Pending, "elapsed within a wait of 20 s");
            assert_eq!(stall.poll(&mut cx, Poll::Ready(())), Poll::Ready(Some(())));
        }
        // A wait of 30 s with nothing between does.
        assert_eq!(stall.poll(&mut cx, Poll::<()>::Pending), Poll::Pending);
        tokio::time::advance(Duration::from_secs(29)).await;
        assert_eq!(stall.poll(&mut cx, Poll::<()>::Pending), Poll::Pending);
        tokio::time::advance(Duration::from_secs(1)).await;
        assert_eq!(stall.poll(&mut cx, Poll::<()>::Pending), Poll::Ready(None));
    }

    #[tokio::test]
    async fn a_write_nobody_reads_fails_after_the_limit_and_one_read_slowly_does_not() {
        let limit = Duration::from_millis(200);
        // A peer that reads nothing: the pipe fills, and the write fails after the limit.
        let (near, _far) = tokio::io::duplex(4096);
        let mut near = WriteStall::new(near, limit);
        let started = std::time::Instant::now();
        let e = near.write_all(&[0u8; 64 << 10]).await.expect_err("a write nobody read succeeded");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(e.to_string().contains("took none of its answer"), "{e}");
        let waited = started.elapsed();
        assert!(waited >= limit && waited < Duration::from_secs(5), "failed after {waited:?}");

        // A peer that reads a little every quarter of a longer limit: the whole answer goes
        // through, though it took longer than the limit.
        let limit = Duration::from_millis(400);
        let (near, mut far) = tokio::io::duplex(4096);
        let mut near = WriteStall::new(near, limit);
        let reader = tokio::spawn(async move {
            let (mut seen, mut piece) = (0, [0u8; 8192]);
            loop {
                tokio::time::sleep(limit / 4).await;
                match far.read(&mut piece).await {
                    Ok(0) | Err(_) => return seen,
                    Ok(n) => seen += n,
                }
            }
        });
        near.write_all(&[1u8; 24 << 10]).await.expect("a slowly read write failed");
        drop(near);
        assert_eq!(reader.await.expect("reader"), 24 << 10);
    }
}
