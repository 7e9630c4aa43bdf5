//! `tessera control-plane` end to end: the real binary on port 0 over a fresh database per
//! test (Postgres by default; `TESSERA_TEST_DB=sqlite` for SQLite), driven with reqwest.
//!
//! Postgres comes from `DATABASE_URL` (an admin URL; default
//! `postgres://postgres@127.0.0.1:5432/postgres`); each test creates `cp_e2e_<uuid>` there
//! and drops it afterwards, even when the test panics.

mod agent_tokens;
mod archives;
mod audit;
mod auth;
mod capture;
mod deployments;
mod flows;
mod gpus;
mod load_failures;
mod metrics;
mod openapi;
mod revocation;
mod signatures;
mod tenancy;
mod tls;
mod uploads;
mod usage;
mod users;
mod validation;
mod whoami;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::HeaderMap;
use serde_json::{Value, json};
use sqlx::Connection;
use tessera_control_plane::auth::keys;
use tessera_control_plane::registry::AuditEventRow;

/// Which database a test app runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DbKind {
    Postgres,
    Sqlite,
}

/// A fresh database, removed on drop.
pub struct TestDb {
    pub kind: DbKind,
    pub url: String,
    postgres: Option<(String, String)>,
    _dir: Option<tempfile::TempDir>,
}

fn admin_url() -> String {
    std::env::var("DATABASE_URL").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

impl TestDb {
    /// The default backend: Postgres unless `TESSERA_TEST_DB=sqlite`.
    pub async fn new() -> Self {
        match std::env::var("TESSERA_TEST_DB").as_deref() {
            Ok("sqlite") => Self::sqlite(),
            _ => Self::postgres().await,
        }
    }

    pub fn sqlite() -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let url = format!("sqlite://{}", dir.path().join("registry.db").display());
        TestDb { kind: DbKind::Sqlite, url, postgres: None, _dir: Some(dir) }
    }

    pub async fn postgres() -> Self {
        let admin = admin_url();
        let mut conn = tokio::time::timeout(Duration::from_secs(10), sqlx::PgConnection::connect(&admin))
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_else(|| {
                panic!(
                    "no PostgreSQL at {admin}: start one (scripts/test.sh does), set DATABASE_URL, \
                     or run with TESSERA_TEST_DB=sqlite"
                )
            });
        let name = format!("cp_e2e_{}", uuid::Uuid::new_v4().simple());
        sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
            .execute(&mut conn)
            .await
            .expect("create the test database");
        let _ = conn.close().await;
        let mut url = url_with_db(&admin, &name);
        url.push_str(if url.contains('?') { "&" } else { "?" });
        url.push_str("application_name=tessera-e2e");
        TestDb { kind: DbKind::Postgres, url, postgres: Some((admin, name)), _dir: None }
    }

    /// Runs one SQL statement against the test database (tampering tests).
    pub async fn execute(&self, sql: &str) -> u64 {
        match self.kind {
            DbKind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("connect");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.expect("sql").rows_affected()
            }
            DbKind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.expect("connect");
                sqlx::raw_sql(sqlx::AssertSqlSafe(sql.to_string())).execute(&mut c).await.expect("sql").rows_affected()
            }
        }
    }

    /// A tenant's audit chain, oldest first (the tampering tests rewrite it).
    pub async fn audit_chain(&self, tenant: &str) -> Vec<AuditEventRow> {
        let sql = "SELECT id, tenant_id, seq, actor_key_id, actor_user_id, action, resource_type, resource_id, \
                   before_state, after_state, request_id, client_addr, created_at, prev_hash, hash FROM audit_events \
                   WHERE tenant_id = (SELECT id FROM tenants WHERE name = $1) ORDER BY seq";
        match self.kind {
            DbKind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("connect");
                sqlx::query_as(sql).bind(tenant).fetch_all(&mut c).await.expect("sql")
            }
            DbKind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.expect("connect");
                sqlx::query_as(sql).bind(tenant).fetch_all(&mut c).await.expect("sql")
            }
        }
    }

    /// Reads one bytes column of the first row (to fetch the signing key in auth tests).
    pub async fn fetch_bytes(&self, sql: &str) -> Vec<u8> {
        match self.kind {
            DbKind::Postgres => {
                let mut c = sqlx::PgConnection::connect(&self.url).await.expect("connect");
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut c).await.expect("sql")
            }
            DbKind::Sqlite => {
                let mut c = sqlx::SqliteConnection::connect(&self.url).await.expect("connect");
                sqlx::query_scalar(sqlx::AssertSqlSafe(sql.to_string())).fetch_one(&mut c).await.expect("sql")
            }
        }
    }
}

fn url_with_db(admin: &str, db: &str) -> String {
    let (base, query) = admin.split_once('?').map_or((admin, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let base = match base[scheme_end..].find('/') {
        Some(i) => &base[..scheme_end + i],
        None => base,
    };
    match query {
        Some(q) => format!("{base}/{db}?{q}"),
        None => format!("{base}/{db}"),
    }
}

impl Drop for TestDb {
    fn drop(&mut self) {
        let Some((admin, name)) = self.postgres.take() else { return };
        // Drop runs outside async code (and after panics): use a private runtime on a thread.
        let dropper = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                if let Ok(mut c) = sqlx::PgConnection::connect(&admin).await {
                    let sql = format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)");
                    let _ = sqlx::raw_sql(sqlx::AssertSqlSafe(sql)).execute(&mut c).await;
                }
            });
        });
        let _ = dropper.join();
    }
}

/// A response: status, JSON body (Null when empty or not JSON), headers.
#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub body: Value,
    pub headers: HeaderMap,
}

impl Resp {
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }

    #[track_caller]
    pub fn expect(&self, status: u16) -> &Value {
        assert_eq!(self.status, status, "unexpected response: {:?}", self.body);
        &self.body
    }
}

/// A running control plane.
pub struct TestApp {
    pub url: String,
    pub admin_key: String,
    pub client: reqwest::Client,
    pub store_dir: tempfile::TempDir,
    pub pid: u32,
    child: Child,
    pub stderr: Arc<Mutex<Vec<String>>>,
    // Declared last: dropped after the server is killed.
    pub db: TestDb,
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Options for [`TestApp::spawn_with`].
#[derive(Default)]
pub struct Opts<'a> {
    pub db: Option<TestDb>,
    pub args: &'a [&'a str],
    /// Leave out `--bootstrap-admin-key` (the server then prints a generated one).
    pub no_bootstrap_key: bool,
}

impl TestApp {
    pub async fn spawn() -> Self {
        Self::spawn_with(Opts::default()).await
    }

    pub async fn spawn_with(opts: Opts<'_>) -> Self {
        let db = match opts.db {
            Some(db) => db,
            None => TestDb::new().await,
        };
        let store_dir = tempfile::tempdir().expect("temp dir");
        let admin_key = keys::generate().key;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(["control-plane", "--listen", "127.0.0.1:0", "--database-url", &db.url])
            .arg("--object-store")
            .arg(store_dir.path())
            .args(opts.args)
            .env("RUST_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if !opts.no_bootstrap_key {
            cmd.args(["--bootstrap-admin-key", &admin_key]);
        }
        let mut child = cmd.spawn().expect("start tessera control-plane");
        let pid = child.id();
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (addr_tx, addr_rx) = mpsc::channel();
        let err = BufReader::new(child.stderr.take().expect("stderr"));
        let lines = stderr.clone();
        let addr_tx2 = addr_tx.clone();
        std::thread::spawn(move || {
            for line in err.lines().map_while(Result::ok) {
                if let Some(addr) = line.split("listening protocol=\"http\" addr=").nth(1) {
                    let _ = addr_tx.send(addr.trim().to_string());
                }
                lines.lock().expect("lock").push(line);
            }
        });
        let (key_tx, key_rx) = mpsc::channel();
        let out = BufReader::new(child.stdout.take().expect("stdout"));
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if let Some(k) = line.split(": ").nth(1).filter(|_| line.starts_with("platform-admin API key")) {
                    let _ = key_tx.send(k.trim().to_string());
                }
            }
            drop(addr_tx2);
        });
        let addr = addr_rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("control plane did not report its address; stderr:\n{}", stderr.lock().expect("lock").join("\n"))
        });
        let admin_key = if opts.no_bootstrap_key {
            key_rx.recv_timeout(Duration::from_secs(5)).expect("the generated admin key on stdout")
        } else {
            admin_key
        };
        TestApp {
            url: format!("http://{addr}"),
            admin_key,
            client: reqwest::Client::new(),
            store_dir,
            pid,
            child,
            stderr,
            db,
        }
    }

    async fn send(&self, req: reqwest::RequestBuilder) -> Resp {
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let bytes = resp.bytes().await.expect("body");
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Resp { status, body, headers }
    }

    fn req(&self, method: reqwest::Method, key: &str, path: &str) -> reqwest::RequestBuilder {
        let r = self.client.request(method, format!("{}{path}", self.url));
        if key.is_empty() { r } else { r.bearer_auth(key) }
    }

    pub async fn get(&self, key: &str, path: &str) -> Resp {
        self.send(self.req(reqwest::Method::GET, key, path)).await
    }

    pub async fn delete(&self, key: &str, path: &str) -> Resp {
        self.send(self.req(reqwest::Method::DELETE, key, path)).await
    }

    pub async fn post(&self, key: &str, path: &str, body: &Value) -> Resp {
        self.send(self.req(reqwest::Method::POST, key, path).json(body)).await
    }

    pub async fn post_idempotent(&self, key: &str, path: &str, body: &Value, idem: &str) -> Resp {
        self.send(self.req(reqwest::Method::POST, key, path).header("Idempotency-Key", idem).json(body)).await
    }

    pub async fn put(&self, key: &str, path: &str, body: &Value) -> Resp {
        self.send(self.req(reqwest::Method::PUT, key, path).json(body)).await
    }

    pub async fn patch(&self, key: &str, path: &str, body: &Value) -> Resp {
        self.send(self.req(reqwest::Method::PATCH, key, path).json(body)).await
    }

    /// Sends a raw request (any method, any body) for the error tests.
    pub async fn raw(&self, req: reqwest::RequestBuilder) -> Resp {
        self.send(req).await
    }

    pub async fn create_tenant(&self, name: &str) -> Resp {
        self.post(&self.admin_key, "/v1/tenants", &json!({ "name": name })).await
    }

    /// Creates a key in `tenant` with `role` using `by`; returns the secret.
    pub async fn create_key(&self, by: &str, tenant: &str, role: &str) -> String {
        let r = self.post(by, &format!("/v1/tenants/{tenant}/api-keys"), &json!({ "name": role, "role": role })).await;
        r.expect(201)["key"].as_str().expect("key").to_string()
    }

    pub async fn create_model(&self, key: &str, tenant: &str, name: &str) -> Resp {
        self.post(key, &format!("/v1/tenants/{tenant}/models"), &json!({ "name": name })).await
    }

    pub async fn upload(&self, key: &str, tenant: &str, model: &str, query: &str, bytes: Vec<u8>) -> Resp {
        let path = format!("/v1/tenants/{tenant}/models/{model}/versions{query}");
        let req = self.req(reqwest::Method::POST, key, &path).header("content-type", "application/octet-stream");
        self.send(req.body(bytes)).await
    }

    pub async fn set_alias(&self, key: &str, tenant: &str, model: &str, alias: &str, version: i64) -> Resp {
        let path = format!("/v1/tenants/{tenant}/models/{model}/aliases/{alias}");
        self.put(key, &path, &json!({ "version": version })).await
    }

    pub async fn token(&self, key: &str) -> Resp {
        self.send(self.req(reqwest::Method::POST, key, "/v1/auth/token")).await
    }

    /// A tenant with one key per role.
    pub async fn tenant(&self, name: &str) -> Tenant {
        self.create_tenant(name).await.expect(201);
        let admin = self.create_key(&self.admin_key, name, "tenant-admin").await;
        Tenant {
            deployer: self.create_key(&admin, name, "deployer").await,
            viewer: self.create_key(&admin, name, "viewer").await,
            inference: self.create_key(&admin, name, "inference").await,
            admin,
        }
    }

    /// Number of files under the artifact store.
    pub fn stored_files(&self) -> usize {
        let mut n = 0;
        let mut stack = vec![self.store_dir.path().to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(d).expect("read dir").flatten() {
                if e.path().is_dir() {
                    stack.push(e.path());
                } else {
                    n += 1;
                }
            }
        }
        n
    }

    /// Resident memory of the server in bytes.
    pub fn rss_bytes(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
            .map_or(0, |kb| kb * 1024)
    }
}

/// A tenant and one key per role.
pub struct Tenant {
    pub admin: String,
    pub deployer: String,
    pub viewer: String,
    pub inference: String,
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(number: u64, body: &[u8], out: &mut Vec<u8>) {
    varint(number << 3 | 2, out);
    varint(body.len() as u64, out);
    out.extend_from_slice(body);
}

/// Length of the smallest model [`onnx_bytes`] makes.
pub const MIN_ONNX_BYTES: usize = 51;

/// A `ValueInfoProto` body: `name`, typed as an FP32 tensor of no declared shape.
fn fp32_value(name: u8) -> Vec<u8> {
    // name, then type { tensor_type { elem_type: FLOAT } }
    vec![0x0a, 0x01, name, 0x12, 0x04, 0x0a, 0x02, 0x08, 0x01]
}

/// A well-formed ONNX model (one Identity node from `x` to `y`, both FP32 tensors), exactly
/// `n` bytes long: a `doc_string` pads it. `n` is [`MIN_ONNX_BYTES`] or at least 2 more.
pub fn onnx_bytes(n: usize) -> Vec<u8> {
    let mut node = Vec::new();
    len_field(1, b"x", &mut node);
    len_field(2, b"y", &mut node);
    len_field(4, b"Identity", &mut node);
    let mut graph = Vec::new();
    len_field(1, &node, &mut graph);
    len_field(2, b"g", &mut graph);
    len_field(11, &fp32_value(b'x'), &mut graph);
    len_field(12, &fp32_value(b'y'), &mut graph);
    let mut m = vec![0x08, 0x08]; // ir_version 8
    len_field(8, &[0x10, 0x0d], &mut m); // opset_import { version: 13 }
    len_field(7, &graph, &mut m);
    assert_eq!(m.len(), MIN_ONNX_BYTES);
    if n > m.len() {
        // The doc string's key and length take 1 + (1 to 5) bytes.
        let pad = (1..=5)
            .filter_map(|len_bytes| n.checked_sub(MIN_ONNX_BYTES + 1 + len_bytes))
            .find(|&pad| {
                let mut l = Vec::new();
                varint(pad as u64, &mut l);
                MIN_ONNX_BYTES + 1 + l.len() + pad == n
            })
            .unwrap_or_else(|| panic!("no {n}-byte model"));
        len_field(6, &vec![b'z'; pad], &mut m);
    }
    assert_eq!(m.len(), n.max(MIN_ONNX_BYTES));
    m
}

/// What scikit-learn's classifiers become through skl2onnx with its default ZipMap: an FP32
/// `float_input [N, 4]`, an INT64 `output_label [N]` and `output_probability`, a sequence of
/// maps from INT64 to FP32.
pub fn zipmap_onnx() -> Vec<u8> {
    let tensor_type = |elem_type: u8, dims: &[Option<u8>]| {
        let mut shape = Vec::new();
        for d in dims {
            let mut dim = Vec::new();
            match d {
                Some(n) => dim.extend_from_slice(&[0x08, *n]),
                None => len_field(2, b"N", &mut dim),
            }
            len_field(1, &dim, &mut shape);
        }
        let mut tensor = vec![0x08, elem_type];
        len_field(2, &shape, &mut tensor);
        let mut ty = Vec::new();
        len_field(1, &tensor, &mut ty);
        ty
    };
    let value = |name: &str, ty: &[u8]| {
        let mut v = Vec::new();
        len_field(1, name.as_bytes(), &mut v);
        len_field(2, ty, &mut v);
        v
    };
    let mut map = vec![0x08, 0x07]; // key_type: INT64
    len_field(2, &tensor_type(1, &[]), &mut map);
    let mut map_type = Vec::new();
    len_field(5, &map, &mut map_type);
    let mut sequence = Vec::new();
    len_field(1, &map_type, &mut sequence);
    let mut zipmap = Vec::new();
    len_field(4, &sequence, &mut zipmap);
    let mut node = Vec::new();
    len_field(1, b"float_input", &mut node);
    len_field(2, b"output_label", &mut node);
    len_field(4, b"LinearClassifier", &mut node);
    let mut graph = Vec::new();
    len_field(1, &node, &mut graph);
    len_field(11, &value("float_input", &tensor_type(1, &[None, Some(4)])), &mut graph);
    len_field(12, &value("output_label", &tensor_type(7, &[None])), &mut graph);
    len_field(12, &value("output_probability", &zipmap), &mut graph);
    let mut m = vec![0x08, 0x08];
    len_field(8, &[0x10, 0x0d], &mut m);
    len_field(7, &graph, &mut m);
    m
}

#[test]
fn admin_urls_get_the_database_swapped() {
    assert_eq!(url_with_db("postgres://u@h:5432/postgres", "x"), "postgres://u@h:5432/x");
    assert_eq!(url_with_db("postgres://u@h/postgres?sslmode=disable", "x"), "postgres://u@h/x?sslmode=disable");
    assert_eq!(url_with_db("postgres://u@h", "x"), "postgres://u@h/x");
}
