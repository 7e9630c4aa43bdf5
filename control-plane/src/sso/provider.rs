//! Talking to an OpenID provider: its discovery document, its signing keys (JWKS), and the
//! token endpoint that trades an authorization code for an ID token. Discovery documents and
//! key sets are cached in memory for a few minutes (they are public and change rarely); a
//! token signed by a key the cache lacks makes one early refetch.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use jsonwebtoken::jwk::JwkSet;
use serde::Deserialize;

use crate::error::{Error, Result};

/// How long a discovery document or key set is reused.
const CACHE_TTL: Duration = Duration::from_secs(300);
/// Shortest time between two fetches of one key set for unknown key ids.
const JWKS_REFETCH_MIN: Duration = Duration::from_secs(10);
/// Limit of one request to the provider.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest document read from the provider.
const MAX_BODY: usize = 1 << 20;

/// The parts of a discovery document (OpenID Connect Discovery 1.0) we use.
#[derive(Debug, Clone, Deserialize)]
pub struct Discovery {
    /// Must equal the configured issuer.
    pub issuer: String,
    /// Where the browser is sent to sign in.
    pub authorization_endpoint: String,
    /// Where codes are exchanged.
    pub token_endpoint: String,
    /// The provider's public keys.
    pub jwks_uri: String,
    /// PKCE methods, when the provider lists them.
    #[serde(default)]
    pub code_challenge_methods_supported: Option<Vec<String>>,
}

/// What the token endpoint answers.
#[derive(Debug, Deserialize)]
struct TokenResponse {
    id_token: Option<String>,
}

/// An OAuth error answer (RFC 6749 §5.2).
#[derive(Debug, Deserialize)]
struct OAuthError {
    error: String,
    #[serde(default)]
    error_description: Option<String>,
}

/// A client for providers, with caches; one per process.
pub struct ProviderClient {
    http: reqwest::Client,
    /// Plain-http issuers and endpoints are allowed (tests, trusted networks).
    allow_http: bool,
    /// Discovery documents by issuer; written on fetch.
    discovery: parking_lot::Mutex<HashMap<String, (Instant, Arc<Discovery>)>>,
    /// Key sets by `jwks_uri`; written on fetch.
    jwks: parking_lot::Mutex<HashMap<String, (Instant, Arc<JwkSet>)>>,
}

impl ProviderClient {
    /// A client trusting the roots of `tessera_protocol::tls`, never following redirects.
    pub fn new(allow_http: bool) -> Result<Self> {
        let tls = tessera_protocol::tls::client_config(None)
            .map_err(|e| Error::Internal(format!("TLS roots for OpenID providers: {e}")))?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .redirect(reqwest::redirect::Policy::none())
            .timeout(REQUEST_TIMEOUT)
            .build()
            .map_err(|e| Error::Internal(format!("build the OpenID HTTP client: {e}")))?;
        Ok(ProviderClient { http, allow_http, discovery: Default::default(), jwks: Default::default() })
    }

    /// Whether plain-http issuers are allowed.
    pub fn allows_http(&self) -> bool {
        self.allow_http
    }

    /// Checks that `url` is an absolute https URL (or http when allowed); `what` names it.
    pub fn check_url(&self, what: &str, url: &str) -> std::result::Result<url::Url, String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("{what} is not a URL: {e}"))?;
        match parsed.scheme() {
            "https" => {}
            "http" if self.allow_http => {}
            "http" => {
                return Err(format!(
                    "{what} must use https (plain http only with --oidc-allow-http-issuers, for tests)"
                ));
            }
            other => return Err(format!("{what} has unsupported scheme '{other}'")),
        }
        if parsed.host_str().is_none_or(str::is_empty) || parsed.fragment().is_some() {
            return Err(format!("{what} must name a host and have no #fragment"));
        }
        Ok(parsed)
    }

    /// The issuer's discovery document, fetched or cached; checks that it names the issuer
    /// itself and that its endpoints pass [`Self::check_url`].
    pub async fn discover(&self, issuer: &str) -> std::result::Result<Arc<Discovery>, String> {
        if let Some((at, doc)) = self.discovery.lock().get(issuer)
            && at.elapsed() < CACHE_TTL
        {
            return Ok(doc.clone());
        }
        let url = format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'));
        let doc: Discovery = self.get_json(&url).await.map_err(|e| format!("discovery document: {e}"))?;
        if doc.issuer != issuer {
            return Err(format!("the discovery document names issuer '{}', not '{issuer}'", doc.issuer));
        }
        for (what, url) in [
            ("authorization_endpoint", &doc.authorization_endpoint),
            ("token_endpoint", &doc.token_endpoint),
            ("jwks_uri", &doc.jwks_uri),
        ] {
            self.check_url(what, url)?;
        }
        if let Some(methods) = &doc.code_challenge_methods_supported
            && !methods.iter().any(|m| m == "S256")
        {
            return Err("the provider does not support PKCE with S256".into());
        }
        let doc = Arc::new(doc);
        self.discovery.lock().insert(issuer.to_string(), (Instant::now(), doc.clone()));
        Ok(doc)
    }

    /// The key set at `jwks_uri`, with the key `kid` if the provider has it: a cached set that
    /// lacks it is refetched (at most every few seconds; providers rotate keys).
    pub async fn keys(&self, jwks_uri: &str, kid: Option<&str>) -> std::result::Result<Arc<JwkSet>, String> {
        let cached = self.jwks.lock().get(jwks_uri).cloned();
        if let Some((at, set)) = &cached {
            let has_key = kid.is_none_or(|k| set.find(k).is_some());
            if at.elapsed() < CACHE_TTL && (has_key || at.elapsed() < JWKS_REFETCH_MIN) {
                return Ok(set.clone());
            }
        }
        let set: JwkSet = self.get_json(jwks_uri).await.map_err(|e| format!("key set (jwks_uri): {e}"))?;
        let set = Arc::new(set);
        self.jwks.lock().insert(jwks_uri.to_string(), (Instant::now(), set.clone()));
        Ok(set)
    }

    /// Trades a code for an ID token at the token endpoint (client_secret_basic, PKCE).
    pub async fn exchange_code(
        &self,
        token_endpoint: &str,
        client_id: &str,
        client_secret: &str,
        code: &str,
        code_verifier: &str,
        redirect_uri: &str,
    ) -> std::result::Result<String, String> {
        let form = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "authorization_code")
            .append_pair("code", code)
            .append_pair("redirect_uri", redirect_uri)
            .append_pair("code_verifier", code_verifier)
            .finish();
        // RFC 6749 §2.3.1: id and secret are form-encoded before Basic encoding.
        let enc = |s: &str| url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
        let response = self
            .http
            .post(token_endpoint)
            .basic_auth(enc(client_id), Some(enc(client_secret)))
            .header(http::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
            .header(http::header::ACCEPT, "application/json")
            .body(form)
            .send()
            .await
            .map_err(|e| format!("the token endpoint did not answer: {}", describe(&e)))?;
        let status = response.status();
        let body = read_body(response).await?;
        if !status.is_success() {
            return Err(match serde_json::from_slice::<OAuthError>(&body) {
                Ok(e) => format!(
                    "the provider refused the code ({}{})",
                    e.error,
                    e.error_description.map(|d| format!(": {d}")).unwrap_or_default()
                ),
                Err(_) => format!("the token endpoint answered HTTP {status}"),
            });
        }
        let answer: TokenResponse =
            serde_json::from_slice(&body).map_err(|e| format!("the token endpoint's answer is not JSON: {e}"))?;
        answer.id_token.ok_or_else(|| "the token endpoint returned no id_token (is `openid` in scopes?)".into())
    }

    async fn get_json<T: serde::de::DeserializeOwned>(&self, url: &str) -> std::result::Result<T, String> {
        self.check_url("the URL", url)?;
        let response = self
            .http
            .get(url)
            .header(http::header::ACCEPT, "application/json")
            .send()
            .await
            .map_err(|e| format!("fetching {url} failed: {}", describe(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{url} answered HTTP {status}"));
        }
        let body = read_body(response).await?;
        serde_json::from_slice(&body).map_err(|e| format!("{url} is not the expected JSON: {e}"))
    }
}

async fn read_body(response: reqwest::Response) -> std::result::Result<bytes::Bytes, String> {
    if response.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err("the provider's answer is too large".into());
    }
    let body = response.bytes().await.map_err(|e| format!("reading the provider's answer: {}", describe(&e)))?;
    if body.len() > MAX_BODY {
        return Err("the provider's answer is too large".into());
    }
    Ok(body)
}

/// A short reason for a failed request, with its innermost cause.
fn describe(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        return format!("timed out after {} s", REQUEST_TIMEOUT.as_secs());
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_must_be_https_unless_allowed() {
        let strict = ProviderClient::new(false).unwrap();
        assert!(strict.check_url("issuer", "https://id.example.com").is_ok());
        let err = strict.check_url("issuer", "http://127.0.0.1:8080").unwrap_err();
        assert!(err.contains("must use https"), "{err}");
        assert!(strict.check_url("issuer", "ftp://id.example.com").is_err());
        assert!(strict.check_url("issuer", "https://id.example.com/#x").is_err());
        assert!(strict.check_url("issuer", "not a url").is_err());
        let lax = ProviderClient::new(true).unwrap();
        assert!(lax.check_url("issuer", "http://127.0.0.1:8080").is_ok());
    }
}
