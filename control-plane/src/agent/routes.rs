//! A gateway's route stream: the complete route table when the stream opens, then again
//! whenever it changes. Like worker sessions, the task learns of changes from this process's
//! scheduler and, for changes made elsewhere (another control-plane replica, heartbeats that
//! turned a replica ready), by re-reading the table every second; an unchanged table is not
//! sent again. The table carries the revocation list, and a new list sends the table again
//! at once.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use prost::Message;
use tessera_protocol::agent::{
    KeyLimit, ModelRoute, RouteReplica, RouteTable, TenantRoutes, VersionWeight, WatchRoutesRequest,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::Status;
use uuid::Uuid;

use super::BoxStream;
use crate::app::App;
use crate::registry::{RouteDeploymentRow, RouteKeyRow, RouteReplicaRow, RouteTenantRow, now};

/// How often the table is re-read.
const POLL: Duration = Duration::from_secs(1);
/// How often an open stream refreshes its gateway's `last_seen_at`.
const SEEN_EVERY: Duration = Duration::from_secs(5);
/// A gateway not seen for this long no longer counts (it died without closing its stream).
const SEEN_WITHIN: Duration = Duration::from_secs(20);
/// Longest gateway id accepted.
const MAX_GATEWAY_ID: usize = 128;

/// Checks the request and starts the stream's task.
pub fn start(
    app: Arc<App>,
    request: WatchRoutesRequest,
    shutdown: CancellationToken,
) -> Result<BoxStream<RouteTable>, Status> {
    let id = request.gateway_id;
    if id.is_empty() || id.len() > MAX_GATEWAY_ID || !id.chars().all(|c| c.is_ascii_graphic()) {
        return Err(Status::invalid_argument(format!(
            "gateway_id must be 1 to {MAX_GATEWAY_ID} printable ASCII characters"
        )));
    }
    tracing::info!(gateway_id = %id, version = %request.version, "gateway watching routes");
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(run(app, id, request.version, tx, shutdown));
    Ok(Box::pin(ReceiverStream::new(rx)))
}

async fn run(
    app: Arc<App>,
    gateway_id: String,
    version: String,
    tx: mpsc::Sender<Result<RouteTable, Status>>,
    shutdown: CancellationToken,
) {
    let mut changes = app.signals.watch_assignments();
    let mut revocations = app.revocations.subscribe();
    let mut poll = tokio::time::interval(POLL);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_sent: Option<Vec<u8>> = None;
    let mut last_seen: Option<Instant> = None;
    loop {
        if last_seen.is_none_or(|at| at.elapsed() >= SEEN_EVERY) {
            match seen(&app, &gateway_id, &version).await {
                Ok(()) => last_seen = Some(Instant::now()),
                Err(e) => tracing::warn!(gateway_id, error = %e, "could not record a gateway"),
            }
        }
        match read_table(&app).await {
            Ok(mut table) => {
                table.revocations = Some(revocations.borrow_and_update().to_proto());
                let encoded = table.encode_to_vec();
                if last_sent.as_ref() != Some(&encoded) {
                    if tx.send(Ok(table)).await.is_err() {
                        break;
                    }
                    last_sent = Some(encoded);
                }
            }
            // The registry is down: the gateway keeps routing by the table it has.
            Err(e) => tracing::warn!(gateway_id, error = %e, "could not read the route table"),
        }
        tokio::select! {
            () = shutdown.cancelled() => break,
            () = tx.closed() => break,
            _ = changes.changed() => {}
            _ = poll.tick() => {}
            Ok(()) = revocations.changed() => {}
        }
    }
    match app.registry.conn().await {
        Ok(mut conn) => {
            if let Err(e) = conn.gateway_gone(&gateway_id).await {
                tracing::warn!(gateway_id, error = %e, "could not forget a gateway");
            }
        }
        Err(e) => tracing::warn!(gateway_id, error = %e, "could not forget a gateway"),
    }
    tracing::info!(gateway_id, "gateway route stream ended");
}

async fn seen(app: &App, gateway_id: &str, version: &str) -> crate::error::Result<()> {
    app.registry.conn().await?.gateway_seen(gateway_id, version, now()).await
}

async fn read_table(app: &App) -> crate::error::Result<RouteTable> {
    let mut conn = app.registry.conn().await?;
    let tenants = conn.route_tenants().await?;
    let keys = conn.route_keys().await?;
    let deployments = conn.route_deployments().await?;
    let replicas = conn.route_replicas().await?;
    let weights = conn.route_weights().await?.into_iter().map(|w| (w.deployment_id, w.weights)).collect();
    let gateways = conn.live_gateways(now(), SEEN_WITHIN).await?;
    Ok(build_table(Rows { tenants, keys, deployments, replicas }, weights, gateways))
}

/// What the table is built from.
struct Rows {
    tenants: Vec<RouteTenantRow>,
    keys: Vec<RouteKeyRow>,
    deployments: Vec<RouteDeploymentRow>,
    replicas: Vec<RouteReplicaRow>,
}

/// Groups the rows into the table gateways read.
fn build_table(rows: Rows, mut weights: BTreeMap<Uuid, Vec<(i64, u32)>>, gateways: u32) -> RouteTable {
    let Rows { tenants, keys, deployments, replicas } = rows;
    let mut keys_by_tenant: BTreeMap<Uuid, Vec<KeyLimit>> = BTreeMap::new();
    for k in keys {
        keys_by_tenant.entry(k.tenant_id).or_default().push(KeyLimit {
            key_id: k.key_id.to_string(),
            requests_per_second: u64::try_from(k.requests_per_second).unwrap_or(0),
            concurrent_requests: u64::try_from(k.concurrent_requests).unwrap_or(0),
        });
    }
    let mut by_deployment: BTreeMap<Uuid, Vec<RouteReplica>> = BTreeMap::new();
    for r in replicas {
        by_deployment.entry(r.deployment_id).or_default().push(RouteReplica {
            replica_id: r.replica_id.to_string(),
            version: r.version,
            serving: r.state.serves(r.serving),
            worker_id: r.worker_id,
            http_endpoint: r.http_endpoint,
            grpc_endpoint: r.grpc_endpoint,
        });
    }
    let mut by_tenant: BTreeMap<Uuid, Vec<ModelRoute>> = BTreeMap::new();
    for d in deployments {
        by_tenant.entry(d.tenant_id).or_default().push(ModelRoute {
            model_name: d.model_name,
            deployment_id: d.deployment_id.to_string(),
            // The split in effect (a canary's share once one of its replicas serves); the
            // deployment's version alone when the registry has none for it.
            weights: weights
                .remove(&d.deployment_id)
                .unwrap_or_else(|| vec![(d.version, 100)])
                .into_iter()
                .map(|(version, weight)| VersionWeight { version, weight })
                .collect(),
            replicas: by_deployment.remove(&d.deployment_id).unwrap_or_default(),
        });
    }
    let tenants = tenants
        .into_iter()
        .map(|t| TenantRoutes {
            tenant_id: t.tenant_id.to_string(),
            tenant_name: t.tenant_name,
            requests_per_second: u64::try_from(t.requests_per_second).unwrap_or(0),
            concurrent_requests: u64::try_from(t.concurrent_requests).unwrap_or(0),
            models: by_tenant.remove(&t.tenant_id).unwrap_or_default(),
            keys: keys_by_tenant.remove(&t.tenant_id).unwrap_or_default(),
        })
        .collect();
    RouteTable { tenants, gateways, revocations: None }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::states::ReplicaState;

    fn replica(deployment: Uuid, version: i64, serving: bool, state: ReplicaState, worker: &str) -> RouteReplicaRow {
        RouteReplicaRow {
            replica_id: Uuid::new_v4(),
            deployment_id: deployment,
            version,
            serving,
            state,
            worker_id: worker.into(),
            http_endpoint: format!("http://{worker}:8000"),
            grpc_endpoint: format!("{worker}:8001"),
        }
    }

    #[test]
    fn rows_group_into_tenants_models_and_replicas() {
        let (t1, t2, d1, d2) = (Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4(), Uuid::new_v4());
        let tenants = vec![
            RouteTenantRow { tenant_id: t1, tenant_name: "a".into(), requests_per_second: 50, concurrent_requests: 0 },
            RouteTenantRow { tenant_id: t2, tenant_name: "b".into(), requests_per_second: -1, concurrent_requests: 4 },
        ];
        let deployments = vec![
            RouteDeploymentRow { deployment_id: d1, tenant_id: t1, model_name: "m".into(), version: 2 },
            RouteDeploymentRow { deployment_id: d2, tenant_id: t2, model_name: "n".into(), version: 1 },
        ];
        let replicas = vec![
            replica(d1, 2, true, ReplicaState::Ready, "w1"),
            replica(d1, 1, false, ReplicaState::Draining, "w2"),
            replica(d1, 2, true, ReplicaState::Draining, "w3"),
        ];
        let weights = BTreeMap::from([(d2, vec![(1, 90), (3, 10)])]);
        let key = Uuid::new_v4();
        let keys = vec![RouteKeyRow { tenant_id: t2, key_id: key, requests_per_second: 5, concurrent_requests: 0 }];
        let table = build_table(Rows { tenants, keys, deployments, replicas }, weights, 3);
        assert_eq!(table.gateways, 3);
        let a = &table.tenants[0];
        assert_eq!((a.tenant_name.as_str(), a.requests_per_second), ("a", 50));
        let m = &a.models[0];
        assert_eq!(m.weights, vec![VersionWeight { version: 2, weight: 100 }]);
        let serving: Vec<_> = m.replicas.iter().map(|r| (r.worker_id.as_str(), r.serving)).collect();
        // Only a ready replica still marked serving takes unversioned requests.
        assert_eq!(serving, vec![("w1", true), ("w2", false), ("w3", false)]);
        let b = &table.tenants[1];
        assert_eq!((b.requests_per_second, b.concurrent_requests), (0, 4));
        assert!(a.keys.is_empty());
        assert_eq!(b.keys, vec![KeyLimit { key_id: key.to_string(), requests_per_second: 5, concurrent_requests: 0 }]);
        assert!(b.models[0].replicas.is_empty(), "a deployment without loaded replicas is still listed");
        let split: Vec<_> = b.models[0].weights.iter().map(|w| (w.version, w.weight)).collect();
        assert_eq!(split, vec![(1, 90), (3, 10)], "the registry's split in effect");
    }
}
