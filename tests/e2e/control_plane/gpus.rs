//! GPUs end to end: a real control plane and a real worker that loads the project's fake NVML
//! (`tests/fake_nvml`) with `--nvml-library`. The worker registers its MIG slices, serves GPU
//! metrics, reports a whole-GPU Xid that marks that GPU's slices unhealthy in the workers API,
//! and registers its slices again after a MIG configuration change. (Models do not run on a fake
//! GPU; placement off unhealthy slices is covered by the scheduler's unit tests.)

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::metrics::{WORKER_TOKEN, Worker, scrape};
use super::{Opts, TestApp};

/// The fake `libnvidia-ml.so.1`, compiled once per test binary.
fn fake_nvml() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake_nvml/fake_nvml.c");
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fake-nvml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("create the fake NVML directory");
        let lib = dir.join("libnvidia-ml.so.1");
        let status = std::process::Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&source)
            .status()
            .expect("run cc to build the fake NVML");
        assert!(status.success(), "cc failed to build {}", source.display());
        lib
    })
}

/// Polls the workers API until `done` holds for the only worker; returns its slices.
async fn slices_until(app: &TestApp, what: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let list = app.get(&app.admin_key, "/v1/workers").await.expect(200).clone();
        let slices = list["workers"][0]["slices"].as_array().cloned().unwrap_or_default();
        if done(&slices) {
            return slices;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}; workers: {list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn profiles(slices: &[Value]) -> Vec<&str> {
    slices.iter().filter_map(|s| s["profile"].as_str()).collect()
}

#[tokio::test]
async fn a_worker_on_nvml_registers_mig_slices_exports_gpu_metrics_and_reports_xids() {
    let app = TestApp::spawn_with(Opts { args: &["--worker-token", WORKER_TOKEN], ..Opts::default() }).await;
    let events = tempfile::NamedTempFile::new().expect("events file");
    let library = fake_nvml().display().to_string();
    let events_path = events.path().display().to_string();
    let env = [("FAKE_NVML_GPUS", "h200:1g.18gb*7;h100"), ("FAKE_NVML_EVENTS", events_path.as_str())];
    let worker = Worker::start_with_env(&app, &["--nvml-library", &library, "--cpu-slices", "0"], &env);
    let append = |line: &str| {
        let mut f = std::fs::OpenOptions::new().append(true).open(events.path()).expect("open events");
        writeln!(f, "{line}").expect("append an event");
    };

    // Seven 1g.18gb MIG slices of the H200 and the whole H100, all healthy.
    let slices = slices_until(&app, "the worker's slices", |s| s.len() == 8).await;
    let mut expected = vec!["mig-1g.18gb"; 7];
    expected.push("gpu");
    assert_eq!(profiles(&slices), expected);
    assert_eq!((slices[0]["kind"].as_str(), slices[0]["memory_bytes"].as_u64()), (Some("mig"), Some(18_432 << 20)));
    assert!(slices[0]["id"].as_str().is_some_and(|id| id.starts_with("MIG-")), "{}", slices[0]);
    assert!(slices.iter().all(|s| s["health"] == "healthy" && s.get("unhealthy_reason").is_none()));

    // GPU metrics under Triton's names, per GPU and per MIG slice.
    let gpu0 = "GPU-fa4e0000-0000-4000-8000-000000000000";
    let mig0 = slices[0]["id"].as_str().expect("id").to_string();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let (status, _, body) = scrape(&worker.metrics, None).await;
        assert_eq!(status, 200);
        let wanted = [
            format!("nv_gpu_utilization{{gpu_uuid=\"{gpu0}\"}} 0.37"),
            format!("nv_gpu_power_usage{{gpu_uuid=\"{gpu0}\"}} 312"),
            format!("nv_gpu_memory_total_bytes{{gpu_uuid=\"{gpu0}\",slice=\"{mig0}\"}} {}", 18_432u64 << 20),
            format!("tessera_slice_healthy{{slice=\"{mig0}\",profile=\"mig-1g.18gb\"}} 1"),
        ];
        if wanted.iter().all(|w| body.contains(w.as_str())) {
            break;
        }
        assert!(Instant::now() < deadline, "GPU metrics missing; wanted {wanted:?} in\n{body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A whole-GPU Xid on the H200 takes its seven slices and leaves the H100 alone; an
    // application Xid on the H100 leaves it healthy.
    append("xid=13 gpu=1");
    append("xid=79 gpu=0 gi=4294967295 ci=4294967295");
    let unhealthy = |s: &Value| s["health"] == "unhealthy";
    let slices =
        slices_until(&app, "the H200's slices unhealthy", |s| s.iter().filter(|s| unhealthy(s)).count() == 7).await;
    for s in &slices[..7] {
        let reason = s["unhealthy_reason"].as_str().unwrap_or_default();
        assert_eq!(reason, format!("Xid 79 (GPU has fallen off the bus) on {gpu0}"), "{s}");
    }
    assert_eq!(slices[7]["health"], "healthy", "{}", slices[7]);

    // The H100 goes into MIG mode with two instances: the worker registers its new slices; the
    // H200's stay unhealthy.
    append("mig_config_change gpu=1 mig=3g.40gb,2g.20gb");
    let slices = slices_until(&app, "the new MIG layout", |s| profiles(s).contains(&"mig-3g.40gb")).await;
    let mut expected = vec!["mig-1g.18gb"; 7];
    expected.extend(["mig-3g.40gb", "mig-2g.20gb"]);
    assert_eq!(profiles(&slices), expected);
    assert_eq!(slices.iter().filter(|s| unhealthy(s)).count(), 7);
}

#[test]
fn tessera_gpus_prints_what_nvml_reports_and_the_slices_a_worker_would_offer() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["gpus", "--nvml-library"])
        .arg(fake_nvml())
        .env("FAKE_NVML_GPUS", "h200:3g.71gb,2g.35gb,1g.18gb*2;h100")
        .output()
        .expect("run tessera gpus");
    assert!(out.status.success(), "tessera gpus failed: {}", String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).expect("JSON on stdout");
    assert_eq!(report["nvml"], true);
    let gpus = report["gpus"].as_array().expect("gpus");
    assert_eq!(gpus.len(), 2);
    assert_eq!((gpus[0]["mig_enabled"].as_bool(), gpus[1]["mig_enabled"].as_bool()), (Some(true), Some(false)));
    let migs: Vec<&str> =
        gpus[0]["mig"].as_array().expect("mig").iter().filter_map(|m| m["profile"].as_str()).collect();
    assert_eq!(migs, ["3g.71gb", "2g.35gb", "1g.18gb", "1g.18gb"]);
    let slices: Vec<&str> =
        report["slices"].as_array().expect("slices").iter().filter_map(|s| s["profile"].as_str()).collect();
    assert_eq!(slices, ["mig-3g.71gb", "mig-2g.35gb", "mig-1g.18gb", "mig-1g.18gb", "gpu"]);

    let missing = std::process::Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["gpus", "--nvml-library", "/nonexistent/libnvidia-ml.so.1"])
        .output()
        .expect("run tessera gpus");
    assert!(!missing.status.success());
    assert!(String::from_utf8_lossy(&missing.stderr).contains("/nonexistent/libnvidia-ml.so.1"));
}
