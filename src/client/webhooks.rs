//! `tessera webhooks list|create|get|update|delete|deliveries|replay|ping|rotate-secret`: a
//! tenant's webhooks (tenant admins write, viewers read) and their deliveries. A hook's signing
//! secret is printed once, at `create` and `rotate-secret`, alone on stdout so a script can
//! capture it. A hook is named on the command line by its id or a prefix of it that only it has.

use anyhow::{Context, bail};
use serde_json::{Map, Value, json};
use tessera_control_plane::kinds::{WebhookDeliveryStatus, WebhookEventType};

use super::api::{ApiClient, segment};
use super::confirm::confirm;
use super::output::{Fields, Output, Table, cell, print_json, time};
use super::settings::ConnectionArgs;

/// What a 404 on a hook suggests.
const HOOKS_HINT: &str = "`tessera webhooks list` shows your webhooks";
/// What a 404 on a delivery suggests.
const DELIVERIES_HINT: &str = "`tessera webhooks deliveries HOOK` shows its deliveries";
/// Longest description the API takes, in characters.
const MAX_DESCRIPTION: usize = 200;

/// `tessera webhooks …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum WebhooksCommand {
    /// The tenant's webhooks, oldest first, without secrets.
    List(ListArgs),
    /// Register a webhook; its signing secret is printed once.
    Create(CreateArgs),
    /// One webhook.
    Get(HookArgs),
    /// Change a webhook's URL, events, description, or enable or disable it.
    Update(UpdateArgs),
    /// Delete a webhook with its deliveries.
    Delete(DeleteArgs),
    /// A webhook's deliveries, newest first, or with DELIVERY one of them with its body.
    Deliveries(DeliveriesArgs),
    /// Send a delivery's event again, as a new delivery with the same body.
    Replay(ReplayArgs),
    /// Queue a `ping` event to a webhook, to test its receiver.
    Ping(HookArgs),
    /// Replace a webhook's signing secret; the new one is printed once.
    RotateSecret(RotateArgs),
}

/// `tessera webhooks list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Flags of verbs on one webhook.
#[derive(Debug, clap::Args)]
pub struct HookArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// An event type as a flag value: one of the API's, checked before any call.
fn event_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(WebhookEventType::ALL.iter().map(|e| e.as_str()))
}

/// A delivery status as a flag value.
fn status_parser() -> clap::builder::PossibleValuesParser {
    clap::builder::PossibleValuesParser::new(WebhookDeliveryStatus::ALL.iter().map(|s| s.as_str()))
}

/// `tessera webhooks create` flags.
#[derive(Debug, clap::Args)]
pub struct CreateArgs {
    /// Where deliveries are POSTed: an https URL of a public address (http and private
    /// addresses only where a platform admin allowed them for the tenant). Not `--url`, which
    /// names the control plane.
    #[arg(long, value_name = "URL")]
    pub hook_url: String,
    /// Event types to receive; repeat the flag or separate them with commas (`ping` is always
    /// received).
    #[arg(long = "event", value_name = "TYPE", required = true, value_delimiter = ',', value_parser = event_parser())]
    pub events: Vec<String>,
    /// Free text, at most 200 characters.
    #[arg(long)]
    pub description: Option<String>,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera webhooks update` flags; what is not given stays.
#[derive(Debug, clap::Args)]
pub struct UpdateArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// New URL deliveries go to (checked as at creation).
    #[arg(long, value_name = "URL")]
    pub hook_url: Option<String>,
    /// New event types, replacing the old; repeat the flag or separate them with commas.
    #[arg(long = "event", value_name = "TYPE", value_delimiter = ',', value_parser = event_parser())]
    pub events: Vec<String>,
    /// New description (empty clears it).
    #[arg(long)]
    pub description: Option<String>,
    /// Enable the hook: new events are delivered again.
    #[arg(long, conflicts_with = "disable")]
    pub enable: bool,
    /// Disable the hook: no new deliveries; pending ones wait.
    #[arg(long)]
    pub disable: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera webhooks delete` flags.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera webhooks rotate-secret` flags.
#[derive(Debug, clap::Args)]
pub struct RotateArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// Do not ask for confirmation (the receiver must learn the new secret).
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera webhooks deliveries` flags.
#[derive(Debug, clap::Args)]
pub struct DeliveriesArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// One delivery's id: show it, with the body sent.
    #[arg(value_name = "DELIVERY")]
    pub delivery: Option<String>,
    /// Only deliveries in this state.
    #[arg(long, value_parser = status_parser(), conflicts_with = "delivery")]
    pub status: Option<String>,
    /// Most deliveries to show, newest first.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub limit: u32,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera webhooks replay` flags.
#[derive(Debug, clap::Args)]
pub struct ReplayArgs {
    /// The webhook: its id, or a prefix of it no other hook has.
    #[arg(value_name = "HOOK")]
    pub hook: String,
    /// The delivery to send again.
    #[arg(value_name = "DELIVERY")]
    pub delivery: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Refuses a description the API would refuse, before any call.
fn check_description(description: &str) -> anyhow::Result<()> {
    let len = description.chars().count();
    if len > MAX_DESCRIPTION {
        bail!("--description must be at most {MAX_DESCRIPTION} characters (it has {len})");
    }
    Ok(())
}

impl CreateArgs {
    /// The request body.
    fn body(&self) -> anyhow::Result<Value> {
        let mut body = Map::new();
        body.insert("url".into(), json!(self.hook_url));
        body.insert("events".into(), json!(self.events));
        if let Some(d) = &self.description {
            check_description(d)?;
            body.insert("description".into(), json!(d));
        }
        Ok(Value::Object(body))
    }
}

impl UpdateArgs {
    /// The PATCH body: only what was given; refuses an update that changes nothing.
    fn body(&self) -> anyhow::Result<Value> {
        let mut body = Map::new();
        if let Some(url) = &self.hook_url {
            body.insert("url".into(), json!(url));
        }
        if !self.events.is_empty() {
            body.insert("events".into(), json!(self.events));
        }
        if let Some(d) = &self.description {
            check_description(d)?;
            body.insert("description".into(), json!(d));
        }
        if self.enable || self.disable {
            body.insert("enabled".into(), json!(self.enable));
        }
        if body.is_empty() {
            bail!("nothing to change: give --hook-url, --event, --description, --enable or --disable");
        }
        Ok(Value::Object(body))
    }
}

fn hooks_path(tenant: &str) -> String {
    format!("/v1/tenants/{}/webhooks", segment(tenant))
}

fn hook_path(tenant: &str, id: &str) -> String {
    format!("{}/{}", hooks_path(tenant), segment(id))
}

/// The hook `wanted` names among `hooks`: the one with that id, else the only one whose id
/// starts with it.
fn pick_hook<'a>(hooks: &'a [Value], wanted: &str) -> anyhow::Result<&'a Value> {
    let wanted = wanted.trim().to_ascii_lowercase();
    if wanted.is_empty() {
        bail!("name a webhook by its id (`tessera webhooks list` shows them)");
    }
    let id = |h: &&Value| h["id"].as_str().unwrap_or_default().to_ascii_lowercase();
    if let Some(exact) = hooks.iter().find(|h| id(h) == wanted) {
        return Ok(exact);
    }
    let matching: Vec<&Value> = hooks.iter().filter(|h| id(h).starts_with(&wanted)).collect();
    match matching.as_slice() {
        [one] => Ok(one),
        [] => bail!("no webhook {wanted:?} in this tenant ({HOOKS_HINT})"),
        many => {
            let ids: Vec<String> = many.iter().map(|h| cell(&h["id"])).collect();
            bail!("{} webhooks have ids starting with {wanted:?}: give more of it ({})", many.len(), ids.join(", "))
        }
    }
}

/// Every webhook of the tenant.
async fn list(api: &ApiClient, tenant: &str) -> anyhow::Result<Vec<Value>> {
    api.get_all(&hooks_path(tenant), &[], "webhooks").await.map_err(|e| e.advise("")).context("list webhooks")
}

/// Whether `s` is a whole UUID in its hyphenated form (then no lookup is needed).
fn is_uuid(s: &str) -> bool {
    s.len() == 36
        && s.bytes()
            .enumerate()
            .all(|(i, b)| if [8, 13, 18, 23].contains(&i) { b == b'-' } else { b.is_ascii_hexdigit() })
}

/// The id of the hook `wanted` names: as given when it is a whole UUID, else looked up.
async fn resolve(api: &ApiClient, tenant: &str, wanted: &str) -> anyhow::Result<String> {
    let wanted = wanted.trim();
    if is_uuid(wanted) {
        return Ok(wanted.to_ascii_lowercase());
    }
    let hooks = list(api, tenant).await?;
    Ok(cell(&pick_hook(&hooks, wanted)?["id"]))
}

/// Event types as one cell: `a, b`.
fn events_cell(hook: &Value) -> String {
    let events: Vec<String> = hook["events"].as_array().map(|a| a.iter().map(cell).collect()).unwrap_or_default();
    events.join(", ")
}

fn state_cell(hook: &Value) -> &'static str {
    if hook["enabled"].as_bool() == Some(false) { "disabled" } else { "enabled" }
}

/// A webhook as `label: value` lines.
fn hook_fields(hook: &Value) -> Fields {
    let mut f = Fields::new();
    f.add("id", cell(&hook["id"])).add("url", cell(&hook["url"])).add("events", events_cell(hook));
    f.add("state", state_cell(hook)).add("description", cell(&hook["description"]));
    f.add("created", time(&cell(&hook["created_at"]))).add("updated", time(&cell(&hook["updated_at"])));
    f
}

/// A delivery as `label: value` lines, its body last.
fn delivery_fields(d: &Value) -> Fields {
    let mut f = Fields::new();
    f.add("id", cell(&d["id"])).add("event", cell(&d["event_type"])).add("event id", cell(&d["event_id"]));
    f.add("status", cell(&d["status"])).add("attempts", cell(&d["attempts"]));
    f.add("last http status", cell(&d["last_http_status"])).add("last error", cell(&d["last_error"]));
    f.add("next attempt", time(&cell(&d["next_attempt_at"]))).add("replay of", cell(&d["replay_of"]));
    f.add("created", time(&cell(&d["created_at"]))).add("delivered", time(&cell(&d["delivered_at"])));
    f.add("payload", cell(&d["payload"]));
    f
}

/// Prints an answer holding a new secret: the secret alone on stdout, the hook on stderr.
fn print_secret(answer: &Value, output: Output) -> anyhow::Result<()> {
    if output.is_json() {
        return print_json(answer);
    }
    println!("{}", cell(&answer["secret"]));
    eprintln!("this signing secret is shown once: store it now");
    eprint!("{}", hook_fields(&answer["webhook"]).render());
    Ok(())
}

/// Up to `limit` deliveries, newest first, following pages.
async fn deliveries(
    api: &ApiClient,
    path: &str,
    status: Option<&str>,
    limit: u32,
) -> Result<Vec<Value>, super::api::ApiError> {
    let mut items: Vec<Value> = Vec::new();
    let mut cursor: Option<String> = None;
    while items.len() < limit as usize {
        let page_size = (limit as usize - items.len()).min(200);
        let mut query = vec![("limit", page_size.to_string())];
        query.extend(status.map(|s| ("status", s.to_string())));
        query.extend(cursor.take().map(|c| ("cursor", c)));
        let mut page: Value = api.get_query(path, &query).await?;
        if let Value::Array(got) = page["deliveries"].take() {
            items.extend(got);
        }
        match page["next_cursor"].as_str() {
            Some(next) if !next.is_empty() => cursor = Some(next.to_string()),
            _ => break,
        }
    }
    items.truncate(limit as usize);
    Ok(items)
}

/// One delivery per row.
fn delivery_table(items: &[Value]) -> Table {
    let mut table = Table::new(["ID", "EVENT", "STATUS", "ATTEMPTS", "HTTP", "CREATED", "LAST ERROR"]);
    for d in items {
        table.row([
            cell(&d["id"]),
            cell(&d["event_type"]),
            cell(&d["status"]),
            cell(&d["attempts"]),
            cell(&d["last_http_status"]),
            time(&cell(&d["created_at"])),
            cell(&d["last_error"]),
        ]);
    }
    table
}

/// Runs `tessera webhooks …`.
pub async fn run(command: WebhooksCommand, output: Output) -> anyhow::Result<()> {
    match command {
        WebhooksCommand::List(args) => {
            let (settings, api) = args.connection.connect()?;
            let hooks = list(&api, &settings.tenant).await?;
            if output.is_json() {
                return print_json(&Value::Array(hooks));
            }
            let mut table = Table::new(["ID", "URL", "EVENTS", "STATE", "CREATED", "DESCRIPTION"]);
            for h in &hooks {
                table.row([
                    cell(&h["id"]),
                    cell(&h["url"]),
                    events_cell(h),
                    state_cell(h).to_string(),
                    time(&cell(&h["created_at"])),
                    cell(&h["description"]),
                ]);
            }
            let empty = format!(
                "no webhooks in tenant {} (register one with `tessera webhooks create --hook-url URL --event TYPE`)",
                settings.tenant
            );
            table.print_or(&empty);
        }
        WebhooksCommand::Create(args) => {
            let body = args.body()?;
            let (settings, api) = args.connection.connect()?;
            let created: Value = api
                .post(&hooks_path(&settings.tenant), &body)
                .await
                .map_err(|e| e.advise(""))
                .with_context(|| format!("create a webhook to {}", args.hook_url))?;
            print_secret(&created, output)?;
        }
        WebhooksCommand::Get(args) => {
            let (settings, api) = args.connection.connect()?;
            let id = resolve(&api, &settings.tenant, &args.hook).await?;
            let hook: Value = api
                .get(&hook_path(&settings.tenant, &id))
                .await
                .map_err(|e| e.advise(HOOKS_HINT))
                .with_context(|| format!("get webhook {id}"))?;
            if output.is_json() {
                return print_json(&hook);
            }
            hook_fields(&hook).print();
        }
        WebhooksCommand::Update(args) => {
            let body = args.body()?;
            let (settings, api) = args.connection.connect()?;
            let id = resolve(&api, &settings.tenant, &args.hook).await?;
            let hook: Value = api
                .call(reqwest::Method::PATCH, &hook_path(&settings.tenant, &id), &body)
                .await
                .map_err(|e| e.advise(HOOKS_HINT))
                .with_context(|| format!("update webhook {id}"))?;
            if output.is_json() {
                return print_json(&hook);
            }
            println!("updated webhook {id}");
            hook_fields(&hook).print();
        }
        WebhooksCommand::Delete(args) => {
            let (settings, api) = args.connection.connect()?;
            let hooks = list(&api, &settings.tenant).await?;
            let hook = pick_hook(&hooks, &args.hook)?;
            let (id, url) = (cell(&hook["id"]), cell(&hook["url"]));
            confirm(
                &format!("delete webhook {id} ({url}) and its deliveries in tenant {}?", settings.tenant),
                args.yes,
            )?;
            let answer = api
                .delete(&hook_path(&settings.tenant, &id))
                .await
                .map_err(|e| e.advise(HOOKS_HINT))
                .with_context(|| format!("delete webhook {id}"))?;
            if output.is_json() {
                return print_json(&answer);
            }
            println!("deleted webhook {id} ({url})");
        }
        WebhooksCommand::Deliveries(args) => run_deliveries(args, output).await?,
        WebhooksCommand::Replay(args) => {
            let (settings, api) = args.connection.connect()?;
            let id = resolve(&api, &settings.tenant, &args.hook).await?;
            let path = format!("{}/deliveries/{}/replay", hook_path(&settings.tenant, &id), segment(&args.delivery));
            let queued: Value = api
                .post(&path, &json!({}))
                .await
                .map_err(|e| e.advise(DELIVERIES_HINT))
                .with_context(|| format!("replay delivery {} of webhook {id}", args.delivery))?;
            if output.is_json() {
                return print_json(&queued);
            }
            println!("queued delivery {} (a replay of {})", cell(&queued["id"]), args.delivery);
        }
        WebhooksCommand::Ping(args) => {
            let (settings, api) = args.connection.connect()?;
            let id = resolve(&api, &settings.tenant, &args.hook).await?;
            let queued: Value = api
                .post(&format!("{}/ping", hook_path(&settings.tenant, &id)), &json!({}))
                .await
                .map_err(|e| e.advise(HOOKS_HINT))
                .with_context(|| format!("ping webhook {id}"))?;
            if output.is_json() {
                return print_json(&queued);
            }
            println!(
                "queued ping delivery {} (`tessera webhooks deliveries {id} {}` shows how it went)",
                cell(&queued["id"]),
                cell(&queued["id"])
            );
        }
        WebhooksCommand::RotateSecret(args) => {
            let (settings, api) = args.connection.connect()?;
            let id = resolve(&api, &settings.tenant, &args.hook).await?;
            confirm(
                &format!(
                    "replace the signing secret of webhook {id}? deliveries from now on are signed with the new one"
                ),
                args.yes,
            )?;
            let rotated: Value = api
                .post(&format!("{}/rotate-secret", hook_path(&settings.tenant, &id)), &json!({}))
                .await
                .map_err(|e| e.advise(HOOKS_HINT))
                .with_context(|| format!("rotate the secret of webhook {id}"))?;
            print_secret(&rotated, output)?;
        }
    }
    Ok(())
}

/// Lists a hook's deliveries, or shows one.
async fn run_deliveries(args: DeliveriesArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let id = resolve(&api, &settings.tenant, &args.hook).await?;
    let path = format!("{}/deliveries", hook_path(&settings.tenant, &id));
    if let Some(delivery) = &args.delivery {
        let d: Value = api
            .get(&format!("{path}/{}", segment(delivery)))
            .await
            .map_err(|e| e.advise(DELIVERIES_HINT))
            .with_context(|| format!("get delivery {delivery} of webhook {id}"))?;
        if output.is_json() {
            return print_json(&d);
        }
        delivery_fields(&d).print();
        return Ok(());
    }
    let items = deliveries(&api, &path, args.status.as_deref(), args.limit)
        .await
        .map_err(|e| e.advise(HOOKS_HINT))
        .with_context(|| format!("list the deliveries of webhook {id}"))?;
    if output.is_json() {
        return print_json(&Value::Array(items));
    }
    let which = args.status.as_deref().map(|s| format!("{s} ")).unwrap_or_default();
    delivery_table(&items).print_or(&format!("no {which}deliveries to webhook {id}"));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hooks() -> Vec<Value> {
        vec![
            json!({"id": "0190aaaa-0000-7000-8000-000000000001", "url": "https://a"}),
            json!({"id": "0190aaaa-0000-7000-8000-000000000002", "url": "https://b"}),
            json!({"id": "0190bbbb-0000-7000-8000-000000000003", "url": "https://c"}),
        ]
    }

    #[test]
    fn hooks_are_named_by_id_or_a_prefix_only_they_have() {
        let hooks = hooks();
        let by_id = pick_hook(&hooks, "0190aaaa-0000-7000-8000-000000000002").expect("by id");
        assert_eq!(by_id["url"], "https://b");
        assert_eq!(pick_hook(&hooks, "0190BBBB").expect("by prefix, any case")["url"], "https://c");
        let shared = pick_hook(&hooks, "0190aaaa").expect_err("two hooks share it").to_string();
        assert!(shared.contains("2 webhooks") && shared.contains("give more of it"), "{shared}");
        let none = pick_hook(&hooks, "ffff").expect_err("no such hook").to_string();
        assert!(none.contains("tessera webhooks list"), "{none}");
        assert!(pick_hook(&hooks, " ").is_err(), "an empty name names nothing");
        assert!(is_uuid("0190aaaa-0000-7000-8000-00000000000A"));
        assert!(!is_uuid("0190aaaa") && !is_uuid("0190aaaa-0000-7000-8000-00000000000g"));
    }

    #[test]
    fn create_bodies_carry_what_was_given() {
        let args = |description: Option<String>| CreateArgs {
            hook_url: "https://hooks.example.com/t".into(),
            events: vec!["alias.moved".into(), "deployment.ready".into()],
            description,
            connection: ConnectionArgs::default(),
        };
        assert_eq!(
            args(None).body().expect("a body"),
            json!({"url": "https://hooks.example.com/t", "events": ["alias.moved", "deployment.ready"]})
        );
        assert_eq!(args(Some("ci".into())).body().expect("a body")["description"], "ci");
        assert!(args(Some("x".repeat(201))).body().is_err(), "too long a description");
    }

    #[test]
    fn update_bodies_carry_only_the_changes_and_refuse_none() {
        let mut args = UpdateArgs {
            hook: "h".into(),
            hook_url: None,
            events: Vec::new(),
            description: None,
            enable: false,
            disable: false,
            connection: ConnectionArgs::default(),
        };
        assert!(args.body().expect_err("nothing to change").to_string().contains("--enable"));
        args.disable = true;
        assert_eq!(args.body().expect("a body"), json!({"enabled": false}));
        args.disable = false;
        args.enable = true;
        args.events = vec!["ping".into()];
        args.description = Some(String::new());
        assert_eq!(args.body().expect("a body"), json!({"enabled": true, "events": ["ping"], "description": ""}));
    }

    #[test]
    fn cells_read_easily() {
        let hook = json!({"events": ["alias.moved", "ping"], "enabled": false});
        assert_eq!(events_cell(&hook), "alias.moved, ping");
        assert_eq!(state_cell(&hook), "disabled");
        assert_eq!(state_cell(&json!({"enabled": true})), "enabled");
        let table = delivery_table(&[json!({
            "id": "d1", "event_type": "ping", "status": "failed", "attempts": 3,
            "last_http_status": 500, "created_at": "2026-12-02T06:43:14.5Z", "last_error": null
        })]);
        assert_eq!(table.render().lines().nth(1), Some("d1  ping   failed  3         500   2026-12-02T06:43:14Z  -"));
    }
}
