//! `tessera usage` and `tessera invoice`: what the tenant used (requests, inferences, compute
//! and slice time, bytes), grouped as asked, and its invoice for a month.

use anyhow::{Context, bail};
use serde_json::Value;

use super::api::segment;
use super::output::{Fields, Output, Table, cell, print_json, time};
use super::settings::ConnectionArgs;

/// `tessera usage` flags.
#[derive(Debug, clap::Args)]
pub struct UsageArgs {
    /// Start (RFC 3339), inclusive; default: the start of the current month (UTC).
    #[arg(long)]
    pub from: Option<String>,
    /// End (RFC 3339), exclusive; default: the end of the current month (UTC).
    #[arg(long)]
    pub to: Option<String>,
    /// Only this model.
    #[arg(long)]
    pub model: Option<String>,
    /// Only this version (with `--model`).
    #[arg(long, requires = "model")]
    pub version: Option<i64>,
    /// Group by `model`, `version`, `profile` and at most one of `minute`, `hour`, `day`
    /// (comma-separated or repeated); absent: one total.
    #[arg(long, value_delimiter = ',')]
    pub group_by: Vec<Grouping>,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// What usage can be grouped by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Grouping {
    /// Per model.
    Model,
    /// Per model version.
    Version,
    /// Per slice profile.
    Profile,
    /// Per minute.
    Minute,
    /// Per hour.
    Hour,
    /// Per day.
    Day,
}

impl Grouping {
    fn as_str(self) -> &'static str {
        match self {
            Grouping::Model => "model",
            Grouping::Version => "version",
            Grouping::Profile => "profile",
            Grouping::Minute => "minute",
            Grouping::Hour => "hour",
            Grouping::Day => "day",
        }
    }

    fn is_time(self) -> bool {
        matches!(self, Grouping::Minute | Grouping::Hour | Grouping::Day)
    }
}

/// `tessera invoice` flags.
#[derive(Debug, clap::Args)]
pub struct InvoiceArgs {
    /// Month, `YYYY-MM` (default: the current month so far, UTC).
    #[arg(long, value_parser = parse_period)]
    pub period: Option<String>,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Checks a `YYYY-MM` month before asking the API.
fn parse_period(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not a month: write it YYYY-MM, e.g. 2026-12");
    let (year, month) = s.split_once('-').ok_or_else(bad)?;
    let digits = |t: &str, n: usize| t.len() == n && t.bytes().all(|b| b.is_ascii_digit());
    if !digits(year, 4) || !digits(month, 2) || !matches!(month.parse::<u8>(), Ok(1..=12)) {
        return Err(bad());
    }
    Ok(s.to_string())
}

impl UsageArgs {
    /// The query: the filters given and the grouping, checked.
    fn query(&self) -> anyhow::Result<Vec<(&'static str, String)>> {
        if self.group_by.iter().filter(|g| g.is_time()).count() > 1 {
            bail!("--group-by takes at most one of minute, hour and day");
        }
        let mut query = Vec::new();
        let given = [("from", self.from.clone()), ("to", self.to.clone()), ("model", self.model.clone())];
        query.extend(given.into_iter().filter_map(|(k, v)| v.map(|v| (k, v))));
        if let Some(v) = self.version {
            query.push(("version", v.to_string()));
        }
        if !self.group_by.is_empty() {
            let groups: Vec<&str> = self.group_by.iter().map(|g| g.as_str()).collect();
            query.push(("group_by", groups.join(",")));
        }
        Ok(query)
    }
}

/// Usage rows as a table: the grouping columns that any row fills, then the measures.
fn usage_table(entries: &[Value]) -> Table {
    let keys = [("start", "START"), ("model", "MODEL"), ("version", "VERSION"), ("slice_profile", "PROFILE")];
    let grouped: Vec<(&str, &str)> =
        keys.into_iter().filter(|(k, _)| entries.iter().any(|e| !e[*k].is_null())).collect();
    let measures = [
        ("requests", "REQUESTS"),
        ("failures", "FAILURES"),
        ("inferences", "INFERENCES"),
        ("compute_seconds", "COMPUTE S"),
        ("slice_seconds", "SLICE S"),
        ("gpu_seconds", "GPU S"),
        ("bytes_in", "BYTES IN"),
        ("bytes_out", "BYTES OUT"),
        ("throttled", "THROTTLED"),
    ];
    let header: Vec<&str> = grouped.iter().chain(&measures).map(|(_, title)| *title).collect();
    let mut table = Table::with_header(&header);
    for e in entries {
        let mut row: Vec<String> = grouped.iter().map(|(k, _)| cell(&e[*k])).collect();
        if let Some(start) = grouped.iter().position(|(k, _)| *k == "start") {
            row[start] = time(&row[start]);
        }
        row.extend(measures.iter().map(|(k, _)| number(&e[*k])));
        table.row(row);
    }
    table
}

/// A measure: integers as they are, seconds to three decimals.
fn number(v: &Value) -> String {
    match v.as_f64() {
        Some(f) if v.is_f64() => format!("{f:.3}"),
        _ => cell(v),
    }
}

/// Cents as dollars: `1234` -> `$12.34`.
fn dollars(cents: i64) -> String {
    let sign = if cents < 0 { "-" } else { "" };
    format!("{sign}${}.{:02}", cents.abs() / 100, cents.abs() % 100)
}

/// Runs `tessera usage`.
pub async fn run_usage(args: UsageArgs, output: Output) -> anyhow::Result<()> {
    let query = args.query()?;
    let (settings, api) = args.connection.connect()?;
    let path = format!("/v1/tenants/{}/usage", segment(&settings.tenant));
    let report: Value = api
        .send(api.request(reqwest::Method::GET, &path).query(&query))
        .await
        .map_err(|e| e.advise(""))
        .context("read usage")?;
    if output.is_json() {
        return print_json(&report);
    }
    let entries = report["usage"].as_array().cloned().unwrap_or_default();
    usage_table(&entries).print_or(&format!("no usage in tenant {} for that period", settings.tenant));
    Ok(())
}

/// Runs `tessera invoice`.
pub async fn run_invoice(args: InvoiceArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let mut path = format!("/v1/tenants/{}/invoices", segment(&settings.tenant));
    if let Some(period) = &args.period {
        path = format!("{path}/{}", segment(period));
    }
    let invoice: Value = api.get(&path).await.map_err(|e| e.advise("")).context("read the invoice")?;
    if output.is_json() {
        return print_json(&invoice);
    }
    let mut fields = Fields::new();
    fields.add("tenant", cell(&invoice["tenant"])).add("period", cell(&invoice["period"]));
    fields.add("total", dollars(invoice["total_cents"].as_i64().unwrap_or(0)));
    fields.add("gpu seconds", number(&invoice["gpu_seconds"]));
    fields.print();
    let mut table = Table::new(["MODEL", "PROFILE", "KIND", "QUANTITY", "UNIT", "UNIT PRICE (CENTS)", "AMOUNT"]);
    for l in invoice["lines"].as_array().into_iter().flatten() {
        table.row([
            cell(&l["model"]),
            cell(&l["slice_profile"]),
            cell(&l["kind"]),
            number(&l["quantity"]),
            cell(&l["unit"]),
            number(&l["unit_price_cents"]),
            dollars(l["amount_cents"].as_i64().unwrap_or(0)),
        ]);
    }
    if !table.is_empty() {
        println!();
        print!("{}", table.render());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn periods_are_months() {
        assert_eq!(parse_period("2026-12").as_deref(), Ok("2026-12"));
        for bad in ["2026-13", "2026-1", "26-12", "2026/12", "2026-00", "december"] {
            assert!(parse_period(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn usage_queries_carry_filters_and_one_time_grouping() {
        let args = |group_by: Vec<Grouping>| UsageArgs {
            from: Some("2026-12-01T00:00:00Z".into()),
            to: None,
            model: Some("resnet".into()),
            version: Some(2),
            group_by,
            connection: ConnectionArgs::default(),
        };
        let query = args(vec![Grouping::Model, Grouping::Day]).query().expect("a query");
        assert_eq!(
            query,
            [
                ("from", "2026-12-01T00:00:00Z".to_string()),
                ("model", "resnet".to_string()),
                ("version", "2".to_string()),
                ("group_by", "model,day".to_string())
            ]
        );
        assert!(args(vec![Grouping::Hour, Grouping::Day]).query().is_err());
    }

    #[test]
    fn usage_shows_only_the_grouping_columns_it_has() {
        let entries = [json!({
            "model": "resnet", "version": null, "slice_profile": null, "start": null, "requests": 10, "failures": 1,
            "inferences": 12, "compute_seconds": 0.5, "slice_seconds": 60.0, "gpu_seconds": 0.0,
            "bytes_in": 100, "bytes_out": 200, "throttled": 3
        })];
        let text = usage_table(&entries).render();
        let mut lines = text.lines();
        assert!(lines.next().is_some_and(|h| h.starts_with("MODEL   REQUESTS")), "{text}");
        assert!(lines.next().is_some_and(|r| r.starts_with("resnet  10") && r.contains("60.000")), "{text}");
        assert!(text.lines().next().is_some_and(|h| h.trim_end().ends_with("THROTTLED")), "{text}");
        assert!(text.lines().nth(1).is_some_and(|r| r.trim_end().ends_with(" 3")), "{text}");
    }

    #[test]
    fn cents_read_as_dollars() {
        assert_eq!(dollars(1234), "$12.34");
        assert_eq!(dollars(5), "$0.05");
        assert_eq!(dollars(-250), "-$2.50");
    }
}
