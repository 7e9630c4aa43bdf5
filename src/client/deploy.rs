//! `tessera deploy` and `tessera deployments list|get|canary|promote|rollback`: create or update
//! a deployment, show its replicas and traffic split, wait (with a spinner) until it serves its
//! target version, and set, weight, promote or roll back its canary.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::api::{ApiClient, segment};
use super::progress;
use super::settings::ConnectionArgs;

/// `tessera deploy` flags.
#[derive(Debug, clap::Args)]
pub struct DeployArgs {
    /// Model to deploy.
    #[arg(long)]
    pub model: String,
    /// Deployment name (default: the model's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Pin a version.
    #[arg(long, conflicts_with = "alias")]
    pub version: Option<i64>,
    /// Follow an alias (moving it rolls the deployment out).
    #[arg(long)]
    pub alias: Option<String>,
    /// Replica count.
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Slice profile: `cpu`, `gpu` or `mig-<profile>`.
    #[arg(long)]
    pub profile: Option<String>,
    /// Model instances per replica.
    #[arg(long)]
    pub instances: Option<u32>,
    /// Wait until every replica serves the target version.
    #[arg(long)]
    pub wait: bool,
    /// Longest wait with `--wait`, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    /// Print the deployment as JSON.
    #[arg(long)]
    pub json: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum DeploymentsCommand {
    /// The tenant's deployments.
    List(ListArgs),
    /// One deployment with its replicas and traffic split.
    Get(GetArgs),
    /// Set the canary (`--version` or `--alias` with `--weight`), or change only its weight
    /// (`--weight` alone): that percent of unversioned traffic goes to the canary's version.
    Canary(CanaryArgs),
    /// Promote the canary: its version rolls out to the stable replicas, then the canary goes.
    Promote(CanaryActionArgs),
    /// Roll the canary back: the stable version takes all traffic, the canary's replicas drain.
    Rollback(CanaryActionArgs),
}

/// `tessera deployments canary` flags.
#[derive(Debug, clap::Args)]
pub struct CanaryArgs {
    /// Deployment name.
    pub name: String,
    /// The canary's version (sets or replaces the canary).
    #[arg(long, conflicts_with = "alias")]
    pub version: Option<i64>,
    /// An alias whose current version becomes the canary (resolved once, not followed).
    #[arg(long)]
    pub alias: Option<String>,
    /// Percent of unversioned traffic the canary gets (1 to 99).
    #[arg(long)]
    pub weight: u32,
    /// Replicas of the canary (default 1; only with `--version` or `--alias`).
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Print the deployment as JSON.
    #[arg(long)]
    pub json: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments promote|rollback` flags.
#[derive(Debug, clap::Args)]
pub struct CanaryActionArgs {
    /// Deployment name.
    pub name: String,
    /// Print the deployment as JSON.
    #[arg(long)]
    pub json: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments get` flags.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// Deployment name.
    pub name: String,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// A deployment as the API shows it (the fields the CLI reads; the JSON keeps the rest).
#[derive(Debug, Clone, Deserialize)]
pub struct Deployment {
    /// Name.
    pub name: String,
    /// Model.
    pub model: String,
    /// Target version.
    pub version: i64,
    /// Alias followed, if any.
    #[serde(default)]
    pub alias: Option<String>,
    /// Version serving traffic.
    #[serde(default)]
    pub serving_version: Option<i64>,
    /// Slice profile.
    #[serde(default)]
    pub profile: String,
    /// Replica count.
    pub replicas: u32,
    /// `pending`, `progressing`, `ready` or `failed`.
    pub state: String,
    /// Replicas.
    #[serde(default)]
    pub replica_status: Vec<Replica>,
    /// How unversioned traffic splits between the stable version and the canary.
    #[serde(default)]
    pub traffic: Vec<TrafficShare>,
    /// Where applications call the model through the gateways, when the control plane knows.
    #[serde(default)]
    pub endpoint: Option<Endpoint>,
}

/// A deployment's gateway endpoint.
#[derive(Debug, Clone, Deserialize)]
pub struct Endpoint {
    /// KServe v2 HTTP base of the model (`…/v2/models/<model>`).
    pub http: String,
    /// KServe v2 gRPC `host:port`.
    #[serde(default)]
    pub grpc: Option<String>,
}

/// One version's share of a deployment's unversioned traffic.
#[derive(Debug, Clone, Deserialize)]
pub struct TrafficShare {
    /// Version.
    pub version: i64,
    /// Percent of unversioned requests.
    pub weight: i64,
    /// Whether this is the canary.
    #[serde(default)]
    pub canary: bool,
    /// Replicas ready and serving.
    #[serde(default)]
    pub ready_replicas: i64,
    /// Replicas wanted.
    #[serde(default)]
    pub replicas: i64,
}

/// One replica of a deployment.
#[derive(Debug, Clone, Deserialize)]
pub struct Replica {
    /// Index within the deployment.
    #[serde(default)]
    pub index: u32,
    /// Version it runs.
    #[serde(default)]
    pub version: i64,
    /// Worker holding it.
    #[serde(default)]
    pub worker_id: Option<String>,
    /// The worker's KServe v2 HTTP endpoint.
    #[serde(default)]
    pub http_endpoint: Option<String>,
    /// Slice.
    #[serde(default)]
    pub slice_id: Option<String>,
    /// `pending`, `scheduled`, `loading`, `ready`, `failed` or `draining`.
    pub state: String,
    /// Why it is pending or failed.
    #[serde(default)]
    pub reason: Option<String>,
    /// Whether it takes traffic.
    #[serde(default)]
    pub serving: bool,
    /// A canary replica.
    #[serde(default)]
    pub canary: bool,
}

impl Deployment {
    /// Serving its target version on every replica; scaled to zero, once it has none left to
    /// wait for (the control plane says `ready` when no replica of the target remains).
    pub fn is_rolled_out(&self) -> bool {
        self.state == "ready" && (self.replicas == 0 || self.serving_version == Some(self.version))
    }

    /// One line: `simple: ready, version 1 (alias production), 1/1 replicas ready`.
    pub fn summary(&self) -> String {
        let ready = self.replica_status.iter().filter(|r| r.state == "ready" && r.serving).count();
        let alias = self.alias.as_deref().map(|a| format!(" (alias {a})")).unwrap_or_default();
        let serving = match self.serving_version {
            Some(v) if v != self.version => format!(", serving version {v}"),
            _ => String::new(),
        };
        format!(
            "{}: {}, model {} version {}{alias}{serving}, {ready}/{} {} replicas ready",
            self.name, self.state, self.model, self.version, self.replicas, self.profile
        )
    }

    /// The split, e.g. `traffic: version 1 90% (2/2 ready), canary version 2 10% (1/1 ready)`.
    pub fn traffic_line(&self) -> String {
        let shares: Vec<String> = self
            .traffic
            .iter()
            .map(|t| {
                let who = if t.canary { "canary version" } else { "version" };
                format!("{who} {} {}% ({}/{} ready)", t.version, t.weight, t.ready_replicas, t.replicas)
            })
            .collect();
        format!("traffic: {}", if shares.is_empty() { "-".to_string() } else { shares.join(", ") })
    }

    /// Why it is not ready, from its replicas' reasons.
    pub fn reasons(&self) -> Vec<String> {
        self.replica_status
            .iter()
            .filter_map(|r| r.reason.as_ref().map(|why| format!("replica {} {}: {why}", r.index, r.state)))
            .collect()
    }

    /// The HTTP endpoint of the first ready, serving replica, as a URL.
    /// The line `deployments get` prints for the endpoint, when there is one.
    pub fn endpoint_line(&self) -> Option<String> {
        let e = self.endpoint.as_ref()?;
        Some(match &e.grpc {
            Some(grpc) => format!("endpoint: {} (gRPC {grpc}, model {})", e.http, self.model),
            None => format!("endpoint: {}", e.http),
        })
    }

    /// The gateway's base URL (what precedes `/v2/models/...`), when the deployment has an
    /// endpoint.
    pub fn gateway_url(&self) -> Option<String> {
        let http = &self.endpoint.as_ref()?.http;
        http.rfind("/v2/models/").map(|at| http[..at].to_string())
    }

    /// The HTTP endpoint of a ready, serving replica's worker (direct access).
    pub fn http_endpoint(&self) -> Option<String> {
        let r = self.replica_status.iter().find(|r| r.state == "ready" && r.serving && r.http_endpoint.is_some())?;
        r.http_endpoint.as_deref().map(endpoint_url)
    }
}

/// `host:port` or a URL, as a URL.
pub fn endpoint_url(endpoint: &str) -> String {
    if endpoint.contains("://") { endpoint.trim_end_matches('/').to_string() } else { format!("http://{endpoint}") }
}

/// The replica table `deploy` and `deployments get` print.
pub fn replica_table(d: &Deployment) -> String {
    let row = |cells: [&str; 7]| {
        let [index, version, state, serving, worker, slice, endpoint] = cells;
        format!("{index:<5} {version:<7} {state:<9} {serving:<7} {worker:<36} {slice:<8} {endpoint}")
    };
    let mut out = row(["INDEX", "VERSION", "STATE", "SERVING", "WORKER", "SLICE", "ENDPOINT"]);
    out.push('\n');
    for r in &d.replica_status {
        let (index, version) = (r.index.to_string(), r.version.to_string());
        let serving = if r.serving { "yes" } else { "no" };
        let text = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
        let (worker, slice, endpoint) = (text(&r.worker_id), text(&r.slice_id), text(&r.http_endpoint));
        out.push_str(&row([&index, &version, &r.state, serving, &worker, &slice, &endpoint]));
        if r.canary {
            out.push_str("  (canary)");
        }
        if let Some(reason) = &r.reason {
            out.push_str(&format!("  ({reason})"));
        }
        out.push('\n');
    }
    out
}

fn deployments_path(tenant: &str) -> String {
    format!("/v1/tenants/{}/deployments", segment(tenant))
}

/// One deployment, `None` if there is none by that name.
pub async fn get(api: &ApiClient, tenant: &str, name: &str) -> anyhow::Result<Option<(Deployment, Value)>> {
    let path = format!("{}/{}", deployments_path(tenant), segment(name));
    let Some(raw) = api.get_opt::<Value>(&path).await.with_context(|| format!("read deployment {name}"))? else {
        return Ok(None);
    };
    let d = serde_json::from_value(raw.clone()).context("read the deployment")?;
    Ok(Some((d, raw)))
}

/// The tenant's deployments, every page of them (the raw value is `{"deployments": [...]}`).
pub async fn list(api: &ApiClient, tenant: &str) -> anyhow::Result<(Vec<Deployment>, Value)> {
    let mut items = Vec::new();
    let mut cursor: Option<String> = None;
    loop {
        // Cursors are URL-safe base64: they need no escaping.
        let path = match &cursor {
            Some(c) => format!("{}?limit=200&cursor={c}", deployments_path(tenant)),
            None => format!("{}?limit=200", deployments_path(tenant)),
        };
        let page: Value = api.get(&path).await.context("list deployments")?;
        if let Some(Value::Array(page_items)) = page.get("deployments") {
            items.extend(page_items.iter().cloned());
        }
        match page.get("next_cursor").and_then(Value::as_str) {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let raw = json!({ "deployments": items });
    Ok((serde_json::from_value(raw["deployments"].clone()).context("read the deployments")?, raw))
}

impl DeployArgs {
    /// The body of a create (every given field) or update (given fields but name and model).
    fn body(&self, create: bool) -> Value {
        let mut body = Map::new();
        if create {
            body.insert("name".into(), json!(self.deployment_name()));
            body.insert("model".into(), json!(self.model));
        }
        let fields = [
            ("version", self.version.map(Value::from)),
            ("alias", self.alias.clone().map(Value::from)),
            ("replicas", self.replicas.map(Value::from)),
            ("profile", self.profile.clone().map(Value::from)),
            ("instance_count", self.instances.map(Value::from)),
        ];
        body.extend(fields.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), v))));
        Value::Object(body)
    }

    fn deployment_name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.model)
    }
}

impl CanaryArgs {
    /// The method and body: PUT with the version (or alias), weight and replicas to set the
    /// canary; PATCH with the weight alone to change it.
    fn request(&self) -> anyhow::Result<(reqwest::Method, Value)> {
        let weight = json!(self.weight);
        if self.version.is_none() && self.alias.is_none() {
            if self.replicas.is_some() {
                bail!("--replicas needs --version or --alias (it sets a new canary)");
            }
            return Ok((reqwest::Method::PATCH, json!({ "weight": weight })));
        }
        let mut body = Map::new();
        let fields = [
            ("version", self.version.map(Value::from)),
            ("alias", self.alias.clone().map(Value::from)),
            ("weight", Some(weight)),
            ("replicas", self.replicas.map(Value::from)),
        ];
        body.extend(fields.into_iter().filter_map(|(k, v)| v.map(|v| (k.to_string(), v))));
        Ok((reqwest::Method::PUT, Value::Object(body)))
    }
}

/// Prints a deployment a canary verb answered: JSON, or its summary, split and replicas.
fn print_deployment(raw: &Value, json: bool, verb: &str) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string_pretty(raw)?);
        return Ok(());
    }
    let d: Deployment = serde_json::from_value(raw.clone()).context("read the deployment")?;
    println!("{verb} {}", d.summary());
    println!("{}", d.traffic_line());
    print!("{}", replica_table(&d));
    Ok(())
}

fn canary_path(tenant: &str, name: &str) -> String {
    format!("{}/{}/canary", deployments_path(tenant), segment(name))
}

/// Runs `tessera deployments canary`.
async fn run_canary(args: &CanaryArgs) -> anyhow::Result<()> {
    let settings = args.connection.resolve()?;
    let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
    let (method, body) = args.request()?;
    let path = canary_path(&settings.tenant, &args.name);
    let raw: Value =
        api.call(method, &path, &body).await.with_context(|| format!("set the canary of {}", args.name))?;
    print_deployment(&raw, args.json, "canary set:")
}

/// Runs `tessera deployments promote|rollback`: `action` is the route's last segment.
async fn run_canary_action(args: &CanaryActionArgs, action: &str) -> anyhow::Result<()> {
    let settings = args.connection.resolve()?;
    let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
    let path = format!("{}/{action}", canary_path(&settings.tenant, &args.name));
    let raw: Value =
        api.post(&path, &json!({})).await.with_context(|| format!("{action} the canary of {}", args.name))?;
    let verb = if action == "promote" { "promoting:" } else { "rolled back:" };
    print_deployment(&raw, args.json, verb)
}

/// Creates the deployment, or updates (PATCH) the one of that name.
pub async fn apply(api: &ApiClient, tenant: &str, args: &DeployArgs) -> anyhow::Result<(Deployment, Value, bool)> {
    let name = args.deployment_name();
    let exists = get(api, tenant, name).await?.is_some();
    let raw: Value = if exists {
        let path = format!("{}/{}", deployments_path(tenant), segment(name));
        api.call(reqwest::Method::PATCH, &path, &args.body(false))
            .await
            .with_context(|| format!("update deployment {name}"))?
    } else {
        api.post(&deployments_path(tenant), &args.body(true))
            .await
            .with_context(|| format!("create deployment {name}"))?
    };
    let d = serde_json::from_value(raw.clone()).context("read the deployment")?;
    Ok((d, raw, !exists))
}

/// Polls the deployment until it serves its target version everywhere, with a spinner
/// showing its state; fails when it fails or `timeout` passes.
pub async fn wait_ready(api: &ApiClient, tenant: &str, name: &str, timeout: Duration) -> anyhow::Result<Deployment> {
    let spinner = progress::spinner(format!("waiting for deployment {name}"));
    let started = Instant::now();
    let outcome = loop {
        let Some((d, _)) = get(api, tenant, name).await? else {
            break Err(anyhow::anyhow!("deployment {name} disappeared"));
        };
        spinner.set_message(d.summary());
        if d.is_rolled_out() && workers_serve(api, &d).await {
            break Ok(d);
        }
        if d.state == "failed" {
            break Err(anyhow::anyhow!("deployment {name} failed: {}", d.reasons().join("; ")));
        }
        if started.elapsed() > timeout {
            let mut message = format!("deployment {name} not ready after {}s: {}", timeout.as_secs(), d.summary());
            for why in d.reasons() {
                message.push_str("; ");
                message.push_str(&why);
            }
            break Err(anyhow::anyhow!(message));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    spinner.finish_and_clear();
    outcome
}

/// Whether every worker with a serving replica answers the model ready. The registry marks
/// replicas serving a moment before their worker has applied the new assignments, and
/// unversioned requests find the model only once it has.
async fn workers_serve(api: &ApiClient, d: &Deployment) -> bool {
    let path = format!("/v2/models/{}/ready", segment(&d.model));
    let mut endpoints: Vec<String> = d
        .replica_status
        .iter()
        .filter(|r| r.serving)
        .filter_map(|r| r.http_endpoint.as_deref().map(endpoint_url))
        .collect();
    endpoints.sort();
    endpoints.dedup();
    for endpoint in endpoints {
        let worker = api.with_base(&endpoint);
        let probe = worker.request(reqwest::Method::GET, &path).timeout(Duration::from_secs(5));
        if worker.send_raw(probe).await.is_err() {
            return false;
        }
    }
    true
}

/// Runs `tessera deploy`.
pub async fn run_deploy(args: DeployArgs) -> anyhow::Result<()> {
    let settings = args.connection.resolve()?;
    let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
    let (mut d, mut raw, created) = apply(&api, &settings.tenant, &args).await?;
    if args.wait {
        d = wait_ready(&api, &settings.tenant, &d.name, Duration::from_secs(args.timeout_secs)).await?;
        raw = get(&api, &settings.tenant, &d.name).await?.map(|(_, raw)| raw).unwrap_or(raw);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&raw)?);
    } else {
        println!("{} {}", if created { "created" } else { "updated" }, d.summary());
        print!("{}", replica_table(&d));
    }
    Ok(())
}

/// Runs `tessera deployments list|get`.
pub async fn run_deployments(command: DeploymentsCommand) -> anyhow::Result<()> {
    match command {
        DeploymentsCommand::List(args) => {
            let settings = args.connection.resolve()?;
            let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
            let (items, raw) = list(&api, &settings.tenant).await?;
            if args.json {
                println!("{}", serde_json::to_string_pretty(&raw)?);
            } else if items.is_empty() {
                println!("no deployments in tenant {}", settings.tenant);
            } else {
                for d in &items {
                    println!("{}", d.summary());
                }
            }
        }
        DeploymentsCommand::Get(args) => {
            let settings = args.connection.resolve()?;
            let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
            let Some((d, raw)) = get(&api, &settings.tenant, &args.name).await? else {
                bail!("HTTP 404 Not Found: deployment {} not found in tenant {}", args.name, settings.tenant);
            };
            if args.json {
                println!("{}", serde_json::to_string_pretty(&raw)?);
            } else {
                println!("{}", d.summary());
                if let Some(line) = d.endpoint_line() {
                    println!("{line}");
                }
                println!("{}", d.traffic_line());
                print!("{}", replica_table(&d));
            }
        }
        DeploymentsCommand::Canary(args) => run_canary(&args).await?,
        DeploymentsCommand::Promote(args) => run_canary_action(&args, "promote").await?,
        DeploymentsCommand::Rollback(args) => run_canary_action(&args, "rollback").await?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Deployment {
        serde_json::from_value(json!({
            "id": "x", "name": "simple", "model": "simple", "version": 2, "alias": "production",
            "serving_version": 1, "profile": "cpu", "replicas": 1, "state": "progressing",
            "replica_status": [
                {"id": "a", "index": 0, "version": 1, "worker_id": "w1", "http_endpoint": "127.0.0.1:8000",
                 "state": "ready", "serving": true, "reason": null},
                {"id": "b", "index": 0, "version": 2, "worker_id": "w1", "http_endpoint": "127.0.0.1:8000",
                 "state": "loading", "serving": false, "reason": null}
            ]
        }))
        .expect("a deployment")
    }

    #[test]
    fn a_rollout_is_done_only_when_the_target_serves() {
        let mut d = sample();
        assert!(!d.is_rolled_out());
        assert_eq!(
            d.summary(),
            "simple: progressing, model simple version 2 (alias production), serving version 1, 1/1 cpu replicas ready"
        );
        d.state = "ready".into();
        d.serving_version = Some(2);
        assert!(d.is_rolled_out());
    }

    #[test]
    fn the_endpoint_is_the_first_serving_replica() {
        assert_eq!(sample().http_endpoint().as_deref(), Some("http://127.0.0.1:8000"));
        assert_eq!(endpoint_url("http://h:1/"), "http://h:1");
    }

    #[test]
    fn the_split_shows_each_version_with_its_share_and_ready_replicas() {
        let mut d = sample();
        d.traffic = serde_json::from_value(json!([
            {"version": 1, "weight": 90, "canary": false, "ready_replicas": 2, "replicas": 2},
            {"version": 2, "weight": 10, "canary": true, "ready_replicas": 0, "replicas": 1}
        ]))
        .expect("traffic");
        assert_eq!(d.traffic_line(), "traffic: version 1 90% (2/2 ready), canary version 2 10% (0/1 ready)");
        d.replica_status[1].canary = true;
        assert!(replica_table(&d).lines().nth(2).is_some_and(|l| l.ends_with("(canary)")), "{}", replica_table(&d));
    }

    #[test]
    fn the_canary_verb_sets_with_a_version_and_weights_without_one() {
        let args = |version: Option<i64>, alias: Option<&str>, replicas: Option<u32>| CanaryArgs {
            name: "simple".into(),
            version,
            alias: alias.map(str::to_string),
            weight: 10,
            replicas,
            json: false,
            connection: ConnectionArgs::default(),
        };
        let (method, body) = args(Some(2), None, Some(2)).request().expect("a request");
        assert_eq!((method, body), (reqwest::Method::PUT, json!({"version": 2, "weight": 10, "replicas": 2})));
        let (method, body) = args(None, Some("staging"), None).request().expect("a request");
        assert_eq!((method, body), (reqwest::Method::PUT, json!({"alias": "staging", "weight": 10})));
        let (method, body) = args(None, None, None).request().expect("a request");
        assert_eq!((method, body), (reqwest::Method::PATCH, json!({"weight": 10})));
        assert!(args(None, None, Some(2)).request().is_err(), "replicas only come with a new canary");
    }

    #[test]
    fn updates_send_only_what_was_given() {
        let args = DeployArgs {
            model: "simple".into(),
            name: None,
            version: None,
            alias: Some("production".into()),
            replicas: Some(2),
            profile: None,
            instances: None,
            wait: false,
            timeout_secs: 1,
            json: false,
            connection: ConnectionArgs::default(),
        };
        assert_eq!(args.body(false), json!({"alias": "production", "replicas": 2}));
        assert_eq!(args.body(true), json!({"name": "simple", "model": "simple", "alias": "production", "replicas": 2}));
    }
}
