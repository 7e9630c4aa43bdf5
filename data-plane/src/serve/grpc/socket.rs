//! A gRPC connection's socket, buffered so that one request and one response cost about one
//! `recv` and one `send` each.
//!
//! h2 reads through an 8 KiB buffer, so an 8 KiB request arrives in two or three `recv`s. On
//! the way out, h2 keeps a DATA frame of 256 bytes or more aside (to write it vectored) and
//! must flush it before it can queue the next frame, so a unary response's DATA frame and its
//! trailers leave in two `send`s, and the client wakes twice. This socket reads ahead into its
//! own buffer, and tells h2 it has no vectored writes, which makes h2 copy DATA frames up to
//! 1 KiB into its frame buffer next to the trailers (one `send`); the pieces of larger frames
//! are gathered here until h2 flushes.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Bytes read from the kernel at once (a few 8 KiB requests).
const READ_AHEAD: usize = 32 * 1024;
/// Writes up to this size are gathered until the flush; larger ones go out at once (with
/// what was gathered before them, in one vectored write).
const GATHER_LIMIT: usize = 16 * 1024;

/// A TCP stream with read-ahead and write gathering (see the module docs).
pub struct Socket {
    inner: TcpStream,
    /// Read-ahead; `read_buf[read_pos..read_end]` is not yet handed to h2. Allocated on the
    /// first read that needs it.
    read_buf: Box<[u8]>,
    read_pos: usize,
    read_end: usize,
    /// Written by h2, not yet sent.
    pending: Vec<u8>,
}

impl Socket {
    /// Wraps an accepted stream.
    pub fn new(inner: TcpStream) -> Self {
        Self { inner, read_buf: Box::default(), read_pos: 0, read_end: 0, pending: Vec::new() }
    }

    /// Sends what was gathered; Ready once all of it is in the kernel.
    fn poll_send_pending(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let mut sent = 0;
        while sent < self.pending.len() {
            match Pin::new(&mut self.inner).poll_write(cx, &self.pending[sent..]) {
                Poll::Ready(Ok(0)) => {
                    self.pending.drain(..sent);
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                Poll::Ready(Ok(n)) => sent += n,
                Poll::Ready(Err(e)) => {
                    self.pending.drain(..sent);
                    return Poll::Ready(Err(e));
                }
                Poll::Pending => {
                    self.pending.drain(..sent);
                    return Poll::Pending;
                }
            }
        }
        self.pending.clear();
        Poll::Ready(Ok(()))
    }
}

impl Connected for Socket {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> TcpConnectInfo {
        self.inner.connect_info()
    }
}

impl AsyncRead for Socket {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if this.read_pos == this.read_end {
            // A caller with room for a whole read-ahead gets the bytes directly.
            if buf.remaining() >= READ_AHEAD {
                return Pin::new(&mut this.inner).poll_read(cx, buf);
            }
            if this.read_buf.is_empty() {
                this.read_buf = vec![0; READ_AHEAD].into_boxed_slice();
            }
            let mut ahead = ReadBuf::new(&mut this.read_buf);
            ready!(Pin::new(&mut this.inner).poll_read(cx, &mut ahead))?;
            (this.read_pos, this.read_end) = (0, ahead.filled().len());
            if this.read_end == 0 {
                return Poll::Ready(Ok(())); // end of stream
            }
        }
        let n = buf.remaining().min(this.read_end - this.read_pos);
        buf.put_slice(&this.read_buf[this.read_pos..this.read_pos + n]);
        this.read_pos += n;
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Socket {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if this.pending.len() + data.len() <= GATHER_LIMIT {
            this.pending.extend_from_slice(data);
            return Poll::Ready(Ok(data.len()));
        }
        // Too large to gather: send what is pending and as much of `data` as the kernel takes.
        loop {
            if this.pending.is_empty() {
                return Pin::new(&mut this.inner).poll_write(cx, data);
            }
            let slices = [IoSlice::new(&this.pending), IoSlice::new(data)];
            let n = ready!(Pin::new(&mut this.inner).poll_write_vectored(cx, &slices))?;
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            if n >= this.pending.len() {
                let of_data = n - this.pending.len();
                this.pending.clear();
                if of_data > 0 {
                    return Poll::Ready(Ok(of_data));
                }
            } else {
                this.pending.drain(..n);
            }
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_send_pending(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        // h2 then copies DATA frames under 1 KiB next to the frame that follows (see above).
        false
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    use super::*;

    async fn pair() -> (Socket, TcpStream) {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (client, accepted) = tokio::join!(TcpStream::connect(addr), listener.accept());
        (Socket::new(accepted.expect("accept").0), client.expect("connect"))
    }

    #[tokio::test]
    async fn small_writes_leave_together_at_the_flush() {
        let (mut socket, mut peer) = pair().await;
        socket.write_all(b"header").await.expect("write");
        socket.write_all(b" and trailers").await.expect("write");
        assert_eq!(socket.pending, b"header and trailers");
        socket.flush().await.expect("flush");
        assert!(socket.pending.is_empty());
        let mut got = vec![0; 19];
        peer.read_exact(&mut got).await.expect("read");
        assert_eq!(got, b"header and trailers");
    }

    #[tokio::test]
    async fn large_writes_keep_their_order_behind_gathered_bytes() {
        let (mut socket, mut peer) = pair().await;
        let big: Vec<u8> = (0..3 * GATHER_LIMIT).map(|i| (i % 251) as u8).collect();
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            peer.read_to_end(&mut got).await.expect("read");
            got
        });
        socket.write_all(b"head").await.expect("write");
        socket.write_all(&big).await.expect("write");
        socket.write_all(b"tail").await.expect("write");
        socket.shutdown().await.expect("shutdown");
        let got = reader.await.expect("join");
        assert_eq!(&got[..4], b"head");
        assert_eq!(&got[4..4 + big.len()], &big[..]);
        assert_eq!(&got[4 + big.len()..], b"tail");
    }

    #[tokio::test]
    async fn reads_ahead_and_hands_out_in_the_callers_steps() {
        let (mut socket, mut peer) = pair().await;
        let sent: Vec<u8> = (0..20_000u32).map(|i| (i % 253) as u8).collect();
        peer.write_all(&sent).await.expect("write");
        drop(peer);
        let mut got = Vec::new();
        let mut step = [0u8; 8192];
        loop {
            let n = socket.read(&mut step).await.expect("read");
            if n == 0 {
                break;
            }
            got.extend_from_slice(&step[..n]);
        }
        assert_eq!(got, sent);
    }
}
