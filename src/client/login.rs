//! `tessera login`: checks a key against the control plane by exchanging it for an access
//! token, learns the key's tenant from the token's claims, and saves URL, key and tenant in
//! the config file.

use std::path::PathBuf;

use anyhow::Context;
use base64::Engine;
use serde::Deserialize;

use super::api::ApiClient;
use super::settings::{ConfigFile, config_path};

/// `tessera login` flags.
#[derive(Debug, clap::Args)]
pub struct LoginArgs {
    /// Control plane URL, e.g. `http://127.0.0.1:8080`.
    #[arg(long, env = "TESSERA_URL")]
    pub url: String,
    /// API key (`tsk_…`).
    #[arg(long = "key", alias = "api-key", env = "TESSERA_API_KEY", hide_env_values = true)]
    pub key: String,
    /// Tenant to act in (default: the key's own; platform admins may name any).
    #[arg(long, env = "TESSERA_TENANT")]
    pub tenant: Option<String>,
    /// PEM certificate to trust for https besides the system's roots; saved (as an absolute
    /// path) for the other verbs.
    #[arg(long, env = "TESSERA_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct TokenResponse {
    access_token: String,
}

/// The claims `tessera login` reads from an access token (it does not verify them: the
/// control plane just issued it over the connection the user chose).
#[derive(Debug, Deserialize)]
struct Claims {
    tenant_name: String,
    role: String,
}

fn claims_of(token: &str) -> anyhow::Result<Claims> {
    let payload = token.split('.').nth(1).context("the access token is not a JWT")?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(payload.trim_end_matches('='))
        .context("the access token's claims are not base64url")?;
    serde_json::from_slice(&bytes).context("the access token's claims are not the expected JSON")
}

/// Runs `tessera login`.
pub async fn run(args: LoginArgs) -> anyhow::Result<()> {
    let url = args.url.trim_end_matches('/').to_string();
    let ca_cert = match args.ca_cert {
        Some(path) => Some(std::path::absolute(&path).with_context(|| format!("resolve {}", path.display()))?),
        None => None,
    };
    let api = ApiClient::new(&url, &args.key, ca_cert.as_deref())?;
    let token: TokenResponse = api.post("/v1/auth/token", &serde_json::json!({})).await.context("check the key")?;
    let claims = claims_of(&token.access_token)?;
    let tenant = args.tenant.unwrap_or_else(|| claims.tenant_name.clone());
    let path = config_path()?;
    let file = ConfigFile { url: Some(url.clone()), api_key: Some(args.key), tenant: Some(tenant.clone()), ca_cert };
    file.save(&path)?;
    let role = claims.role;
    println!("logged in to {url}: tenant {tenant}, role {role} (saved in {})", path.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn claims_are_read_from_the_payload() {
        let payload = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .encode(br#"{"tenant_name":"demo","role":"tenant-admin","exp":1}"#);
        let claims = claims_of(&format!("e30.{payload}.sig")).expect("claims");
        assert_eq!((claims.tenant_name.as_str(), claims.role.as_str()), ("demo", "tenant-admin"));
        assert!(claims_of("not-a-jwt").is_err());
    }
}
