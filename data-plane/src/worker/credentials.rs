//! API key lookups and token keys from the control plane: the worker's [`CredentialSource`].
//!
//! An answer from the control plane that the credential is bad (`UNAUTHENTICATED`,
//! `INVALID_ARGUMENT`, `NOT_FOUND`, `PERMISSION_DENIED`) is [`SourceError::Rejected`]; anything
//! else (unreachable, timed out, internal errors) is [`SourceError::Unavailable`], which lets the
//! authenticator keep answers it cached (static stability).

use std::path::PathBuf;
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use tessera_protocol::agent;

use super::client::AgentClient;
use crate::auth::{CredentialSource, KeyInfo, Principal, Role, SourceError, TokenKeys};

/// How long one lookup may take: inference requests wait for it.
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(3);

/// Resolves credentials through the control plane's agent service.
#[derive(Clone)]
pub struct ControlPlaneCredentials {
    client: AgentClient,
    timeout: Duration,
    /// Where the last token keys are kept (public keys only), for a restart while the control
    /// plane is unreachable.
    saved_keys: Option<PathBuf>,
}

impl ControlPlaneCredentials {
    /// Looks credentials up through `client`.
    pub fn new(client: AgentClient) -> Self {
        Self { client, timeout: LOOKUP_TIMEOUT, saved_keys: None }
    }

    /// Also keeps the token keys in `path`, and answers from it when the control plane cannot
    /// be asked: access tokens then verify after a restart during an outage.
    pub fn with_saved_token_keys(mut self, path: PathBuf) -> Self {
        self.saved_keys = Some(path);
        self
    }

    async fn token_keys_saved_or_fetched(&self) -> Result<TokenKeys, SourceError> {
        let Some(path) = &self.saved_keys else { return self.get_token_keys().await };
        match self.get_token_keys().await {
            Ok(keys) => {
                let doc =
                    serde_json::json!({ "jwks": keys.jwks_json, "issuer": keys.issuer, "audience": keys.audience });
                let tmp = path.with_extension("json.tmp");
                let written = std::fs::write(&tmp, doc.to_string()).and_then(|()| std::fs::rename(&tmp, path));
                if let Err(e) = written {
                    tracing::warn!(path = %path.display(), error = %e, "cannot save the token keys");
                }
                Ok(keys)
            }
            Err(SourceError::Unavailable(reason)) => {
                let saved = std::fs::read(path).ok().and_then(|b| serde_json::from_slice::<serde_json::Value>(&b).ok());
                let field = |v: &serde_json::Value, k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_string);
                match saved.as_ref().and_then(|v| Some((field(v, "jwks")?, field(v, "issuer")?, field(v, "audience")?)))
                {
                    Some((jwks_json, issuer, audience)) => {
                        tracing::info!(%reason, "control plane unreachable; using the saved token keys");
                        Ok(TokenKeys { jwks_json, issuer, audience })
                    }
                    None => Err(SourceError::Unavailable(reason)),
                }
            }
            Err(rejected) => Err(rejected),
        }
    }

    async fn authenticate_key(&self, api_key: &str) -> Result<KeyInfo, SourceError> {
        let request = agent::AuthenticateKeyRequest { api_key: api_key.to_string() };
        let mut client = self.client.clone();
        let response = tokio::time::timeout(self.timeout, client.authenticate_key(request))
            .await
            .map_err(|_| SourceError::Unavailable("the control plane did not answer a key lookup in time".into()))?
            .map_err(|status| source_error(&status))?;
        key_info(response.into_inner())
    }

    async fn get_token_keys(&self) -> Result<TokenKeys, SourceError> {
        let mut client = self.client.clone();
        let response = tokio::time::timeout(self.timeout, client.get_token_keys(agent::GetTokenKeysRequest {}))
            .await
            .map_err(|_| SourceError::Unavailable("the control plane did not send its token keys in time".into()))?
            .map_err(|status| source_error(&status))?
            .into_inner();
        Ok(TokenKeys { jwks_json: response.jwks_json, issuer: response.issuer, audience: response.audience })
    }
}

impl CredentialSource for ControlPlaneCredentials {
    fn resolve_key<'a>(&'a self, api_key: &'a str) -> BoxFuture<'a, Result<KeyInfo, SourceError>> {
        self.authenticate_key(api_key).boxed()
    }

    fn token_keys(&self) -> BoxFuture<'_, Result<TokenKeys, SourceError>> {
        self.token_keys_saved_or_fetched().boxed()
    }
}

/// Splits gRPC failures into "the control plane said no" and "could not ask".
fn source_error(status: &tonic::Status) -> SourceError {
    use tonic::Code;
    match status.code() {
        Code::InvalidArgument | Code::NotFound | Code::PermissionDenied => {
            SourceError::Rejected(status.message().to_string())
        }
        // The control plane refused this worker's own token: not a verdict on the key, so
        // cached answers stay (and the session logs the misconfiguration).
        Code::Unauthenticated => SourceError::Unavailable(format!(
            "the control plane refused this worker's token (check --worker-token): {}",
            status.message()
        )),
        code => SourceError::Unavailable(format!("control plane lookup failed ({code:?}): {}", status.message())),
    }
}

/// Checks a lookup answer; one the worker cannot understand is a rejection, never a guess.
fn key_info(response: agent::AuthenticateKeyResponse) -> Result<KeyInfo, SourceError> {
    if response.tenant_id.is_empty() {
        return Err(SourceError::Rejected("the control plane resolved the key to no tenant".into()));
    }
    let role: Role =
        response.role.parse().map_err(|e: tessera_protocol::auth::UnknownRole| SourceError::Rejected(e.to_string()))?;
    // Ids are optional (older control planes send none); one that is sent must parse.
    let id = |text: &str, what: &str| match text {
        "" => Ok(None),
        text => uuid::Uuid::try_parse(text)
            .map(Some)
            .map_err(|_| SourceError::Rejected(format!("the control plane sent an invalid {what} id"))),
    };
    let key_id = id(&response.key_id, "key")?;
    Ok(KeyInfo {
        key_id,
        user_id: id(&response.user_id, "user")?,
        principal: Principal { tenant_id: response.tenant_id, tenant_name: response.tenant_name, role, key_id },
        expires_at: (response.expires_at != 0).then_some(response.expires_at),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_codes_split_into_rejected_and_unavailable() {
        assert!(matches!(source_error(&tonic::Status::permission_denied("no")), SourceError::Rejected(m) if m == "no"));
        // The worker's own token refused: not a verdict on the key.
        assert!(matches!(source_error(&tonic::Status::unauthenticated("no")), SourceError::Unavailable(_)));
        assert!(matches!(source_error(&tonic::Status::not_found("x")), SourceError::Rejected(_)));
        for status in [
            tonic::Status::unavailable("down"),
            tonic::Status::deadline_exceeded("slow"),
            tonic::Status::internal("db"),
            tonic::Status::unknown("transport error"),
        ] {
            assert!(matches!(source_error(&status), SourceError::Unavailable(_)), "{status:?}");
        }
    }

    #[test]
    fn key_answers_are_checked() {
        let answer = |tenant: &str, role: &str, expires_at| agent::AuthenticateKeyResponse {
            tenant_id: tenant.into(),
            tenant_name: "acme".into(),
            role: role.into(),
            expires_at,
            ..Default::default()
        };
        let info = key_info(answer("t1", "inference", 0)).expect("valid");
        assert_eq!((info.principal.role, info.expires_at, info.key_id), (Role::Inference, None, None));
        let (key, user) = (uuid::Uuid::new_v4(), uuid::Uuid::new_v4());
        let with_ids = agent::AuthenticateKeyResponse {
            key_id: key.to_string(),
            user_id: user.to_string(),
            ..answer("t1", "viewer", 0)
        };
        let info = key_info(with_ids.clone()).expect("valid");
        assert_eq!((info.key_id, info.user_id), (Some(key), Some(user)));
        let bad_id = agent::AuthenticateKeyResponse { key_id: "nope".into(), ..with_ids };
        assert!(matches!(key_info(bad_id), Err(SourceError::Rejected(_))));
        assert_eq!(key_info(answer("t1", "viewer", 99)).expect("valid").expires_at, Some(99));
        assert!(matches!(key_info(answer("", "viewer", 0)), Err(SourceError::Rejected(_))));
        assert!(matches!(key_info(answer("t1", "root", 0)), Err(SourceError::Rejected(_))));
    }

    #[tokio::test]
    async fn an_unreachable_control_plane_is_unavailable() {
        let client =
            super::super::client::connect("http://127.0.0.1:1", &super::super::config::WorkerToken::new("t"), None)
                .expect("client");
        let creds = ControlPlaneCredentials::new(client);
        assert!(matches!(creds.resolve_key("tsk_x").await, Err(SourceError::Unavailable(_))));
        assert!(matches!(creds.token_keys().await, Err(SourceError::Unavailable(_))));
    }
}
