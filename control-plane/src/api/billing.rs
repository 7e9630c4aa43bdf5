//! Prices and invoices: the price schedule platform admins set (everyone authenticated reads
//! it), and each tenant's monthly invoices computed from its usage (viewers and up). The
//! pricing and rounding rules are in [`crate::usage::billing`].

use axum::Json;
use axum::extract::{Path, State};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use utoipa::{IntoParams, ToSchema};

use super::deployments::check_profile;
use super::usage::to_time;
use super::{ApiJson, ApiQuery, AppState, Caller};
use crate::error::{Error, Result};
use crate::kinds::wire_enum;
use crate::registry::{PriceRow, UsageFilter, now};
use crate::types::{Role, check_time};
use crate::usage::billing::{LineKind, Period, cents_to_micro, invoice, micro_to_cents};

wire_enum! {
    /// The unit of an invoice line's quantity and price.
    pub enum InvoiceUnit {
        /// An hour of a reserved slice.
        SliceHour = "slice_hour",
        /// A thousand inferences.
        ThousandInferences = "1000_inferences",
    }
}

wire_enum! {
    /// The currency of prices and invoices.
    pub enum Currency {
        /// US dollars (amounts in cents).
        Usd = "USD",
    }
}

/// The unit a kind of line is counted in.
fn unit_of(kind: LineKind) -> InvoiceUnit {
    match kind {
        LineKind::SliceHours => InvoiceUnit::SliceHour,
        LineKind::Inferences => InvoiceUnit::ThousandInferences,
    }
}

/// Most entries in the price schedule.
const MAX_PRICES: usize = 1_000;

/// One entry of the price schedule.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Price {
    /// Slice profile priced: `cpu`, `gpu` or `mig-<profile>`.
    pub slice_profile: String,
    /// Cents per slice-hour reserved: decimals down to the micro-cent (0.000001); finer
    /// precision is refused, not rounded.
    // Not stated as `multipleOf`: JSON Schema checks that in binary floating point, where a
    // stored 0.3 is no multiple of 0.000001 and responses would fail their own schema.
    #[schema(minimum = 0, maximum = 1e12)]
    pub per_slice_hour_cents: f64,
    /// Cents per 1,000 inferences: decimals down to the micro-cent (0.000001); finer
    /// precision is refused, not rounded.
    #[schema(minimum = 0, maximum = 1e12)]
    pub per_1000_inferences_cents: f64,
    /// When the entry takes effect (RFC 3339, a whole minute, 2000-01-01T00:00:00Z to
    /// 9999-12-31T23:59:00Z); it applies until the profile's next entry.
    #[serde(with = "time::serde::rfc3339")]
    pub effective_from: OffsetDateTime,
}

/// The price schedule.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
#[schema(examples(json!({"prices": [{"slice_profile": "cpu", "per_slice_hour_cents": 4.5, "per_1000_inferences_cents": 0.02, "effective_from": "2026-01-01T00:00:00Z"}, {"slice_profile": "mig-1g.10gb", "per_slice_hour_cents": 55, "per_1000_inferences_cents": 0.1, "effective_from": "2026-01-01T00:00:00Z"}]})))]
pub struct Prices {
    /// By profile, then effective time.
    pub prices: Vec<Price>,
}

/// One invoice line.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct InvoiceLine {
    /// Model.
    pub model: String,
    /// Slice profile.
    pub slice_profile: String,
    /// `slice_hours` (reserved slice time) or `inferences`.
    pub kind: LineKind,
    /// Quantity in `unit`.
    pub quantity: f64,
    /// Unit of `quantity` and `unit_price_cents`.
    pub unit: InvoiceUnit,
    /// Cents per unit (0 when the profile had no price in effect).
    pub unit_price_cents: f64,
    /// Amount, whole cents: quantity × unit price rounded half up, once per line.
    pub amount_cents: i64,
    /// The schedule entry that priced the line (a price change inside the month gives one line
    /// per entry); null when none was in effect.
    #[serde(with = "time::serde::rfc3339::option")]
    pub price_effective_from: Option<OffsetDateTime>,
}

/// A tenant's invoice for one calendar month (UTC).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Invoice {
    /// Tenant name.
    pub tenant: String,
    /// Month, `YYYY-MM`.
    pub period: String,
    /// Always `USD`.
    pub currency: Currency,
    /// By model, profile, kind, then price entry.
    pub lines: Vec<InvoiceLine>,
    /// Sum of the lines' amounts, cents.
    pub total_cents: i64,
    /// GPU-seconds in the month: time the tenant's replicas held whole GPUs or MIG instances
    /// (their `slice_hours` lines price it per profile).
    pub gpu_seconds: f64,
    /// `open` while the month runs and during its grace for late usage, then `issued`.
    pub status: InvoiceStatus,
    /// When it was issued (an `invoice.issued` webhook event announced it).
    #[serde(default, with = "time::serde::rfc3339::option", skip_serializing_if = "Option::is_none")]
    pub issued_at: Option<OffsetDateTime>,
    /// The total when it was issued, cents; `total_cents` differs from it only when usage
    /// arrived after the grace (a worker cut off from the control plane for longer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub issued_total_cents: Option<i64>,
}

wire_enum! {
    /// Where an invoice stands.
    pub enum InvoiceStatus {
        /// The month runs, or its grace for late usage has not passed.
        Open = "open",
        /// Issued: its total was recorded and announced.
        Issued = "issued",
    }
}

/// Which invoice.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct InvoiceParams {
    /// Month, `YYYY-MM` (default: the current month, UTC).
    #[param(pattern = "^[0-9]{4}-[0-9]{2}$")]
    pub period: Option<String>,
}

fn to_rows(body: Prices) -> Result<Vec<PriceRow>> {
    if body.prices.len() > MAX_PRICES {
        return Err(Error::invalid("prices", format!("at most {MAX_PRICES} prices")));
    }
    let mut rows = Vec::with_capacity(body.prices.len());
    for (i, p) in body.prices.into_iter().enumerate() {
        let field = |name: &str| format!("prices[{i}].{name}");
        check_profile(&p.slice_profile)
            .map_err(|_| Error::invalid(field("slice_profile"), "slice_profile must be cpu, gpu or mig-<profile>"))?;
        check_time(&field("effective_from"), p.effective_from)?;
        let effective_from = p.effective_from.unix_timestamp();
        if effective_from % 60 != 0 || p.effective_from.nanosecond() != 0 {
            return Err(Error::invalid(field("effective_from"), "effective_from must be a whole minute"));
        }
        rows.push(PriceRow {
            slice_profile: p.slice_profile,
            effective_from,
            per_slice_hour_micro_cents: cents_to_micro(&field("per_slice_hour_cents"), p.per_slice_hour_cents)?,
            per_1000_inferences_micro_cents: cents_to_micro(
                &field("per_1000_inferences_cents"),
                p.per_1000_inferences_cents,
            )?,
        });
    }
    Ok(rows)
}

fn to_doc(rows: Vec<PriceRow>) -> Prices {
    let prices = rows
        .into_iter()
        .map(|p| Price {
            slice_profile: p.slice_profile,
            per_slice_hour_cents: micro_to_cents(p.per_slice_hour_micro_cents),
            per_1000_inferences_cents: micro_to_cents(p.per_1000_inferences_micro_cents),
            effective_from: to_time(p.effective_from),
        })
        .collect();
    Prices { prices }
}

/// The price schedule (everyone authenticated).
#[utoipa::path(get, path = "/v1/prices", operation_id = "get_prices", tag = "billing",
    responses((status = 200, description = "The schedule.", body = Prices)))]
pub async fn handle_prices_get(State(app): State<AppState>, _caller: Caller) -> Result<Json<Prices>> {
    Ok(Json(to_doc(app.registry.conn().await?.prices().await?)))
}

/// Replaces the whole price schedule (platform admins; audited in the platform tenant's
/// trail). Invoices are computed from the schedule when read, so past entries changed here
/// change past invoices too: add entries with a new `effective_from` to change prices.
#[utoipa::path(put, path = "/v1/prices", operation_id = "set_prices", tag = "billing", request_body = Prices,
    responses(
        (status = 200, description = "The new schedule.", body = Prices),
        (status = 409, description = "Two entries for one profile at one time (`duplicate_price`).",
         body = crate::error::ErrorBody)))]
pub async fn handle_prices_set(
    State(app): State<AppState>,
    caller: Caller,
    ApiJson(body): ApiJson<Prices>,
) -> Result<Json<Prices>> {
    caller.principal.require(Role::PlatformAdmin, "set prices")?;
    let rows = to_rows(body)?;
    Ok(Json(to_doc(app.registry.set_prices(&caller.actor, &rows).await?)))
}

async fn invoice_for(app: &AppState, caller: &Caller, tenant: &str, period: Option<&str>) -> Result<Invoice> {
    let t = app.tenant_for(&caller.principal, tenant, Role::Viewer, "read invoices").await?;
    let period = match period {
        Some(p) => Period::parse(p)?,
        None => Period::of(now()),
    };
    let (from, to) = period.bounds();
    let mut conn = app.registry.conn().await?;
    let usage = conn.usage_totals(t.id, &UsageFilter { from, to, model: None, version: None }).await?;
    let prices = conn.prices().await?;
    let issued = conn.issued_invoice(t.id, &period.to_string()).await?;
    drop(conn);
    let computed = invoice(&usage, &prices);
    let lines = computed
        .lines
        .iter()
        .map(|l| InvoiceLine {
            model: l.model.clone(),
            slice_profile: l.slice_profile.clone(),
            kind: l.kind,
            quantity: l.quantity(),
            unit: unit_of(l.kind),
            unit_price_cents: micro_to_cents(l.unit_price_micro_cents),
            amount_cents: l.amount_cents,
            price_effective_from: l.price_effective_from.map(to_time),
        })
        .collect();
    Ok(Invoice {
        tenant: t.name,
        period: period.to_string(),
        currency: Currency::Usd,
        lines,
        total_cents: computed.total_cents,
        gpu_seconds: computed.gpu_us as f64 / 1e6,
        status: if issued.is_some() { InvoiceStatus::Issued } else { InvoiceStatus::Open },
        issued_at: issued.map(|i| i.issued_at),
        issued_total_cents: issued.map(|i| i.total_cents),
    })
}

/// A tenant's invoice for a month, `?period=YYYY-MM` (default: the current month so far;
/// viewers and up).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/invoices", operation_id = "get_invoice_by_query", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name"), InvoiceParams),
    responses((status = 200, description = "The invoice.", body = Invoice)))]
pub async fn handle_invoice_query(
    State(app): State<AppState>,
    caller: Caller,
    Path(tenant): Path<String>,
    ApiQuery(params): ApiQuery<InvoiceParams>,
) -> Result<Json<Invoice>> {
    Ok(Json(invoice_for(&app, &caller, &tenant, params.period.as_deref()).await?))
}

/// A tenant's invoice for a month (`YYYY-MM`; viewers and up).
#[utoipa::path(get, path = "/v1/tenants/{tenant}/invoices/{period}", operation_id = "get_invoice", tag = "billing",
    params(("tenant" = String, Path, description = "Tenant name"), ("period" = String, Path, description = "Month, YYYY-MM")),
    responses((status = 200, description = "The invoice.", body = Invoice)))]
pub async fn handle_invoice_get(
    State(app): State<AppState>,
    caller: Caller,
    Path((tenant, period)): Path<(String, String)>,
) -> Result<Json<Invoice>> {
    Ok(Json(invoice_for(&app, &caller, &tenant, Some(&period)).await?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::usage::parse_time;

    fn body(v: serde_json::Value) -> Prices {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn price_bodies_are_checked_by_field() {
        let ok = body(serde_json::json!({ "prices": [
            { "slice_profile": "gpu", "per_slice_hour_cents": 12.5, "per_1000_inferences_cents": 0.000001,
              "effective_from": "2026-01-01T00:00:00Z" }
        ]}));
        let rows = to_rows(ok).unwrap();
        assert_eq!((rows[0].per_slice_hour_micro_cents, rows[0].per_1000_inferences_micro_cents), (12_500_000, 1));
        let fails = |v: serde_json::Value, field: &str| match to_rows(body(v)) {
            Err(Error::InvalidInput { field: Some(f), .. }) => assert_eq!(f, field),
            other => panic!("expected a complaint about {field}: {other:?}"),
        };
        fails(
            serde_json::json!({ "prices": [{ "slice_profile": "tpu", "per_slice_hour_cents": 1, "per_1000_inferences_cents": 1, "effective_from": "2026-01-01T00:00:00Z" }]}),
            "prices[0].slice_profile",
        );
        fails(
            serde_json::json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": -1, "per_1000_inferences_cents": 1, "effective_from": "2026-01-01T00:00:00Z" }]}),
            "prices[0].per_slice_hour_cents",
        );
        fails(
            serde_json::json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": 1, "per_1000_inferences_cents": 1, "effective_from": "2026-01-01T00:00:30Z" }]}),
            "prices[0].effective_from",
        );
        fails(
            serde_json::json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": 1, "per_1000_inferences_cents": 1, "effective_from": "0000-01-01T00:00:00Z" }]}),
            "prices[0].effective_from",
        );
        fails(
            serde_json::json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": 1e-12, "per_1000_inferences_cents": 1, "effective_from": "2026-01-01T00:00:00Z" }]}),
            "prices[0].per_slice_hour_cents",
        );
        assert_eq!(parse_time("from", Some("2026-01-01T00:01:00Z")).unwrap(), Some(1_767_225_660));
        assert!(parse_time("from", Some("0000-01-01T00:00:00Z")).is_err());
        assert!(parse_time("from", Some("yesterday")).is_err());
    }
}
