//! The dispatcher: sends due deliveries and records how each attempt went.
//!
//! One control-plane replica dispatches at a time (a Postgres advisory lock, like the
//! scheduler's but its own), so a delivery is not sent twice by two replicas; a replica that
//! dies mid-attempt leaves the delivery pending and the next leader sends it again, which is
//! why receivers should dedupe on the event id. Each attempt re-checks the target address
//! against the SSRF guard and connects to exactly the address it checked; redirects are not
//! followed and each attempt has a timeout.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use rand::Rng;
use time::OffsetDateTime;
use tokio_util::sync::CancellationToken;

use super::{backoff, signing, ssrf};
use crate::app::App;
use crate::kinds::WebhookDeliveryStatus;
use crate::registry::{AttemptOutcome, DueDeliveryRow, now};
use crate::scheduler::run::Leadership;

/// Key of the dispatcher's leader lock (distinct from the scheduler's).
const LEADER_LOCK: i64 = crate::locks::WEBHOOK_SENDER;

/// Most deliveries read per pass.
const BATCH: i64 = 64;

/// Most batches sent in one pass before waiting for the next tick.
const MAX_BATCHES_PER_PASS: usize = 16;

/// Most attempts in flight at once.
const CONCURRENCY: usize = 8;

/// Longest a connection may take to open (within the attempt's timeout).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs the dispatcher until `shutdown`.
pub async fn run_dispatcher(app: Arc<App>, shutdown: CancellationToken) {
    let tls = match tessera_protocol::tls::client_config(None) {
        Ok(tls) => tls,
        Err(e) => {
            tracing::error!(error = %e, "webhook dispatcher cannot load TLS roots; webhooks are not sent");
            return;
        }
    };
    let mut leadership = Leadership::new(&app, LEADER_LOCK);
    // The leader also issues closed months' invoices, whose events it then sends.
    let mut invoices = crate::usage::issue::Issuer::default();
    let mut interval = tokio::time::interval(app.config.webhook_poll);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = shutdown.cancelled() => break,
            _ = interval.tick() => {}
            () = app.signals.webhooks_woken() => {}
        }
        if !leadership.check().await {
            continue;
        }
        if let Err(e) = invoices.run(&app).await {
            tracing::warn!(error = %e, "issuing invoices failed; trying again on the next tick");
        }
        // A full batch means more may be due: go again at once, a bounded number of times (a
        // batch whose outcomes could not be recorded is read again).
        for _ in 0..MAX_BATCHES_PER_PASS {
            match dispatch_due(&app, &tls).await {
                Ok(n) if n as i64 == BATCH && !shutdown.is_cancelled() => continue,
                Ok(_) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "webhook dispatch pass failed");
                    break;
                }
            }
        }
    }
    tracing::info!("webhook dispatcher stopped");
}

/// Sends the deliveries due now; returns how many it read.
async fn dispatch_due(app: &App, tls: &rustls::ClientConfig) -> crate::error::Result<usize> {
    let due = app.registry.conn().await?.due_webhook_deliveries(now(), BATCH).await?;
    let n = due.len();
    futures::stream::iter(due)
        .for_each_concurrent(CONCURRENCY, |d| async move {
            let outcome = attempt(app, tls, &d).await;
            tracing::info!(
                delivery = %d.id, webhook = %d.webhook_id, tenant = %d.tenant_id, event = %d.event_type,
                attempt = d.attempts + 1, status = %outcome.status, http_status = ?outcome.http_status,
                error = ?outcome.error, "webhook delivery attempted"
            );
            crate::metrics::observe_webhook_attempt(outcome.status.as_str());
            let recorded = match app.registry.conn().await {
                Ok(mut c) => c.record_webhook_attempt(d.id, &outcome).await,
                Err(e) => Err(e),
            };
            if let Err(e) = recorded {
                // Still pending: it is sent again on a later pass.
                tracing::warn!(delivery = %d.id, error = %e, "could not record a webhook attempt");
            }
        })
        .await;
    Ok(n)
}

/// One attempt, and what the delivery becomes.
async fn attempt(app: &App, tls: &rustls::ClientConfig, d: &DueDeliveryRow) -> AttemptOutcome {
    let sent = send(app, tls, d).await;
    let (http_status, error) = match sent {
        Ok(code) if (200..300).contains(&code) => {
            return AttemptOutcome {
                status: WebhookDeliveryStatus::Delivered,
                http_status: Some(code),
                error: None,
                next_attempt_at: None,
            };
        }
        Ok(code) if (300..400).contains(&code) => {
            (Some(code), format!("receiver answered {code}; redirects are not followed"))
        }
        Ok(code) => (Some(code), format!("receiver answered {code}")),
        Err(e) => (None, e),
    };
    let attempts = d.attempts + 1;
    if backoff::retries_left(attempts) {
        let wait = backoff::delay(attempts, app.config.webhook_retry_base, rand::rng().random::<f64>());
        AttemptOutcome {
            status: WebhookDeliveryStatus::Pending,
            http_status,
            error: Some(error),
            next_attempt_at: Some(now() + wait),
        }
    } else {
        AttemptOutcome { status: WebhookDeliveryStatus::Failed, http_status, error: Some(error), next_attempt_at: None }
    }
}

/// POSTs the delivery; the receiver's status, or why there is none.
async fn send(app: &App, tls: &rustls::ClientConfig, d: &DueDeliveryRow) -> Result<u16, String> {
    let allow_private = d.allow_private || app.config.webhooks_allow_private;
    let target = ssrf::parse_target("url", &d.url, allow_private).map_err(|e| e.to_string())?;
    let addrs = ssrf::resolve("url", &target, allow_private).await.map_err(|e| e.to_string())?;
    let addr = addrs[0];
    let mut builder = reqwest::Client::builder()
        .use_preconfigured_tls(tls.clone())
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .timeout(app.config.webhook_timeout)
        .connect_timeout(CONNECT_TIMEOUT.min(app.config.webhook_timeout));
    if target.host.parse::<IpAddr>().is_err() {
        // Connect to the address just checked, not to whatever the name resolves to next.
        builder = builder.resolve(&target.host, addr);
    }
    let client = builder.build().map_err(|e| format!("build the HTTP client: {e}"))?;
    let timestamp = OffsetDateTime::now_utc().unix_timestamp();
    let body = d.payload.clone().into_bytes();
    let signature = signing::signature(&d.secret, timestamp, &body);
    let response = client
        .post(target.url.clone())
        .header(http::header::CONTENT_TYPE, "application/json")
        .header(http::header::USER_AGENT, "Tessera-Webhooks/1")
        .header("Tessera-Event", &d.event_type)
        .header("Tessera-Delivery", d.id.to_string())
        .header("Tessera-Timestamp", timestamp.to_string())
        .header("Tessera-Signature", signature)
        .body(body)
        .send()
        .await
        .map_err(|e| describe(&e, app.config.webhook_timeout))?;
    Ok(response.status().as_u16())
}

/// A short reason for a failed request, with its innermost cause.
fn describe(e: &reqwest::Error, timeout: Duration) -> String {
    if e.is_timeout() {
        return format!("timed out after {} ms", timeout.as_millis());
    }
    let mut cause: &dyn std::error::Error = e;
    while let Some(inner) = cause.source() {
        cause = inner;
    }
    let what = if e.is_connect() { "could not connect" } else { "request failed" };
    format!("{what}: {cause}")
}
