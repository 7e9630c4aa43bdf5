//! `tessera models push`: registers the model if it is new, hashes the file (sha256, with a
//! progress bar), streams it to the control plane with the hash so the server verifies it,
//! and prints the new version.

use std::io::Read;
use std::path::{Path, PathBuf};

use anyhow::Context;
use futures::StreamExt;
use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::api::{ApiClient, segment};
use super::progress;
use super::settings::ConnectionArgs;

/// `tessera models …` verbs.
#[derive(Debug, clap::Subcommand)]
pub enum ModelsCommand {
    /// Upload a file as the model's next version (creating the model if needed).
    Push(PushArgs),
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
}

/// Runs `tessera models push`.
pub async fn run(command: ModelsCommand) -> anyhow::Result<()> {
    match command {
        ModelsCommand::Push(args) => {
            let settings = args.connection.resolve()?;
            let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
            let format = args.format.or_else(|| Format::from_name(&args.file)).unwrap_or(Format::Onnx);
            let artifact = Artifact { file: &args.file, format, config: args.config.as_deref() };
            let v = push(&api, &settings.tenant, &args.model, artifact).await?;
            println!("pushed {} version {} (sha256 {}, {} bytes)", args.model, v.version, v.sha256, v.size_bytes);
            Ok(())
        }
    }
}

/// Creates `model` in `tenant` unless it exists; returns its latest version number.
pub async fn ensure_model(api: &ApiClient, tenant: &str, model: &str) -> anyhow::Result<i64> {
    let path = format!("/v1/tenants/{}/models/{}", segment(tenant), segment(model));
    if let Some(m) = api.get_opt::<Model>(&path).await.with_context(|| format!("look up model {model}"))? {
        return Ok(m.latest_version);
    }
    let created: Model = api
        .post(&format!("/v1/tenants/{}/models", segment(tenant)), &serde_json::json!({ "name": model }))
        .await
        .with_context(|| format!("create model {model}"))?;
    Ok(created.latest_version)
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

/// Registers the model if needed and uploads the artifact as its next version.
pub async fn push(api: &ApiClient, tenant: &str, model: &str, artifact: Artifact<'_>) -> anyhow::Result<Version> {
    ensure_model(api, tenant, model).await?;
    let (sha256, size) = hash_file(artifact.file).await?;
    let path = format!("/v1/tenants/{}/models/{}/versions", segment(tenant), segment(model));
    upload(api, &path, artifact, &sha256, size).await
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
    let version = api.send::<Version>(request).await.with_context(|| format!("upload {}", file.display()));
    bar.finish_and_clear();
    version
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
