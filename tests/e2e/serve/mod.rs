//! `tessera serve` end to end: the real binary on port 0, reqwest over HTTP and the generated
//! tonic client over gRPC.

mod batching;
mod bench;
mod control;
mod gpu;
mod grpc;
mod http;
mod runner;
mod sequence;

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tessera_data_plane::tools::onnx_builder as onnx;
use tessera_protocol::inference::ModelInferRequest;
use tessera_protocol::inference::model_infer_request::InferInputTensor;

/// A running `tessera serve` over its own temporary repository.
pub struct TestServer {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub http: String,
    /// `http://127.0.0.1:PORT` for tonic.
    pub grpc: String,
    /// `http://127.0.0.1:PORT`.
    pub metrics: String,
    _dir: tempfile::TempDir,
}

impl Drop for TestServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the standard test repository: add_sub (with config), add_sub_auto (no config),
/// identity_bytes, a model with a broken config and one with a broken file.
pub fn write_repository(root: &Path) {
    let write = |rel: &str, bytes: &[u8]| {
        let path = root.join(rel);
        std::fs::create_dir_all(path.parent().expect("has a parent")).expect("mkdir");
        std::fs::write(path, bytes).expect("write");
    };
    write("add_sub/1/model.onnx", &onnx::add_sub());
    write(
        "add_sub/config.pbtxt",
        br#"name: "add_sub"
backend: "onnxruntime"
max_batch_size: 8
input [
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
"#,
    );
    write("add_sub_auto/1/model.onnx", &onnx::add_sub());
    write("identity_bytes/1/model.onnx", &onnx::identity(onnx::STRING));
    write("identity_fp32/3/model.onnx", &onnx::identity(onnx::FLOAT));
    write("identity_fp32/config.pbtxt", b"max_batch_size: 4\nversion_policy: { all: {} }\n");
    write("identity_fp32/5/model.onnx", &onnx::identity(onnx::FLOAT));
    write("bad_config/1/model.onnx", &onnx::add_sub());
    write("bad_config/config.pbtxt", b"max_batch_size: [ oops");
    write("bad_file/1/model.onnx", b"this is not an onnx model");
}

impl TestServer {
    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The server's model repository, for tests that change it while it runs.
    pub fn repository(&self) -> std::path::PathBuf {
        self._dir.path().join("models")
    }

    /// Starts the server over the standard repository with extra flags.
    pub fn start(extra: &[&str]) -> Self {
        Self::start_with(&[], extra)
    }

    /// Starts the server with extra add_sub models, each `(name, config.pbtxt)`, and flags.
    pub fn start_with(models: &[(&str, &str)], extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let repo = dir.path().join("models");
        write_repository(&repo);
        for (name, config) in models {
            std::fs::create_dir_all(repo.join(name).join("1")).expect("mkdir");
            std::fs::write(repo.join(name).join("1/model.onnx"), onnx::add_sub()).expect("write model");
            std::fs::write(repo.join(name).join("config.pbtxt"), config).expect("write config");
        }
        let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["serve", "--model-repository"])
            .arg(&repo)
            .args(["--http-address", "127.0.0.1", "--grpc-address", "127.0.0.1", "--metrics-address", "127.0.0.1"])
            .args(["--http-port", "0", "--grpc-port", "0", "--metrics-port", "0", "--strict-readiness", "false"])
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start tessera");
        let stderr = child.stderr.take().expect("piped stderr");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let (mut http, mut grpc, mut metrics) = (None, None, None);
        let mut log = Vec::new();
        loop {
            let line = match rx.recv_timeout(Duration::from_secs(60)) {
                Ok(line) => line,
                Err(_) => panic!("server did not start; log:\n{}", log.join("\n")),
            };
            if line.contains("listening") {
                let addr = line.split("addr=").nth(1).and_then(|s| s.split_whitespace().next()).map(str::to_string);
                let url = addr.map(|a| format!("http://{a}"));
                if line.contains("protocol=\"http\"") {
                    http = url;
                } else if line.contains("protocol=\"grpc\"") {
                    grpc = url;
                } else if line.contains("protocol=\"metrics\"") {
                    metrics = url;
                }
            }
            let started = line.contains("server started");
            log.push(line);
            if started {
                break;
            }
        }
        // Keep draining so the server never blocks on a full pipe.
        std::thread::spawn(move || while rx.recv().is_ok() {});
        let take =
            |u: Option<String>, what: &str| u.unwrap_or_else(|| panic!("no {what} address; log:\n{}", log.join("\n")));
        Self { http: take(http, "http"), grpc: take(grpc, "grpc"), metrics: take(metrics, "metrics"), child, _dir: dir }
    }
}

/// A bare HTTP/2 connection to the server's gRPC port, for requests tonic's client would not
/// send as they are; the address goes in each request's URI.
pub async fn grpc_connection(
    server: &TestServer,
) -> (hyper::client::conn::http2::SendRequest<http_body_util::Full<bytes::Bytes>>, String) {
    let addr = server.grpc.trim_start_matches("http://").to_string();
    let tcp = tokio::net::TcpStream::connect(&addr).await.expect("connect");
    let io = hyper_util::rt::TokioIo::new(tcp);
    let executor = hyper_util::rt::TokioExecutor::new();
    let (sender, conn) = hyper::client::conn::http2::handshake(executor, io).await.expect("HTTP/2 handshake");
    tokio::spawn(conn);
    (sender, addr)
}

/// A gRPC request for one row of the two-input test models (`INPUT0`, `INPUT1`: FP32 [1, 16]),
/// with its tensors as raw contents.
pub fn raw_infer_request(model: &str, id: &str, a: &[f32], b: &[f32]) -> ModelInferRequest {
    let tensor = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "FP32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: model.into(),
        id: id.into(),
        inputs: vec![tensor("INPUT0"), tensor("INPUT1")],
        raw_input_contents: vec![f32_bytes(a).into(), f32_bytes(b).into()],
        ..Default::default()
    }
}

/// Little-endian bytes of f32 values.
pub fn f32_bytes(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// f32 values from little-endian bytes.
pub fn f32_values(bytes: &[u8]) -> Vec<f32> {
    bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}
