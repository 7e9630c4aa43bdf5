//! Test fixtures for the authenticated endpoints: a fixed credential source and a server state
//! with models installed under two tenants' namespaces.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;

use super::{Authenticator, CredentialSource, KeyInfo, Principal, Role, SourceError, TokenKeys};
use crate::engine::manager::{ControlMode, ModelManager, scoped_key};
use crate::engine::repository::Repository;
use crate::serve::server::ServerState;

/// Tenant A's id.
pub const TENANT_A: &str = "0b8a4a5e-1d0c-4f7e-9a51-5b1d1c2f3a01";
/// Tenant B's id.
pub const TENANT_B: &str = "0b8a4a5e-1d0c-4f7e-9a51-5b1d1c2f3a02";
/// Tenant A, role `inference`.
pub const A_INFERENCE: &str = "tsk_a_inference";
/// Tenant A, role `viewer`.
pub const A_VIEWER: &str = "tsk_a_viewer";
/// Tenant B, role `deployer`.
pub const B_DEPLOYER: &str = "tsk_b_deployer";
/// A platform admin (of a tenant of its own).
pub const PLATFORM_ADMIN: &str = "tsk_platform_admin";
/// The platform admin's tenant.
const TENANT_OPS: &str = "0b8a4a5e-1d0c-4f7e-9a51-5b1d1c2f3a09";

/// Knows the three keys above; refuses everything else.
struct StaticSource(HashMap<&'static str, Principal>);

impl CredentialSource for StaticSource {
    fn resolve_key<'a>(&'a self, api_key: &'a str) -> BoxFuture<'a, Result<KeyInfo, SourceError>> {
        let answer = match self.0.get(api_key) {
            Some(principal) => {
                Ok(KeyInfo { principal: principal.clone(), expires_at: None, key_id: None, user_id: None })
            }
            None => Err(SourceError::Rejected("unknown key".into())),
        };
        Box::pin(async move { answer })
    }

    fn token_keys(&self) -> BoxFuture<'_, Result<TokenKeys, SourceError>> {
        Box::pin(async { Err(SourceError::Unavailable("no tokens in these tests".into())) })
    }
}

fn principal(tenant: &str, role: Role) -> Principal {
    Principal {
        tenant_id: tenant.into(),
        tenant_name: format!("tenant-{}", &tenant[tenant.len() - 2..]),
        role,
        key_id: None,
    }
}

/// An authenticator that knows [`A_INFERENCE`], [`A_VIEWER`], [`B_DEPLOYER`] and
/// [`PLATFORM_ADMIN`].
pub fn authenticator() -> Arc<Authenticator> {
    let keys = HashMap::from([
        (A_INFERENCE, principal(TENANT_A, Role::Inference)),
        (A_VIEWER, principal(TENANT_A, Role::Viewer)),
        (B_DEPLOYER, principal(TENANT_B, Role::Deployer)),
        (PLATFORM_ADMIN, principal(TENANT_OPS, Role::PlatformAdmin)),
    ]);
    Arc::new(Authenticator::new(Arc::new(StaticSource(keys)), Duration::from_secs(60)))
}

/// A started server state, authentication on: tenant A has `add_sub` (version 1) and a
/// `broken` model that failed to load; tenant B has `add_sub` (version 2) and `only_b`.
/// The temp dir holds the model files and must outlive the state.
pub async fn tenant_state() -> (Arc<ServerState>, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let file = dir.path().join("add_sub.onnx");
    std::fs::write(&file, crate::tools::onnx_builder::add_sub()).expect("write the model");
    let garbage = dir.path().join("broken.onnx");
    std::fs::write(&garbage, b"not an onnx model").expect("write the broken model");
    let repo_dir = dir.path().join("repository");
    std::fs::create_dir(&repo_dir).expect("a repository dir");
    let repository = Repository::open(&repo_dir).expect("an empty repository");
    let manager = Arc::new(ModelManager::new(repository, ControlMode::None));

    let install = |tenant: &str, name: &str, version: i64, file: &std::path::Path| {
        let (manager, key, name, file) =
            (manager.clone(), scoped_key(Some(tenant), name), name.to_string(), file.to_owned());
        async move { manager.install_version(&key, &name, version, file, Default::default(), None).await }
    };
    install(TENANT_A, "add_sub", 1, &file).await.expect("install A's add_sub");
    install(TENANT_B, "add_sub", 2, &file).await.expect("install B's add_sub");
    install(TENANT_B, "only_b", 1, &file).await.expect("install B's only_b");
    install(TENANT_A, "broken", 1, &garbage).await.expect_err("a broken model fails to load");

    let state =
        ServerState::new(manager, false, crate::serve::server::DEFAULT_MAX_INPUT_SIZE).with_auth(authenticator());
    state.mark_started();
    (Arc::new(state), dir)
}

/// A KServe v2 JSON inference request for `add_sub` (FP32 `[1, 16]`, inputs 1 and 2).
pub fn add_sub_request() -> serde_json::Value {
    let ones = vec![1.0f32; 16];
    let twos = vec![2.0f32; 16];
    serde_json::json!({
        "inputs": [
            { "name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "data": ones },
            { "name": "INPUT1", "shape": [1, 16], "datatype": "FP32", "data": twos },
        ]
    })
}
