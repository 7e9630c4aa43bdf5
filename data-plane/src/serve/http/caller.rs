//! The `Caller` extractor: who sent an HTTP request, resolved from its `Authorization` header
//! when the server requires authentication.

use std::sync::Arc;

use axum::extract::FromRequestParts;
use axum::http::request::Parts;

use crate::auth::{Principal, Role};
use crate::error::Error;
use crate::serve::server::ServerState;

/// The authenticated caller (`None` when authentication is off). Extracting it refuses a
/// request without a valid credential (401) before its body is read.
pub struct Caller(pub Option<Principal>);

impl Caller {
    /// The principal, if authentication is on.
    pub fn principal(&self) -> Option<&Principal> {
        self.0.as_ref()
    }
}

impl FromRequestParts<Arc<ServerState>> for Caller {
    type Rejection = Error;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<ServerState>) -> Result<Self, Error> {
        let header = |name: &'static str| parts.headers.get(name).and_then(|v| v.to_str().ok());
        // Every role may call the inference routes; statistics check for more themselves.
        state.authorize(header, Role::Inference).await.map(Caller)
    }
}
