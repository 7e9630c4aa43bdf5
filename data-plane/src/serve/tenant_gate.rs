//! A cap on each tenant's inference requests in flight on this server, so one tenant's flood
//! (each request holding its body, up to the input limit, until it is answered) cannot take a
//! worker's memory and queues from the others. A request over the cap is refused at once with
//! 429 / RESOURCE_EXHAUSTED naming the cap, before it reaches a model (and is not billed).

use std::collections::HashMap;

use parking_lot::Mutex;

use crate::error::{Error, ErrorKind, Result};

/// Default requests in flight per tenant on one worker (`--tenant-max-in-flight`).
pub const DEFAULT_TENANT_MAX_IN_FLIGHT: usize = 512;

/// Requests in flight by tenant, and the cap.
#[derive(Debug)]
pub struct TenantGate {
    limit: usize,
    in_flight: Mutex<HashMap<String, usize>>,
}

/// One admitted request; it leaves the count when dropped.
#[derive(Debug)]
pub struct Admitted<'a> {
    gate: &'a TenantGate,
    tenant: String,
}

impl TenantGate {
    /// A gate letting `limit` requests of each tenant in at once.
    pub fn new(limit: usize) -> Self {
        Self { limit: limit.max(1), in_flight: Mutex::new(HashMap::new()) }
    }

    /// Counts a request of `tenant`, or refuses it when the tenant is at the cap.
    pub fn admit(&self, tenant: &str) -> Result<Admitted<'_>> {
        let mut in_flight = self.in_flight.lock();
        let n = match in_flight.get_mut(tenant) {
            Some(n) => n,
            None => in_flight.entry(tenant.to_string()).or_insert(0),
        };
        if *n >= self.limit {
            let message = format!(
                "the tenant has {} inference requests in flight on this worker, its limit \
                 (--tenant-max-in-flight); retry when some are answered",
                self.limit
            );
            return Err(Error::new(ErrorKind::TooManyRequests, message).retry_after(1));
        }
        *n += 1;
        Ok(Admitted { gate: self, tenant: tenant.to_string() })
    }

    /// Requests of `tenant` in flight now.
    pub fn in_flight(&self, tenant: &str) -> usize {
        self.in_flight.lock().get(tenant).copied().unwrap_or(0)
    }
}

impl Drop for Admitted<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.gate.in_flight.lock();
        if let Some(n) = in_flight.get_mut(&self.tenant) {
            *n -= 1;
            if *n == 0 {
                in_flight.remove(&self.tenant);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_has_its_own_cap_and_answered_requests_free_their_place() {
        let gate = TenantGate::new(2);
        let a1 = gate.admit("a").expect("first");
        let a2 = gate.admit("a").expect("second");
        let refused = gate.admit("a").expect_err("third");
        assert_eq!((refused.kind, refused.retry_after_s), (ErrorKind::TooManyRequests, Some(1)));
        assert!(refused.message.contains("--tenant-max-in-flight"), "{}", refused.message);
        let _b = gate.admit("b").expect("another tenant is not affected");
        drop(a1);
        let _a3 = gate.admit("a").expect("a place came free");
        drop(a2);
        assert_eq!(gate.in_flight("a"), 1);
    }

    #[tokio::test]
    async fn the_facade_refuses_a_tenant_over_its_cap_before_looking_up_the_model() {
        use std::sync::Arc;

        use crate::auth::{Principal, Role};
        use crate::engine::manager::{ControlMode, ModelManager};
        use crate::engine::repository::Repository;
        use crate::serve::facade::Answered;
        use crate::serve::server::ServerState;

        let dir = tempfile::tempdir().expect("a temp dir");
        let repository = Repository::open(dir.path()).expect("an empty repository");
        let manager = Arc::new(ModelManager::new(repository, ControlMode::None));
        let state = ServerState::new(manager, false, 1 << 20).with_tenant_limit(1);
        let caller = |tenant: &str| Principal {
            tenant_id: tenant.into(),
            tenant_name: tenant.into(),
            role: Role::Inference,
            key_id: None,
        };
        let infer = async |who: &Principal| {
            let run = async |_: &crate::engine::model::LoadedModel,
                             _: &mut crate::serve::capture::Tap|
                   -> Result<Answered<()>> { Ok(Answered { answer: (), rows: 1, bytes_out: 0 }) };
            state.infer(crate::spans::Origin::bare("http"), Some(who), "absent", None, || 0, run).await
        };
        let gate = state.tenant_gate().expect("a gate");
        let held = gate.admit("a").expect("one request of tenant a in flight");
        let refused = infer(&caller("a")).await.expect_err("over the cap");
        assert_eq!(refused.kind, ErrorKind::TooManyRequests);
        let other = infer(&caller("b")).await.expect_err("no such model");
        assert_eq!(other.kind, ErrorKind::NotFound, "tenant b passes the gate: {}", other.message);
        drop(held);
        assert_eq!(infer(&caller("a")).await.expect_err("no such model").kind, ErrorKind::NotFound);
        assert_eq!(gate.in_flight("a"), 0, "a refused or failed request leaves nothing counted");
    }
}
