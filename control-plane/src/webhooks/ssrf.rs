//! Where a webhook may be sent: the guard against server-side request forgery.
//!
//! A hook's URL is parsed, its host resolved, and every address classified; one address in a
//! refused range refuses the hook (a name with one public and one private address could be
//! steered to the private one). Deliveries connect to the address checked here, never
//! resolving the name again, so a DNS answer that changes between check and connect (DNS
//! rebinding) cannot reach a refused address. A platform admin may allow private targets
//! for a tenant (or the server for all), which also allows plain http.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use url::Url;

use crate::error::{Error, Result};

/// Longest a webhook host's name may take to resolve.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why an address is refused, or `None` when a webhook may reach it.
pub fn refused_range(ip: IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => refused_v4(v4),
        IpAddr::V6(v6) => refused_v6(v6),
    }
}

fn refused_v4(ip: Ipv4Addr) -> Option<&'static str> {
    let [a, b, c, _] = ip.octets();
    Some(match (a, b, c) {
        _ if ip.is_unspecified() || a == 0 => "unspecified",
        _ if ip.is_loopback() => "loopback",
        // 169.254.169.254 (cloud metadata) is in this range too.
        _ if ip.is_link_local() => "link-local",
        _ if ip.is_private() => "private",
        (100, 64..=127, _) => "shared (carrier-grade NAT)",
        (192, 0, 0) => "reserved (IETF protocol assignments)",
        (198, 18..=19, _) => "reserved (benchmarking)",
        _ if ip.is_multicast() => "multicast",
        _ if ip.is_broadcast() || a >= 240 => "reserved",
        _ => return None,
    })
}

fn refused_v6(ip: Ipv6Addr) -> Option<&'static str> {
    // An IPv4 address carried in IPv6 (mapped, or NAT64's well-known prefix) is judged as IPv4.
    if let Some(v4) = ip.to_ipv4_mapped() {
        return refused_v4(v4);
    }
    let s = ip.segments();
    if s[0] == 0x64 && s[1] == 0xff9b && s[2..6] == [0, 0, 0, 0] {
        return refused_v4(Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8));
    }
    Some(match s[0] {
        _ if ip.is_unspecified() => "unspecified",
        _ if ip.is_loopback() => "loopback",
        x if x & 0xffc0 == 0xfe80 => "link-local",
        // fd00:ec2::254 (a cloud metadata address) is unique-local too.
        x if x & 0xfe00 == 0xfc00 => "unique-local",
        x if x & 0xff00 == 0xff00 => "multicast",
        x if x & 0xffc0 == 0xfec0 => "site-local",
        // Deprecated IPv4-compatible addresses (::a.b.c.d).
        0 if s[1..6] == [0, 0, 0, 0, 0] => "IPv4-compatible",
        _ => return None,
    })
}

/// A webhook URL that passed the scheme checks, with the parts a delivery needs.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    pub url: Url,
    /// Its host (a name or an address literal).
    pub host: String,
    /// Its port (the scheme's default when absent).
    pub port: u16,
}

/// Parses and checks a hook URL: absolute http(s), no credentials or fragment, https unless
/// `allow_private`.
pub fn parse_target(field: &str, raw: &str, allow_private: bool) -> Result<Target> {
    let url = Url::parse(raw).map_err(|e| Error::invalid(field, format!("not an absolute URL: {e}")))?;
    match url.scheme() {
        "https" => {}
        "http" if allow_private => {}
        "http" => {
            return Err(Error::invalid(
                field,
                "webhook URLs must use https (plain http only where private targets are allowed)",
            ));
        }
        other => return Err(Error::invalid(field, format!("unsupported scheme '{other}': use https"))),
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err(Error::invalid(field, "webhook URLs may not carry credentials; verify the signature instead"));
    }
    if url.fragment().is_some() {
        return Err(Error::invalid(field, "webhook URLs may not have a fragment"));
    }
    let host = match url.host() {
        Some(url::Host::Domain(d)) => d.to_string(),
        Some(url::Host::Ipv4(ip)) => ip.to_string(),
        Some(url::Host::Ipv6(ip)) => ip.to_string(),
        None => return Err(Error::invalid(field, "webhook URL has no host")),
    };
    let port = url.port_or_known_default().unwrap_or(443);
    Ok(Target { url, host, port })
}

/// The addresses of `target`, each allowed (or `allow_private`); the first is the one to
/// connect to. Refuses names that do not resolve and any refused address.
pub async fn resolve(field: &str, target: &Target, allow_private: bool) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = match target.host.parse::<IpAddr>() {
        Ok(ip) => vec![SocketAddr::new(ip, target.port)],
        Err(_) => {
            let lookup = tokio::net::lookup_host((target.host.as_str(), target.port));
            tokio::time::timeout(RESOLVE_TIMEOUT, lookup)
                .await
                .map_err(|_| {
                    Error::invalid(field, format!("host '{}' did not resolve within {RESOLVE_TIMEOUT:?}", target.host))
                })?
                .map_err(|e| Error::invalid(field, format!("host '{}' does not resolve: {e}", target.host)))?
                .collect()
        }
    };
    if addrs.is_empty() {
        return Err(Error::invalid(field, format!("host '{}' has no addresses", target.host)));
    }
    if !allow_private {
        for a in &addrs {
            if let Some(range) = refused_range(a.ip()) {
                return Err(Error::invalid(
                    field,
                    format!(
                        "webhook target {} is a {range} address; only a platform admin can allow private targets",
                        a.ip()
                    ),
                ));
            }
        }
    }
    Ok(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(s: &str) -> Option<&'static str> {
        refused_range(s.parse().unwrap())
    }

    #[test]
    fn private_and_special_addresses_are_refused() {
        for (ip, why) in [
            ("127.0.0.1", "loopback"),
            ("127.255.0.9", "loopback"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("172.31.255.255", "private"),
            ("192.168.1.1", "private"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "unspecified"),
            ("100.64.0.1", "shared (carrier-grade NAT)"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "reserved"),
            ("240.0.0.1", "reserved"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("fe80::1", "link-local"),
            ("fd00:ec2::254", "unique-local"),
            ("fc00::1", "unique-local"),
            ("ff02::1", "multicast"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            ("64:ff9b::a00:1", "private"),
            ("::10.0.0.1", "IPv4-compatible"),
        ] {
            assert_eq!(refused(ip), Some(why), "{ip}");
        }
    }

    #[test]
    fn public_addresses_are_allowed() {
        for ip in [
            "8.8.8.8",
            "1.1.1.1",
            "172.32.0.1",
            "100.128.0.1",
            "2001:4860:4860::8888",
            "::ffff:8.8.4.4",
            "64:ff9b::808:808",
        ] {
            assert_eq!(refused(ip), None, "{ip}");
        }
    }

    #[test]
    fn urls_need_https_unless_private_targets_are_allowed() {
        assert!(parse_target("url", "https://hooks.example.com/x", false).is_ok());
        assert!(parse_target("url", "http://hooks.example.com/x", false).is_err());
        assert!(parse_target("url", "http://127.0.0.1:9/x", true).is_ok());
        assert!(parse_target("url", "ftp://example.com/", true).is_err());
        assert!(parse_target("url", "https://u:p@example.com/", false).is_err());
        assert!(parse_target("url", "https://example.com/#frag", false).is_err());
        assert!(parse_target("url", "not a url", false).is_err());
        let t = parse_target("url", "https://[::1]/h", false).unwrap();
        assert_eq!((t.host.as_str(), t.port), ("::1", 443));
    }

    #[tokio::test]
    async fn resolution_refuses_private_addresses_unless_allowed() {
        let t = parse_target("url", "https://127.0.0.1:8443/h", false).unwrap();
        let e = resolve("url", &t, false).await.unwrap_err().to_string();
        assert!(e.contains("loopback") && e.contains("platform admin"), "{e}");
        assert_eq!(resolve("url", &t, true).await.unwrap(), vec!["127.0.0.1:8443".parse().unwrap()]);
        // `localhost` resolves to loopback: refused by address, not by name.
        let t = parse_target("url", "https://localhost/h", false).unwrap();
        assert!(resolve("url", &t, false).await.is_err());
    }
}
