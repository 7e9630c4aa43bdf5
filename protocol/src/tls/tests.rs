use std::sync::Arc;

use clap::Parser;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};

use super::local::{self, LocalCert, LocalFiles};
use super::*;

/// Writes a fresh local certificate into `dir`; its CA, for clients.
fn write_pair(dir: &Path) -> LocalCert {
    let made = local::generate(&local::LOOPBACK_HOSTS, local::VALIDITY).expect("generate");
    let files = LocalFiles::in_dir(dir);
    std::fs::write(&files.pair.cert, &made.cert_pem).expect("write cert");
    std::fs::write(&files.pair.key, &made.key_pem).expect("write key");
    std::fs::write(&files.ca, &made.ca_pem).expect("write ca");
    made
}

/// A client trusting the given CAs.
fn client(cas: &[&LocalCert]) -> tokio_rustls::TlsConnector {
    let mut roots = RootCertStore::empty();
    for ca in cas {
        let der = CertificateDer::from_pem_slice(ca.ca_pem.as_bytes()).expect("CA PEM");
        roots.add(der).expect("add root");
    }
    let config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
}

/// Handshakes a new connection through `acceptor`; the leaf certificate the client saw.
async fn leaf_seen(acceptor: &TlsAcceptor, connector: &tokio_rustls::TlsConnector) -> Vec<u8> {
    let (client_io, server_io) = tokio::io::duplex(64 * 1024);
    let server = {
        let acceptor = acceptor.clone();
        tokio::spawn(async move { acceptor.accept(server_io, std::time::Duration::from_secs(30)).await.map(|_| ()) })
    };
    let name = ServerName::try_from("localhost").expect("name");
    let stream = connector.connect(name, client_io).await.expect("handshake");
    server.await.expect("join").expect("server handshake");
    stream.get_ref().1.peer_certificates().expect("certificates")[0].to_vec()
}

fn leaf_der(made: &LocalCert) -> Vec<u8> {
    CertificateDer::from_pem_slice(made.cert_pem.as_bytes()).expect("PEM").to_vec()
}

#[test]
fn a_pair_loads_with_alpn_for_grpc_and_http() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pair(dir.path());
    let config = server_config(&LocalFiles::in_dir(dir.path()).pair).expect("loads");
    assert_eq!(config.alpn_protocols, [b"h2".to_vec(), b"http/1.1".to_vec()]);
}

#[test]
fn loading_errors_name_the_file() {
    let dir = tempfile::tempdir().expect("tempdir");
    write_pair(dir.path());
    let good = LocalFiles::in_dir(dir.path()).pair;
    let missing = dir.path().join("missing.pem");
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "not a certificate").expect("write");

    let err = server_config(&CertFiles { cert: missing.clone(), key: good.key.clone() }).expect_err("missing cert");
    assert!(matches!(err, TlsError::Read { .. }), "{err}");
    assert!(err.to_string().contains("missing.pem"), "{err}");

    let err = server_config(&CertFiles { cert: garbage.clone(), key: good.key.clone() }).expect_err("no PEM");
    assert!(matches!(err, TlsError::Parse { what: "certificate", .. }) && err.to_string().contains("garbage.pem"));

    let err = server_config(&CertFiles { cert: good.cert.clone(), key: garbage }).expect_err("no key");
    assert!(matches!(err, TlsError::Parse { what: "private key", .. }), "{err}");

    // The key of another certificate.
    let other = tempfile::tempdir().expect("tempdir");
    write_pair(other.path());
    let mismatched = CertFiles { cert: good.cert.clone(), key: LocalFiles::in_dir(other.path()).pair.key };
    let err = server_config(&mismatched).expect_err("mismatch");
    assert!(matches!(err, TlsError::Pair { .. }), "{err}");
    assert!(err.to_string().contains("cert.pem") && err.to_string().contains("key.pem"), "{err}");

    let err = read_ca_pem(&missing).expect_err("missing CA");
    assert!(err.to_string().contains("CA certificate") && err.to_string().contains("missing.pem"), "{err}");
}

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    tls: TlsArgs,
}

#[test]
fn cert_and_key_come_together_or_not_at_all() {
    let none = Cli::try_parse_from(["t"]).expect("neither");
    assert_eq!(none.tls.files(), None);
    let both = Cli::try_parse_from(["t", "--tls-cert", "c.pem", "--tls-key", "k.pem"]).expect("both");
    assert_eq!(both.tls.files(), Some(CertFiles { cert: "c.pem".into(), key: "k.pem".into() }));
    let err = Cli::try_parse_from(["t", "--tls-cert", "c.pem"]).err().expect("cert alone");
    assert!(err.to_string().contains("--tls-key"), "{err}");
    let err = Cli::try_parse_from(["t", "--tls-key", "k.pem"]).err().expect("key alone");
    assert!(err.to_string().contains("--tls-cert"), "{err}");
}

#[tokio::test]
async fn a_new_pair_reaches_new_connections_and_a_bad_one_is_ignored() {
    let dir = tempfile::tempdir().expect("tempdir");
    let first = write_pair(dir.path());
    let acceptor =
        TlsAcceptor::watch_every(LocalFiles::in_dir(dir.path()).pair, Duration::from_millis(50)).expect("loads");
    let second = local::generate(&local::LOOPBACK_HOSTS, local::VALIDITY).expect("generate");
    let connector = client(&[&first, &second]);
    assert_eq!(leaf_seen(&acceptor, &connector).await, leaf_der(&first));

    // Replaced in place: the watch swaps it in for the next connection.
    let files = LocalFiles::in_dir(dir.path()).pair;
    std::fs::write(&files.key, &second.key_pem).expect("write key");
    std::fs::write(&files.cert, &second.cert_pem).expect("write cert");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while leaf_seen(&acceptor, &connector).await != leaf_der(&second) {
        assert!(tokio::time::Instant::now() < deadline, "the new certificate was not picked up");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // A broken pair (a key from elsewhere) is refused: the last good one stays.
    let third = local::generate(&local::LOOPBACK_HOSTS, local::VALIDITY).expect("generate");
    std::fs::write(&files.key, &third.key_pem).expect("write key");
    assert!(!acceptor.reload_if_changed(), "a mismatched pair is not swapped in");
    assert!(!acceptor.reload_if_changed(), "nor tried again until a file changes");
    assert_eq!(leaf_seen(&acceptor, &connector).await, leaf_der(&second));
}

#[test]
fn a_local_certificate_is_kept_while_valid_and_remade_when_broken() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (files, made) = local::ensure(dir.path(), &local::LOOPBACK_HOSTS).expect("ensure");
    assert!(made);
    let cert = std::fs::read(&files.pair.cert).expect("read");
    let (again, made) = local::ensure(dir.path(), &local::LOOPBACK_HOSTS).expect("ensure");
    assert!(!made && again == files && std::fs::read(&files.pair.cert).expect("read") == cert, "reused");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&files.pair.key).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
    }
    std::fs::write(&files.pair.key, "broken").expect("write");
    let (_, made) = local::ensure(dir.path(), &local::LOOPBACK_HOSTS).expect("ensure");
    assert!(made, "a pair that no longer loads is made anew");
    server_config(&files.pair).expect("the new pair loads");
}
