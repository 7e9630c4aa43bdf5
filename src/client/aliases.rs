//! `tessera aliases list|set|rollback`: a model's movable names (`production`, `staging`).
//! Setting an alias creates or moves it (`move` is the same verb); rolling back moves it to the
//! version it pointed at before its last move, which the registry keeps with the alias. A
//! deployment following the alias rolls out to the new version; `--wait` waits for that.

use std::time::Duration;

use anyhow::{Context, bail};
use serde::Deserialize;
use serde_json::{Value, json};

use super::api::{ApiClient, segment};
use super::deploy;
use super::output::{Output, Table, opt, print_json, time};
use super::settings::ConnectionArgs;

/// `tessera aliases …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum AliasesCommand {
    /// A model's aliases: the version each points at and the one before.
    List(ListArgs),
    /// Point an alias at a version, creating or moving it; a deployment following it rolls out.
    #[command(visible_alias = "move")]
    Set(SetArgs),
    /// Move an alias back to the version it pointed at before its last move.
    Rollback(RollbackArgs),
}

/// `tessera aliases list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Model name.
    pub model: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera aliases set` flags.
#[derive(Debug, clap::Args)]
pub struct SetArgs {
    /// Model name.
    pub model: String,
    /// Alias name, e.g. `production`.
    pub alias: String,
    /// The version it should point at.
    #[arg(long)]
    pub version: i64,
    /// Wait until the deployments following the alias serve that version.
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera aliases rollback` flags.
#[derive(Debug, clap::Args)]
pub struct RollbackArgs {
    /// Model name.
    pub model: String,
    /// Alias name, e.g. `production`.
    pub alias: String,
    /// Wait until the deployments following the alias serve the version rolled back to.
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `--wait` and its timeout, for verbs that start a rollout.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct WaitArgs {
    /// Wait until the deployments following the alias serve its version.
    #[arg(long)]
    pub wait: bool,
    /// Longest wait with `--wait`, in seconds.
    #[arg(long, default_value_t = 300)]
    pub timeout_secs: u64,
}

/// An alias as the API shows it.
#[derive(Debug, Clone, Deserialize)]
pub struct Alias {
    /// Name.
    pub alias: String,
    /// Version it points at.
    pub version: i64,
    /// Version before its last move.
    #[serde(default)]
    pub previous_version: Option<i64>,
    /// Last moved (RFC 3339).
    #[serde(default)]
    pub updated_at: String,
}

fn aliases_path(tenant: &str, model: &str) -> String {
    format!("/v1/tenants/{}/models/{}/aliases", segment(tenant), segment(model))
}

/// Where to look when the model or alias is missing.
fn missing(model: &str, alias: &str) -> String {
    format!(
        "`tessera aliases list {model}` shows its aliases, `tessera models list` your models; \
         set one with `tessera aliases set {model} {alias} --version N`"
    )
}

/// One alias, `None` when the model has none by that name.
pub async fn get(api: &ApiClient, tenant: &str, model: &str, alias: &str) -> anyhow::Result<Option<Alias>> {
    let path = format!("{}/{}", aliases_path(tenant, model), segment(alias));
    match api.get::<Alias>(&path).await {
        Ok(a) => Ok(Some(a)),
        // A 404 is either: tell the missing model apart, since its advice differs.
        Err(e) if e.is_not_found() => {
            let model_path = format!("/v1/tenants/{}/models/{}", segment(tenant), segment(model));
            api.get::<Value>(&model_path)
                .await
                .map_err(|e| e.advise("`tessera models list` shows your models"))
                .with_context(|| format!("read model {model}"))?;
            Ok(None)
        }
        Err(e) => Err(e.advise("")).with_context(|| format!("read alias {alias} of {model}")),
    }
}

/// Points `alias` of `model` at `version` (creating or moving it); the alias before and after.
pub async fn set(
    api: &ApiClient,
    tenant: &str,
    model: &str,
    alias: &str,
    version: i64,
) -> anyhow::Result<(Option<Alias>, Alias, Value)> {
    let before = get(api, tenant, model, alias).await?;
    let path = format!("{}/{}", aliases_path(tenant, model), segment(alias));
    let raw: Value = api
        .call(reqwest::Method::PUT, &path, &json!({ "version": version }))
        .await
        .map_err(|e| e.advise(&format!("`tessera versions list {model}` shows its versions")))
        .with_context(|| format!("point alias {alias} of {model} at version {version}"))?;
    let after = serde_json::from_value(raw.clone()).context("read the alias")?;
    Ok((before, after, raw))
}

/// `alias of model: version 1 -> 2` (or `created at version 2`, `unchanged at version 2`).
pub fn moved_line(model: &str, before: Option<&Alias>, after: &Alias) -> String {
    let name = format!("alias {} of {model}", after.alias);
    match before {
        None => format!("{name}: created at version {}", after.version),
        Some(b) if b.version == after.version => format!("{name}: unchanged at version {}", after.version),
        Some(b) => format!("{name}: version {} -> {}", b.version, after.version),
    }
}

/// The version a rollback moves the alias to, or why there is none.
fn rollback_target(model: &str, alias: &Alias) -> anyhow::Result<i64> {
    match alias.previous_version {
        Some(v) if v != alias.version => Ok(v),
        _ => bail!(
            "alias {} of {model} has not moved since it was set (version {}): nothing to roll back to \
             (point it elsewhere with `tessera aliases set {model} {} --version N`)",
            alias.alias,
            alias.version,
            alias.alias
        ),
    }
}

/// Waits until every deployment of `model` that follows `alias` serves its version; the lines
/// to print (one per deployment, or that none follows it).
pub async fn wait_followers(
    api: &ApiClient,
    tenant: &str,
    model: &str,
    alias: &Alias,
    timeout: Duration,
) -> anyhow::Result<Vec<String>> {
    let (version, alias) = (alias.version, alias.alias.as_str());
    let (deployments, _) = deploy::list(api, tenant).await?;
    let following: Vec<_> =
        deployments.iter().filter(|d| d.model == model && d.alias.as_deref() == Some(alias)).collect();
    if following.is_empty() {
        return Ok(vec![format!("no deployment follows alias {alias} of {model}: nothing to wait for")]);
    }
    let mut lines = Vec::new();
    for d in following {
        let ready = deploy::wait_serving(api, tenant, &d.name, Some(version), timeout).await?;
        lines.push(format!("rolled out: {}", ready.summary()));
    }
    Ok(lines)
}

/// Runs `tessera aliases …`.
pub async fn run(command: AliasesCommand, output: Output) -> anyhow::Result<()> {
    match command {
        AliasesCommand::List(args) => {
            let (settings, api) = args.connection.connect()?;
            let path = aliases_path(&settings.tenant, &args.model);
            let raw: Value = api
                .get(&path)
                .await
                .map_err(|e| e.advise("`tessera models list` shows your models"))
                .with_context(|| format!("list the aliases of {}", args.model))?;
            if output.is_json() {
                return print_json(&raw);
            }
            let aliases: Vec<Alias> =
                serde_json::from_value(raw.get("aliases").cloned().unwrap_or(Value::Array(Vec::new())))
                    .context("read the aliases")?;
            let mut table = Table::new(["ALIAS", "VERSION", "PREVIOUS", "UPDATED"]);
            for a in &aliases {
                table.row([a.alias.clone(), a.version.to_string(), opt(a.previous_version), time(&a.updated_at)]);
            }
            let empty = format!(
                "model {} has no aliases (set one with `tessera aliases set {} production --version N`)",
                args.model, args.model
            );
            table.print_or(&empty);
        }
        AliasesCommand::Set(args) => {
            let (settings, api) = args.connection.connect()?;
            let (before, after, raw) = set(&api, &settings.tenant, &args.model, &args.alias, args.version).await?;
            let line = moved_line(&args.model, before.as_ref(), &after);
            finish(&api, &settings.tenant, &args.model, &after, args.wait, output, &raw, line).await?;
        }
        AliasesCommand::Rollback(args) => {
            let (settings, api) = args.connection.connect()?;
            let Some(current) = get(&api, &settings.tenant, &args.model, &args.alias).await? else {
                bail!(
                    "alias not found: {} of model {} ({})",
                    args.alias,
                    args.model,
                    missing(&args.model, &args.alias)
                );
            };
            let target = rollback_target(&args.model, &current)?;
            let (_, after, raw) = set(&api, &settings.tenant, &args.model, &args.alias, target).await?;
            let line = format!("rolled back {}", moved_line(&args.model, Some(&current), &after));
            finish(&api, &settings.tenant, &args.model, &after, args.wait, output, &raw, line).await?;
        }
    }
    Ok(())
}

/// Prints a moved alias (JSON, or `line`), then waits for its followers when asked.
#[allow(clippy::too_many_arguments)]
async fn finish(
    api: &ApiClient,
    tenant: &str,
    model: &str,
    alias: &Alias,
    wait: WaitArgs,
    output: Output,
    raw: &Value,
    line: String,
) -> anyhow::Result<()> {
    if output.is_json() {
        print_json(raw)?;
    } else {
        println!("{line}");
    }
    if wait.wait {
        let lines = wait_followers(api, tenant, model, alias, Duration::from_secs(wait.timeout_secs)).await?;
        if !output.is_json() {
            for line in lines {
                println!("{line}");
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alias(version: i64, previous_version: Option<i64>) -> Alias {
        Alias { alias: "production".into(), version, previous_version, updated_at: String::new() }
    }

    #[test]
    fn moves_read_as_before_and_after() {
        assert_eq!(moved_line("resnet", None, &alias(1, None)), "alias production of resnet: created at version 1");
        assert_eq!(
            moved_line("resnet", Some(&alias(1, None)), &alias(2, Some(1))),
            "alias production of resnet: version 1 -> 2"
        );
        assert_eq!(
            moved_line("resnet", Some(&alias(2, Some(1))), &alias(2, Some(1))),
            "alias production of resnet: unchanged at version 2"
        );
    }

    #[test]
    fn a_rollback_goes_to_the_previous_version_or_says_there_is_none() {
        assert_eq!(rollback_target("resnet", &alias(2, Some(1))).expect("a target"), 1);
        let never = rollback_target("resnet", &alias(1, None)).expect_err("no history").to_string();
        assert!(never.contains("nothing to roll back to") && never.contains("tessera aliases set resnet"), "{never}");
        assert!(rollback_target("resnet", &alias(1, Some(1))).is_err());
    }
}
