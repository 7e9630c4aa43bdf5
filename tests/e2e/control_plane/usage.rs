//! Usage metering end to end: a fake worker reports usage over `ReportUsage` (twice: the
//! replay is stored once), and the REST usage, metrics and invoice routes show exactly the
//! numbers sent, priced by the schedule set through `/v1/prices` (with a price change between
//! the two minutes); other tenants get 404, the monthly spend quota refuses new deployments.

use serde_json::json;
use tessera_protocol::agent::{ReportUsageRequest, UsageRecord};
use tessera_protocol::usage::{BATCH_SIZE_BUCKETS, LATENCY_BUCKETS_US};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

use super::deployments::{TOKEN, args, client};
use super::{Opts, TestApp, onnx_bytes};

fn rfc3339(unix: i64) -> String {
    OffsetDateTime::from_unix_timestamp(unix).expect("time").format(&Rfc3339).expect("format")
}

fn month_of(unix: i64) -> String {
    let t = OffsetDateTime::from_unix_timestamp(unix).expect("time");
    format!("{:04}-{:02}", t.year(), u8::from(t.month()))
}

/// A record with latency and batch-size histograms holding `latency` and `batches` in one
/// bucket each.
#[allow(clippy::too_many_arguments)]
fn record(
    key: &str,
    tenant: &str,
    version: i64,
    minute: i64,
    ok: u64,
    failed: u64,
    inferences: u64,
    slice: f64,
) -> UsageRecord {
    let mut latency_counts = vec![0; LATENCY_BUCKETS_US.len() + 1];
    let mut batch_size_counts = vec![0; BATCH_SIZE_BUCKETS.len() + 1];
    // 2 requests in (500, 1000] us per version-1 minute, else in (0, 100].
    latency_counts[if version == 1 { 3 } else { 0 }] = ok + failed;
    // Batches of 5 to 8 for version 1 (bucket (4, 8]), of 1 otherwise.
    batch_size_counts[if version == 1 { 3 } else { 0 }] = ok;
    UsageRecord {
        key: key.into(),
        worker_id: "worker-1".into(),
        tenant_id: tenant.into(),
        model_name: "m".into(),
        version,
        slice_profile: "cpu".into(),
        minute,
        requests: ok,
        failures: failed,
        inferences,
        executions: ok,
        compute_seconds: 1.5,
        slice_seconds: slice,
        bytes_in: 1000,
        bytes_out: 2000,
        latency_counts,
        latency_sum_us: 1234,
        batch_size_counts,
        throttled: 0,
    }
}

/// What a gateway reports: `throttled` requests refused under the tenant's limits, nothing else.
fn throttled(key: &str, tenant: &str, version: i64, minute: i64, refused: u64) -> UsageRecord {
    UsageRecord {
        worker_id: "gateway-1".into(),
        slice_profile: tessera_protocol::usage::GATEWAY_PROFILE.into(),
        throttled: refused,
        compute_seconds: 0.0,
        bytes_in: 0,
        bytes_out: 0,
        latency_sum_us: 0,
        latency_counts: vec![0; LATENCY_BUCKETS_US.len() + 1],
        ..record(key, tenant, version, minute, 0, 0, 0, 0.0)
    }
}

#[tokio::test]
async fn reported_usage_is_stored_once_and_shows_in_usage_metrics_and_invoices() {
    let args = args();
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let other = app.tenant("umbrella").await;
    let acme_id = app.get(&acme.viewer, "/v1/tenants/acme").await.expect(200)["id"].as_str().unwrap().to_string();
    let other_id = app.get(&other.viewer, "/v1/tenants/umbrella").await.expect(200)["id"].as_str().unwrap().to_string();

    // Two minutes of the same month, in the recent past (never folded by retention).
    let mut m2 = OffsetDateTime::now_utc().unix_timestamp() / 60 * 60 - 300;
    if month_of(m2 - 300) != month_of(m2) {
        m2 -= 900;
    }
    let m1 = m2 - 300;
    let period = month_of(m1);

    // Prices: only platform admins write them; everyone authenticated reads them.
    let prices = json!({ "prices": [
        { "slice_profile": "cpu", "per_slice_hour_cents": 360.0, "per_1000_inferences_cents": 50.0,
          "effective_from": "2020-01-01T00:00:00Z" },
        { "slice_profile": "cpu", "per_slice_hour_cents": 720.0, "per_1000_inferences_cents": 100.0,
          "effective_from": rfc3339(m2) },
    ]});
    app.put(&acme.admin, "/v1/prices", &prices).await.expect(403);
    let bad = json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": -1,
        "per_1000_inferences_cents": 0, "effective_from": "2020-01-01T00:00:00Z" }]});
    assert_eq!(
        app.put(&app.admin_key, "/v1/prices", &bad).await.expect(422)["error"]["field"],
        "prices[0].per_slice_hour_cents"
    );
    let set = app.put(&app.admin_key, "/v1/prices", &prices).await.expect(200).clone();
    assert_eq!(set, prices);
    assert_eq!(app.get(&acme.inference, "/v1/prices").await.expect(200), &prices);

    // The worker reports; a replay of the same batch is acknowledged and stored once.
    let batch = vec![
        record("w1/0-100/a", &acme_id, 1, m1, 10, 2, 30, 60.0),
        record("w1/100-200/a", &acme_id, 2, m2, 4, 0, 4, 30.0),
        record("w1/0-100/u", &other_id, 1, m1, 1, 0, 1, 6.0),
        throttled("gw:gateway-1:b:0", &acme_id, 1, m1, 5),
    ];
    let keys: Vec<String> = batch.iter().map(|r| r.key.clone()).collect();
    let mut agent = client(&app, TOKEN).await;
    for _ in 0..2 {
        let acked = agent.report_usage(ReportUsageRequest { records: batch.clone() }).await.expect("report usage");
        assert_eq!(acked.into_inner().acknowledged, keys);
    }
    let mut wrong = client(&app, "not-the-token").await;
    let e = wrong.report_usage(ReportUsageRequest { records: batch.clone() }).await.expect_err("wrong token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    let odd = record("odd-minute", &acme_id, 1, m1 + 1, 1, 0, 1, 1.0);
    let e = agent.report_usage(ReportUsageRequest { records: vec![odd] }).await.expect_err("bad minute");
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("odd-minute"), "{}", e.message());
    let stranger = record("stranger", "00000000-0000-7000-8000-000000000000", 1, m1, 1, 0, 1, 1.0);
    let e = agent.report_usage(ReportUsageRequest { records: vec![stranger] }).await.expect_err("unknown tenant");
    assert_eq!((e.code(), e.message().contains("stranger")), (tonic::Code::InvalidArgument, true));

    // Usage: exactly what was sent, grouped as asked.
    let range = format!("from={}&to={}", rfc3339(m1 - 60), rfc3339(m2 + 60));
    let total = app.get(&acme.viewer, &format!("/v1/tenants/acme/usage?{range}")).await.expect(200).clone();
    assert_eq!(
        total,
        json!({ "usage": [{ "model": null, "version": null, "slice_profile": null, "start": null,
            "requests": 14, "failures": 2, "inferences": 34, "compute_seconds": 3.0, "slice_seconds": 90.0,
            "gpu_seconds": 0.0, "gpu_compute_seconds": 0.0, "bytes_in": 2000, "bytes_out": 4000, "throttled": 5 }] })
    );
    let by = app.get(&acme.viewer, &format!("/v1/tenants/acme/usage?{range}&group_by=version,minute")).await;
    let by = by.expect(200)["usage"].clone();
    assert_eq!(by.as_array().unwrap().len(), 2);
    assert_eq!(
        (by[0]["version"].as_i64(), by[0]["start"].as_str(), by[0]["model"].as_str()),
        (Some(1), Some(rfc3339(m1).as_str()), None)
    );
    assert_eq!((by[0]["requests"].as_i64(), by[0]["slice_seconds"].as_f64()), (Some(10), Some(60.0)));
    assert_eq!((by[0]["throttled"].as_i64(), by[1]["throttled"].as_i64()), (Some(5), Some(0)));
    assert_eq!((by[1]["version"].as_i64(), by[1]["requests"].as_i64()), (Some(2), Some(4)));
    let v2 = app.get(&acme.viewer, &format!("/v1/tenants/acme/usage?{range}&model=m&version=2&group_by=model")).await;
    assert_eq!(v2.expect(200)["usage"][0]["model"], "m");
    assert_eq!(v2.body["usage"][0]["inferences"], 4);
    app.get(&acme.viewer, &format!("/v1/tenants/acme/usage?{range}&group_by=tenant")).await.expect(422);
    let theirs = app.get(&other.viewer, &format!("/v1/tenants/umbrella/usage?{range}")).await.expect(200).clone();
    assert_eq!(theirs["usage"][0]["requests"], 1, "each tenant sees its own usage only");

    // Metrics: one point per minute of the range.
    let q = format!("/v1/tenants/acme/metrics?model=m&from={}&to={}&step=minute", rfc3339(m1), rfc3339(m2 + 60));
    let points = app.get(&acme.viewer, &q).await.expect(200)["points"].clone();
    let points = points.as_array().unwrap();
    assert_eq!(points.len(), 6);
    let first = &points[0];
    assert_eq!(
        (first["start"].as_str(), first["requests"].as_i64(), first["failures"].as_i64()),
        (Some(rfc3339(m1).as_str()), Some(10), Some(2))
    );
    assert_eq!((first["request_rate"].as_f64(), first["error_rate"].as_f64()), (Some(12.0 / 60.0), Some(2.0 / 60.0)));
    assert_eq!(first["throttled"].as_i64(), Some(5), "refusals beside, not in, the rates");
    // 12 latencies in (500, 1000] us: the median interpolates to the middle; batches of 5 to 8.
    assert_eq!((first["p50_us"].as_u64(), first["p99_us"].as_u64()), (Some(750), Some(995)));
    assert_eq!(first["mean_batch_size"].as_f64(), Some(6.5));
    assert_eq!((points[1]["requests"].as_i64(), points[1]["p50_us"].as_u64()), (Some(0), None));
    assert_eq!((points[5]["requests"].as_i64(), points[5]["p50_us"].as_u64()), (Some(4), Some(50)));
    let hourly = format!("/v1/tenants/acme/metrics?from={}&to={}&step=hour", rfc3339(m1), rfc3339(m2 + 60));
    let hours = app.get(&acme.viewer, &hourly).await.expect(200)["points"].clone();
    let sum: i64 = hours.as_array().unwrap().iter().map(|p| p["requests"].as_i64().unwrap()).sum();
    assert_eq!(sum, 14);

    // The invoice: the price change at m2 splits the month's lines.
    let invoice = app.get(&acme.viewer, &format!("/v1/tenants/acme/invoices/{period}")).await.expect(200).clone();
    assert_eq!(
        (invoice["tenant"].as_str(), invoice["period"].as_str(), invoice["currency"].as_str()),
        (Some("acme"), Some(period.as_str()), Some("USD"))
    );
    let lines: Vec<(String, f64, f64, i64)> = invoice["lines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert_eq!((l["model"].as_str(), l["slice_profile"].as_str()), (Some("m"), Some("cpu")));
            (
                l["kind"].as_str().unwrap().to_string(),
                l["quantity"].as_f64().unwrap(),
                l["unit_price_cents"].as_f64().unwrap(),
                l["amount_cents"].as_i64().unwrap(),
            )
        })
        .collect();
    // 60 s at 360 c/h = 6 c; 30 s at 720 c/h = 6 c; 30 inferences at 50 c per 1000 = 1.5 c -> 2 c
    // (half up); 4 at 100 c per 1000 = 0.4 c -> 0 c.
    let expected = [
        ("slice_hours", 60.0 / 3600.0, 360.0, 6),
        ("slice_hours", 30.0 / 3600.0, 720.0, 6),
        ("inferences", 0.03, 50.0, 2),
        ("inferences", 0.004, 100.0, 0),
    ];
    assert_eq!(lines.len(), expected.len(), "{invoice:#}");
    for (got, want) in lines.iter().zip(expected) {
        assert_eq!(got.0, want.0);
        assert!((got.1 - want.1).abs() < 1e-12, "{got:?} vs {want:?}");
        assert_eq!((got.2, got.3), (want.2, want.3));
    }
    assert_eq!(invoice["total_cents"], 14);
    // Every record here is on a CPU slice: no GPU time.
    assert_eq!(invoice["gpu_seconds"], 0.0);
    assert_eq!(invoice["lines"][0]["unit"], "slice_hour");
    assert_eq!(invoice["lines"][2]["unit"], "1000_inferences");
    let by_query = app.get(&acme.viewer, &format!("/v1/tenants/acme/invoices?period={period}")).await;
    assert_eq!(by_query.expect(200), &invoice);
    app.get(&acme.viewer, "/v1/tenants/acme/invoices/2026-13").await.expect(422);

    // Other tenants' usage, metrics and invoices are not found; inference keys may not read them.
    for path in [
        format!("/v1/tenants/acme/usage?{range}"),
        "/v1/tenants/acme/metrics".to_string(),
        format!("/v1/tenants/acme/invoices/{period}"),
        format!("/v1/tenants/acme/invoices?period={period}"),
    ] {
        let r = app.get(&other.admin, &path).await;
        assert_eq!((r.status, r.code()), (404, "not_found"), "{path}: {:?}", r.body);
        app.get(&acme.inference, &path).await.expect(403);
    }

    // Spend: with the month's 14 c reaching a 14 c quota, new deployments are refused.
    if period == month_of(OffsetDateTime::now_utc().unix_timestamp()) {
        // Without a range: the current month.
        let month = app.get(&acme.viewer, "/v1/tenants/acme/usage?group_by=model").await.expect(200).clone();
        assert_eq!(
            (month["usage"][0]["model"].as_str(), month["usage"][0]["requests"].as_i64()),
            (Some("m"), Some(14))
        );
        let current = app.get(&acme.viewer, "/v1/tenants/acme/invoices").await.expect(200).clone();
        assert_eq!(current["total_cents"], 14);
        let mut quotas = app.get(&app.admin_key, "/v1/tenants/acme/quotas").await.expect(200)["limits"].clone();
        quotas["monthly_spend_cents"] = json!(14);
        app.put(&app.admin_key, "/v1/tenants/acme/quotas", &quotas).await.expect(200);
        app.create_model(&acme.deployer, "acme", "m").await.expect(201);
        app.upload(&acme.deployer, "acme", "m", "", onnx_bytes(64)).await.expect(201);
        let refused =
            app.post(&acme.deployer, "/v1/tenants/acme/deployments", &json!({ "name": "d", "model": "m" })).await;
        assert_eq!((refused.status, refused.code()), (409, "quota_exceeded.monthly_spend_cents"), "{:?}", refused.body);
        quotas["monthly_spend_cents"] = json!(15);
        app.put(&app.admin_key, "/v1/tenants/acme/quotas", &quotas).await.expect(200);
        app.post(&acme.deployer, "/v1/tenants/acme/deployments", &json!({ "name": "d", "model": "m" }))
            .await
            .expect(201);
    }

    // Control-plane metrics count what was stored and what was a duplicate.
    let text = app.client.get(format!("{}/metrics", app.url)).send().await.unwrap().text().await.unwrap();
    let value = |line_start: &str| -> f64 {
        text.lines()
            .find(|l| l.starts_with(line_start))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(-1.0)
    };
    assert_eq!(value("tessera_usage_records_total{outcome=\"stored\"}"), 4.0);
    assert_eq!(value("tessera_usage_records_total{outcome=\"duplicate\"}"), 4.0);
    assert!(value("tessera_scheduler_ticks_total{outcome=\"idle\"}") > 0.0, "{text}");
    assert!(text.contains("tessera_scheduler_tick_duration_seconds_bucket"));
}

/// A closed month's invoice is issued once its grace has passed: the invoice shows `issued`
/// with its total, and a subscribed webhook gets one `invoice.issued` event naming the period
/// and total; the current month stays open, and a later check issues nothing twice.
#[tokio::test]
async fn closed_months_are_issued_once_with_an_invoice_issued_event() {
    let mut args = args().to_vec();
    args.extend([
        "--invoice-issue-delay-secs",
        "0",
        "--invoice-check-interval-ms",
        "100",
        "--webhook-poll-ms",
        "50",
        "--webhooks-allow-private",
    ]);
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let acme = app.tenant("acme").await;
    let acme_id = app.get(&acme.viewer, "/v1/tenants/acme").await.expect(200)["id"].as_str().unwrap().to_string();
    // Nothing listens on the discard port: deliveries stay pending, which is all this needs.
    let hook = app
        .post(
            &acme.admin,
            "/v1/tenants/acme/webhooks",
            &json!({ "url": "http://127.0.0.1:9/hook", "events": ["invoice.issued"] }),
        )
        .await
        .expect(201)
        .clone();
    let hook_id = hook["webhook"]["id"].as_str().unwrap().to_string();
    let prices = json!({ "prices": [{ "slice_profile": "cpu", "per_slice_hour_cents": 360.0,
        "per_1000_inferences_cents": 1000.0, "effective_from": "2020-01-01T00:00:00Z" }]});
    app.put(&app.admin_key, "/v1/prices", &prices).await.expect(200);

    // A minute two days before this month began, and one in this month.
    let now = OffsetDateTime::now_utc();
    let month_start = now.replace_day(1).unwrap().replace_time(time::Time::MIDNIGHT).unix_timestamp();
    let last_month = month_start - 2 * 86_400;
    let this_month = now.unix_timestamp() / 60 * 60 - 60;
    let mut agent = client(&app, TOKEN).await;
    let batch = vec![
        record("w1/old/a", &acme_id, 1, last_month, 10, 0, 10, 60.0),
        record("w1/new/a", &acme_id, 1, this_month.max(month_start), 3, 0, 3, 60.0),
    ];
    agent.report_usage(ReportUsageRequest { records: batch }).await.expect("report usage");

    let period = month_of(last_month);
    let path = format!("/v1/tenants/acme/invoices/{period}");
    let mut invoice = json!(null);
    for _ in 0..100 {
        invoice = app.get(&acme.viewer, &path).await.expect(200).clone();
        if invoice["status"] == "issued" {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(invoice["status"], "issued", "{invoice}");
    // 60 slice-seconds at 360 c/h = 6 c, 10 inferences at 1000 c per 1000 = 10 c.
    assert_eq!((invoice["total_cents"].as_i64(), invoice["issued_total_cents"].as_i64()), (Some(16), Some(16)));
    assert!(invoice["issued_at"].is_string(), "{invoice}");
    let current = app.get(&acme.viewer, "/v1/tenants/acme/invoices").await.expect(200).clone();
    assert_eq!(current["status"], "open", "{current}");
    assert!(current.get("issued_at").is_none(), "{current}");

    // One event, for the closed month only, however many checks ran since.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let deliveries =
        app.get(&acme.viewer, &format!("/v1/tenants/acme/webhooks/{hook_id}/deliveries")).await.expect(200).clone();
    let items = deliveries["deliveries"].as_array().expect("a page of deliveries");
    let issued: Vec<&serde_json::Value> = items.iter().filter(|d| d["event_type"] == "invoice.issued").collect();
    assert_eq!(issued.len(), 1, "{deliveries}");
    let payload: serde_json::Value = serde_json::from_str(issued[0]["payload"].as_str().unwrap()).unwrap();
    assert_eq!(payload["type"], "invoice.issued", "{payload}");
    assert_eq!(
        (
            payload["data"]["period"].as_str(),
            payload["data"]["total_cents"].as_i64(),
            payload["data"]["tenant"].as_str()
        ),
        (Some(period.as_str()), Some(16), Some("acme")),
        "{payload}"
    );
}
