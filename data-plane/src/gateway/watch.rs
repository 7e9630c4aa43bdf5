//! The gateway's route stream from the control plane: each table replaces the one before, and
//! the revocation list it carries replaces the one the gateway's authenticator enforces.
//! When the stream breaks the gateway keeps routing by the last table and enforcing the last
//! list (static stability), and reconnects with capped exponential backoff.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use tessera_protocol::agent::WatchRoutesRequest;
use tessera_protocol::revocation::RevocationList;
use tokio_util::sync::CancellationToken;

use super::Gateway;
use super::routes::Routes;
use crate::worker::client::AgentClient;

const BACKOFF_START: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Follows the route stream until `shutdown`.
pub async fn run(client: AgentClient, gateway: Arc<Gateway>, gateway_id: String, shutdown: CancellationToken) {
    let mut backoff = BACKOFF_START;
    loop {
        let request = WatchRoutesRequest { gateway_id: gateway_id.clone(), version: env!("CARGO_PKG_VERSION").into() };
        let mut client = client.clone();
        let opened = tokio::select! {
            () = shutdown.cancelled() => return,
            opened = client.watch_routes(request) => opened,
        };
        match opened {
            Ok(response) => {
                let mut stream = response.into_inner();
                loop {
                    let next = tokio::select! {
                        () = shutdown.cancelled() => return,
                        next = stream.next() => next,
                    };
                    match next {
                        Some(Ok(table)) => {
                            if let Some(list) = &table.revocations {
                                gateway.apply_revocations(RevocationList::from_proto(list));
                            }
                            let routes = Routes::from_table(&table, &gateway.routes());
                            let models: usize = routes.tenants.values().map(|t| t.models.len()).sum();
                            tracing::debug!(
                                tenants = routes.tenants.len(),
                                models,
                                gateways = routes.gateways,
                                "route table"
                            );
                            gateway.set_routes(routes);
                            backoff = BACKOFF_START;
                        }
                        Some(Err(status)) => {
                            tracing::warn!(error = %status, "route stream broke; routing by the last table");
                            break;
                        }
                        None => {
                            tracing::warn!("route stream ended; routing by the last table");
                            break;
                        }
                    }
                }
            }
            Err(status) => tracing::warn!(error = %status, retry_in = ?backoff, "cannot open the route stream"),
        }
        gateway.revocation_stream_lost();
        tokio::select! {
            () = shutdown.cancelled() => return,
            () = tokio::time::sleep(backoff) => {}
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}
