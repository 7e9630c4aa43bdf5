//! Webhooks: signed HTTP callbacks to a tenant's endpoints when something happens to its
//! deployments, versions and aliases.
//!
//! The registry writes an event's deliveries in the transaction of the change (an outbox,
//! [`crate::registry::DeliveryRow`]); the [`dispatch`] loop, on one control-plane replica at a
//! time, POSTs them [`signing`]-signed to addresses the [`ssrf`] guard allows, and retries
//! failures with [`backoff`] for about a day. The API (`/v1/tenants/{tenant}/webhooks`)
//! registers hooks, lists deliveries and replays them.

pub mod backoff;
pub mod dispatch;
pub mod signing;
pub mod ssrf;
