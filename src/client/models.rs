//! `tessera models list|get|delete|push`. `push` registers the model if it is new, hashes the
//! file (sha256, with a progress bar), streams it to the control plane with the hash so the
//! server verifies it, prints the new version, and with `--alias` points the alias at it.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::aliases::{self, WaitArgs};
use super::api::{ApiClient, segment};
use super::confirm::confirm;
use super::output::{Fields, Output, Table, cell, print_json, time};
use super::progress;
use super::settings::ConnectionArgs;

/// `tessera models …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// The tenant's models.
    List(ListArgs),
    /// One model with its aliases.
    Get(NameArgs),
    /// Delete a model with its versions and aliases (refused while a deployment runs it).
    Delete(DeleteArgs),
    /// Upload a file as the model's next version (creating the model if needed); `--alias`
    /// points an alias at it.
    Push(PushArgs),
}

/// `tessera models list` flags.
#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Flags of verbs on one model.
#[derive(Debug, clap::Args)]
pub struct NameArgs {
    /// Model name.
    pub name: String,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// `tessera models delete` flags.
#[derive(Debug, clap::Args)]
pub struct DeleteArgs {
    /// Model name.
    pub name: String,
    /// Do not ask for confirmation.
    #[arg(long, short = 'y')]
    pub yes: bool,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

/// Artifact packaging.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One ONNX file.
    Onnx,
    /// A tar (or tar.gz) archive of a Triton model directory.
    Tar,
    /// A zip archive of a Triton model directory.
    Zip,
}

impl Format {
    fn as_str(self) -> &'static str {
        match self {
            Format::Onnx => "onnx",
            Format::Tar => "tar",
            Format::Zip => "zip",
        }
    }

    /// The format a file name suggests (`.onnx`, `.tar`, `.tar.gz`, `.tgz`, `.zip`).
    fn from_name(path: &Path) -> Option<Self> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        if name.ends_with(".onnx") {
            Some(Format::Onnx)
        } else if name.ends_with(".tar") || name.ends_with(".tar.gz") || name.ends_with(".tgz") {
            Some(Format::Tar)
        } else if name.ends_with(".zip") {
            Some(Format::Zip)
        } else {
            None
        }
    }
}

/// `tessera models push` flags.
#[derive(Debug, clap::Args)]
pub struct PushArgs {
    /// The artifact: an `.onnx` file or a Triton model directory archive.
    pub file: PathBuf,
    /// Model name (created if it does not exist).
    #[arg(long)]
    pub model: String,
    /// Packaging (default: from the file name, else `onnx`).
    #[arg(long, value_enum)]
    pub format: Option<Format>,
    /// Model configuration as a JSON object (Triton's config in JSON form), for `.onnx` files.
    #[arg(long)]
    pub config: Option<String>,
    /// Point this alias (e.g. `production`) at the new version, creating or moving it; a
    /// deployment following it rolls out.
    #[arg(long)]
    pub alias: Option<String>,
    /// With `--alias`: wait until the deployments following it serve the new version.
    #[command(flatten)]
    pub wait: WaitArgs,
    /// Control plane connection.
    #[command(flatten)]
    pub connection: ConnectionArgs,
}

#[derive(Debug, Deserialize)]
struct Model {
    latest_version: i64,
}

/// A stored version, as `POST …/versions` answers.
#[derive(Debug, Deserialize)]
pub struct Version {
    /// Version number.
    pub version: i64,
    /// Hex sha256.
    pub sha256: String,
    /// Bytes.
    pub size_bytes: i64,
    /// The whole answer, for `--output json`.
    #[serde(skip)]
    pub raw: Value,
}

/// Runs `tessera models …`.
pub async fn run(command: ModelsCommand, output: Output) -> anyhow::Result<()> {
    match command {
        ModelsCommand::List(args) => run_list(args, output).await,
        ModelsCommand::Get(args) => run_get(args, output).await,
        ModelsCommand::Delete(args) => {
            let (settings, api) = args.connection.connect()?;
            confirm(
                &format!("delete model {} with all its versions in tenant {}?", args.name, settings.tenant),
                args.yes,
            )?;
            api.delete(&model_path(&settings.tenant, &args.name))
                .await
                .map_err(|e| e.advise(MODELS_HINT))
                .with_context(|| format!("delete model {}", args.name))?;
            println!("deleted model {}", args.name);
            Ok(())
        }
        ModelsCommand::Push(args) => run_push(args, output).await,
    }
}

/// Where to look when a model is not found.
const MODELS_HINT: &str = "`tessera models list` shows your models";

fn model_path(tenant: &str, model: &str) -> String {
    format!("/v1/tenants/{}/models/{}", segment(tenant), segment(model))
}

async fn run_list(args: ListArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let path = format!("/v1/tenants/{}/models", segment(&settings.tenant));
    let models = api.get_all(&path, &[], "models").await.map_err(|e| e.advise("")).context("list models")?;
    if output.is_json() {
        return print_json(&Value::Array(models));
    }
    let mut table = Table::new(["NAME", "LATEST", "UPDATED", "DESCRIPTION"]);
    for m in &models {
        table.row([
            cell(&m["name"]),
            cell(&m["latest_version"]),
            time(&cell(&m["updated_at"])),
            cell(&m["description"]),
        ]);
    }
    let empty =
        format!("no models in tenant {} (upload one with `tessera models push FILE --model NAME`)", settings.tenant);
    table.print_or(&empty);
    Ok(())
}

async fn run_get(args: NameArgs, output: Output) -> anyhow::Result<()> {
    let (settings, api) = args.connection.connect()?;
    let path = model_path(&settings.tenant, &args.name);
    let mut model: Value =
        api.get(&path).await.map_err(|e| e.advise(MODELS_HINT)).with_context(|| format!("read model {}", args.name))?;
    let aliases: Value = api
        .get(&format!("{path}/aliases"))
        .await
        .map_err(|e| e.advise(""))
        .with_context(|| format!("list the aliases of {}", args.name))?;
    let aliases = aliases.get("aliases").cloned().unwrap_or(Value::Array(Vec::new()));
    if output.is_json() {
        if let Value::Object(m) = &mut model {
            m.insert("aliases".into(), aliases);
        }
        return print_json(&model);
    }
    let pointers: Vec<String> = aliases
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| format!("{} -> {}", cell(&a["alias"]), cell(&a["version"])))
        .collect();
    let mut fields = Fields::new();
    fields
        .add("name", cell(&model["name"]))
        .add("id", cell(&model["id"]))
        .add("latest version", cell(&model["latest_version"]))
        .add("aliases", pointers.join(", "))
        .add("description", cell(&model["description"]))
        .add("created", time(&cell(&model["created_at"])))
        .add("updated", time(&cell(&model["updated_at"])));
    fields.print();
    Ok(())
}

async fn run_push(args: PushArgs, output: Output) -> anyhow::Result<()> {
    if args.wait.wait && args.alias.is_none() {
        anyhow::bail!("--wait needs --alias (it waits for the deployments following the alias)");
    }
    let (settings, api) = args.connection.connect()?;
    let format = args.format.or_else(|| Format::from_name(&args.file)).unwrap_or(Format::Onnx);
    let artifact = Artifact { file: &args.file, format, config: args.config.as_deref() };
    let v = push(&api, &settings.tenant, &args.model, artifact).await?;
    let line = format!("pushed {} version {} (sha256 {}, {} bytes)", args.model, v.version, v.sha256, v.size_bytes);
    let Some(alias) = &args.alias else {
        if output.is_json() {
            return print_json(&v.raw);
        }
        println!("{line}");
        return Ok(());
    };
    let (before, after, alias_raw) = aliases::set(&api, &settings.tenant, &args.model, alias, v.version).await?;
    if output.is_json() {
        print_json(&serde_json::json!({ "version": v.raw, "alias": alias_raw }))?;
    } else {
        println!("{line}");
        println!("{}", aliases::moved_line(&args.model, before.as_ref(), &after));
    }
    if args.wait.wait {
        let timeout = std::time::Duration::from_secs(args.wait.timeout_secs);
        let lines = aliases::wait_followers(&api, &settings.tenant, &args.model, &after, timeout).await?;
        if !output.is_json() {
            lines.iter().for_each(|l| println!("{l}"));
        }
    }
    Ok(())
}

/// Creates `model` in `tenant` unless it exists; returns its latest version number.
pub async fn ensure_model(api: &ApiClient, tenant: &str, model: &str) -> anyhow::Result<i64> {
    Ok(find_or_create(api, tenant, model).await?.0.latest_version)
}

/// The model, and whether this call created it.
async fn find_or_create(api: &ApiClient, tenant: &str, model: &str) -> anyhow::Result<(Model, bool)> {
    let path = model_path(tenant, model);
    let found = api.get_opt::<Model>(&path).await.map_err(|e| e.advise(""));
    if let Some(m) = found.with_context(|| format!("look up model {model}"))? {
        return Ok((m, false));
    }
    let created: Model = api
        .post(&format!("/v1/tenants/{}/models", segment(tenant)), &serde_json::json!({ "name": model }))
        .await
        .map_err(|e| e.advise(""))
        .with_context(|| format!("create model {model}"))?;
    Ok((created, true))
}

/// A file to upload as a version.
#[derive(Debug, Clone, Copy)]
pub struct Artifact<'a> {
    /// The file.
    pub file: &'a Path,
    /// Its packaging.
    pub format: Format,
    /// Model configuration (JSON object text), sent as `X-Model-Config`.
    pub config: Option<&'a str>,
}

/// Registers the model if needed and uploads the artifact as its next version. A model this
/// push registered is removed again when the upload is refused, so a failed first push leaves
/// no empty model behind.
pub async fn push(api: &ApiClient, tenant: &str, model: &str, artifact: Artifact<'_>) -> anyhow::Result<Version> {
    // Hash first: a file that cannot be read registers nothing.
    let (sha256, size) = hash_file(artifact.file).await?;
    let (_, created) = find_or_create(api, tenant, model).await?;
    let path = format!("/v1/tenants/{}/models/{}/versions", segment(tenant), segment(model));
    let uploaded = upload(api, &path, artifact, &sha256, size).await;
    if uploaded.is_err() && created {
        // Best effort: the upload's error is what the user needs to see, not this one's.
        if let Err(e) = api.delete(&model_path(tenant, model)).await {
            tracing::warn!(error = %e, model, "could not remove the model this failed push registered");
        }
    }
    uploaded
}

/// The hex sha256 and length of a file, read on a blocking thread with a progress bar.
async fn hash_file(file: &Path) -> anyhow::Result<(String, u64)> {
    let path = file.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let mut f = std::fs::File::open(&path).with_context(|| format!("open {}", path.display()))?;
        let size = f.metadata().with_context(|| format!("read {}", path.display()))?.len();
        let bar = progress::bytes("sha256", size);
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf).with_context(|| format!("read {}", path.display()))?;
            if n == 0 {
                break;
            }
            hasher.update(&buf[..n]);
            bar.inc(n as u64);
        }
        bar.finish_and_clear();
        Ok((hex::encode(hasher.finalize()), size))
    })
    .await
    .context("hash the file")?
}

/// Streams the file as the request body, advancing a progress bar as chunks leave.
async fn upload(
    api: &ApiClient,
    path: &str,
    artifact: Artifact<'_>,
    sha256: &str,
    size: u64,
) -> anyhow::Result<Version> {
    let Artifact { file, format, config } = artifact;
    let f = tokio::fs::File::open(file).await.with_context(|| format!("open {}", file.display()))?;
    let bar = progress::bytes("upload", size);
    let counter = bar.clone();
    let stream = tokio_util::io::ReaderStream::with_capacity(f, 1 << 20).inspect(move |chunk| {
        if let Ok(bytes) = chunk {
            counter.inc(bytes.len() as u64);
        }
    });
    let mut request = api
        .request(reqwest::Method::POST, path)
        .query(&[("format", format.as_str()), ("sha256", sha256)])
        .header(reqwest::header::CONTENT_TYPE, "application/octet-stream")
        .header(reqwest::header::CONTENT_LENGTH, size)
        .body(reqwest::Body::wrap_stream(stream));
    if let Some(config) = config {
        request = request.header("x-model-config", config);
    }
    let answer = api
        .send::<Value>(request)
        .await
        .map_err(|e| e.advise(""))
        .with_context(|| format!("upload {}", file.display()));
    bar.finish_and_clear();
    let raw = answer?;
    let mut version: Version = serde_json::from_value(raw.clone()).context("read the new version")?;
    version.raw = raw;
    Ok(version)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_follow_the_file_name() {
        assert_eq!(Format::from_name(Path::new("m/model.onnx")), Some(Format::Onnx));
        assert_eq!(Format::from_name(Path::new("repo.tar.gz")), Some(Format::Tar));
        assert_eq!(Format::from_name(Path::new("repo.TGZ")), Some(Format::Tar));
        assert_eq!(Format::from_name(Path::new("repo.zip")), Some(Format::Zip));
        assert_eq!(Format::from_name(Path::new("weights.bin")), None);
    }

    #[tokio::test]
    async fn files_hash_to_their_sha256() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        std::fs::write(&path, b"abc").expect("write");
        let (sha, size) = hash_file(&path).await.expect("hash");
        assert_eq!(sha, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
        assert_eq!(size, 3);
    }
}
