//! TLS of Tessera's public listeners and of its clients, shared by both planes: the
//! `--tls-cert`/`--tls-key` and `--ca-cert` flags, loading a PEM certificate chain and key into a
//! rustls [`ServerConfig`] (ring, ALPN `h2` and `http/1.1`), and [`TlsAcceptor`], which reloads
//! the pair when its files change so that new connections get the new certificate.
//!
//! rustls runs on ring everywhere and never on the process default provider: object_store
//! brings aws-lc-rs into the build too, and with two providers built in there is no default.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::{Mutex, RwLock};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio_rustls::server::TlsStream;

pub use rustls;
pub use tokio_rustls;

pub mod local;

/// How often [`TlsAcceptor::watch`] looks at the certificate and key files.
pub const RELOAD_POLL: Duration = Duration::from_secs(2);

/// `--tls-cert` and `--tls-key`: both or neither; without them the listeners speak plain HTTP.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct TlsArgs {
    /// PEM certificate chain the listeners present (leaf first); with `--tls-key` they speak
    /// TLS, and a changed pair is picked up for new connections within seconds.
    #[arg(long, env = "TESSERA_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key (PKCS#8, PKCS#1 or SEC1) of `--tls-cert`.
    #[arg(long, env = "TESSERA_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl TlsArgs {
    /// The certificate and key files, when TLS is on.
    pub fn files(&self) -> Option<CertFiles> {
        match (&self.tls_cert, &self.tls_key) {
            (Some(cert), Some(key)) => Some(CertFiles { cert: cert.clone(), key: key.clone() }),
            _ => None,
        }
    }

    /// A reloading acceptor over the files, when TLS is on (start-up: a bad pair is an error
    /// naming the file). Must be called inside a Tokio runtime.
    pub fn acceptor(&self) -> Result<Option<TlsAcceptor>, TlsError> {
        self.files().map(TlsAcceptor::watch).transpose()
    }
}

/// `--ca-cert`: a certificate a client trusts besides the system's roots.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct CaArgs {
    /// PEM certificate(s) to trust besides the system's roots when connecting over https (a
    /// self-signed or private CA, e.g. the one `tessera dev --tls` prints).
    #[arg(long, env = "TESSERA_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// A certificate chain file and its private key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate chain, leaf first.
    pub cert: PathBuf,
    /// PEM private key.
    pub key: PathBuf,
}

/// Why a certificate, key or CA file cannot be used; each names the file.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The file cannot be read.
    #[error("cannot read {what} {}: {source}", path.display())]
    Read {
        /// `certificate`, `private key` or `CA certificate`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: io::Error,
    },
    /// The file holds no usable PEM item of the kind expected.
    #[error("{} holds no {what} in PEM: {reason}", path.display())]
    Parse {
        /// `certificate`, `private key` or `CA certificate`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// rustls refused the pair (most often: the key is not the certificate's).
    #[error("certificate {} and key {} do not make a usable pair: {reason}", cert.display(), key.display())]
    Pair {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

/// The ring provider every config here is built on.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Reads `path`, naming it and `what` on failure.
fn read(what: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read { what, path: path.to_path_buf(), source })
}

/// The PEM certificates in `path` (at least one), naming `what` on failure.
pub fn read_certificates(what: &'static str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = read(what, path)?;
    let parse = |reason: String| TlsError::Parse { what, path: path.to_path_buf(), reason };
    let certs =
        CertificateDer::pem_slice_iter(&pem).collect::<Result<Vec<_>, _>>().map_err(|e| parse(e.to_string()))?;
    if certs.is_empty() {
        return Err(parse("no CERTIFICATE block found".into()));
    }
    Ok(certs)
}

/// The first PEM private key in `path`.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    let pem = read("private key", path)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::Parse {
        what: "private key",
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The server config of a certificate and key pair: TLS 1.2 and 1.3, no client certificates,
/// ALPN `h2` then `http/1.1` (gRPC clients insist on `h2`).
pub fn server_config(files: &CertFiles) -> Result<ServerConfig, TlsError> {
    let certs = read_certificates("certificate", &files.cert)?;
    let key = read_key(&files.key)?;
    let pair =
        |e: rustls::Error| TlsError::Pair { cert: files.cert.clone(), key: files.key.clone(), reason: e.to_string() };
    let mut config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(pair)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(pair)?;
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(config)
}

/// What says a file changed: its modification time and length.
type Stamp = Option<(SystemTime, u64)>;

fn stamp(path: &Path) -> Stamp {
    std::fs::metadata(path).ok().map(|m| (m.modified().unwrap_or(SystemTime::UNIX_EPOCH), m.len()))
}

/// The acceptor's shared state.
#[derive(Debug)]
struct Shared {
    files: CertFiles,
    /// The config new connections get; written by [`Shared::reload_if_changed`] only.
    current: RwLock<Arc<ServerConfig>>,
    /// The file stamps last tried, so a bad pair is reported once rather than every poll.
    seen: Mutex<(Stamp, Stamp)>,
}

impl Shared {
    fn stamps(&self) -> (Stamp, Stamp) {
        (stamp(&self.files.cert), stamp(&self.files.key))
    }

    /// Loads the pair again if either file changed since the last try; whether it swapped.
    fn reload_if_changed(&self) -> bool {
        let now = self.stamps();
        {
            let mut seen = self.seen.lock();
            if *seen == now {
                return false;
            }
            *seen = now;
        }
        match server_config(&self.files) {
            Ok(config) => {
                *self.current.write() = Arc::new(config);
                tracing::info!(cert = %self.files.cert.display(), "tls certificate reloaded");
                true
            }
            Err(e) => {
                // Often a pair caught half-replaced: the next change to either file retries.
                tracing::warn!(error = %e, "tls certificate not reloaded; the previous one stays in use");
                false
            }
        }
    }
}

/// Accepts TLS connections with the current certificate; cheap to clone. Built by
/// [`TlsAcceptor::watch`], it reloads the pair when the files change: connections accepted after
/// that get the new certificate, open ones keep theirs, and a bad new pair is logged and the
/// old one kept.
#[derive(Debug, Clone)]
pub struct TlsAcceptor {
    shared: Arc<Shared>,
}

impl TlsAcceptor {
    /// Loads the pair (an error names the file) without watching it.
    pub fn load(files: CertFiles) -> Result<Self, TlsError> {
        let config = server_config(&files)?;
        tracing::info!(cert = %files.cert.display(), key = %files.key.display(), "tls certificate loaded");
        let seen = Mutex::new((stamp(&files.cert), stamp(&files.key)));
        Ok(Self { shared: Arc::new(Shared { files, current: RwLock::new(Arc::new(config)), seen }) })
    }

    /// Loads the pair and reloads it when the files change ([`RELOAD_POLL`]). Must be called
    /// inside a Tokio runtime; the watch ends when the last clone is dropped.
    pub fn watch(files: CertFiles) -> Result<Self, TlsError> {
        Self::watch_every(files, RELOAD_POLL)
    }

    /// [`TlsAcceptor::watch`] polling every `period`.
    pub fn watch_every(files: CertFiles, period: Duration) -> Result<Self, TlsError> {
        let acceptor = Self::load(files)?;
        tokio::spawn(watch_task(Arc::downgrade(&acceptor.shared), period));
        Ok(acceptor)
    }

    /// The certificate and key files.
    pub fn files(&self) -> &CertFiles {
        &self.shared.files
    }

    /// The config a connection accepted now gets.
    pub fn config(&self) -> Arc<ServerConfig> {
        self.shared.current.read().clone()
    }

    /// Loads the pair again now if its files changed; whether the certificate was swapped.
    pub fn reload_if_changed(&self) -> bool {
        self.shared.reload_if_changed()
    }

    /// Runs the server side of the handshake on `io`, which must end within `timeout`: a
    /// listener passes the time it gives a client for its request head, since its header timer
    /// starts only after the handshake.
    pub async fn accept<IO>(&self, io: IO, timeout: Duration) -> io::Result<TlsStream<IO>>
    where
        IO: AsyncRead + AsyncWrite + Unpin,
    {
        let handshake = tokio_rustls::TlsAcceptor::from(self.config()).accept(io);
        match tokio::time::timeout(timeout, handshake).await {
            Ok(done) => done,
            Err(_) => {
                Err(io::Error::new(io::ErrorKind::TimedOut, format!("tls handshake not finished in {timeout:?}")))
            }
        }
    }
}

/// Polls the files every `period` until the acceptor is gone.
async fn watch_task(shared: Weak<Shared>, period: Duration) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(shared) = shared.upgrade() else { return };
        // Reading and parsing files blocks: off the async threads.
        if tokio::task::spawn_blocking(move || shared.reload_if_changed()).await.is_err() {
            return;
        }
    }
}

/// The PEM bytes of `--ca-cert`, checked to hold at least one certificate.
pub fn read_ca_pem(path: &Path) -> Result<Vec<u8>, TlsError> {
    read_certificates("CA certificate", path)?;
    read("CA certificate", path)
}

/// The roots a client trusts: the system's (none, where it has no store) and the
/// certificates in `ca` (`--ca-cert`).
pub fn client_roots(ca: Option<&Path>) -> Result<RootCertStore, TlsError> {
    let mut roots = RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    if !native.errors.is_empty() {
        tracing::debug!(errors = ?native.errors, "some system root certificates could not be loaded");
    }
    roots.add_parsable_certificates(native.certs);
    if let Some(path) = ca {
        for cert in read_certificates("CA certificate", path)? {
            roots.add(cert).map_err(|e| TlsError::Parse {
                what: "CA certificate",
                path: path.to_path_buf(),
                reason: e.to_string(),
            })?;
        }
    }
    Ok(roots)
}

/// A client config trusting [`client_roots`], without ALPN (callers that speak HTTP/2 add `h2`).
pub fn client_config(ca: Option<&Path>) -> Result<ClientConfig, TlsError> {
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsError::Parse { what: "TLS versions", path: PathBuf::new(), reason: e.to_string() })?
        .with_root_certificates(client_roots(ca)?)
        .with_no_client_auth();
    Ok(config)
}

/// The server certificate verifier of [`client_roots`] (tonic takes one).
pub fn server_verifier(ca: Option<&Path>) -> Result<Arc<WebPkiServerVerifier>, TlsError> {
    let roots = Arc::new(client_roots(ca)?);
    WebPkiServerVerifier::builder_with_provider(roots, provider()).build().map_err(|e| TlsError::Parse {
        what: "CA certificate",
        path: ca.map(Path::to_path_buf).unwrap_or_default(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests;
