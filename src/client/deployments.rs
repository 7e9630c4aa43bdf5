//! `tessera deployments list|get|scale|delete|events|watch|canary|promote|rollback`: read a
//! tenant's deployments, change their replica count, delete them, follow their placement events
//! and replica states as they change, and set, weight, promote or roll back a canary.

use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use super::api::ApiClient;
use super::confirm::confirm;
use super::deploy::{self, DEPLOYMENTS_HINT, Deployment, Replica, deployment_path, replica_table};
use super::output::{Output, Table, cell, print_json, time};
use super::settings::ConnectionArgs;

/// `tessera deployments …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum DeploymentsCommand {
    /// The tenant's deployments.
    List(ListArgs),
    /// One deployment with its endpoint, traffic split and replicas.
    Get(NameArgs),
    /// Change a deployment's replica count (0 keeps it, serving nothing).
    Scale(ScaleArgs),
    /// Delete a deployment; workers unload its replicas.
    Delete(DeleteArgs),
    /// A deployment's latest placement events (replicas placed, loaded, failed, moved).
    Events(NameArgs),
    /// Follow a deployment: print its state, replica changes and new events as they happen.
    Watch(WatchArgs),
    /// Set the canary (`--version` or `--alias` with `--weight`), or change only its weight
    /// (`--weight` alone): that percent of unversioned traffic goes to the canary's version.
    Canary(CanaryArgs),
    /// Promote the canary: its version rolls out to the stable replicas, then the canary goes.
    Promote(NameArgs),
    /// Roll the canary back: the stable version takes all traffic, the canary's replicas drain.
    Rollback(NameArgs),
    /// A deployment's capture files (captured requests), or with `--get FILE` one file's
    /// JSON Lines on stdout.
    Captures(CapturesArgs),
}

/// `tessera deployments captures` flags.
#[derive(Debug, clap::Args)]
pub struct CapturesArgs {
    /// Deployment name.
    pub name: String,
    /// Print this file (`YYYY-MM-DD/<worker>-<batch>.jsonl`, as listed) instead of the list.
    #[arg(long, value_name = "FILE")]
    pub get: Option<String>,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Flags of verbs on one deployment.
#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// Deployment name.
    pub name: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments scale` flags.
#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// Deployment name.
    pub name: String,
    /// Replica count (0 to 64).
    #[arg(long, value_parser = clap::value_parser!(u32).range(0..=64))]
    pub replicas: u32,
    /// Wait until every replica serves.
    #[arg(long)]
    pub wait: bool,
    /// Longest wait with `--wait`, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments delete` flags.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Deployment name.
    pub name: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera deployments watch` flags.
#[derive(Debug, clap::Args)]
pub struct WatchArgs {
    /// Deployment name.
    pub name: String,
    /// Stop, successfully, once the deployment serves its target version everywhere (and fail
    /// if it fails); without it, watch until Ctrl-C.
    #[arg(long)]
    pub until_ready: bool,
    /// Stop with an error after this many seconds (default: never).
    #[arg(long)]
    pub timeout_secs: Option<u64>,
    /// Milliseconds between looks.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(100..=60_000))]
    pub interval_ms: u64,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
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
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
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

/// Prints a deployment a verb answered: JSON, or `verb` and its summary, split and replicas.
fn print_deployment(raw: &Value, output: Output, verb: &str) -> anyhow::Result<()> {
    if output.is_json() {
        return print_json(raw);
    }
    let d: Deployment = serde_json::from_value(raw.clone()).context("read the deployment")?;
    if let Some(note) = &d.notice {
        println!("note: {note}");
    }
    println!("{verb}{}", d.summary());
    if let Some(line) = d.endpoint_line() {
        println!("{line}");
    }
    println!("{}", d.traffic_line());
    print!("{}", replica_table(&d));
    Ok(())
}

/// Lists a deployment's capture files, or prints one.
async fn run_captures(args: CapturesArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let base = format!("{}/captures", deployment_path(&settings.tenant, &args.name));
    if let Some(file) = &args.get {
        let request = api.request(reqwest::Method::GET, &format!("{base}/{file}"));
        let (_, text) = api
            .send_raw(request)
            .await
            .map_err(|e| e.advise(DEPLOYMENTS_HINT))
            .with_context(|| format!("download capture file {file} of {}", args.name))?;
        print!("{text}");
        return Ok(());
    }
    let files = api
        .get_all(&base, &[], "files")
        .await
        .map_err(|e| e.advise(DEPLOYMENTS_HINT))
        .with_context(|| format!("list the capture files of {}", args.name))?;
    if output.is_json() {
        return print_json(&Value::Array(files));
    }
    let mut table = Table::new(["FILE", "BYTES", "WRITTEN"]);
    for f in &files {
        table.row([cell(&f["name"]), cell(&f["size_bytes"]), time(&cell(&f["last_modified"]))]);
    }
    let empty = format!(
        "no capture files for deployment {} (turn capture on with PATCH .../deployments/{} {{\"capture\": {{\"enabled\": true}}}})",
        args.name, args.name
    );
    table.print_or(&empty);
    Ok(())
}

fn canary_path(tenant: &str, name: &str) -> String {
    format!("{}/canary", deployment_path(tenant, name))
}

/// Runs `tessera deployments …`.
pub async fn run(command: DeploymentsCommand, output: Output) -> anyhow::Result<()> {
    match command {
        DeploymentsCommand::List(args) => {
            let (settings, api) = args.connection.connect()?;
            let (items, raw) = deploy::list(&api, &settings.tenant).await?;
            if output.is_json() {
                return print_json(&raw);
            }
            let empty = format!(
                "no deployments in tenant {} (create one with `tessera deploy --model MODEL --alias production --wait`)",
                settings.tenant
            );
            deploy::deployments_table(&items).print_or(&empty);
        }
        DeploymentsCommand::Get(args) => {
            let (settings, api) = args.connection.connect()?;
            let raw = read(&api, &settings.tenant, &args.name).await?;
            print_deployment(&raw, output, "")?;
        }
        DeploymentsCommand::Scale(args) => run_scale(args, output).await?,
        DeploymentsCommand::Delete(args) => {
            let (settings, api) = args.connection.connect()?;
            confirm(&format!("delete deployment {} in tenant {}?", args.name, settings.tenant), args.yes)?;
            api.delete(&deployment_path(&settings.tenant, &args.name))
                .await
                .map_err(|e| e.advise(DEPLOYMENTS_HINT))
                .with_context(|| format!("delete deployment {}", args.name))?;
            println!("deleted deployment {} (its replicas unload)", args.name);
        }
        DeploymentsCommand::Events(args) => {
            let (settings, api) = args.connection.connect()?;
            let events = events(&api, &settings.tenant, &args.name).await?;
            if output.is_json() {
                return print_json(&Value::Array(events));
            }
            let mut table = Table::new(["AT", "KIND", "WORKER", "MESSAGE"]);
            for e in &events {
                table.row([time(&cell(&e["at"])), cell(&e["kind"]), cell(&e["worker_id"]), cell(&e["message"])]);
            }
            table.print_or(&format!("no events for deployment {}", args.name));
        }
        DeploymentsCommand::Watch(args) => run_watch(args, output).await?,
        DeploymentsCommand::Captures(args) => run_captures(args, output).await?,
        DeploymentsCommand::Canary(args) => {
            let (settings, api) = args.connection.connect()?;
            let (method, body) = args.request()?;
            let path = canary_path(&settings.tenant, &args.name);
            let raw: Value = api
                .call(method, &path, &body)
                .await
                .map_err(|e| e.advise(DEPLOYMENTS_HINT))
                .with_context(|| format!("set the canary of {}", args.name))?;
            print_deployment(&raw, output, "canary set: ")?;
        }
        DeploymentsCommand::Promote(args) => run_canary_action(args, "promote", output).await?,
        DeploymentsCommand::Rollback(args) => run_canary_action(args, "rollback", output).await?,
    }
    Ok(())
}

/// One deployment's JSON; a missing one is an error saying where to look.
async fn read(api: &ApiClient, tenant: &str, name: &str) -> anyhow::Result<Value> {
    api.get(&deployment_path(tenant, name))
        .await
        .map_err(|e| e.advise(DEPLOYMENTS_HINT))
        .with_context(|| format!("read deployment {name}"))
}

/// A deployment's latest events, oldest first (every page).
async fn events(api: &ApiClient, tenant: &str, name: &str) -> anyhow::Result<Vec<Value>> {
    let path = format!("{}/events", deployment_path(tenant, name));
    api.get_all(&path, &[], "events")
        .await
        .map_err(|e| e.advise(DEPLOYMENTS_HINT))
        .with_context(|| format!("read the events of deployment {name}"))
}

/// Runs `tessera deployments promote|rollback`: `action` is the route's last segment.
async fn run_canary_action(args: NameArgs, action: &str, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let path = format!("{}/{action}", canary_path(&settings.tenant, &args.name));
    let raw: Value = api
        .post(&path, &json!({}))
        .await
        .map_err(|e| e.advise(DEPLOYMENTS_HINT))
        .with_context(|| format!("{action} the canary of {}", args.name))?;
    let verb = if action == "promote" { "promoting: " } else { "rolled back: " };
    print_deployment(&raw, output, verb)
}

/// Runs `tessera deployments scale`.
async fn run_scale(args: ScaleArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let raw: Value = api
        .call(
            reqwest::Method::PATCH,
            &deployment_path(&settings.tenant, &args.name),
            &json!({ "replicas": args.replicas }),
        )
        .await
        .map_err(|e| e.advise(DEPLOYMENTS_HINT))
        .with_context(|| format!("scale deployment {} to {} replicas", args.name, args.replicas))?;
    if !args.wait {
        return print_deployment(&raw, output, "scaled: ");
    }
    deploy::wait_ready(&api, &settings.tenant, &args.name, Duration::from_secs(args.timeout_secs)).await?;
    let raw = read(&api, &settings.tenant, &args.name).await?;
    print_deployment(&raw, output, "scaled: ")
}

/// Runs `tessera deployments watch`: prints what changed at each look, as lines (table) or
/// one JSON object per line (`{"deployment": …}`, `{"event": …}`).
async fn run_watch(args: WatchArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let started = Instant::now();
    let mut seen_events: HashSet<String> = HashSet::new();
    let mut last: Option<(String, Vec<Replica>)> = None;
    loop {
        let raw = read(&api, &settings.tenant, &args.name).await?;
        let d: Deployment = serde_json::from_value(raw.clone()).context("read the deployment")?;
        for e in events(&api, &settings.tenant, &args.name).await? {
            if seen_events.insert(event_key(&e)) {
                if output.is_json() {
                    println!("{}", json!({ "event": e }));
                } else {
                    println!("event  {}  {}  {}", time(&cell(&e["at"])), cell(&e["kind"]), cell(&e["message"]));
                }
            }
        }
        let summary = d.summary();
        let changed = last.as_ref().is_none_or(|(s, r)| *s != summary || *r != d.replica_status);
        if changed {
            if output.is_json() {
                println!("{}", json!({ "deployment": raw }));
            } else {
                let before = last.as_ref().map(|(_, r)| r.as_slice()).unwrap_or_default();
                println!("{summary}");
                for line in replica_changes(before, &d.replica_status) {
                    println!("  {line}");
                }
            }
            last = Some((summary, d.replica_status.clone()));
        }
        if args.until_ready {
            if d.state == "failed" {
                bail!("deployment {} failed: {}", d.name, d.reasons().join("; "));
            }
            if d.is_rolled_out() && deploy::workers_serve(&api, &d).await {
                return Ok(());
            }
        }
        if let Some(limit) = args.timeout_secs.filter(|s| started.elapsed() > Duration::from_secs(*s)) {
            bail!("deployment {} still {} after {limit}s: {}", d.name, d.state, d.summary());
        }
        tokio::time::sleep(Duration::from_millis(args.interval_ms)).await;
    }
}

/// What tells two events apart (they have no id).
fn event_key(e: &Value) -> String {
    format!("{}|{}|{}|{}", cell(&e["at"]), cell(&e["kind"]), cell(&e["replica_id"]), cell(&e["message"]))
}

/// Lines for replicas that appeared, changed state or serving, or went away.
fn replica_changes(before: &[Replica], after: &[Replica]) -> Vec<String> {
    let key = |r: &Replica| r.id.clone().unwrap_or_else(|| format!("{}/{}/{}", r.index, r.version, r.canary));
    let name = |r: &Replica| {
        let canary = if r.canary { " (canary)" } else { "" };
        format!("replica {} version {}{canary}", r.index, r.version)
    };
    let status = |r: &Replica| {
        let serving = if r.serving { ", serving" } else { "" };
        let place = r.worker_id.as_deref().map(|w| format!(" on {w}")).unwrap_or_default();
        let why = r.reason.as_deref().map(|w| format!(" ({w})")).unwrap_or_default();
        format!("{}{serving}{place}{why}", r.state)
    };
    let old: HashMap<String, &Replica> = before.iter().map(|r| (key(r), r)).collect();
    let mut lines = Vec::new();
    for r in after {
        match old.get(&key(r)) {
            None => lines.push(format!("{}: {}", name(r), status(r))),
            Some(b) if status(b) != status(r) => lines.push(format!("{}: {} -> {}", name(r), status(b), status(r))),
            Some(_) => {}
        }
    }
    let now: HashSet<String> = after.iter().map(key).collect();
    for r in before.iter().filter(|r| !now.contains(&key(r))) {
        lines.push(format!("{}: gone", name(r)));
    }
    lines
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(id: &str, version: i64, state: &str, serving: bool) -> Replica {
        serde_json::from_value(json!({
            "id": id, "index": 0, "version": version, "worker_id": "w1", "state": state, "serving": serving
        }))
        .expect("a replica")
    }

    #[test]
    fn the_canary_verb_sets_with_a_version_and_weights_without_one() {
        let args = |version: Option<i64>, alias: Option<&str>, replicas: Option<u32>| CanaryArgs {
            name: "simple".into(),
            version,
            alias: alias.map(str::to_string),
            weight: 10,
            replicas,
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
    fn watch_prints_what_changed_between_looks() {
        let before = [replica("a", 1, "ready", true), replica("b", 2, "loading", false)];
        let after = [replica("b", 2, "ready", true), replica("c", 2, "scheduled", false)];
        assert_eq!(
            replica_changes(&before, &after),
            [
                "replica 0 version 2: loading on w1 -> ready, serving on w1",
                "replica 0 version 2: scheduled on w1",
                "replica 0 version 1: gone",
            ]
        );
        assert!(replica_changes(&after, &after).is_empty(), "no change, no line");
        let first = replica_changes(&[], &before[..1]);
        assert_eq!(first, ["replica 0 version 1: ready, serving on w1"]);
    }

    #[test]
    fn events_are_told_apart_by_time_kind_replica_and_message() {
        let e = json!({"at": "t", "kind": "placed", "replica_id": null, "message": "m"});
        assert_eq!(event_key(&e), "t|placed|-|m");
        let other = json!({"at": "t", "kind": "loaded", "replica_id": null, "message": "m"});
        assert_ne!(event_key(&e), event_key(&other));
    }
}
