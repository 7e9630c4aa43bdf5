//! Invoices from usage and the price schedule: pure integer arithmetic, unit-tested here.
//!
//! # Rules
//! - A period is a calendar month in UTC: usage whose period (minute, or hour once folded)
//!   starts in `[first day 00:00, next month's first day 00:00)` belongs to it.
//! - Each usage period is priced by the profile's schedule entry in effect at the period's
//!   start (the latest `effective_from <= start`); a price change inside a month therefore
//!   splits the month's quantities at the change (per minute; an hour folded by retention goes
//!   wholly to the price in effect at its start). Usage of a profile without a price in effect
//!   is listed at price 0.
//! - Lines: one per (model, profile, kind, price entry) with a non-zero quantity: `slice_hours`
//!   (reserved slice time; unit `slice_hour`) and `inferences` (unit `1000_inferences`).
//! - Rounding: prices are integer micro-cents and quantities integer microseconds or counts,
//!   so each line's exact amount is a fraction; it is rounded to whole cents half up, once per
//!   line. The total is the sum of the rounded lines, so an invoice always adds up.

use std::collections::BTreeMap;

use time::{Date, Month, OffsetDateTime, Time};

use crate::error::{Error, Result};
use crate::registry::{PriceRow, UsageTotalsRow};

/// Micro-cents per cent.
pub const MICRO_PER_CENT: i64 = 1_000_000;
/// Microseconds per hour.
const US_PER_HOUR: i128 = 3_600_000_000;

/// What a line bills.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize, utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
#[schema(as = InvoiceLineKind)]
pub enum LineKind {
    /// Reserved slice time.
    SliceHours,
    /// Inferences.
    Inferences,
}

impl LineKind {
    /// Name in the API.
    pub fn as_str(self) -> &'static str {
        match self {
            LineKind::SliceHours => "slice_hours",
            LineKind::Inferences => "inferences",
        }
    }

    /// Unit of the quantity and the unit price.
    pub fn unit(self) -> &'static str {
        match self {
            LineKind::SliceHours => "slice_hour",
            LineKind::Inferences => "1000_inferences",
        }
    }
}

/// One invoice line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Line {
    /// Model.
    pub model: String,
    /// Slice profile.
    pub slice_profile: String,
    /// What it bills.
    pub kind: LineKind,
    /// Raw quantity: microseconds of slice time, or inferences.
    pub raw_quantity: i64,
    /// Unit price, micro-cents per unit.
    pub unit_price_micro_cents: i64,
    /// The schedule entry's effective time, if a price was in effect.
    pub price_effective_from: Option<i64>,
    /// Amount, whole cents (rounded half up).
    pub amount_cents: i64,
}

impl Line {
    /// Quantity in the line's unit (slice-hours, or thousands of inferences).
    pub fn quantity(&self) -> f64 {
        match self.kind {
            LineKind::SliceHours => self.raw_quantity as f64 / US_PER_HOUR as f64,
            LineKind::Inferences => self.raw_quantity as f64 / 1000.0,
        }
    }
}

/// A computed invoice.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Invoice {
    /// By model, profile, kind, then price entry.
    pub lines: Vec<Line>,
    /// Sum of the lines' amounts, cents.
    pub total_cents: i64,
    /// Slice time held on GPU and MIG slices, microseconds (priced or not).
    pub gpu_us: i64,
}

/// A month, `YYYY-MM`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Period {
    /// Year.
    pub year: i32,
    /// Month.
    pub month: Month,
}

impl Period {
    /// Parses `YYYY-MM`; anything else is invalid input blamed on `period`.
    pub fn parse(s: &str) -> Result<Self> {
        let bad = || Error::invalid("period", "period must be a month, YYYY-MM (e.g. 2026-11)");
        let (y, m) = s.split_once('-').ok_or_else(bad)?;
        if y.len() != 4 || m.len() != 2 || !y.bytes().chain(m.bytes()).all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        let year: i32 = y.parse().map_err(|_| bad())?;
        let month: u8 = m.parse().map_err(|_| bad())?;
        let month = Month::try_from(month).map_err(|_| bad())?;
        if year < 1970 {
            return Err(bad());
        }
        Ok(Period { year, month })
    }

    /// The month holding `t`.
    pub fn of(t: OffsetDateTime) -> Self {
        Period { year: t.year(), month: t.month() }
    }

    /// The month before this one.
    pub fn previous(self) -> Self {
        match self.month {
            Month::January => Period { year: self.year - 1, month: Month::December },
            m => Period { year: self.year, month: m.previous() },
        }
    }

    /// `[start, end)` in Unix seconds.
    pub fn bounds(self) -> (i64, i64) {
        let start = first_day(self.year, self.month);
        let (ny, nm) = if self.month == Month::December {
            (self.year + 1, Month::January)
        } else {
            (self.year, self.month.next())
        };
        (start, first_day(ny, nm))
    }
}

impl std::fmt::Display for Period {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:04}-{:02}", self.year, u8::from(self.month))
    }
}

fn first_day(year: i32, month: Month) -> i64 {
    // Day 1 exists in every month of every year `Period::parse` accepts.
    let date = Date::from_calendar_date(year, month, 1).unwrap_or(Date::MIN);
    date.with_time(Time::MIDNIGHT).assume_utc().unix_timestamp()
}

/// The entry of `profile` in effect at `t`: the latest with `effective_from <= t`.
pub fn price_at<'a>(prices: &'a [PriceRow], profile: &str, t: i64) -> Option<&'a PriceRow> {
    prices.iter().filter(|p| p.slice_profile == profile && p.effective_from <= t).max_by_key(|p| p.effective_from)
}

/// `num / den` rounded half up, for non-negative `num` and positive `den`.
pub fn div_round_half_up(num: i128, den: i128) -> i128 {
    (num + den / 2) / den
}

/// What lines are summed by: model, profile, kind, and the price entry's effective time.
type LineKey = (String, String, LineKind, Option<i64>);

/// Prices `usage` (rows of one tenant and one period) with `prices`.
pub fn invoice(usage: &[UsageTotalsRow], prices: &[PriceRow]) -> Invoice {
    // (model, profile, kind, effective_from) -> (raw quantity, unit price)
    let mut sums: BTreeMap<LineKey, (i128, i64)> = BTreeMap::new();
    let mut out = Invoice::default();
    for u in usage {
        if crate::types::is_gpu_profile(&u.slice_profile) {
            out.gpu_us = out.gpu_us.saturating_add(u.slice_us);
        }
        let price = price_at(prices, &u.slice_profile, u.period_start);
        let entry = price.map(|p| p.effective_from);
        for (kind, quantity, unit_price) in [
            (LineKind::SliceHours, u.slice_us, price.map_or(0, |p| p.per_slice_hour_micro_cents)),
            (LineKind::Inferences, u.inferences, price.map_or(0, |p| p.per_1000_inferences_micro_cents)),
        ] {
            let key = (u.model_name.clone(), u.slice_profile.clone(), kind, entry);
            let slot = sums.entry(key).or_insert((0, unit_price));
            slot.0 += i128::from(quantity);
        }
    }
    for ((model, slice_profile, kind, price_effective_from), (raw, unit_price)) in sums {
        if raw == 0 {
            continue;
        }
        let per_unit: i128 = match kind {
            LineKind::SliceHours => US_PER_HOUR,
            LineKind::Inferences => 1000,
        };
        let amount = div_round_half_up(raw * i128::from(unit_price), per_unit * i128::from(MICRO_PER_CENT));
        let amount_cents = i64::try_from(amount).unwrap_or(i64::MAX);
        out.total_cents = out.total_cents.saturating_add(amount_cents);
        out.lines.push(Line {
            model,
            slice_profile,
            kind,
            raw_quantity: i64::try_from(raw).unwrap_or(i64::MAX),
            unit_price_micro_cents: unit_price,
            price_effective_from,
            amount_cents,
        });
    }
    out
}

/// A decimal number of cents as integer micro-cents, exactly: prices are stored to the
/// micro-cent (0.000001 cents), and a price with finer precision (`1e-12`, `0.0000015`) is
/// refused rather than rounded (to 0, a price that silently makes something free). Refuses
/// negative, non-finite or absurdly large values too, blaming `field`.
pub fn cents_to_micro(field: &str, cents: f64) -> Result<i64> {
    if !cents.is_finite() || !(0.0..=1e12).contains(&cents) {
        return Err(Error::invalid(field, format!("{field} must be a non-negative number of cents (at most 1e12)")));
    }
    let scaled = cents * MICRO_PER_CENT as f64;
    let micro = scaled.round();
    // Decimal fractions are not exact in binary: allow a few units of float rounding, far
    // below a micro-cent; a non-zero price never becomes 0.
    let slack = (4.0 * f64::EPSILON * scaled).max(1e-7);
    if (scaled - micro).abs() > slack || (cents > 0.0 && micro == 0.0) {
        return Err(Error::invalid(
            field,
            format!("{field} must be a whole number of micro-cents (at most 6 decimals of a cent), not {cents:e}"),
        ));
    }
    Ok(micro as i64)
}

/// Integer micro-cents as decimal cents (exact for the magnitudes [`cents_to_micro`] accepts).
pub fn micro_to_cents(micro: i64) -> f64 {
    micro as f64 / MICRO_PER_CENT as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> i64 {
        OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).unwrap().unix_timestamp()
    }

    fn price(profile: &str, from: &str, hour_cents: i64, k_cents: i64) -> PriceRow {
        PriceRow {
            slice_profile: profile.into(),
            effective_from: at(from),
            per_slice_hour_micro_cents: hour_cents * MICRO_PER_CENT,
            per_1000_inferences_micro_cents: k_cents * MICRO_PER_CENT,
        }
    }

    fn minute(model: &str, profile: &str, start: &str, slice_secs: i64, inferences: i64) -> UsageTotalsRow {
        UsageTotalsRow {
            model_name: model.into(),
            version: 1,
            slice_profile: profile.into(),
            period_start: at(start),
            requests: inferences,
            failures: 0,
            inferences,
            executions: inferences,
            compute_us: 0,
            slice_us: slice_secs * 1_000_000,
            bytes_in: 0,
            bytes_out: 0,
            throttled: 0,
        }
    }

    /// What the API does: keep the rows whose start lies in the period, then price them.
    fn invoice_for(period: &str, usage: &[UsageTotalsRow], prices: &[PriceRow]) -> Invoice {
        let (start, end) = Period::parse(period).unwrap().bounds();
        let rows: Vec<_> = usage.iter().filter(|u| u.period_start >= start && u.period_start < end).cloned().collect();
        invoice(&rows, prices)
    }

    #[test]
    fn periods_are_utc_calendar_months() {
        assert_eq!(
            Period::parse("2026-02").unwrap().bounds(),
            (at("2026-02-01T00:00:00Z"), at("2026-03-01T00:00:00Z"))
        );
        assert_eq!(
            Period::parse("2026-12").unwrap().bounds(),
            (at("2026-12-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        );
        for bad in ["2026-13", "2026-00", "26-01", "2026-1", "2026/01", "x", "2026-01-01"] {
            assert!(Period::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(Period::parse("2026-03").unwrap().to_string(), "2026-03");
    }

    #[test]
    fn the_last_minute_of_a_month_and_the_first_of_the_next_go_to_different_invoices() {
        let prices = [price("gpu", "2026-01-01T00:00:00Z", 360, 10)];
        let usage = [
            minute("m", "gpu", "2026-01-31T23:59:00Z", 60, 1000),
            minute("m", "gpu", "2026-02-01T00:00:00Z", 60, 2000),
        ];
        let jan = invoice_for("2026-01", &usage, &prices);
        let feb = invoice_for("2026-02", &usage, &prices);
        // 60 s at 360 c/h = 6 c; 1000 inferences at 10 c per 1000 = 10 c.
        assert_eq!(jan.lines.iter().map(|l| l.amount_cents).collect::<Vec<_>>(), [6, 10]);
        assert_eq!(jan.total_cents, 16);
        assert_eq!(jan.gpu_us, 60_000_000);
        assert_eq!(feb.total_cents, 6 + 20);
        assert_eq!(feb.lines[1].raw_quantity, 2000);
        assert_eq!(feb.lines[1].quantity(), 2.0);
        assert_eq!(jan.lines[0].kind, LineKind::SliceHours);
        assert!((jan.lines[0].quantity() - 60.0 / 3600.0).abs() < 1e-12);
    }

    #[test]
    fn a_price_change_inside_a_month_splits_its_lines() {
        let prices = [price("gpu", "2026-01-01T00:00:00Z", 100, 10), price("gpu", "2026-03-15T12:00:00Z", 200, 20)];
        let usage = [
            minute("m", "gpu", "2026-03-15T11:59:00Z", 3600, 500),
            minute("m", "gpu", "2026-03-15T12:00:00Z", 1800, 1500),
            minute("m", "gpu", "2026-03-20T00:00:00Z", 1800, 0),
        ];
        let inv = invoice_for("2026-03", &usage, &prices);
        let lines: Vec<_> =
            inv.lines.iter().map(|l| (l.kind, l.raw_quantity, l.unit_price_micro_cents, l.amount_cents)).collect();
        assert_eq!(
            lines,
            [
                (LineKind::SliceHours, 3_600_000_000, 100 * MICRO_PER_CENT, 100),
                (LineKind::SliceHours, 3_600_000_000, 200 * MICRO_PER_CENT, 200),
                (LineKind::Inferences, 500, 10 * MICRO_PER_CENT, 5),
                (LineKind::Inferences, 1500, 20 * MICRO_PER_CENT, 30),
            ]
        );
        assert_eq!(inv.total_cents, 335);
        assert_eq!(inv.lines[1].price_effective_from, Some(at("2026-03-15T12:00:00Z")));
    }

    #[test]
    fn lines_round_half_up_once_and_the_total_adds_them() {
        // 1 s of a 1.8 c/h slice = 0.0005 c -> 0; 1,250 s = 0.625 c -> 1; 1 inference at 500 c per 1000 = 0.5 c -> 1.
        let prices = [PriceRow {
            slice_profile: "cpu".into(),
            effective_from: 0,
            per_slice_hour_micro_cents: 1_800_000,
            per_1000_inferences_micro_cents: 500 * MICRO_PER_CENT,
        }];
        let a = invoice(&[minute("a", "cpu", "2026-01-01T00:00:00Z", 1, 0)], &prices);
        assert_eq!(a.total_cents, 0);
        let b = invoice(
            &[minute("b", "cpu", "2026-01-01T00:00:00Z", 1250, 1), minute("c", "cpu", "2026-01-01T00:00:00Z", 0, 1)],
            &prices,
        );
        assert_eq!(b.lines.iter().map(|l| l.amount_cents).collect::<Vec<_>>(), [1, 1, 1]);
        assert_eq!(b.total_cents, 3);
        assert_eq!(div_round_half_up(5, 10), 1);
        assert_eq!(div_round_half_up(4, 10), 0);
    }

    #[test]
    fn unpriced_profiles_are_listed_at_zero() {
        let inv = invoice(&[minute("m", "mig-1g.10gb", "2026-01-01T00:00:00Z", 60, 7)], &[]);
        assert_eq!(inv.lines.len(), 2);
        assert!(inv.lines.iter().all(|l| l.amount_cents == 0 && l.price_effective_from.is_none()));
    }

    #[test]
    fn decimal_cents_become_micro_cents() {
        assert_eq!(cents_to_micro("p", 12.5).unwrap(), 12_500_000);
        assert_eq!(cents_to_micro("p", 0.000001).unwrap(), 1);
        assert!(cents_to_micro("p", -1.0).is_err());
        assert!(cents_to_micro("p", f64::NAN).is_err());
        // Finer than a micro-cent is refused, not rounded (to 0 or otherwise).
        for fine in [1e-12, 0.0000015, 1e-7, 12.3456789] {
            assert!(cents_to_micro("p", fine).is_err(), "{fine}");
        }
        for (exact, micro) in
            [(0.0, 0), (0.1, 100_000), (0.3, 300_000), (1e12, 1_000_000_000_000_000_000), (123.456789, 123_456_789)]
        {
            assert_eq!(cents_to_micro("p", exact).unwrap(), micro, "{exact}");
        }
        assert_eq!(micro_to_cents(12_500_000), 12.5);
    }
}
