//! The price schedule platform admins set: per slice profile, a price per slice-hour and per
//! 1,000 inferences from an effective time on. Prices are integer micro-cents (1e-6 cent).

use serde_json::json;
use sqlx::FromRow;

use super::audit::{Actor, NewAuditEvent};
use super::{Conn, Registry, exec, on_conn};
use crate::error::{Error, Result};

/// One entry of the schedule.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct PriceRow {
    /// Slice profile priced.
    pub slice_profile: String,
    /// Unix seconds (a whole minute) from which the entry applies, until the profile's next one.
    pub effective_from: i64,
    /// Price of one slice-hour reserved, micro-cents.
    pub per_slice_hour_micro_cents: i64,
    /// Price of 1,000 inferences, micro-cents.
    pub per_1000_inferences_micro_cents: i64,
}

impl Conn {
    /// The whole schedule by profile, then effective time.
    pub async fn prices(&mut self) -> Result<Vec<PriceRow>> {
        on_conn!(self, "price.list", |c| sqlx::query_as::<_, PriceRow>(
            "SELECT slice_profile, effective_from, per_slice_hour_micro_cents, per_1000_inferences_micro_cents \
             FROM prices ORDER BY slice_profile, effective_from"
        )
        .fetch_all(c))
    }
}

impl Registry {
    /// Replaces the whole schedule; audited in the platform tenant's chain.
    pub async fn set_prices(&self, actor: &Actor, prices: &[PriceRow]) -> Result<Vec<PriceRow>> {
        let mut tx = self.begin().await?;
        let platform = tx.platform_tenant().await?.ok_or(Error::NotFound("tenant"))?;
        tx.lock_tenant(platform.id).await?;
        let before = tx.prices().await?;
        exec!(tx, "price.delete_all", |c| sqlx::query("DELETE FROM prices").execute(c))?;
        for p in prices {
            exec!(tx, "price.insert", |c| sqlx::query(
                "INSERT INTO prices (slice_profile, effective_from, per_slice_hour_micro_cents, \
                 per_1000_inferences_micro_cents) VALUES ($1, $2, $3, $4)"
            )
            .bind(&p.slice_profile)
            .bind(p.effective_from)
            .bind(p.per_slice_hour_micro_cents)
            .bind(p.per_1000_inferences_micro_cents)
            .execute(c))
            .map_err(|e| {
                super::on_unique(e, crate::error::ErrorCode::DuplicatePrice, || {
                    format!("two prices for '{}' at the same effective_from", p.slice_profile)
                })
            })?;
        }
        let after = tx.prices().await?;
        let event = NewAuditEvent {
            tenant_id: platform.id,
            action: "prices.update",
            resource_type: "prices",
            resource_id: "prices".into(),
            before: Some(summary(&before)),
            after: Some(summary(&after)),
        };
        tx.append_audit(actor, event).await?;
        tx.commit().await?;
        Ok(after)
    }
}

/// The schedule as an audit summary: an object (audit summaries are objects), `{"prices": [...]}`.
fn summary(prices: &[PriceRow]) -> serde_json::Value {
    let rows: Vec<serde_json::Value> = prices
        .iter()
        .map(|p| {
            json!({
                "slice_profile": p.slice_profile,
                "effective_from": p.effective_from,
                "per_slice_hour_micro_cents": p.per_slice_hour_micro_cents,
                "per_1000_inferences_micro_cents": p.per_1000_inferences_micro_cents,
            })
        })
        .collect();
    json!({ "prices": rows })
}
