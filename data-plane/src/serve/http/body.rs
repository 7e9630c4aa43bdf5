//! A response body made of several `Bytes` chunks sent as they are (JSON header, then each
//! binary output's own buffer), so outputs are never concatenated into a new allocation.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

/// Chunks with an exact total length, so the response still carries `Content-Length`.
pub struct ChunkedBytes {
    chunks: VecDeque<Bytes>,
    remaining: u64,
}

impl ChunkedBytes {
    /// A body of these chunks in order.
    pub fn new(chunks: Vec<Bytes>) -> Self {
        let remaining = chunks.iter().map(|c| c.len() as u64).sum();
        Self { chunks: chunks.into_iter().filter(|c| !c.is_empty()).collect(), remaining }
    }
}

impl Body for ChunkedBytes {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        match self.chunks.pop_front() {
            Some(chunk) => {
                self.remaining -= chunk.len() as u64;
                Poll::Ready(Some(Ok(Frame::data(chunk))))
            }
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.chunks.is_empty()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.remaining)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[tokio::test]
    async fn chunks_arrive_in_order_with_an_exact_length() {
        let body = ChunkedBytes::new(vec![Bytes::from_static(b"{}"), Bytes::new(), Bytes::from_static(b"ab")]);
        assert_eq!(body.size_hint().exact(), Some(4));
        let collected = body.collect().await.expect("infallible").to_bytes();
        assert_eq!(collected.as_ref(), b"{}ab");
    }
}
