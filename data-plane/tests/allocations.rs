//! Checks the claim that a request costs no payload-sized allocation beyond the one copy into
//! the batch buffer: a counting global allocator measures bytes allocated per binary request
//! (1 MiB in, 1 MiB out) while the server runs in this process and `curl` is the client.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tessera_data_plane::onnx_builder as onnx;

struct Counting;

static ALLOCATED: AtomicU64 = AtomicU64::new(0);

// SAFETY: forwards to the system allocator, only counting sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATED.fetch_add(layout.size() as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as ours.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATED.fetch_add(new_size as u64, Ordering::Relaxed);
        // SAFETY: same contract as ours.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const ELEMENTS: usize = 256 * 1024;
const PAYLOAD: u64 = (ELEMENTS * 4) as u64;

fn curl_infer(url: &str, body_file: &std::path::Path, header_len: usize) {
    let out = std::process::Command::new("curl")
        .args(["-sS", "-o", "/dev/null", "-w", "%{http_code}", "-X", "POST"])
        .arg(format!("{url}/v2/models/identity/infer"))
        .args(["-H", &format!("Inference-Header-Content-Length: {header_len}")])
        .args(["-H", "Content-Type: application/octet-stream", "--data-binary"])
        .arg(format!("@{}", body_file.display()))
        .output()
        .expect("curl runs");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "200", "{}", String::from_utf8_lossy(&out.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_binary_request_allocates_about_one_payload_beyond_receiving_and_running() {
    if tessera_data_plane::backend::runtime::environment().is_err() {
        eprintln!("SKIPPED: ONNX Runtime library not found; run ./scripts/setup-ort.sh");
        return;
    }
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        eprintln!("SKIPPED: curl is not installed (this test uses it as an out-of-process client)");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("models");
    std::fs::create_dir_all(repo.join("identity/1")).expect("mkdir");
    std::fs::write(repo.join("identity/1/model.onnx"), onnx::identity(onnx::FLOAT)).expect("model");
    std::fs::write(repo.join("identity/config.pbtxt"), "max_batch_size: 8\n").expect("config");

    let header = format!(
        r#"{{"inputs":[{{"name":"INPUT0","shape":[1,{ELEMENTS}],"datatype":"FP32","parameters":{{"binary_data_size":{PAYLOAD}}}}}],"outputs":[{{"name":"OUTPUT0","parameters":{{"binary_data":true}}}}]}}"#
    );
    let body_file = dir.path().join("body.bin");
    let mut body = header.clone().into_bytes();
    body.extend(std::iter::repeat_n(0u8, PAYLOAD as usize));
    std::fs::write(&body_file, &body).expect("body");

    let config = tessera_data_plane::ServeConfig {
        model_repository: repo,
        http_addr: Some("127.0.0.1:0".parse().expect("addr")),
        grpc_addr: None,
        metrics_addr: None,
        control_mode: tessera_data_plane::manager::ControlMode::None,
        load_models: Vec::new(),
        poll_interval: Duration::from_secs(60),
        strict_readiness: true,
        exit_on_error: true,
        max_input_size: 64 << 20,
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let server = tokio::spawn(tessera_data_plane::run(config, shutdown.clone(), move |addrs| {
        let _ = tx.send(addrs);
    }));
    let addr = rx.await.expect("server bound").http.expect("http address");
    let url = format!("http://{addr}");
    let ready = format!("{url}/v2/health/ready");
    for _ in 0..100 {
        let ok = std::process::Command::new("curl").args(["-sf", &ready]).status().is_ok_and(|s| s.success());
        if ok {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let run = |n: usize| {
        let (url, file, len) = (url.clone(), body_file.clone(), header.len());
        async move {
            tokio::task::spawn_blocking(move || {
                for _ in 0..n {
                    curl_infer(&url, &file, len);
                }
            })
            .await
            .expect("client thread")
        }
    };
    run(3).await; // warm-up: connection pools, ORT arenas
    let before = ALLOCATED.load(Ordering::Relaxed);
    let n = 20;
    run(n).await;
    let per_request = (ALLOCATED.load(Ordering::Relaxed) - before) / n as u64;
    let ratio = per_request as f64 / PAYLOAD as f64;
    eprintln!("allocated per request: {per_request} bytes = {ratio:.2} x payload");
    // Receiving the body (1x), the batch buffer (the one copy, 1x) and ORT's output tensor (1x)
    // are inherent; anything near 4x would mean another payload-sized copy crept in.
    assert!(ratio < 3.5, "{ratio:.2} x payload allocated per request");
    shutdown.cancel();
    let _ = server.await;
}
