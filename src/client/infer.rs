//! `tessera infer`: one KServe v2 JSON inference against a worker, with the caller's key.
//! The worker is `--url`/`TESSERA_INFERENCE_URL`, or the first ready replica of the model's
//! deployment as the control plane reports it. The answer prints compactly, one line per
//! output (`--output json`: the KServe JSON).

use std::io::Read;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde_json::Value;

use super::api::{ApiClient, segment};
use super::deploy;
use super::output::{Output, Table, cell, print_json};
use super::settings::{ConfigFile, ConnectionArgs, config_path};

/// `tessera infer` flags.
#[derive(Debug, clap::Args)]
pub struct InferArgs {
    /// Model name (in your tenant).
    #[arg(long)]
    pub model: String,
    /// Model version (default: the one the deployment serves).
    #[arg(long)]
    pub version: Option<i64>,
    /// The request: KServe v2 JSON (`{"inputs": [...]}`), `@file.json`, or `-` for stdin
    /// (the default).
    #[arg(long, default_value = "-")]
    pub input: String,
    /// Worker URL (KServe v2 HTTP), e.g. `http://127.0.0.1:8000`; default: looked up in the
    /// model's deployment.
    #[arg(long, env = "TESSERA_INFERENCE_URL")]
    pub url: Option<String>,
    /// Control plane URL, to look the worker up.
    #[arg(long, env = "TESSERA_URL")]
    pub control_plane: Option<String>,
    /// API key (`tsk_…`) or access token.
    #[arg(long = "key", alias = "api-key", env = "TESSERA_API_KEY", hide_env_values = true)]
    pub key: Option<String>,
    /// Tenant (to look the deployment up).
    #[arg(long, env = "TESSERA_TENANT")]
    pub tenant: Option<String>,
    /// PEM certificate to trust for https besides the system's roots (default: the one
    /// `tessera login` saved).
    #[arg(long, env = "TESSERA_CA_CERT")]
    pub ca_cert: Option<PathBuf>,
}

/// The request body `--input` names, checked to be a JSON object.
fn read_request(input: &str) -> anyhow::Result<Value> {
    let text = if input == "-" {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("read the request from stdin")?;
        text
    } else if let Some(path) = input.strip_prefix('@') {
        std::fs::read_to_string(path).with_context(|| format!("read {path}"))?
    } else {
        input.to_string()
    };
    let value: Value = serde_json::from_str(&text).context("the request is not JSON")?;
    if !value.get("inputs").is_some_and(Value::is_array) {
        bail!("the request must be a KServe v2 JSON object with an \"inputs\" array");
    }
    Ok(value)
}

/// Where to send the request: the flag, else the model's deployment's gateway endpoint, else
/// its first ready replica's worker.
async fn worker_url(args: &InferArgs, key: &str, ca_cert: Option<PathBuf>) -> anyhow::Result<String> {
    if let Some(url) = &args.url {
        return Ok(deploy::endpoint_url(url));
    }
    let connection = ConnectionArgs {
        url: args.control_plane.clone(),
        key: Some(key.to_string()),
        tenant: args.tenant.clone(),
        ca_cert,
    };
    let settings = connection.resolve()?;
    let api = ApiClient::new(&settings.url, &settings.key, settings.ca_cert.as_deref())?;
    let (deployments, _) =
        deploy::list(&api, &settings.tenant).await.context("find the model's worker (or pass --url)")?;
    let Some(d) = deployments.iter().find(|d| d.model == args.model) else {
        bail!("model {} has no deployment in tenant {} (deploy it, or pass --url)", args.model, settings.tenant);
    };
    if let Some(gateway) = d.gateway_url() {
        return Ok(gateway);
    }
    d.http_endpoint().with_context(|| format!("deployment {} has no ready replica yet: {}", d.name, d.summary()))
}

/// Most elements of an output's data shown before `…`.
const SHOWN_ELEMENTS: usize = 16;

/// An answer as people read it: `model simple version 1`, then one row per output with its
/// datatype, shape and first elements.
fn compact(answer: &Value) -> String {
    let mut out = format!("model {} version {}\n", cell(&answer["model_name"]), cell(&answer["model_version"]));
    let mut table = Table::new(["OUTPUT", "DATATYPE", "SHAPE", "DATA"]);
    for o in answer["outputs"].as_array().into_iter().flatten() {
        let shape = o["shape"].as_array().map(|d| d.iter().map(cell).collect::<Vec<_>>().join("x")).unwrap_or_default();
        let data = match o["data"].as_array() {
            Some(items) => {
                let shown: Vec<String> = items.iter().take(SHOWN_ELEMENTS).map(cell).collect();
                let more = items.len().saturating_sub(SHOWN_ELEMENTS);
                let tail = if more > 0 { format!(" … (+{more})") } else { String::new() };
                format!("[{}{tail}]", shown.join(", "))
            }
            None => "(binary or shared memory)".to_string(),
        };
        table.row([cell(&o["name"]), cell(&o["datatype"]), shape, data]);
    }
    out.push_str(&table.render());
    out
}

/// Runs `tessera infer`.
pub async fn run(args: InferArgs, output: Output) -> anyhow::Result<()> {
    let request = read_request(&args.input)?;
    let saved = || ConfigFile::load(&config_path()?);
    let key = match &args.key {
        Some(key) => key.clone(),
        None => {
            saved()?.api_key.context("no API key: run `tessera login --url URL --key KEY` or set TESSERA_API_KEY")?
        }
    };
    // The worker's certificate is trusted as the control plane's is: flag, else what login saved.
    let ca_cert = match &args.ca_cert {
        Some(path) => Some(path.clone()),
        None => saved().ok().and_then(|file| file.ca_cert),
    };
    let url = worker_url(&args, &key, ca_cert.clone()).await?;
    let path = match args.version {
        Some(v) => format!("/v2/models/{}/versions/{v}/infer", segment(&args.model)),
        None => format!("/v2/models/{}/infer", segment(&args.model)),
    };
    let worker = ApiClient::new(&url, &key, ca_cert.as_deref())?;
    let answer: Value = worker
        .send(worker.request(reqwest::Method::POST, &path).json(&request))
        .await
        .map_err(|e| e.advise("`tessera deployments list` shows what is deployed"))
        .with_context(|| format!("infer with {} at {url}", args.model))?;
    if output.is_json() {
        return print_json(&answer);
    }
    print!("{}", compact(&answer));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_need_an_inputs_array() {
        assert!(read_request(r#"{"inputs": []}"#).is_ok());
        assert!(read_request(r#"{"outputs": []}"#).is_err());
        assert!(read_request("not json").is_err());
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.json");
        std::fs::write(&path, r#"{"inputs": [{"name": "INPUT0"}]}"#).expect("write");
        let request = read_request(&format!("@{}", path.display())).expect("from a file");
        assert_eq!(request["inputs"][0]["name"], "INPUT0");
    }

    #[test]
    fn answers_print_one_line_per_output_with_the_first_elements() {
        let answer = serde_json::json!({
            "model_name": "simple", "model_version": "1",
            "outputs": [
                {"name": "OUTPUT0", "datatype": "INT32", "shape": [1, 20], "data": (0..20).collect::<Vec<i32>>()},
                {"name": "OUTPUT1", "datatype": "FP32", "shape": [1, 2], "data": [0.5, 1.5]}
            ]
        });
        let text = compact(&answer);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "model simple version 1");
        assert!(
            lines[2].starts_with("OUTPUT0  INT32     1x20   [0, 1, 2,") && lines[2].ends_with("15 … (+4)]"),
            "{text}"
        );
        assert!(lines[3].ends_with("[0.5, 1.5]"), "{text}");
    }
}
