//! `tessera versions list|get`: a model's versions, newest first, and one version with its
//! signature (inputs, outputs, datatypes, shapes, max batch size, platform) when the registry
//! has it.

use anyhow::Context;
use serde_json::Value;

use super::api::segment;
use super::output::{Fields, Output, Table, bytes, cell, print_json, time};
use super::settings::ConnectionArgs;

/// `tessera versions …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum VersionsCommand {
    /// A model's versions, newest first.
    List(ListArgs),
    /// One version: hash, size, format, status and signature.
    Get(GetArgs),
}

/// `tessera versions list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Model name.
    pub model: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera versions get` flags.
#[derive(Debug, clap::Args)]
pub struct GetArgs {
    /// Model name.
    pub model: String,
    /// Version number.
    pub version: i64,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

fn versions_path(tenant: &str, model: &str) -> String {
    format!("/v1/tenants/{}/models/{}/versions", segment(tenant), segment(model))
}

/// Runs `tessera versions …`.
pub async fn run(command: VersionsCommand, output: Output) -> anyhow::Result<()> {
    match command {
        VersionsCommand::List(args) => {
            let (settings, api) = args.connection.connect()?;
            let path = versions_path(&settings.tenant, &args.model);
            let versions = api
                .get_all(&path, &[], "versions")
                .await
                .map_err(|e| e.advise("`tessera models list` shows your models"))
                .with_context(|| format!("list the versions of {}", args.model))?;
            if output.is_json() {
                return print_json(&Value::Array(versions));
            }
            let mut table = Table::new(["VERSION", "STATUS", "FORMAT", "SIZE", "SHA256", "CREATED"]);
            for v in &versions {
                let sha: String = cell(&v["sha256"]).chars().take(12).collect();
                let size = v["size_bytes"].as_i64().map(bytes).unwrap_or_default();
                table.row([
                    cell(&v["version"]),
                    cell(&v["status"]),
                    cell(&v["format"]),
                    size,
                    sha,
                    time(&cell(&v["created_at"])),
                ]);
            }
            let empty = format!(
                "model {} has no versions (upload one with `tessera models push FILE --model {}`)",
                args.model, args.model
            );
            table.print_or(&empty);
        }
        VersionsCommand::Get(args) => {
            let (settings, api) = args.connection.connect()?;
            let path = format!("{}/{}", versions_path(&settings.tenant, &args.model), args.version);
            let hint = format!("`tessera versions list {}` shows its versions", args.model);
            let v: Value = api
                .get(&path)
                .await
                .map_err(|e| e.advise(&hint))
                .with_context(|| format!("read version {} of {}", args.version, args.model))?;
            if output.is_json() {
                return print_json(&v);
            }
            print!("{}", render_version(&v));
        }
    }
    Ok(())
}

/// A version as `label: value` lines, then its signature's tensors as a table.
fn render_version(v: &Value) -> String {
    let mut fields = Fields::new();
    fields
        .add("model", cell(&v["model"]))
        .add("version", cell(&v["version"]))
        .add("status", cell(&v["status"]))
        .add("format", cell(&v["format"]))
        .add("size", v["size_bytes"].as_i64().map(bytes).unwrap_or_default())
        .add("sha256", cell(&v["sha256"]))
        .add("created", time(&cell(&v["created_at"])));
    let signature = &v["signature"];
    if signature.is_object() {
        fields.add("platform", cell(&signature["platform"])).add("max batch size", cell(&signature["max_batch_size"]));
    }
    let mut out = fields.render();
    if signature.is_object() {
        out.push('\n');
        out.push_str(&signature_table(signature).render());
    }
    out
}

/// The signature's inputs and outputs: `TENSOR NAME DATATYPE SHAPE`.
fn signature_table(signature: &Value) -> Table {
    let mut table = Table::new(["TENSOR", "NAME", "DATATYPE", "SHAPE"]);
    for (kind, key) in [("input", "inputs"), ("output", "outputs")] {
        for t in signature[key].as_array().into_iter().flatten() {
            let shape = t["shape"].as_array().map(|dims| {
                let dims: Vec<String> = dims.iter().map(cell).collect();
                format!("[{}]", dims.join(", "))
            });
            table.row([kind.to_string(), cell(&t["name"]), cell(&t["datatype"]), shape.unwrap_or_default()]);
        }
    }
    table
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_version_shows_its_signature_when_it_has_one() {
        let v = serde_json::json!({
            "model": "resnet", "version": 2, "status": "ready", "format": "onnx", "size_bytes": 2048,
            "sha256": "ab", "created_at": "2026-12-02T06:43:14.5Z",
            "signature": {
                "platform": "onnxruntime_onnx", "max_batch_size": 8,
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]}]
            }
        });
        let text = render_version(&v);
        assert!(text.contains("size:            2.0 KiB\n"), "{text}");
        assert!(text.contains("max batch size:  8\n"), "{text}");
        assert!(text.contains("input   INPUT0   FP32      [-1, 4]\n"), "{text}");
        assert!(text.contains("output  OUTPUT0  FP32      [-1, 4]\n"), "{text}");
    }

    #[test]
    fn a_version_without_a_signature_shows_no_tensor_table() {
        let v = serde_json::json!({ "model": "m", "version": 1, "status": "uploaded" });
        let text = render_version(&v);
        assert!(text.starts_with("model:    m\n"), "{text}");
        assert!(!text.contains("TENSOR"), "{text}");
    }
}
