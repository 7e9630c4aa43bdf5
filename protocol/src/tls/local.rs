//! A local certificate authority and a server certificate it signs, for development and tests
//! (`tessera dev --tls`, `tessera tls-cert`): clients trust `ca.pem` (`--ca-cert`, tritonclient's
//! SSL options), the listeners present `cert.pem` with `key.pem`.
//!
//! A CA and a leaf rather than one self-signed leaf: strict verifiers (OpenSSL's X509_STRICT,
//! webpki) refuse a leaf used as its own trust anchor in some configurations. The CA's key is
//! thrown away, so the CA signs nothing else.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

use super::CertFiles;

/// Names a local certificate is made for by default: loopback by name and address.
pub const LOOPBACK_HOSTS: [&str; 3] = ["localhost", "127.0.0.1", "::1"];
/// How long a generated certificate is valid.
pub const VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// A kept certificate older than this is made anew (a month before it expires).
pub const REUSE_FOR: Duration = Duration::from_secs(335 * 24 * 3600);

/// A generated CA certificate, and a server certificate and key it signed, in PEM.
#[derive(Clone)]
pub struct LocalCert {
    /// The CA certificate clients trust.
    pub ca_pem: String,
    /// The server certificate (leaf only).
    pub cert_pem: String,
    /// The server certificate's private key (PKCS#8).
    pub key_pem: String,
}

/// Makes a CA and a server certificate for `hosts` (DNS names or IP addresses), valid from an
/// hour ago (clock skew) for `valid_for`.
pub fn generate(hosts: &[&str], valid_for: Duration) -> Result<LocalCert, rcgen::Error> {
    let now = time::OffsetDateTime::now_utc();
    let (not_before, not_after) = (now - time::Duration::hours(1), now + valid_for);

    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name.push(DnType::CommonName, "Tessera local CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    (ca.not_before, ca.not_after) = (not_before, not_after);
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;

    let mut leaf = CertificateParams::new(hosts.iter().map(|h| h.to_string()).collect::<Vec<_>>())?;
    leaf.distinguished_name.push(DnType::CommonName, hosts.first().copied().unwrap_or("localhost"));
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.use_authority_key_identifier_extension = true;
    (leaf.not_before, leaf.not_after) = (not_before, not_after);
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &ca)?;
    Ok(LocalCert { ca_pem: ca.pem(), cert_pem: cert.pem(), key_pem: key.serialize_pem() })
}

/// The files of a local certificate in a directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalFiles {
    /// `ca.pem`: what clients trust.
    pub ca: PathBuf,
    /// `cert.pem` and `key.pem`: what the listeners present.
    pub pair: CertFiles,
}

impl LocalFiles {
    /// The file names in `dir`.
    pub fn in_dir(dir: &Path) -> Self {
        LocalFiles { ca: dir.join("ca.pem"), pair: CertFiles { cert: dir.join("cert.pem"), key: dir.join("key.pem") } }
    }
}

/// The local certificate in `dir` for `hosts`: the one kept there while it loads and is younger
/// than [`REUSE_FOR`], else a new one written there (the key readable by its owner only).
/// Whether it was made now comes with it.
pub fn ensure(dir: &Path, hosts: &[&str]) -> io::Result<(LocalFiles, bool)> {
    let files = LocalFiles::in_dir(dir);
    if reusable(&files) {
        return Ok((files, false));
    }
    Ok((make(dir, hosts)?, true))
}

/// Makes a new local certificate for `hosts` in `dir` (replacing what is there), the key
/// readable by its owner only.
pub fn make(dir: &Path, hosts: &[&str]) -> io::Result<LocalFiles> {
    let files = LocalFiles::in_dir(dir);
    let made = generate(hosts, VALIDITY).map_err(io::Error::other)?;
    std::fs::create_dir_all(dir)?;
    write_private(&files.pair.key, made.key_pem.as_bytes())?;
    std::fs::write(&files.pair.cert, made.cert_pem)?;
    std::fs::write(&files.ca, made.ca_pem)?;
    Ok(files)
}

/// Whether the kept files make a usable pair, with a CA, and are young enough.
fn reusable(files: &LocalFiles) -> bool {
    let young = std::fs::metadata(&files.pair.cert)
        .and_then(|m| m.modified())
        .ok()
        .and_then(|t| SystemTime::now().duration_since(t).ok())
        .is_some_and(|age| age < REUSE_FOR);
    young && super::server_config(&files.pair).is_ok() && super::read_ca_pem(&files.ca).is_ok()
}

/// Writes `bytes` to `path` with mode 0600 from its creation.
fn write_private(path: &Path, bytes: &[u8]) -> io::Result<()> {
    use std::io::Write;
    let mut options = std::fs::OpenOptions::new();
    options.write(true).create(true).truncate(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
    options.open(path)?.write_all(bytes)
}
