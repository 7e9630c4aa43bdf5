//! `tessera keys create|list|limit|revoke`: a tenant's API keys (tenant admins). A new key's
//! secret is printed once, at creation; listings show the public prefix only. A key is named on
//! the command line by its id, its prefix (`tsk_…`) or its name.

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};

use super::api::segment;
use super::confirm::confirm;
use super::output::{Fields, Output, Table, cell, print_json, time};
use super::settings::ConnectionArgs;

/// `tessera keys …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum KeysCommand {
    /// Create a key; its secret is printed once.
    Create(CreateArgs),
    /// The tenant's keys (revoked and expired ones included), without secrets.
    List(ListArgs),
    /// Set a key's own limits at the gateways (by id, prefix or name); 0 removes one.
    Limit(LimitArgs),
    /// Revoke a key (by id, prefix or name): it stops working at once.
    Revoke(RevokeArgs),
}

/// A key's own limits at the gateways, beside its tenant's.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct KeyLimitArgs {
    /// Most inference requests per second with this key (0: only the tenant's limit).
    #[arg(long)]
    pub requests_per_second: Option<u64>,
    /// Most inference requests in flight with this key (0: only the tenant's limit).
    #[arg(long)]
    pub concurrent_requests: Option<u64>,
}

/// `tessera keys limit` flags.
#[derive(Debug, clap::Args)]
pub struct LimitArgs {
    /// The key: its id, prefix (`tsk_…`) or name.
    #[arg(value_name = "KEY")]
    pub which: String,
    /// The limits to set; one not given keeps its value.
    #[command(flatten)]
    pub limits: KeyLimitArgs,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// What a key may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KeyRole {
    /// Inference only, plus its models' metadata and statistics.
    Inference,
    /// Read the tenant's registry.
    Viewer,
    /// Register models, upload versions, move aliases, deploy.
    Deployer,
    /// Everything in the tenant, including keys and the audit trail.
    TenantAdmin,
    /// Everything everywhere (platform tenant only).
    PlatformAdmin,
}

impl KeyRole {
    /// The role's wire name.
    fn as_str(self) -> &'static str {
        match self {
            KeyRole::Inference => "inference",
            KeyRole::Viewer => "viewer",
            KeyRole::Deployer => "deployer",
            KeyRole::TenantAdmin => "tenant-admin",
            KeyRole::PlatformAdmin => "platform-admin",
        }
    }
}

/// `tessera keys create` flags.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Label, 1 to 100 characters (e.g. `ci deployer`).
    #[arg(long)]
    pub name: String,
    /// What the key may do.
    #[arg(long, value_enum)]
    pub role: KeyRole,
    /// The user of this tenant the key belongs to (absent: a service key).
    #[arg(long)]
    pub user_id: Option<String>,
    /// Expiry, RFC 3339 (e.g. `2027-01-01T00:00:00Z`); absent: never expires.
    #[arg(long)]
    pub expires_at: Option<String>,
    /// The key's own limits (absent: only the tenant's).
    #[command(flatten)]
    pub limits: KeyLimitArgs,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera keys list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera keys revoke` flags.
#[derive(Debug, clap::Args)]
pub struct RevokeArgs {
    /// The key: its id, prefix (`tsk_…`) or name.
    #[arg(value_name = "KEY")]
    pub which: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

impl CreateArgs {
    /// The request body; refuses a name the API would refuse, before any call.
    fn body(&self) -> anyhow::Result<Value> {
        let len = self.name.chars().count();
        if !(1..=100).contains(&len) {
            bail!("--name must be 1 to 100 characters (it has {len})");
        }
        let mut body = Map::new();
        body.insert("name".into(), json!(self.name));
        body.insert("role".into(), json!(self.role.as_str()));
        if let Some(user) = &self.user_id {
            body.insert("user_id".into(), json!(user));
        }
        if let Some(at) = &self.expires_at {
            body.insert("expires_at".into(), json!(at));
        }
        if self.limits.requests_per_second.is_some() || self.limits.concurrent_requests.is_some() {
            body.insert("limits".into(), self.limits.over(&Value::Null));
        }
        Ok(Value::Object(body))
    }
}

impl KeyLimitArgs {
    /// The limits object: what was given, the rest from `current` (a key's `limits`), else 0.
    fn over(&self, current: &Value) -> Value {
        let pick = |given: Option<u64>, field: &str| given.unwrap_or_else(|| current[field].as_u64().unwrap_or(0));
        json!({
            "requests_per_second": pick(self.requests_per_second, "requests_per_second"),
            "concurrent_requests": pick(self.concurrent_requests, "concurrent_requests"),
        })
    }
}

/// `50/s, 8 in flight`, one of them, or `-` for a key with none of its own.
fn key_limits(k: &Value) -> String {
    let l = &k["limits"];
    let mut parts = Vec::new();
    if let Some(n) = l["requests_per_second"].as_u64().filter(|n| *n > 0) {
        parts.push(format!("{n}/s"));
    }
    if let Some(n) = l["concurrent_requests"].as_u64().filter(|n| *n > 0) {
        parts.push(format!("{n} in flight"));
    }
    if parts.is_empty() { "-".into() } else { parts.join(", ") }
}

fn keys_path(tenant: &str) -> String {
    format!("/v1/tenants/{}/api-keys", segment(tenant))
}

/// `active`, `revoked` or `expires <time>`.
fn key_state(k: &Value) -> String {
    if !k["revoked_at"].is_null() {
        return "revoked".into();
    }
    match k["expires_at"].as_str() {
        Some(at) => format!("expires {}", time(at)),
        None => "active".into(),
    }
}

/// The key `wanted` names: by id, prefix or name; a name two keys share is refused.
fn pick_key<'a>(keys: &'a [Value], wanted: &str) -> anyhow::Result<&'a Value> {
    let by = |field: &str| -> Vec<&'a Value> { keys.iter().filter(|k| k[field].as_str() == Some(wanted)).collect() };
    for field in ["id", "prefix"] {
        if let [one] = by(field).as_slice() {
            return Ok(one);
        }
    }
    // Several keys may share a name; only the unrevoked ones can be meant.
    let named: Vec<&Value> = by("name").into_iter().filter(|k| k["revoked_at"].is_null()).collect();
    match named.as_slice() {
        [one] => Ok(one),
        [] => bail!("no key {wanted:?} in this tenant (`tessera keys list` shows ids, prefixes and names)"),
        many => {
            let ids: Vec<String> = many.iter().map(|k| cell(&k["id"])).collect();
            bail!("{} keys are named {wanted:?}: name one by id ({})", many.len(), ids.join(", "))
        }
    }
}

/// Runs `tessera keys …`.
pub async fn run(command: KeysCommand, output: Output) -> anyhow::Result<()> {
    match command {
        KeysCommand::Create(args) => {
            let body = args.body()?;
            let (settings, api) = args.connection.connect()?;
            let created: Value = api
                .post(&keys_path(&settings.tenant), &body)
                .await
                .map_err(|e| e.advise(""))
                .with_context(|| format!("create key {:?}", args.name))?;
            if output.is_json() {
                return print_json(&created);
            }
            let k = &created["api_key"];
            println!("{}", cell(&created["key"]));
            eprintln!("this secret is shown once: store it now");
            let mut fields = Fields::new();
            fields.add("id", cell(&k["id"])).add("name", cell(&k["name"])).add("role", cell(&k["role"]));
            fields.add("prefix", cell(&k["prefix"])).add("state", key_state(k)).add("limits", key_limits(k));
            eprint!("{}", fields.render());
        }
        KeysCommand::List(args) => {
            let (settings, api) = args.connection.connect()?;
            let keys = list(&api, &settings.tenant).await?;
            if output.is_json() {
                return print_json(&Value::Array(keys));
            }
            let mut table = Table::new(["ID", "PREFIX", "NAME", "ROLE", "STATE", "LIMITS", "LAST USED", "CREATED"]);
            for k in &keys {
                table.row([
                    cell(&k["id"]),
                    cell(&k["prefix"]),
                    cell(&k["name"]),
                    cell(&k["role"]),
                    key_state(k),
                    key_limits(k),
                    time(&cell(&k["last_used_at"])),
                    time(&cell(&k["created_at"])),
                ]);
            }
            table.print_or(&format!("no keys in tenant {}", settings.tenant));
        }
        KeysCommand::Limit(args) => {
            if args.limits.requests_per_second.is_none() && args.limits.concurrent_requests.is_none() {
                bail!("give --requests-per-second, --concurrent-requests or both (0 removes a limit)");
            }
            let (settings, api) = args.connection.connect()?;
            let keys = list(&api, &settings.tenant).await?;
            let key = pick_key(&keys, &args.which)?;
            let (id, name) = (cell(&key["id"]), cell(&key["name"]));
            let body = json!({ "limits": args.limits.over(&key["limits"]) });
            let path = format!("{}/{}", keys_path(&settings.tenant), segment(&id));
            let changed: Value = api
                .call(reqwest::Method::PATCH, &path, &body)
                .await
                .map_err(|e| e.advise(""))
                .with_context(|| format!("limit key {id}"))?;
            if output.is_json() {
                return print_json(&changed);
            }
            println!("key {name:?} ({id}): {}", key_limits(&changed));
        }
        KeysCommand::Revoke(args) => {
            let (settings, api) = args.connection.connect()?;
            let keys = list(&api, &settings.tenant).await?;
            let key = pick_key(&keys, &args.which)?;
            let (id, name) = (cell(&key["id"]), cell(&key["name"]));
            confirm(
                &format!("revoke key {name:?} ({}) in tenant {}?", cell(&key["prefix"]), settings.tenant),
                args.yes,
            )?;
            let path = format!("{}/{}", keys_path(&settings.tenant), segment(&id));
            let revoked =
                api.delete(&path).await.map_err(|e| e.advise("")).with_context(|| format!("revoke key {id}"))?;
            if output.is_json() {
                return print_json(&revoked);
            }
            println!("revoked key {name:?} ({id})");
        }
    }
    Ok(())
}

async fn list(api: &super::api::ApiClient, tenant: &str) -> anyhow::Result<Vec<Value>> {
    api.get_all(&keys_path(tenant), &[], "api_keys").await.map_err(|e| e.advise("")).context("list API keys")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys() -> Vec<Value> {
        vec![
            json!({"id": "1", "prefix": "tsk_aaa", "name": "ci", "revoked_at": null}),
            json!({"id": "2", "prefix": "tsk_bbb", "name": "ci", "revoked_at": "2026-01-01T00:00:00Z"}),
            json!({"id": "3", "prefix": "tsk_ccc", "name": "ops", "revoked_at": null}),
            json!({"id": "4", "prefix": "tsk_ddd", "name": "ops", "revoked_at": null}),
        ]
    }

    #[test]
    fn keys_are_named_by_id_prefix_or_unrevoked_name() {
        let keys = keys();
        assert_eq!(pick_key(&keys, "2").expect("by id")["id"], "2");
        assert_eq!(pick_key(&keys, "tsk_ccc").expect("by prefix")["id"], "3");
        assert_eq!(pick_key(&keys, "ci").expect("the unrevoked ci")["id"], "1");
        let shared = pick_key(&keys, "ops").expect_err("two keys named ops").to_string();
        assert!(shared.contains("name one by id (3, 4)"), "{shared}");
        let none = pick_key(&keys, "nope").expect_err("no such key").to_string();
        assert!(none.contains("tessera keys list"), "{none}");
    }

    #[test]
    fn create_bodies_carry_the_wire_role_and_only_what_was_given() {
        let args = |name: &str| CreateArgs {
            name: name.into(),
            role: KeyRole::TenantAdmin,
            user_id: None,
            expires_at: Some("2027-01-01T00:00:00Z".into()),
            limits: KeyLimitArgs::default(),
            connection: ConnectionArgs::default(),
        };
        assert_eq!(
            args("ops").body().expect("a body"),
            json!({"name": "ops", "role": "tenant-admin", "expires_at": "2027-01-01T00:00:00Z"})
        );
        assert!(args("").body().is_err());
        let limited = CreateArgs {
            limits: KeyLimitArgs { requests_per_second: Some(50), concurrent_requests: None },
            ..args("ci")
        };
        assert_eq!(
            limited.body().expect("a body")["limits"],
            json!({"requests_per_second": 50, "concurrent_requests": 0})
        );
        assert!(args(&"x".repeat(101)).body().is_err());
    }

    #[test]
    fn limits_keep_what_was_not_given_and_read_briefly() {
        let current = json!({"requests_per_second": 50, "concurrent_requests": 8});
        let only_rate = KeyLimitArgs { requests_per_second: Some(0), concurrent_requests: None };
        assert_eq!(only_rate.over(&current), json!({"requests_per_second": 0, "concurrent_requests": 8}));
        assert_eq!(key_limits(&json!({"limits": current})), "50/s, 8 in flight");
        assert_eq!(key_limits(&json!({"limits": {"requests_per_second": 0, "concurrent_requests": 2}})), "2 in flight");
        assert_eq!(key_limits(&json!({"limits": {"requests_per_second": 0, "concurrent_requests": 0}})), "-");
    }

    #[test]
    fn states_read_revoked_expiring_or_active() {
        assert_eq!(key_state(&json!({"revoked_at": "t", "expires_at": null})), "revoked");
        assert_eq!(
            key_state(&json!({"revoked_at": null, "expires_at": "2027-01-01T00:00:00Z"})),
            "expires 2027-01-01T00:00:00Z"
        );
        assert_eq!(key_state(&json!({"revoked_at": null, "expires_at": null})), "active");
    }
}
