//! `tessera dev` end to end: the real binary on port 0 over a temporary data directory. The
//! test runs the examples the banner prints (curl as printed; the tritonclient snippet when
//! the project's venv exists), drives the client CLI against it (login, push, deploy,
//! infer), and restarts it on the same directory to see state and keys survive.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::Value;
use tessera_data_plane::tools::onnx_builder;

/// The banner's last line (`src/dev.rs`).
const READY_LINE: &str = "tessera dev is ready (Ctrl-C stops it)";

/// A running `tessera dev` and what its banner said.
struct Dev {
    child: Child,
    banner: Vec<String>,
    log: Arc<Mutex<Vec<String>>>,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Dev {
    /// Starts `tessera dev` on `dir` with every port 0 and waits for its banner.
    fn start(dir: &Path) -> Dev {
        Dev::start_with(dir, &[])
    }

    /// [`Dev::start`] with more flags.
    fn start_with(dir: &Path, extra: &[&str]) -> Dev {
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .arg("dev")
            .arg("--data-dir")
            .arg(dir)
            .args(["--listen", "127.0.0.1:0", "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0"])
            .args(["--gateway-http-port", "0", "--gateway-grpc-port", "0", "--gateway-metrics-port", "0"])
            .args(extra)
            .current_dir(repo_root())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera dev");
        let log = Arc::new(Mutex::new(Vec::new()));
        let stderr = child.stderr.take().expect("piped stderr");
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                sink.lock().expect("log lock").push(line);
            }
        });
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut dev = Dev { child, banner: Vec::new(), log };
        loop {
            match rx.recv_timeout(Duration::from_secs(300)) {
                Ok(line) if line == READY_LINE => break,
                Ok(line) => dev.banner.push(line),
                Err(_) => panic!("tessera dev did not print its banner; log:\n{}", dev.log_text()),
            }
        }
        dev
    }

    fn log_text(&self) -> String {
        self.log.lock().expect("log lock").join("\n")
    }

    /// The value after `label` on the banner line that starts with it.
    fn field(&self, label: &str) -> String {
        let line = self.banner.iter().find(|l| l.trim_start().starts_with(label));
        let line = line.unwrap_or_else(|| panic!("no '{label}' line in the banner:\n{}", self.banner.join("\n")));
        line.trim_start()[label.len()..].split_whitespace().next().expect("a value").to_string()
    }

    fn control_plane(&self) -> String {
        self.field("REST API").trim_end_matches("/v1").to_string()
    }

    fn line_starting(&self, prefix: &str) -> String {
        let found = self.banner.iter().find(|l| l.starts_with(prefix));
        found
            .unwrap_or_else(|| panic!("no line starting {prefix:?} in the banner:\n{}", self.banner.join("\n")))
            .clone()
    }

    /// The lines of the printed tritonclient example, from the `python - <<'EOF'` line to `EOF`.
    fn python_example(&self) -> String {
        let start = self.banner.iter().position(|l| l.contains("<<'EOF'")).expect("a python example");
        let end = start + self.banner[start..].iter().position(|l| l == "EOF").expect("the example's end");
        self.banner[start..=end].join("\n")
    }

    /// Ctrl-C, then waits for a clean exit.
    fn interrupt(mut self) {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-INT", &pid]).status().expect("run kill");
        assert!(sent.success());
        for _ in 0..600 {
            if let Some(status) = self.child.try_wait().expect("wait") {
                assert!(status.success(), "tessera dev exited with {status}; log:\n{}", self.log_text());
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("tessera dev did not stop within 60s of Ctrl-C; log:\n{}", self.log_text());
    }
}

fn bash(script: &str) -> Output {
    Command::new("bash").arg("-c").arg(script).current_dir(repo_root()).output().expect("run bash")
}

/// Checks a KServe v2 answer of `simple` to the demo request (1..=16 and ones).
fn check_simple_answer(answer: &Value) {
    let output = |name: &str| -> Vec<i64> {
        let outputs = answer["outputs"].as_array().unwrap_or_else(|| panic!("no outputs in {answer}"));
        let o = outputs.iter().find(|o| o["name"] == name).unwrap_or_else(|| panic!("no {name} in {answer}"));
        o["data"].as_array().expect("data").iter().map(|v| v.as_i64().expect("an integer")).collect()
    };
    assert_eq!(output("OUTPUT0"), (2..=17).collect::<Vec<_>>(), "{answer}");
    assert_eq!(output("OUTPUT1"), (0..=15).collect::<Vec<_>>(), "{answer}");
}

/// Runs the printed curl example as printed and checks the outputs.
fn run_printed_curl(dev: &Dev) {
    let curl = dev.line_starting("curl ");
    // The examples call the gateway, the one endpoint applications use.
    let gateway = dev.field("gateway       KServe v2 HTTP").trim_end_matches(',').to_string();
    assert!(curl.contains(&format!("://{gateway}/v2/models/")), "{curl} does not call the gateway {gateway}");
    let out = bash(&curl);
    assert!(out.status.success(), "curl failed: {}", String::from_utf8_lossy(&out.stderr));
    let answer: Value = serde_json::from_slice(&out.stdout).expect("a JSON answer");
    check_simple_answer(&answer);
}

/// The client CLI with its own config file.
struct Cli {
    config: PathBuf,
}

impl Cli {
    fn run(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(args)
            .env("TESSERA_CONFIG", &self.config)
            .env_remove("TESSERA_URL")
            .env_remove("TESSERA_API_KEY")
            .env_remove("TESSERA_TENANT")
            .env_remove("TESSERA_INFERENCE_URL")
            .env_remove("TESSERA_CA_CERT")
            .output()
            .expect("run tessera")
    }

    fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "tessera {args:?} failed:\n{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        stdout
    }
}

async fn get_json(url: &str, key: &str) -> Value {
    let response = reqwest::Client::new().get(url).bearer_auth(key).send().await.expect("GET");
    assert!(response.status().is_success(), "GET {url}: {}", response.status());
    response.json().await.expect("JSON")
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_serves_the_demo_the_cli_drives_it_and_a_restart_keeps_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("state");
    let dev = Dev::start(&data);
    run_printed_curl(&dev);
    let admin_key = dev.field("tenant-admin key");
    let inference_key = dev.field("inference key");
    let cp = dev.control_plane();

    // The tritonclient example, as printed, where the project's venv exists.
    if repo_root().join(".venv/bin/python").exists() {
        let out = bash(&dev.python_example());
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "python example failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(stdout.contains("OUTPUT0 = [[ 2  3  4"), "{stdout}");
        assert!(stdout.contains("OUTPUT1 = [[ 0  1  2"), "{stdout}");
    } else {
        eprintln!("no .venv: the printed tritonclient example was not run (scripts/setup-python.sh makes it)");
    }

    // Secrets and credentials are private files.
    #[cfg(unix)]
    for name in ["secrets.json", "dev-credentials.json"] {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(data.join(name)).expect("stat").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "{name}");
    }

    // The client CLI: login, push a second version, deploy it, infer.
    let cli = Cli { config: dir.path().join("cli/config.json") };
    let out = cli.ok(&["login", "--url", &cp, "--key", &admin_key]);
    assert!(out.contains("tenant demo"), "{out}");
    let model = dir.path().join("simple-v2.onnx");
    std::fs::write(&model, onnx_builder::simple()).expect("write model");
    let config = onnx_builder::simple_config().to_string();
    let out =
        cli.ok(&["models", "push", model.to_str().expect("utf-8 path"), "--model", "simple", "--config", &config]);
    assert!(out.contains("pushed simple version 2"), "{out}");
    let out = cli.ok(&["deploy", "--model", "simple", "--version", "2", "--wait"]);
    assert!(out.contains("updated simple: ready, model simple version 2"), "{out}");
    let request = serde_json::to_string(&dev_request()).expect("json");
    // The registry marks version 2 serving just before the worker applies it: allow it that
    // moment before every answer must come from version 2.
    let infer = || -> Value {
        serde_json::from_str(&cli.ok(&["infer", "--model", "simple", "--input", &request, "--output", "json"]))
            .expect("JSON")
    };
    let mut answer = infer();
    for _ in 0..50 {
        if answer["model_version"] == "2" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
        answer = infer();
    }
    assert_eq!(answer["model_version"], "2", "{answer}");
    check_simple_answer(&answer);
    let out = cli.ok(&["deployments", "list"]);
    assert!(out.lines().any(|l| l.starts_with("simple ") && l.contains(" ready ")), "{out}");
    let out = cli.ok(&["deployments", "get", "simple"]);
    assert!(out.contains("INDEX") && out.contains("ready"), "{out}");
    // Scaled to zero, `--wait` returns as soon as no replica is left, not at its timeout.
    let started = std::time::Instant::now();
    let out = cli.ok(&["deploy", "--model", "simple", "--replicas", "0", "--wait", "--timeout-secs", "60"]);
    assert!(out.contains("0/0"), "{out}");
    assert!(started.elapsed() < Duration::from_secs(30), "waited {:?}: {out}", started.elapsed());
    let out = cli.ok(&["deploy", "--model", "simple", "--replicas", "1", "--wait"]);
    assert!(out.contains("1/1"), "{out}");

    // An inference key may infer, not deploy: one line naming the status.
    let out = cli.run(&["deploy", "--model", "simple", "--url", &cp, "--key", &inference_key, "--tenant", "demo"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("HTTP 403"), "{stderr}");
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");

    // Ctrl-C stops it cleanly; a restart on the same directory reuses everything.
    dev.interrupt();
    let dev = Dev::start(&data);
    assert_eq!(dev.field("tenant-admin key"), admin_key);
    assert_eq!(dev.field("inference key"), inference_key);
    run_printed_curl(&dev);
    let cp = dev.control_plane();
    let keys = get_json(&format!("{cp}/v1/tenants/demo/api-keys"), &admin_key).await;
    assert_eq!(keys["api_keys"].as_array().map(Vec::len), Some(2), "no new keys: {keys}");
    let deployments = get_json(&format!("{cp}/v1/tenants/demo/deployments"), &admin_key).await;
    let deployments = deployments["deployments"].as_array().expect("deployments").clone();
    assert_eq!(deployments.len(), 1, "{deployments:?}");
    assert_eq!(deployments[0]["version"], 2);
    let versions = get_json(&format!("{cp}/v1/tenants/demo/models/simple/versions"), &admin_key).await;
    assert_eq!(versions["versions"].as_array().map(Vec::len), Some(2), "{versions}");
    dev.interrupt();
}

/// The demo request the banner prints: 1..=16 and ones.
fn dev_request() -> Value {
    let a: Vec<i32> = (1..=16).collect();
    serde_json::json!({ "inputs": [
        { "name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": a },
        { "name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": vec![1; 16] },
    ]})
}

#[tokio::test(flavor = "multi_thread")]
async fn dev_with_tls_serves_every_listener_over_https_with_its_local_certificate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let data = dir.path().join("state");
    let dev = Dev::start_with(&data, &["--tls"]);
    let ca = data.canonicalize().expect("data dir").join("tls/ca.pem");
    assert_eq!(PathBuf::from(dev.field("TLS CA")), ca, "the banner names the CA to trust");
    let cp = dev.control_plane();
    assert!(cp.starts_with("https://"), "{cp}");

    // The printed examples work as printed: curl with --cacert, tritonclient with SSL options.
    let curl = dev.line_starting("curl ");
    assert!(curl.contains("--cacert") && curl.contains("https://"), "{curl}");
    run_printed_curl(&dev);
    if repo_root().join(".venv/bin/python").exists() {
        let out = bash(&dev.python_example());
        assert!(out.status.success(), "python example failed: {}", String::from_utf8_lossy(&out.stderr));
        assert!(String::from_utf8_lossy(&out.stdout).contains("OUTPUT0 = [[ 2  3  4"));
    }

    // The CLI: login trusting the CA, then infer through the worker's advertised https endpoint.
    let cli = Cli { config: dir.path().join("cli/config.json") };
    let admin_key = dev.field("tenant-admin key");
    let refused = cli.run(&["login", "--url", &cp, "--key", &admin_key]);
    assert!(!refused.status.success(), "the local CA is not trusted without --ca-cert");
    cli.ok(&["login", "--url", &cp, "--key", &admin_key, "--ca-cert", ca.to_str().expect("utf-8")]);
    let deployment = cli.ok(&["deployments", "get", "simple"]);
    assert!(deployment.contains("https://127.0.0.1:"), "the worker advertises https: {deployment}");
    let request = serde_json::to_string(&dev_request()).expect("json");
    let answer: Value =
        serde_json::from_str(&cli.ok(&["infer", "--model", "simple", "--input", &request, "-o", "json"]))
            .expect("JSON");
    check_simple_answer(&answer);

    // A restart keeps the certificate.
    let cert = std::fs::read(data.join("tls/cert.pem")).expect("certificate");
    dev.interrupt();
    let dev = Dev::start_with(&data, &["--tls"]);
    assert_eq!(std::fs::read(data.join("tls/cert.pem")).expect("certificate"), cert);
    run_printed_curl(&dev);
    dev.interrupt();
}
