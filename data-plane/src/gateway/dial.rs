//! Connecting to a worker: TCP within the connect timeout, Nagle off, watched by the
//! busy-poller (as every connection to a worker: see `forward::WatchedConnector`), then TLS
//! for `https://` workers.

use http::Uri;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;
use tokio_util::either::Either;

use super::forward::{CONNECT_TIMEOUT, CallError};

/// A connection to a worker, plain or TLS.
pub type Io = Either<TcpStream, TlsStream<TcpStream>>;

/// Connects to the worker `uri` names (TLS with `tls` for https), giving back the connection
/// and its `host:port`.
pub async fn dial(uri: &Uri, tls: &TlsConnector) -> Result<(Io, String), CallError> {
    let address = address_of(uri)?;
    let unsent = |what: &str, e: &dyn std::fmt::Display| CallError::Unsent(format!("{what} {address}: {e}"));
    let tcp = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(&address))
        .await
        .map_err(|e| unsent("connecting to", &e))?
        .map_err(|e| unsent("connecting to", &e))?;
    let _ = tcp.set_nodelay(true);
    crate::serve::net::busy_poll::watch(&tcp);
    if uri.scheme() != Some(&http::uri::Scheme::HTTPS) {
        return Ok((Either::Left(tcp), address));
    }
    let name = rustls::pki_types::ServerName::try_from(host_of(uri).to_string())
        .map_err(|e| unsent("a server name for", &e))?;
    let tls = tokio::time::timeout(CONNECT_TIMEOUT, tls.connect(name, tcp))
        .await
        .map_err(|e| unsent("TLS with", &e))?
        .map_err(|e| unsent("TLS with", &e))?;
    Ok((Either::Right(tls), address))
}

/// `host:port` of a worker's URI (port 80 or 443 when it names none).
pub fn address_of(uri: &Uri) -> Result<String, CallError> {
    let Some(authority) = uri.authority() else {
        return Err(CallError::Unsent(format!("the worker address {uri} names no host")));
    };
    let https = uri.scheme() == Some(&http::uri::Scheme::HTTPS);
    let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
    Ok(format!("{}:{port}", authority.host()))
}

/// The host of `uri` as a TLS server name (an IPv6 address without its brackets).
pub fn host_of(uri: &Uri) -> &str {
    let host = uri.host().unwrap_or_default();
    host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_addresses_take_default_ports_and_bare_ipv6_names() {
        let address = |u: &str| address_of(&u.parse().expect("uri")).expect("address");
        assert_eq!(address("http://10.0.0.5:8001/x"), "10.0.0.5:8001");
        assert_eq!(address("https://w1/x"), "w1:443");
        assert_eq!(address("http://[::1]/x"), "[::1]:80");
        assert_eq!(host_of(&"https://[::1]:8001/x".parse().expect("uri")), "::1");
        assert!(matches!(address_of(&"/x".parse().expect("uri")), Err(CallError::Unsent(_))));
    }
}
