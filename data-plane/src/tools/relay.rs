//! `tessera bench relay`: a plain TCP relay on the gateway's runtime (one async thread, the same
//! busy-polling) with no HTTP, authentication or routing. What it adds to a request is what one
//! proxy hop costs on the machine before any proxy logic: `bench/gateway.py` measures it beside
//! the gateway, so the gateway's own share of its overhead can be told from the machine's.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::Context;
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::serve::net::busy_poll;

/// Flags of `tessera bench relay`.
#[derive(Debug, Clone, clap::Args)]
pub struct RelayArgs {
    /// Address to listen on (port 0 picks one; the bound address is logged as `listening`).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// Address every accepted connection is relayed to.
    #[arg(long)]
    pub to: SocketAddr,
    /// Microseconds an idle thread keeps polling connections before it sleeps, as the gateway's
    /// `--busy-poll-us` (0 turns it off).
    #[arg(long, default_value_t = busy_poll::DEFAULT_WINDOW_US)]
    pub busy_poll_us: u64,
}

/// Relays connections until `shutdown`; `on_bound` hears the bound address.
pub async fn run(
    args: RelayArgs,
    shutdown: CancellationToken,
    on_bound: impl FnOnce(SocketAddr),
) -> anyhow::Result<()> {
    busy_poll::enable(Duration::from_micros(args.busy_poll_us));
    let listener = TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("bind the relay's listener on {}", args.listen))?;
    let addr = listener.local_addr()?;
    tracing::info!(protocol = "tcp", %addr, to = %args.to, "listening");
    on_bound(addr);
    loop {
        let (client, peer) = tokio::select! {
            () = shutdown.cancelled() => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(e) => {
                    // Out of descriptors and the like: the next accept may succeed.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let to = args.to;
        tokio::spawn(async move {
            if let Err(e) = relay(client, to).await {
                tracing::debug!(%peer, %to, error = %e, "relay ended with an error");
            }
        });
    }
}

/// Copies bytes both ways between `client` and a new connection to `to` until both sides close.
async fn relay(mut client: TcpStream, to: SocketAddr) -> std::io::Result<()> {
    client.set_nodelay(true)?;
    let mut upstream = TcpStream::connect(to).await?;
    upstream.set_nodelay(true)?;
    busy_poll::watch(&client);
    busy_poll::watch(&upstream);
    tokio::io::copy_bidirectional(&mut client, &mut upstream).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    #[tokio::test]
    async fn bytes_cross_the_relay_both_ways_and_a_close_reaches_the_client() {
        let echo = TcpListener::bind("127.0.0.1:0").await.expect("bind echo");
        let to = echo.local_addr().expect("echo address");
        tokio::spawn(async move {
            let (mut s, _) = echo.accept().await.expect("accept");
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).await.expect("read");
            s.write_all(&buf[..n]).await.expect("write");
            s.write_all(b"!").await.expect("write");
            // Closing here must reach the client through the relay.
        });
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let args = RelayArgs { listen: "127.0.0.1:0".parse().expect("address"), to, busy_poll_us: 0 };
        let relay = tokio::spawn(run(args, shutdown.clone(), move |addr| {
            let _ = tx.send(addr);
        }));
        let addr = rx.await.expect("bound");
        let mut client = TcpStream::connect(addr).await.expect("connect");
        client.write_all(b"hello").await.expect("send");
        let mut got = Vec::new();
        client.read_to_end(&mut got).await.expect("read until closed");
        assert_eq!(got, b"hello!");
        shutdown.cancel();
        relay.await.expect("relay task").expect("relay ends cleanly");
    }

    #[tokio::test]
    async fn an_unreachable_target_closes_the_client_connection() {
        // A port that was just free: nothing listens there.
        let to = TcpListener::bind("127.0.0.1:0").await.expect("bind").local_addr().expect("address");
        let shutdown = CancellationToken::new();
        let (tx, rx) = tokio::sync::oneshot::channel();
        let args = RelayArgs { listen: "127.0.0.1:0".parse().expect("address"), to, busy_poll_us: 0 };
        tokio::spawn(run(args, shutdown.clone(), move |addr| {
            let _ = tx.send(addr);
        }));
        let mut client = TcpStream::connect(rx.await.expect("bound")).await.expect("connect");
        let mut got = Vec::new();
        let read = tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "closed, not left hanging: {read:?}");
        shutdown.cancel();
    }
}
