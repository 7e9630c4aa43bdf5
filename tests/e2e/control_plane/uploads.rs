//! Uploads: streamed with sha256 and a size cap; refused uploads leave nothing behind; a
//! 200 MB artifact streams without the server holding it in memory.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use serde_json::json;

use super::{Opts, TestApp, onnx_bytes};

fn sha256_hex(data: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(data))
}

#[tokio::test]
async fn corrupted_and_mislabelled_uploads_are_refused_and_leave_nothing() {
    let app = TestApp::spawn_with(Opts { args: &["--max-upload-bytes", "1048576"], ..Opts::default() }).await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let data = onnx_bytes(4096);

    let wrong = "ab".repeat(32);
    let r = app.upload(&t.deployer, "acme", "m", &format!("?sha256={wrong}"), data.clone()).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("sha256")));
    let r = app.upload(&t.deployer, "acme", "m", "?format=zip", data.clone()).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("format")));
    let r = app.upload(&t.deployer, "acme", "m", "?sha256=xyz", data.clone()).await;
    assert_eq!(r.status, 422);
    let r = app.upload(&t.deployer, "acme", "m", "", Vec::new()).await;
    assert_eq!(r.status, 422);
    let r = app.upload(&t.deployer, "acme", "m", "", onnx_bytes(2 * 1024 * 1024)).await;
    assert_eq!((r.status, r.code()), (413, "payload_too_large"));
    assert_eq!(app.stored_files(), 0, "nothing left behind");
    let versions = app.get(&t.viewer, "/v1/tenants/acme/models/m/versions").await;
    assert_eq!(versions.expect(200)["versions"].as_array().unwrap().len(), 0);

    // The sha256 has one place, the query: the old header is refused, naming itself, and
    // nothing is stored.
    let good = sha256_hex(&data);
    let req = app
        .client
        .post(format!("{}/v1/tenants/acme/models/m/versions", app.url))
        .bearer_auth(&t.deployer)
        .header("content-type", "application/octet-stream")
        .header("x-content-sha256", good.clone())
        .body(data.clone());
    let r = app.raw(req).await;
    assert_eq!((r.status, r.body["error"]["field"].as_str()), (400, Some("X-Content-Sha256")));
    assert!(r.body["error"]["message"].as_str().unwrap().contains("`sha256` query parameter"), "{:?}", r.body);
    assert_eq!(app.stored_files(), 0);

    // The right sha256 (any case) and a model config are kept.
    let req = app
        .client
        .post(format!("{}/v1/tenants/acme/models/m/versions?sha256={}", app.url, good.to_uppercase()))
        .bearer_auth(&t.deployer)
        .header("content-type", "application/octet-stream")
        .header("x-model-config", r#"{"max_batch_size": 8}"#)
        .body(data.clone());
    let v = app.raw(req).await;
    assert_eq!(v.expect(201)["sha256"].as_str(), Some(good.as_str()));
    assert_eq!(v.body["config"], json!({ "max_batch_size": 8 }));
    assert_eq!(app.stored_files(), 1);

    // Presigned uploads need an S3-compatible store.
    let r = app.post(&t.deployer, "/v1/tenants/acme/models/m/uploads", &json!({ "format": "onnx" })).await;
    assert_eq!((r.status, r.code()), (409, "presign_unsupported"));
}

#[tokio::test]
async fn a_200_mb_upload_streams_in_bounded_memory() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "big").await.expect(201);
    let size = 200 * 1024 * 1024;
    let data = onnx_bytes(size);
    let expected = sha256_hex(&data);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let idle = app.rss_bytes();

    let peak = Arc::new(AtomicU64::new(idle));
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let (peak, done, pid) = (peak.clone(), done.clone(), app.pid);
        std::thread::spawn(move || {
            while !done.load(Ordering::Relaxed) {
                let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let rss = status
                    .lines()
                    .find_map(|l| l.strip_prefix("VmRSS:"))
                    .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024;
                peak.fetch_max(rss, Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        })
    };
    let v = app.upload(&t.deployer, "acme", "big", &format!("?sha256={expected}"), data).await;
    done.store(true, Ordering::Relaxed);
    sampler.join().unwrap();
    assert_eq!(v.expect(201)["size_bytes"].as_u64(), Some(size as u64));
    assert_eq!(v.body["sha256"].as_str(), Some(expected.as_str()));
    let grew = peak.load(Ordering::Relaxed).saturating_sub(idle);
    eprintln!("200 MiB upload: server RSS {} MiB idle, +{} MiB peak", idle >> 20, grew >> 20);
    assert!(grew < 100 * 1024 * 1024, "server RSS grew by {} MiB during the upload", grew / (1024 * 1024));
    let stored = std::fs::metadata(find_artifact(&app)).unwrap().len();
    assert_eq!(stored, size as u64);
}

fn find_artifact(app: &TestApp) -> std::path::PathBuf {
    let mut stack = vec![app.store_dir.path().to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            if e.path().is_dir() {
                stack.push(e.path());
            } else {
                return e.path();
            }
        }
    }
    panic!("no artifact stored")
}

/// `n` bytes from a fixed xorshift sequence.
fn noise(n: usize) -> Vec<u8> {
    let mut state: u64 = 0x2545_f491_4f6c_dd1d;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 24) as u8
        })
        .collect()
}

#[tokio::test]
async fn uploads_that_are_not_onnx_models_are_refused() {
    let app = TestApp::spawn().await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let real = tessera_data_plane::tools::onnx_builder::add_sub();

    let mut text = vec![0x08, 0x07];
    text.extend_from_slice(b"ir_version: 7\ngraph { node { op_type: \"Add\" } }\n");
    let refused: [(&str, Vec<u8>, &str); 5] = [
        ("20 bytes of a model", real[..20].to_vec(), "truncated at byte 20"),
        ("a model less its last byte", real[..real.len() - 1].to_vec(), "truncated"),
        ("1 MB of noise", noise(1 << 20), ""),
        ("64 MB of noise", noise(64 << 20), ""),
        ("two bytes and text", text, ""),
    ];
    for (what, body, detail) in refused {
        let r = app.upload(&t.deployer, "acme", "m", "", body).await;
        let message = r.body["error"]["message"].as_str().unwrap_or("").to_string();
        assert_eq!((r.status, r.body["error"]["field"].as_str()), (422, Some("body")), "{what}: {:?}", r.body);
        assert!(message.starts_with("model.onnx is not a valid ONNX model: "), "{what}: {message}");
        assert!(message.contains(detail), "{what}: '{message}' should say '{detail}'");
    }
    assert_eq!(app.stored_files(), 0, "refused uploads leave nothing behind");

    // A real model (and the same model with a trailing byte, which is not) is told apart.
    let mut longer = real.clone();
    longer.push(0);
    assert_eq!(app.upload(&t.deployer, "acme", "m", "", longer).await.status, 422);
    let v = app.upload(&t.deployer, "acme", "m", "", real.clone()).await;
    assert_eq!(v.expect(201)["size_bytes"].as_u64(), Some(real.len() as u64));
    assert_eq!(app.stored_files(), 1);
}

/// Writes `head` (and nothing more) on a fresh connection to the control plane at `url`; how
/// long the server takes to close it, and what it answered.
async fn held_open(url: String, head: String) -> (Duration, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(url.trim_start_matches("http://")).await.expect("connect");
    tcp.write_all(head.as_bytes()).await.expect("write");
    let started = std::time::Instant::now();
    let mut seen = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(15), tcp.read_to_end(&mut seen)).await;
    assert!(read.is_ok(), "the control plane held a connection that sent only {head:?} for 15 s");
    (started.elapsed(), String::from_utf8_lossy(&seen).into_owned())
}

#[tokio::test]
async fn slow_clients_are_cut_off_and_a_tenant_streams_a_bounded_number_of_uploads() {
    let args = ["--client-timeout-secs", "3", "--max-concurrent-uploads", "2"];
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let t = app.tenant("acme").await;
    app.create_model(&t.deployer, "acme", "m").await.expect(201);
    let upload_head = |len: usize| {
        format!(
            "POST /v1/tenants/acme/models/m/versions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
             Content-Type: application/octet-stream\r\nContent-Length: {len}\r\n\r\n",
            t.deployer
        )
    };

    // A head that never ends, and an upload whose body stops: each is given up after 3 s.
    let (waited, _) = held_open(app.url.clone(), "GET /v1/tenants HTTP/1.1\r\nHost: x\r\n".into()).await;
    assert!(waited < Duration::from_secs(8), "closed after {waited:?}");
    let (waited, answer) = held_open(app.url.clone(), upload_head(4096) + "\u{8}\u{7}").await;
    assert!(waited < Duration::from_secs(8), "closed after {waited:?}");
    assert!(answer.is_empty() || answer.starts_with("HTTP/1.1 4"), "no success for half a body: {answer}");

    // Two uploads streaming at once hold the tenant's places; a third gets 429 at once.
    let slow = [(); 2].map(|()| tokio::spawn(held_open(app.url.clone(), upload_head(4096))));
    tokio::time::sleep(Duration::from_millis(800)).await;
    let r = app.upload(&t.deployer, "acme", "m", "", onnx_bytes(4096)).await;
    assert_eq!((r.status, r.code()), (429, "too_many_requests"), "{:?}", r.body);
    assert_eq!(r.headers.get("retry-after").and_then(|v| v.to_str().ok()), Some("1"));
    assert!(r.body["error"]["message"].as_str().is_some_and(|m| m.contains("2 uploads in progress")), "{:?}", r.body);
    let other = app.tenant("other").await;
    app.create_model(&other.deployer, "other", "m").await.expect(201);
    app.upload(&other.deployer, "other", "m", "", onnx_bytes(4096)).await.expect(201);
    // Once the stalled uploads are given up, their places come back.
    for task in slow {
        task.await.expect("the stalled upload ended");
    }
    app.upload(&t.deployer, "acme", "m", "", onnx_bytes(4096)).await.expect(201);
}
