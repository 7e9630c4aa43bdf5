//! `tessera whoami`: the tenant, role, key and user the configured key stands for, as the
//! control plane sees them (`GET /v1/whoami`), and where it is.

use anyhow::Context;
use serde_json::Value;

use super::output::{Fields, Output, cell, print_json};
use super::settings::ConnectionArgs;

/// `tessera whoami` flags.
#[derive(Debug, clap::Args)]
pub struct WhoamiArgs {
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// The caller as `label: value` lines.
fn render(url: &str, acting_in: &str, me: &Value) -> String {
    let user = match (me["user"]["email"].as_str(), me["user"]["name"].as_str()) {
        (Some(email), Some(name)) if !name.is_empty() => format!("{name} <{email}>"),
        (Some(email), _) => email.to_string(),
        _ => "- (a service key)".to_string(),
    };
    let mut fields = Fields::new();
    fields.add("control plane", url).add("tenant", cell(&me["tenant"]));
    if me["tenant"].as_str() != Some(acting_in) {
        fields.add("acting in", acting_in);
    }
    fields
        .add("role", cell(&me["role"]))
        .add("key", format!("{} ({})", cell(&me["key_name"]), cell(&me["key_prefix"])))
        .add("key id", cell(&me["key_id"]))
        .add("user", user);
    fields.render()
}

/// Runs `tessera whoami`.
pub async fn run(args: WhoamiArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let me: Value = api.get("/v1/whoami").await.map_err(|e| e.advise("")).context("ask who the key is")?;
    if output.is_json() {
        return print_json(&me);
    }
    print!("{}", render(&settings.url, &settings.tenant, &me));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_caller_reads_as_tenant_role_key_and_user() {
        let me = serde_json::json!({
            "tenant": "demo", "role": "deployer", "key_id": "k1", "key_name": "ci", "key_prefix": "tsk_abc",
            "user": {"id": "u1", "email": "ana@example.com", "name": "Ana"}
        });
        let text = render("http://cp", "demo", &me);
        assert!(text.contains("role:           deployer\n"), "{text}");
        assert!(text.contains("key:            ci (tsk_abc)\n"), "{text}");
        assert!(text.contains("user:           Ana <ana@example.com>\n"), "{text}");
        assert!(!text.contains("acting in"), "{text}");
        let service = serde_json::json!({ "tenant": "platform", "role": "platform-admin", "user": null });
        let text = render("http://cp", "demo", &service);
        assert!(text.contains("acting in:      demo\n") && text.contains("a service key"), "{text}");
    }
}
