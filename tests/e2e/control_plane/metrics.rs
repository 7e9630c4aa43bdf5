//! Access to `/metrics` on the control plane and on a worker: open by default, as before; with
//! a metrics token, 401 (with a `WWW-Authenticate: Bearer` challenge) without it or with a
//! wrong one, 200 with it; the control plane's `/metrics` on a listener of its own.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use super::{Opts, TestApp};

const METRICS_TOKEN: &str = "metrics-token-for-tests";
pub(super) const WORKER_TOKEN: &str = "worker-secret-for-metrics-tests";

/// A file holding the metrics token, as Prometheus' `credentials_file` would.
fn token_file() -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), format!("{METRICS_TOKEN}\n")).expect("write the token");
    file
}

/// GETs `url` with an optional bearer token: status, `WWW-Authenticate`, body.
pub(super) async fn scrape(url: &str, token: Option<&str>) -> (u16, Option<String>, String) {
    let mut req = reqwest::Client::new().get(url);
    if let Some(token) = token {
        req = req.bearer_auth(token);
    }
    let resp = req.send().await.expect("request");
    let status = resp.status().as_u16();
    let challenge = resp.headers().get("www-authenticate").and_then(|v| v.to_str().ok()).map(str::to_string);
    (status, challenge, resp.text().await.expect("body"))
}

/// Checks that `url` wants the test token and serves metrics with it.
async fn assert_guarded(url: &str, family: &str) {
    for token in [None, Some("wrong"), Some("")] {
        let (status, challenge, _) = scrape(url, token).await;
        assert_eq!(status, 401, "{url} with {token:?}");
        assert_eq!(challenge.as_deref(), Some("Bearer realm=\"metrics\""));
    }
    let (status, _, body) = scrape(url, Some(METRICS_TOKEN)).await;
    assert_eq!(status, 200);
    assert!(body.contains(family), "{body}");
}

/// The address a process logged for `protocol="metrics"`, from log lines collected so far.
fn logged_metrics_addr(lines: &[String]) -> Option<String> {
    lines
        .iter()
        .find_map(|l| l.split("listening protocol=\"metrics\" addr=").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .map(str::to_string)
}

#[tokio::test]
async fn control_plane_metrics_are_open_by_default_and_guarded_by_a_token() {
    let open = TestApp::spawn().await;
    let (status, _, body) = scrape(&format!("{}/metrics", open.url), None).await;
    assert_eq!(status, 200);
    assert!(body.contains("tessera_registry_query_duration_seconds"), "{body}");

    let file = token_file();
    let path = file.path().display().to_string();
    let guarded = TestApp::spawn_with(Opts { args: &["--metrics-token-file", path.as_str()], ..Opts::default() }).await;
    assert_guarded(&format!("{}/metrics", guarded.url), "tessera_registry_query_duration_seconds").await;
    // API keys are no metrics credential.
    assert_eq!(scrape(&format!("{}/metrics", guarded.url), Some(&guarded.admin_key)).await.0, 401);
}

#[tokio::test]
async fn control_plane_metrics_move_to_their_own_listener() {
    let file = token_file();
    let path = file.path().display().to_string();
    let args = ["--metrics-listen", "127.0.0.1:0", "--metrics-token-file", path.as_str()];
    let app = TestApp::spawn_with(Opts { args: &args, ..Opts::default() }).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    let addr = loop {
        if let Some(addr) = logged_metrics_addr(&app.stderr.lock().expect("log")) {
            break addr;
        }
        assert!(Instant::now() < deadline, "no metrics listener logged");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_guarded(&format!("http://{addr}/metrics"), "tessera_registry_query_duration_seconds").await;
    let (status, _, _) = scrape(&format!("{}/metrics", app.url), Some(METRICS_TOKEN)).await;
    assert_eq!(status, 404, "the API listener no longer serves metrics");
}

/// A real `tessera worker` (models in process) against `app`, with extra flags; kills it on
/// drop.
pub(super) struct Worker {
    child: Child,
    /// Its metrics URL.
    pub(super) metrics: String,
    _dir: tempfile::TempDir,
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Worker {
    fn start(app: &TestApp, extra: &[&str]) -> Worker {
        Self::start_with_env(app, extra, &[])
    }

    /// Like `start`, with extra environment variables.
    pub(super) fn start_with_env(app: &TestApp, extra: &[&str], env: &[(&str, &str)]) -> Worker {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["worker", "--control-plane", &app.url, "--worker-token", WORKER_TOKEN, "--data-dir"])
            .arg(dir.path())
            .args(["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"])
            .args(["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--isolation", "in-process"])
            .args(extra)
            .envs(env.iter().copied())
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera worker");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let mut log = Vec::new();
        let metrics = loop {
            match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => log.push(line),
                Err(_) => panic!("the worker did not start; log:\n{}", log.join("\n")),
            }
            if let Some(addr) = logged_metrics_addr(&log) {
                break format!("http://{addr}/metrics");
            }
        };
        Worker { child, metrics, _dir: dir }
    }
}

#[tokio::test]
async fn worker_metrics_are_open_by_default_and_guarded_by_a_token() {
    let app = TestApp::spawn_with(Opts { args: &["--worker-token", WORKER_TOKEN], ..Opts::default() }).await;
    let open = Worker::start(&app, &[]);
    let (status, _, body) = scrape(&open.metrics, None).await;
    assert_eq!(status, 200);
    assert!(body.contains("nv_cpu_memory_total_bytes"), "{body}");

    let file = token_file();
    let path = file.path().display().to_string();
    let guarded = Worker::start(&app, &["--metrics-token-file", path.as_str()]);
    assert_guarded(&guarded.metrics, "nv_cpu_memory_total_bytes").await;
}
