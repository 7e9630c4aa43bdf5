//! Closed sets of names the API shows: what the audit trail records (actions, resource types)
//! and what a deployment's event log says happened. They are stored as text; these types give
//! them one spelling each and make the OpenAPI document list them as enums, so generated
//! clients get enum types instead of strings.

/// Declares a fieldless enum whose variants travel as the given strings, with `as_str`,
/// `parse` and the list of all values. (The values are plain literals, not `rename_all`, since
/// some hold dots.)
macro_rules! wire_enum {
    ($(#[$meta:meta])* $vis:vis enum $name:ident { $($(#[$vmeta:meta])* $variant:ident = $wire:tt,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
        $vis enum $name {
            $($(#[$vmeta])* #[serde(rename = $wire)] $variant,)*
        }

        impl $name {
            /// Every value, in declaration order.
            #[allow(dead_code)]
            pub const ALL: &'static [$name] = &[$($name::$variant,)*];

            /// The value as it is stored and sent.
            #[allow(dead_code)]
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $wire,)*
                }
            }

            /// The value spelled `s`, if it is one.
            #[allow(dead_code)]
            pub fn parse(s: &str) -> Option<Self> {
                match s {
                    $($wire => Some($name::$variant),)*
                    _ => None,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}
pub(crate) use wire_enum;

wire_enum! {
    /// What an audit event records: `resource.verb`.
    pub enum AuditAction {
        /// A tenant was created.
        TenantCreate = "tenant.create",
        /// A tenant's quotas were replaced.
        QuotaUpdate = "quota.update",
        /// The price schedule was replaced.
        PricesUpdate = "prices.update",
        /// The token signing key was rotated.
        SigningKeyRotate = "signing_key.rotate",
        /// An API key was created.
        ApiKeyCreate = "api_key.create",
        /// An API key was revoked.
        ApiKeyRevoke = "api_key.revoke",
        /// An API key's own limits were changed.
        ApiKeyUpdate = "api_key.update",
        /// A user was created.
        UserCreate = "user.create",
        /// A user was disabled (and their keys revoked).
        UserDisable = "user.disable",
        /// A model was registered.
        ModelCreate = "model.create",
        /// A model was deleted with its versions.
        ModelDelete = "model.delete",
        /// A version was uploaded.
        VersionCreate = "version.create",
        /// A version was deleted.
        VersionDelete = "version.delete",
        /// A presigned upload was opened.
        UploadCreate = "upload.create",
        /// An alias was created or moved.
        AliasSet = "alias.set",
        /// An alias was removed.
        AliasDelete = "alias.delete",
        /// A deployment was created.
        DeploymentCreate = "deployment.create",
        /// A deployment was changed.
        DeploymentUpdate = "deployment.update",
        /// A deployment was deleted.
        DeploymentDelete = "deployment.delete",
        /// A canary was set on a deployment.
        DeploymentCanarySet = "deployment.canary.set",
        /// A canary's weight changed.
        DeploymentCanaryWeight = "deployment.canary.weight",
        /// A canary was promoted.
        DeploymentCanaryPromote = "deployment.canary.promote",
        /// A canary was rolled back.
        DeploymentCanaryRollback = "deployment.canary.rollback",
        /// A webhook was registered.
        WebhookCreate = "webhook.create",
        /// A webhook's URL, events or state changed.
        WebhookUpdate = "webhook.update",
        /// A webhook was deleted with its deliveries.
        WebhookDelete = "webhook.delete",
        /// A webhook's signing secret was replaced.
        WebhookSecretRotate = "webhook.secret.rotate",
        /// A delivery was queued again.
        WebhookDeliveryReplay = "webhook.delivery.replay",
        /// A test event was queued to a webhook.
        WebhookPing = "webhook.ping",
        /// A platform admin changed whether a tenant's webhooks may reach private addresses.
        WebhookSettingsUpdate = "webhook_settings.update",
        /// A tenant's capture retention was set.
        CaptureRetentionUpdate = "capture_retention.update",
        /// A platform admin set a tenant's OpenID Connect issuer.
        OidcIssuerSet = "oidc_issuer.set",
        /// A platform admin removed a tenant's OpenID Connect issuer.
        OidcIssuerDelete = "oidc_issuer.delete",
        /// A user signed in to the console through single sign-on.
        SessionSignIn = "session.sign_in",
        /// A user signed out of the console (the session was revoked).
        SessionSignOut = "session.sign_out",
    }
}

wire_enum! {
    /// The kind of resource an audit event is about.
    pub enum AuditResourceType {
        /// A tenant.
        Tenant = "tenant",
        /// A tenant's quotas.
        Quota = "quota",
        /// A tenant's capture retention.
        CaptureRetention = "capture_retention",
        /// The price schedule.
        Prices = "prices",
        /// The token signing key.
        SigningKey = "signing_key",
        /// An API key.
        ApiKey = "api_key",
        /// A user.
        User = "user",
        /// A model.
        Model = "model",
        /// A model version.
        ModelVersion = "model_version",
        /// A model's alias.
        ModelAlias = "model_alias",
        /// A presigned upload.
        Upload = "upload",
        /// A deployment.
        Deployment = "deployment",
        /// A webhook.
        Webhook = "webhook",
        /// A tenant's webhook settings.
        WebhookSettings = "webhook_settings",
        /// A tenant's OpenID Connect issuer.
        OidcIssuer = "oidc_issuer",
        /// A console session.
        Session = "session",
    }
}

wire_enum! {
    /// What a deployment event says happened.
    pub enum DeploymentEventKind {
        /// The deployment was created.
        Created = "created",
        /// Its spec changed (a rollout follows when the version or the replica shape changed).
        Updated = "updated",
        /// Its replica count changed.
        Scaled = "scaled",
        /// A replica was placed on a worker's slice.
        Placed = "placed",
        /// A replica cannot be placed (the message says why).
        Unplaceable = "unplaceable",
        /// A replica is ready.
        Ready = "ready",
        /// A replica failed.
        Failed = "failed",
        /// A replica's worker stopped sending heartbeats.
        WorkerLost = "worker_lost",
        /// A replica's slice turned unhealthy (a critical Xid error, a lost GPU): it moves.
        SliceUnhealthy = "slice_unhealthy",
        /// A replica was moved to another worker.
        Rescheduled = "rescheduled",
        /// The deployment's target version changed (an alias moved).
        Retargeted = "retargeted",
        /// New replicas started loading beside the old ones.
        RolloutStarted = "rollout_started",
        /// Traffic switched to the new replicas.
        RolloutSwitched = "rollout_switched",
        /// An old replica finished draining.
        Drained = "drained",
        /// A replica that crash-looped on several workers stays where it is.
        CrashLoop = "crash_loop",
        /// Replicas had to share a slice (the message says why).
        ReplicasColocated = "replicas_colocated",
        /// A version pin stopped following an alias.
        AliasUnfollowed = "alias_unfollowed",
        /// A canary was set.
        CanarySet = "canary_set",
        /// The canary's weight changed.
        CanaryWeight = "canary_weight",
        /// The canary was promoted.
        CanaryPromoted = "canary_promoted",
        /// The canary was rolled back.
        CanaryRolledBack = "canary_rolled_back",
        /// The canary's replicas started.
        CanaryStarted = "canary_started",
        /// The canary serves its share.
        CanaryServing = "canary_serving",
        /// The canary's replicas drain.
        CanaryDraining = "canary_draining",
        /// A promotion finished: the canary is cleared.
        CanaryCleared = "canary_cleared",
    }
}

wire_enum! {
    /// What a webhook delivery announces (its `Tessera-Event` header and `type` field).
    pub enum WebhookEventType {
        /// A deployment was created.
        DeploymentCreated = "deployment.created",
        /// A replica of a deployment became ready (one event per replica).
        DeploymentReady = "deployment.ready",
        /// A replica of a deployment failed.
        DeploymentFailed = "deployment.failed",
        /// A rollout switched a deployment's traffic to its new version.
        DeploymentRolledOut = "deployment.rolled_out",
        /// A model version was uploaded.
        VersionUploaded = "version.uploaded",
        /// An alias was created or moved.
        AliasMoved = "alias.moved",
        /// A request was refused by one of the tenant's quotas (at most one event per quota
        /// every ten minutes).
        QuotaExceeded = "quota.exceeded",
        /// A closed month's invoice was issued (once per tenant and month, after the grace
        /// period for late usage).
        InvoiceIssued = "invoice.issued",
        /// A test event sent on request (every hook receives it, whatever it subscribes to).
        Ping = "ping",
    }
}

wire_enum! {
    /// Where a webhook delivery stands.
    pub enum WebhookDeliveryStatus {
        /// Waiting for its next attempt.
        Pending = "pending",
        /// The receiver answered 2xx.
        Delivered = "delivered",
        /// Every attempt failed (about a day of retries), or the hook refused it for good.
        Failed = "failed",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_round_trip_through_their_wire_names() {
        for a in AuditAction::ALL {
            assert_eq!(AuditAction::parse(a.as_str()), Some(*a));
            assert_eq!(serde_json::to_value(a).unwrap(), serde_json::json!(a.as_str()));
        }
        for k in DeploymentEventKind::ALL {
            assert_eq!(serde_json::from_value::<DeploymentEventKind>(serde_json::json!(k.as_str())).unwrap(), *k);
        }
        for r in AuditResourceType::ALL {
            assert_eq!(AuditResourceType::parse(&r.to_string()), Some(*r));
        }
        for e in WebhookEventType::ALL {
            assert_eq!(WebhookEventType::parse(e.as_str()), Some(*e));
        }
        assert_eq!(AuditAction::parse("model.explode"), None);
    }
}
