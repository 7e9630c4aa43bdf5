//! Issuing invoices: once a month has closed and its grace for late usage has passed, each
//! tenant with usage in it gets its invoice issued: the total is recorded and an
//! `invoice.issued` webhook event queued, once. The webhook dispatcher's leader runs it, so
//! one control plane issues at a time; the registry's primary key makes a second attempt a
//! no-op all the same.

use std::time::{Duration, Instant};

use serde_json::json;
use time::OffsetDateTime;

use super::billing::{Period, invoice};
use crate::app::App;
use crate::error::Result;
use crate::registry::{IssuedInvoice, UsageFilter, now};

/// The closed month whose invoices are due at `at`: the previous month once `delay` has passed
/// since it ended, else none (the month before that was issued a month ago).
pub fn due_period(at: OffsetDateTime, delay: Duration) -> Option<Period> {
    let previous = Period::of(at).previous();
    let (_, end) = previous.bounds();
    let delay = i64::try_from(delay.as_secs()).unwrap_or(i64::MAX);
    (at.unix_timestamp() >= end.saturating_add(delay)).then_some(previous)
}

/// Remembers when the due month was last fully issued, so a leader reads the month's usage
/// once per check interval rather than on every tick (a tenant whose first usage of the
/// month arrives late is issued at the next check).
#[derive(Debug, Default)]
pub struct Issuer {
    done: Option<(Period, Instant)>,
}

impl Issuer {
    /// Issues the due month's invoices not issued yet; returns how many it issued.
    pub async fn run(&mut self, app: &App) -> Result<usize> {
        let Some(period) = due_period(now(), app.config.invoice_issue_delay) else { return Ok(0) };
        if let Some((done, at)) = self.done
            && done == period
            && at.elapsed() < app.config.invoice_check_interval
        {
            return Ok(0);
        }
        let issued = issue(app, period).await?;
        self.done = Some((period, Instant::now()));
        Ok(issued)
    }
}

async fn issue(app: &App, period: Period) -> Result<usize> {
    let name = period.to_string();
    let (from, to) = period.bounds();
    let tenants = app.registry.conn().await?.tenants_to_invoice(&name, from, to).await?;
    let mut issued = 0;
    for tenant_id in tenants {
        let mut tx = app.registry.begin().await?;
        let Some(tenant) = tx.tenant_by_id(tenant_id).await? else { continue };
        let usage = tx.usage_totals(tenant_id, &UsageFilter { from, to, model: None, version: None }).await?;
        let prices = tx.prices().await?;
        let computed = invoice(&usage, &prices);
        let data = json!({
            "tenant": tenant.name,
            "period": name,
            "currency": "USD",
            "total_cents": computed.total_cents,
            "gpu_seconds": computed.gpu_us as f64 / 1e6,
            "lines": computed.lines.len(),
            "invoice": format!("/v1/tenants/{}/invoices/{name}", tenant.name),
        });
        let record = IssuedInvoice { total_cents: computed.total_cents, issued_at: now() };
        if tx.issue_invoice(tenant_id, &name, record, data).await? {
            tx.commit().await?;
            issued += 1;
            tracing::info!(tenant = %tenant.name, period = %name, total_cents = computed.total_cents, "invoice issued");
        }
    }
    Ok(issued)
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    #[test]
    fn a_month_is_due_once_its_grace_has_passed() {
        let hour = Duration::from_secs(3600);
        assert_eq!(due_period(datetime!(2026-12-01 00:59:59 UTC), hour), None);
        assert_eq!(due_period(datetime!(2026-12-01 01:00:00 UTC), hour).map(|p| p.to_string()), Some("2026-11".into()));
        assert_eq!(due_period(datetime!(2026-12-31 23:59:59 UTC), hour).map(|p| p.to_string()), Some("2026-11".into()));
        // January issues December of the year before.
        assert_eq!(due_period(datetime!(2027-01-02 00:00:00 UTC), hour).map(|p| p.to_string()), Some("2026-12".into()));
        assert_eq!(
            due_period(datetime!(2027-01-01 00:00:00 UTC), Duration::ZERO).map(|p| p.to_string()),
            Some("2026-12".into())
        );
    }
}
