//! A connection's clock for request bodies that stop coming: ticked once an interval (by a
//! timer the connection has anyway, or one per connection), it fails a unary call whose body
//! sends nothing through two ticks, at least one interval and at most two. The gateway's gRPC
//! listener also ends a call whose client takes none of its answer for as long.
//!
//! A timer per call would cost every call, since a call is first polled when its HEADERS
//! arrive, before its DATA frame is read; here a call waiting for its body only registers with
//! the connection's clock, and only while the next piece is not there yet. Without a bound, a
//! client that sends half a body and then nothing holds the call, a stream of its connection
//! and the server's graceful shutdown for ever (a rollout's drain included).

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;
use tokio::sync::futures::OwnedNotified;

/// One connection's clock; see the module's documentation.
#[derive(Debug)]
pub struct BodyClock {
    /// The interval between ticks.
    every: Duration,
    ticks: AtomicU64,
    tick: Arc<Notify>,
}

impl BodyClock {
    /// A clock ticked every `every` (by [`BodyClock::tick`] or [`BodyClock::run`]).
    pub fn new(every: Duration) -> Arc<Self> {
        Arc::new(Self { every, ticks: AtomicU64::new(0), tick: Arc::new(Notify::new()) })
    }

    /// One interval has passed: wakes the bodies waiting for their next piece to look at the clock.
    pub fn tick(&self) {
        self.ticks.fetch_add(1, Ordering::Relaxed);
        self.tick.notify_waiters();
    }

    /// Ticks every interval, for a connection with no timer of its own to tick it; never returns.
    pub async fn run(&self) -> std::convert::Infallible {
        loop {
            tokio::time::sleep(self.every).await;
            self.tick();
        }
    }

    fn now(&self) -> u64 {
        self.ticks.load(Ordering::Relaxed)
    }

    /// Whether a wait that began at tick `began` has gone through two ticks: at least one whole
    /// interval, at most two.
    fn stalled_since(&self, began: u64) -> bool {
        self.now() >= began + 2
    }

    /// `piece` (the next piece of a body), or [`Stalled`] once it has waited through two ticks.
    pub async fn next<F: Future>(&self, piece: F) -> Result<F::Output, Stalled> {
        let began = self.now();
        let mut piece = std::pin::pin!(piece);
        loop {
            // Registered only if the piece is not there yet (polled after it, in this order).
            let tick = self.tick.notified();
            tokio::select! {
                biased;
                next = piece.as_mut() => return Ok(next),
                () = tick => {
                    if self.stalled_since(began) {
                        return Err(Stalled { every: self.every });
                    }
                }
            }
        }
    }

    /// `body`, failing with [`StalledBody`] once it sends nothing through two ticks.
    pub fn watch<B>(self: &Arc<Self>, body: B) -> Watched<B> {
        Watched { inner: body, clock: Some(self.clone()), began: None, waiting: None }
    }
}

/// A body that sent nothing through two ticks of its connection's clock.
#[derive(Debug, Clone, Copy)]
pub struct Stalled {
    every: Duration,
}

impl std::fmt::Display for Stalled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "the request's body sent nothing for {} s or more", self.every.as_secs_f64())
    }
}

impl std::error::Error for Stalled {}

/// The error a [`Watched`] body ends with when it stalls: its message is [`Stalled`]'s, and its
/// source the `tonic::Status` that gRPC's codec finds and answers with (`INVALID_ARGUMENT`, as
/// for any malformed request).
#[derive(Debug)]
pub struct StalledBody(tonic::Status);

impl From<Stalled> for StalledBody {
    fn from(stalled: Stalled) -> Self {
        Self(tonic::Status::invalid_argument(stalled.to_string()))
    }
}

impl std::fmt::Display for StalledBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.0.message())
    }
}

impl std::error::Error for StalledBody {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

pin_project_lite::pin_project! {
    /// A request body watched by its connection's [`BodyClock`].
    pub struct Watched<B> {
        #[pin]
        inner: B,
        clock: Option<Arc<BodyClock>>,
        // The tick at which the body began waiting for its next piece.
        began: Option<u64>,
        #[pin]
        waiting: Option<OwnedNotified>,
    }
}

impl<B> Watched<B> {
    /// `body` as it comes, unwatched (a stream's, which may rightly idle between messages).
    pub fn unwatched(body: B) -> Self {
        Self { inner: body, clock: None, began: None, waiting: None }
    }
}

impl<B> Body for Watched<B>
where
    B: Body<Data = Bytes>,
    B::Error: Into<tonic::codegen::StdError>,
{
    type Data = Bytes;
    type Error = tonic::codegen::StdError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let mut this = self.project();
        if let Poll::Ready(frame) = this.inner.poll_frame(cx) {
            if this.began.take().is_some() {
                this.waiting.set(None);
            }
            return Poll::Ready(frame.map(|f| f.map_err(Into::into)));
        }
        let Some(clock) = this.clock.as_ref() else { return Poll::Pending };
        let began = *this.began.get_or_insert_with(|| clock.now());
        loop {
            let Some(waiting) = this.waiting.as_mut().as_pin_mut() else {
                this.waiting.set(Some(clock.tick.clone().notified_owned()));
                continue;
            };
            if waiting.poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.waiting.set(None);
            if clock.stalled_since(began) {
                let stalled = StalledBody::from(Stalled { every: clock.every });
                return Poll::Ready(Some(Err(Box::new(stalled))));
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt as _;
    use http_body_util::BodyExt as _;

    use super::*;

    /// `clock` ticking on a task of its own, until the task is aborted.
    fn ticking(clock: &Arc<BodyClock>) -> tokio::task::JoinHandle<()> {
        let clock = clock.clone();
        tokio::spawn(async move {
            let never = clock.run().await;
            match never {}
        })
    }

    /// A body fed by a channel, as a connection feeds a call's.
    fn channel_body()
    -> (tokio::sync::mpsc::Sender<Bytes>, impl Body<Data = Bytes, Error = std::convert::Infallible> + Unpin) {
        let (send, receive) = tokio::sync::mpsc::channel::<Bytes>(4);
        let frames = tokio_stream::wrappers::ReceiverStream::new(receive).map(|b| Ok(Frame::data(b)));
        (send, http_body_util::StreamBody::new(frames))
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_sends_nothing_through_two_ticks_fails_and_one_that_keeps_coming_does_not() {
        let clock = BodyClock::new(Duration::from_secs(30));
        let ticking = ticking(&clock);
        let (send, body) = channel_body();
        let mut body = std::pin::pin!(clock.watch(body));
        // A piece every 20 s (never a whole interval without one) for three minutes.
        for _ in 0..9 {
            let sent = send.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(20)).await;
                sent.send(Bytes::from_static(b"x")).await.expect("the body is read");
            });
            let frame = body.frame().await.expect("a frame").expect("not stalled");
            assert_eq!(frame.into_data().expect("data"), Bytes::from_static(b"x"));
        }
        // Then nothing: refused after one to two intervals.
        let waited = tokio::time::Instant::now();
        let refused = body.frame().await.expect("a refusal").expect_err("stalled");
        let elapsed = waited.elapsed();
        assert!((Duration::from_secs(30)..=Duration::from_secs(60)).contains(&elapsed), "{elapsed:?}");
        assert_eq!(refused.to_string(), "the request's body sent nothing for 30 s or more");
        let status = tonic::Status::from_error(refused);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert_eq!(status.message(), "the request's body sent nothing for 30 s or more");
        ticking.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn next_waits_for_a_piece_through_one_tick_and_refuses_after_two() {
        let clock = BodyClock::new(Duration::from_secs(30));
        let ticking = ticking(&clock);
        let slow = tokio::time::sleep(Duration::from_secs(25));
        assert!(clock.next(slow).await.is_ok(), "a piece within the interval is taken");
        let stalled = clock.next(std::future::pending::<()>()).await.expect_err("nothing comes");
        assert_eq!(stalled.to_string(), "the request's body sent nothing for 30 s or more");
        ticking.abort();
    }
}
