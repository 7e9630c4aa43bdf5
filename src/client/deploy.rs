//! `tessera deploy`: create or update a deployment and wait (with a spinner) until it serves its
//! target version; the deployment and replica types, reads and waits the `deployments` verbs
//! share.

use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use super::api::{ApiClient, segment};
use super::output::{Output, Table, opt, print_json};
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
    /// What the control plane wants the caller to know about the change just made (e.g. that
    /// a version pin stopped following an alias).
    #[serde(default)]
    pub notice: Option<String>,
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
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Replica {
    /// Id.
    #[serde(default)]
    pub id: Option<String>,
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

    /// Replicas ready and taking traffic.
    pub fn ready_replicas(&self) -> usize {
        self.replica_status.iter().filter(|r| r.state == "ready" && r.serving).count()
    }

    /// One line: `simple: ready, version 1 (alias production), 1/1 replicas ready`.
    pub fn summary(&self) -> String {
        let ready = self.ready_replicas();
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
    let mut table = Table::new(["INDEX", "VERSION", "STATE", "SERVING", "WORKER", "SLICE", "ENDPOINT", "NOTE"]);
    for r in &d.replica_status {
        let serving = if r.serving { "yes" } else { "no" };
        let mut notes = Vec::new();
        if r.canary {
            notes.push("canary".to_string());
        }
        notes.extend(r.reason.clone());
        table.row([
            r.index.to_string(),
            r.version.to_string(),
            r.state.clone(),
            serving.to_string(),
            opt(r.worker_id.as_ref()),
            opt(r.slice_id.as_ref()),
            opt(r.http_endpoint.as_ref()),
            notes.join("; "),
        ]);
    }
    table.render()
}

/// The deployments as a table: one row each.
pub fn deployments_table(items: &[Deployment]) -> Table {
    let mut table = Table::new(["NAME", "MODEL", "VERSION", "ALIAS", "STATE", "READY", "PROFILE"]);
    for d in items {
        let ready = format!("{}/{}", d.ready_replicas(), d.replicas);
        let version = match d.serving_version {
            Some(v) if v != d.version => format!("{} (serving {v})", d.version),
            _ => d.version.to_string(),
        };
        table.row([
            d.name.clone(),
            d.model.clone(),
            version,
            opt(d.alias.as_ref()),
            d.state.clone(),
            ready,
            d.profile.clone(),
        ]);
    }
    table
}

fn deployments_path(tenant: &str) -> String {
    format!("/v1/tenants/{}/deployments", segment(tenant))
}

/// One deployment, `None` if there is none by that name.
pub async fn get(api: &ApiClient, tenant: &str, name: &str) -> anyhow::Result<Option<(Deployment, Value)>> {
    let path = format!("{}/{}", deployments_path(tenant), segment(name));
    let found = api.get_opt::<Value>(&path).await.map_err(|e| e.advise(""));
    let Some(raw) = found.with_context(|| format!("read deployment {name}"))? else {
        return Ok(None);
    };
    let d = serde_json::from_value(raw.clone()).context("read the deployment")?;
    Ok(Some((d, raw)))
}

/// The tenant's deployments (every page), parsed and as the API gave them.
pub async fn list(api: &ApiClient, tenant: &str) -> anyhow::Result<(Vec<Deployment>, Value)> {
    let items = api
        .get_all(&deployments_path(tenant), &[], "deployments")
        .await
        .map_err(|e| e.advise(""))
        .context("list deployments")?;
    let raw = Value::Array(items);
    Ok((serde_json::from_value(raw.clone()).context("read the deployments")?, raw))
}

/// The path of one deployment.
pub fn deployment_path(tenant: &str, name: &str) -> String {
    format!("{}/{}", deployments_path(tenant), segment(name))
}

/// Where to look when a deployment is not found.
pub const DEPLOYMENTS_HINT: &str = "`tessera deployments list` shows your deployments";

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

/// Creates the deployment, or updates (PATCH) the one of that name; the deployment, its JSON,
/// whether it was created, and a note when a version pin stopped it following an alias.
pub async fn apply(api: &ApiClient, tenant: &str, args: &DeployArgs) -> anyhow::Result<Applied> {
    let name = args.deployment_name();
    let before = get(api, tenant, name).await?.map(|(d, _)| d);
    let hint = |e: super::api::ApiError| e.advise(&missing_hint(args));
    let raw: Value = if before.is_some() {
        api.call(reqwest::Method::PATCH, &deployment_path(tenant, name), &args.body(false))
            .await
            .map_err(hint)
            .with_context(|| format!("update deployment {name}"))?
    } else {
        api.post(&deployments_path(tenant), &args.body(true))
            .await
            .map_err(hint)
            .with_context(|| format!("create deployment {name}"))?
    };
    let deployment: Deployment = serde_json::from_value(raw.clone()).context("read the deployment")?;
    let notice = deployment.notice.clone().or_else(|| unfollowed_note(before.as_ref(), args));
    Ok(Applied { deployment, raw, created: before.is_none(), notice })
}

/// What [`apply`] did.
#[derive(Debug)]
pub struct Applied {
    /// The deployment after the change.
    pub deployment: Deployment,
    /// Its JSON.
    pub raw: Value,
    /// Created (not updated).
    pub created: bool,
    /// A note for the user (the control plane's `notice`, else the CLI's own).
    pub notice: Option<String>,
}

/// What to do when a deploy names something that does not exist: the alias (most often, right
/// after a first push) or the model.
fn missing_hint(args: &DeployArgs) -> String {
    let model = &args.model;
    match &args.alias {
        Some(alias) => format!(
            "if the alias is missing, set one with `tessera aliases set {model} {alias} --version N` or push with \
             `tessera models push FILE --model {model} --alias {alias}`; `tessera models list` shows your models"
        ),
        None => "`tessera models list` shows your models, `tessera versions list MODEL` their versions".to_string(),
    }
}

/// The note for a deployment that followed an alias and was just pinned to a version.
fn unfollowed_note(before: Option<&Deployment>, args: &DeployArgs) -> Option<String> {
    let alias = before?.alias.as_deref()?;
    let version = args.version?;
    Some(format!(
        "deployment {} no longer follows alias {alias}: it is pinned to version {version} \
         (`tessera deploy --model {} --alias {alias}` follows it again)",
        args.deployment_name(),
        args.model
    ))
}

/// Polls the deployment until it serves its target version everywhere, with a spinner
/// showing its state; fails when it fails or `timeout` passes.
pub async fn wait_ready(api: &ApiClient, tenant: &str, name: &str, timeout: Duration) -> anyhow::Result<Deployment> {
    wait_serving(api, tenant, name, None, timeout).await
}

/// [`wait_ready`], and, with `version`, until that is the target: an alias just moved reaches
/// the deployments following it at the scheduler's next pass, so until then the deployment
/// still looks rolled out to the old version.
pub async fn wait_serving(
    api: &ApiClient,
    tenant: &str,
    name: &str,
    version: Option<i64>,
    timeout: Duration,
) -> anyhow::Result<Deployment> {
    let spinner = progress::spinner(format!("waiting for deployment {name}"));
    let started = Instant::now();
    let outcome = loop {
        let Some((d, _)) = get(api, tenant, name).await? else {
            break Err(anyhow::anyhow!("deployment {name} disappeared"));
        };
        spinner.set_message(d.summary());
        let targets = version.is_none_or(|v| d.version == v);
        if targets && d.is_rolled_out() && workers_serve(api, &d).await {
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
pub async fn workers_serve(api: &ApiClient, d: &Deployment) -> bool {
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
pub async fn run_deploy(args: DeployArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let applied = apply(&api, &settings.tenant, &args).await?;
    if let Some(note) = &applied.notice {
        // On stderr with JSON, so the answer stays parseable.
        if output.is_json() { eprintln!("note: {note}") } else { println!("note: {note}") }
    }
    let (mut d, mut raw) = (applied.deployment, applied.raw);
    if args.wait {
        d = wait_ready(&api, &settings.tenant, &d.name, Duration::from_secs(args.timeout_secs)).await?;
        raw = get(&api, &settings.tenant, &d.name).await?.map(|(_, raw)| raw).unwrap_or(raw);
    }
    if output.is_json() {
        return print_json(&raw);
    }
    println!("{} {}", if applied.created { "created" } else { "updated" }, d.summary());
    print!("{}", replica_table(&d));
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
        assert!(replica_table(&d).lines().nth(2).is_some_and(|l| l.ends_with("canary")), "{}", replica_table(&d));
    }

    #[test]
    fn the_list_shows_one_row_per_deployment_with_its_ready_replicas() {
        let text = deployments_table(&[sample()]).render();
        assert_eq!(
            text,
            "NAME    MODEL   VERSION        ALIAS       STATE        READY  PROFILE\n\
             simple  simple  2 (serving 1)  production  progressing  1/1    cpu\n"
        );
    }

    #[test]
    fn a_version_pin_on_a_deployment_that_followed_an_alias_says_so() {
        let mut args = deploy_args();
        args.alias = None;
        args.version = Some(3);
        let note = unfollowed_note(Some(&sample()), &args).expect("a note");
        assert!(note.contains("no longer follows alias production") && note.contains("--alias production"), "{note}");
        assert_eq!(unfollowed_note(None, &args), None, "a new deployment followed nothing");
        args.version = None;
        assert_eq!(unfollowed_note(Some(&sample()), &args), None, "no pin, nothing stopped");
    }

    #[test]
    fn a_missing_alias_says_how_to_set_one() {
        let hint = missing_hint(&deploy_args());
        assert!(hint.contains("tessera aliases set simple production --version N"), "{hint}");
        assert!(hint.contains("--alias production"), "{hint}");
    }

    fn deploy_args() -> DeployArgs {
        DeployArgs {
            model: "simple".into(),
            name: None,
            version: None,
            alias: Some("production".into()),
            replicas: Some(2),
            profile: None,
            instances: None,
            wait: false,
            timeout_secs: 1,
            connection: ConnectionArgs::default(),
        }
    }

    #[test]
    fn updates_send_only_what_was_given() {
        let args = deploy_args();
        assert_eq!(args.body(false), json!({"alias": "production", "replicas": 2}));
        assert_eq!(args.body(true), json!({"name": "simple", "model": "simple", "alias": "production", "replicas": 2}));
    }
}
