//! Loopback stand-ins for workers, shared by the upstream clients' tests: a listener that
//! counts its connections and serves each with the test's own function (under TLS when given
//! an acceptor), a test certificate with a client config that trusts it, and a gateway with one
//! model on such a stand-in.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::TlsAcceptor;
use tokio_util::either::Either;

/// A connection the stand-in accepted, plain or TLS.
pub type ServerIo = Either<TcpStream, tokio_rustls::server::TlsStream<TcpStream>>;

/// A listening stand-in.
pub struct Listening {
    /// Its port on 127.0.0.1.
    pub port: u16,
    /// Connections accepted so far.
    pub connections: Arc<AtomicUsize>,
}

/// Listens on loopback and runs `serve` on each accepted connection, after a TLS handshake when
/// `tls` is given.
pub async fn listen<F, Fut>(tls: Option<TlsAcceptor>, serve: F) -> Listening
where
    F: Fn(ServerIo) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let port = listener.local_addr().expect("address").port();
    let connections = Arc::new(AtomicUsize::new(0));
    let counted = connections.clone();
    let serve = Arc::new(serve);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            counted.fetch_add(1, Ordering::SeqCst);
            let (tls, serve) = (tls.clone(), serve.clone());
            tokio::spawn(async move {
                let io = match tls {
                    // A client that refuses the certificate ends the handshake: nothing to serve.
                    Some(tls) => match tls.accept(tcp).await {
                        Ok(tls) => Either::Right(tls),
                        Err(_) => return,
                    },
                    None => Either::Left(tcp),
                };
                serve(io).await;
            });
        }
    });
    Listening { port, connections }
}

/// A certificate for `localhost`, its acceptor, and a client config trusting its CA.
pub struct TestTls {
    /// Serves the certificate.
    pub acceptor: TlsAcceptor,
    /// Trusts the certificate's CA.
    pub trusting: rustls::ClientConfig,
}

/// Makes a [`TestTls`].
pub fn tls() -> TestTls {
    let dir = tempfile::tempdir().expect("tempdir");
    let cert = tessera_protocol::tls::local::generate(&["localhost"], Duration::from_secs(3600)).expect("certificate");
    let files = tessera_protocol::tls::local::LocalFiles::in_dir(dir.path());
    std::fs::write(&files.ca, &cert.ca_pem).expect("ca");
    std::fs::write(&files.pair.cert, &cert.cert_pem).expect("cert");
    std::fs::write(&files.pair.key, &cert.key_pem).expect("key");
    let server = tessera_protocol::tls::server_config(&files.pair).expect("server config");
    let trusting = tessera_protocol::tls::client_config(Some(&files.ca)).expect("client config");
    TestTls { acceptor: TlsAcceptor::from(Arc::new(server)), trusting }
}

/// A gateway whose tenant A (`auth::test_support`) has model `m`, version 1, on one stand-in
/// worker listening on `port` (its HTTP and gRPC endpoint both), requests up to
/// `max_request_bytes`.
pub fn one_model_gateway(port: u16, max_request_bytes: usize) -> Arc<crate::gateway::Gateway> {
    use tessera_protocol::agent::{ModelRoute, RouteReplica, RouteTable, TenantRoutes, VersionWeight};
    let base = format!("http://127.0.0.1:{port}");
    let table = RouteTable {
        tenants: vec![TenantRoutes {
            tenant_id: crate::auth::test_support::TENANT_A.into(),
            tenant_name: "a".into(),
            requests_per_second: 0,
            concurrent_requests: 0,
            models: vec![ModelRoute {
                model_name: "m".into(),
                deployment_id: "d".into(),
                weights: vec![VersionWeight { version: 1, weight: 100 }],
                replicas: vec![RouteReplica {
                    replica_id: "r".into(),
                    version: 1,
                    worker_id: "w".into(),
                    http_endpoint: base.clone(),
                    grpc_endpoint: base,
                    serving: true,
                }],
            }],
            keys: vec![],
        }],
        gateways: 1,
        revocations: None,
    };
    let tls = tessera_protocol::tls::client_config(None).expect("client TLS config");
    let g = crate::gateway::Gateway::new(
        Some(crate::auth::test_support::authenticator()),
        crate::auth::IdentityKey::from_token("test"),
        max_request_bytes,
        crate::gateway::forward::Clients::new(tls, false),
    );
    g.set_routes(crate::gateway::routes::Routes::from_table(&table, &crate::gateway::routes::Routes::default()));
    Arc::new(g)
}
