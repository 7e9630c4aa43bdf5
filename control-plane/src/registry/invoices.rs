//! Invoices issued: which closed months have been invoiced to which tenant, and for how much.
//! A row is written once, in the transaction that queues the tenant's `invoice.issued` webhook
//! event, so a month is announced once however many control planes race for it.

use time::OffsetDateTime;
use uuid::Uuid;

use super::{Conn, exec, on_conn};
use crate::error::Result;
use crate::kinds::WebhookEventType;

/// A closed month's invoice as issued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssuedInvoice {
    /// The total when it was issued, cents.
    pub total_cents: i64,
    /// When it was issued.
    pub issued_at: OffsetDateTime,
}

impl Conn {
    /// Tenants with usage in `[from, to)` (Unix seconds) whose invoice for `period` is not issued.
    pub async fn tenants_to_invoice(&mut self, period: &str, from: i64, to: i64) -> Result<Vec<Uuid>> {
        on_conn!(self, "invoice.to_issue", |c| sqlx::query_scalar(
            "SELECT DISTINCT u.tenant_id FROM usage_records u \
             WHERE u.period_start >= $1 AND u.period_start < $2 \
             AND NOT EXISTS (SELECT 1 FROM invoices_issued i WHERE i.tenant_id = u.tenant_id AND i.period = $3) \
             ORDER BY u.tenant_id"
        )
        .bind(from)
        .bind(to)
        .bind(period)
        .fetch_all(c))
    }

    /// The tenant's invoice for `period` as issued, if it was.
    pub async fn issued_invoice(&mut self, tenant_id: Uuid, period: &str) -> Result<Option<IssuedInvoice>> {
        let row: Option<(i64, OffsetDateTime)> = on_conn!(self, "invoice.issued", |c| sqlx::query_as(
            "SELECT total_cents, issued_at FROM invoices_issued WHERE tenant_id = $1 AND period = $2"
        )
        .bind(tenant_id)
        .bind(period)
        .fetch_optional(c))?;
        Ok(row.map(|(total_cents, issued_at)| IssuedInvoice { total_cents, issued_at }))
    }

    /// Records the tenant's invoice for `period` as issued and queues its `invoice.issued` event
    /// with `data`; does nothing and returns false when it was issued already. Call it in a
    /// transaction.
    pub async fn issue_invoice(
        &mut self,
        tenant_id: Uuid,
        period: &str,
        issued: IssuedInvoice,
        data: serde_json::Value,
    ) -> Result<bool> {
        let inserted = exec!(self, "invoice.issue", |c| sqlx::query(
            "INSERT INTO invoices_issued (tenant_id, period, total_cents, issued_at) VALUES ($1, $2, $3, $4) \
             ON CONFLICT (tenant_id, period) DO NOTHING"
        )
        .bind(tenant_id)
        .bind(period)
        .bind(issued.total_cents)
        .bind(issued.issued_at)
        .execute(c))?;
        if inserted == 0 {
            return Ok(false);
        }
        self.enqueue_webhook_event(tenant_id, WebhookEventType::InvoiceIssued, data).await?;
        Ok(true)
    }
}
