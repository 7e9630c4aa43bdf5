//! Command-line interface: one subcommand per role, flags named as tritonserver names them.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::{ArgAction, Parser, Subcommand, ValueEnum};
use tessera_data_plane::engine::manager::ControlMode;
use tessera_data_plane::serve::net::listen::ListenArgs;
use tessera_data_plane::serve::server::{DEFAULT_MAX_INPUT_SIZE, ServeConfig};
use tessera_data_plane::trace::TraceConfig;
use tessera_data_plane::worker::gpu::NvmlSource;
use tokio_util::sync::CancellationToken;

use crate::client::output::Output;

/// Tessera: a Triton-compatible, multi-tenant inference service.
#[derive(Debug, Parser)]
#[command(name = "tessera", version, about)]
pub struct Cli {
    /// Log line format.
    #[arg(long, env = "TESSERA_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text, global = true)]
    pub log_format: LogFormat,
    /// How the client verbs print: tables for people, or the API's JSON for scripts.
    #[arg(long, short = 'o', env = "TESSERA_OUTPUT", value_enum, default_value_t = Output::Table, global = true)]
    pub output: Output,
    /// What to run.
    #[command(subcommand)]
    pub command: Command,
}

/// Log output formats.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// Roles and tools.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Standalone Triton-compatible server over a model repository (KServe v2 HTTP + gRPC).
    Serve(ServeArgs),
    /// Measurement tools.
    #[command(subcommand)]
    Bench(BenchCommand),
    /// Control plane: tenant registry, auth, model versions, audit, quotas, REST API `/v1`.
    ControlPlane(tessera_control_plane::ControlPlaneArgs),
    /// Worker: registers its slices with a control plane, loads what it assigns, serves inference.
    Worker(tessera_data_plane::worker::WorkerArgs),
    /// Gateway: one KServe v2 endpoint (HTTP + gRPC) for every tenant in front of the workers;
    /// authenticates, applies rate limits, balances over replicas, splits canary traffic.
    Gateway(tessera_data_plane::gateway::GatewayArgs),
    /// Internal: hosts one tenant's models on one slice; started and supervised by a worker.
    #[command(hide = true)]
    Runner(tessera_data_plane::runner::RunnerArgs),
    /// Print the control plane's OpenAPI document (what `openapi/openapi.json` holds).
    Openapi,
    /// Print the GPUs and MIG instances NVML reports, and the slices a worker here would offer
    /// (JSON; reads only, changes nothing).
    Gpus(GpusArgs),
    /// Everything on one machine in one process: control plane (SQLite), a worker, a demo
    /// tenant with the demo model deployed; prints keys and examples. State in `--data-dir`.
    Dev(crate::dev::DevArgs),
    /// Check an API key against a control plane and save URL, key and tenant for the verbs below.
    Login(crate::client::login::LoginArgs),
    /// Who the configured key is: tenant, role, key and user.
    Whoami(crate::client::whoami::WhoamiArgs),
    /// Models: `list`, `get`, `delete`; `push FILE --model NAME [--alias A]` uploads a version.
    #[command(subcommand)]
    Models(crate::client::models::ModelsCommand),
    /// A model's versions: `list MODEL`, `get MODEL VERSION` (with its signature).
    #[command(subcommand)]
    Versions(crate::client::versions::VersionsCommand),
    /// A model's aliases: `list`, `set` (or `move`), `rollback`.
    #[command(subcommand)]
    Aliases(crate::client::aliases::AliasesCommand),
    /// Create or update a model's deployment (replicas on workers).
    Deploy(crate::client::deploy::DeployArgs),
    /// Deployments: `list`, `get`, `scale`, `delete`, `events`, `watch`; canaries: `canary`,
    /// `promote`, `rollback`.
    #[command(subcommand)]
    Deployments(crate::client::deployments::DeploymentsCommand),
    /// The tenant's API keys: `create` (the secret is printed once), `list`, `limit`, `revoke`.
    #[command(subcommand)]
    Keys(crate::client::keys::KeysCommand),
    /// The tenant's webhooks: `list`, `create` (the secret is printed once), `get`, `update`,
    /// `delete`, `deliveries`, `replay`, `ping`, `rotate-secret`.
    #[command(subcommand)]
    Webhooks(crate::client::webhooks::WebhooksCommand),
    /// The tenant's usage (requests, inferences, compute and slice time), grouped as asked.
    Usage(crate::client::billing::UsageArgs),
    /// The tenant's invoice for a month.
    Invoice(crate::client::billing::InvoiceArgs),
    /// One KServe v2 JSON inference; prints each output compactly (`--output json`: the answer).
    Infer(crate::client::infer::InferArgs),
    /// Make a local CA (`ca.pem`) and a server certificate it signs (`cert.pem`, `key.pem`) in a
    /// directory, for `--tls-cert`/`--tls-key` and clients' `--ca-cert` in development and tests.
    TlsCert(TlsCertArgs),
}

impl Command {
    /// The async threads the role asks for, when it says (`gateway --threads`).
    pub fn threads(&self) -> Option<usize> {
        match self {
            Command::Gateway(args) => {
                Some(args.threads.map_or_else(tessera_data_plane::gateway::default_threads, usize::from))
            }
            // One thread, as the gateway's default on a small machine: the relay is its floor.
            Command::Bench(BenchCommand::Relay(_)) => Some(1),
            _ => None,
        }
    }

    /// Whether this is the internal runner role (a single-threaded runtime).
    pub fn is_runner(&self) -> bool {
        matches!(self, Command::Runner(_))
    }

    /// Whether this is a client verb (quiet logs; errors as one line).
    pub fn is_client(&self) -> bool {
        matches!(
            self,
            Command::Login(_)
                | Command::Whoami(_)
                | Command::Models(_)
                | Command::Versions(_)
                | Command::Aliases(_)
                | Command::Deploy(_)
                | Command::Deployments(_)
                | Command::Keys(_)
                | Command::Webhooks(_)
                | Command::Usage(_)
                | Command::Invoice(_)
                | Command::Infer(_)
        )
    }
}

/// `tessera serve` flags (tritonserver's names where they exist).
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Model repository directory (Triton layout).
    #[arg(long, alias = "model-store", env = "TESSERA_MODEL_REPOSITORY")]
    pub model_repository: PathBuf,
    /// Ports and bind addresses of the HTTP, gRPC and metrics endpoints.
    #[command(flatten)]
    pub listen: ListenArgs,
    /// Serve HTTP.
    #[arg(long, env = "TESSERA_ALLOW_HTTP", default_value_t = true, action = ArgAction::Set)]
    pub allow_http: bool,
    /// Serve gRPC.
    #[arg(long, env = "TESSERA_ALLOW_GRPC", default_value_t = true, action = ArgAction::Set)]
    pub allow_grpc: bool,
    /// Serve Prometheus metrics.
    #[arg(long, env = "TESSERA_ALLOW_METRICS", default_value_t = true, action = ArgAction::Set)]
    pub allow_metrics: bool,
    /// How models are loaded: all at start (none), following the repository (poll), or by API (explicit).
    #[arg(long, env = "TESSERA_MODEL_CONTROL_MODE", value_enum, default_value_t = Mode::None)]
    pub model_control_mode: Mode,
    /// Model to load at start in explicit mode; repeat it, or `*` for all.
    #[arg(long = "load-model", env = "TESSERA_LOAD_MODEL", value_delimiter = ',')]
    pub load_model: Vec<String>,
    /// Seconds between repository scans in poll mode.
    #[arg(long, env = "TESSERA_REPOSITORY_POLL_SECS", default_value_t = 15)]
    pub repository_poll_secs: u64,
    /// Report ready only when every model is ready.
    #[arg(long, env = "TESSERA_STRICT_READINESS", default_value_t = true, action = ArgAction::Set)]
    pub strict_readiness: bool,
    /// Exit when a model fails to load at start (off: the model is UNAVAILABLE, the rest serve).
    #[arg(long, env = "TESSERA_EXIT_ON_ERROR", default_value_t = false, action = ArgAction::Set)]
    pub exit_on_error: bool,
    /// Largest request body (HTTP) or message (gRPC) accepted, in bytes.
    #[arg(long, env = "TESSERA_HTTP_MAX_INPUT_SIZE", default_value_t = DEFAULT_MAX_INPUT_SIZE)]
    pub http_max_input_size: usize,
    /// Run the models in a runner process, as a worker runs each tenant's (for comparing the two).
    #[arg(long, env = "TESSERA_RUNNER", default_value_t = false, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub runner: bool,
    /// MiB of each shared-memory arena the runner gets (requests, answers): tensors from 64 KiB
    /// cross in it instead of through the runner's socket; 0 turns it off.
    #[arg(long, env = "TESSERA_RUNNER_SHM_MIB", default_value_t = tessera_data_plane::runner::shm::DEFAULT_ARENA_BYTES >> 20)]
    pub runner_shm_mib: usize,
    /// Let clients register system and CUDA shared memory regions and pass tensors through them
    /// (on, as in Triton 2.51; Triton turned it off by default later).
    #[arg(long, env = "TESSERA_ALLOW_CLIENT_SHM", default_value_t = true, action = ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_client_shm: bool,
    /// MiB the response cache holds for models with `response_cache { enable: true }` (Triton's
    /// `--cache-config local,size=N`, on by default here); 0 turns it off.
    #[arg(long, env = "TESSERA_RESPONSE_CACHE_MIB", default_value_t = tessera_data_plane::engine::response_cache::DEFAULT_TOTAL_BYTES >> 20)]
    pub response_cache_mib: u64,
    /// Tracing at start, as tritonserver's `--trace-config`: `level=TIMESTAMPS`, `rate=N`,
    /// `count=N`, `mode=triton|opentelemetry`, `triton,file=PATH`, `triton,log-frequency=N`,
    /// `opentelemetry,url=URL`, `opentelemetry,resource=KEY=VALUE`, `opentelemetry,bsp_*=N`;
    /// repeat it. Off by default.
    #[arg(long = "trace-config", env = "TESSERA_TRACE_CONFIG", value_delimiter = ';')]
    pub trace_config: Vec<String>,
}

/// Flags of `tessera tls-cert`.
#[derive(Debug, clap::Args)]
pub struct TlsCertArgs {
    /// Directory to write `ca.pem`, `cert.pem` and `key.pem` into (replacing them).
    #[arg(long)]
    pub dir: PathBuf,
    /// Host name or IP address the certificate is for; repeat it. Default: localhost,
    /// 127.0.0.1 and ::1.
    #[arg(long = "host")]
    pub hosts: Vec<String>,
}

/// Model control modes.
#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum Mode {
    /// Load everything at start.
    None,
    /// Follow repository changes.
    Poll,
    /// Load and unload through the API.
    Explicit,
}

/// Flags of `tessera gpus`.
#[derive(Debug, clap::Args)]
pub struct GpusArgs {
    /// Load NVML from this file instead of the system's `libnvidia-ml.so.1`.
    #[arg(long, env = "TESSERA_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,
}

/// Measurement tools.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Raw ONNX Runtime throughput in-process (the baseline a server is compared with).
    Ort(tessera_data_plane::tools::bench::OrtBenchArgs),
    /// Load generator over KServe v2 HTTP with binary tensors (any Triton-compatible server).
    Http(crate::loadgen::LoadArgs),
    /// Load generator over Triton's gRPC service.
    Grpc(crate::loadgen::LoadArgs),
    /// Time the control plane's replica placement on simulated workers.
    Placement(PlacementBenchArgs),
    /// A plain TCP relay on the gateway's runtime settings: what one proxy hop costs here.
    Relay(tessera_data_plane::tools::relay::RelayArgs),
}

/// Flags of `tessera bench placement`.
#[derive(Debug, clap::Args)]
pub struct PlacementBenchArgs {
    /// Simulated workers.
    #[arg(long, default_value_t = 1_000)]
    pub workers: usize,
    /// CPU slices per worker.
    #[arg(long, default_value_t = 8)]
    pub slices: usize,
    /// Replicas to place (deployments of 20 replicas, 100 tenants).
    #[arg(long, default_value_t = 10_000)]
    pub replicas: u32,
}

impl ServeArgs {
    fn into_config(self) -> std::io::Result<ServeConfig> {
        let runner_exe = if self.runner { Some(std::env::current_exe()?) } else { None };
        Ok(ServeConfig {
            model_repository: self.model_repository,
            http_addr: self.allow_http.then(|| self.listen.http()),
            grpc_addr: self.allow_grpc.then(|| self.listen.grpc()),
            metrics_addr: self.allow_metrics.then(|| self.listen.metrics()),
            control_mode: match self.model_control_mode {
                Mode::None => ControlMode::None,
                Mode::Poll => ControlMode::Poll,
                Mode::Explicit => ControlMode::Explicit,
            },
            load_models: self.load_model,
            poll_interval: Duration::from_secs(self.repository_poll_secs.max(1)),
            strict_readiness: self.strict_readiness,
            exit_on_error: self.exit_on_error,
            max_input_size: self.http_max_input_size,
            runner_exe,
            runner_shm_bytes: self.runner_shm_mib.saturating_mul(1 << 20),
            metrics_token: self.listen.metrics_token()?,
            allow_client_shm: self.allow_client_shm,
            tls: self.listen.tls.files(),
            response_cache_bytes: self.response_cache_mib.saturating_mul(1 << 20),
            trace: TraceConfig::parse(&self.trace_config).map_err(std::io::Error::other)?,
        })
    }
}

/// Sets up `tracing` output, filtered by `RUST_LOG` (else `default_filter`), with the switches
/// Triton's logging extension changes at run time.
pub fn init_logging(format: LogFormat, default_filter: &str) {
    tessera_data_plane::logging::init(matches!(format, LogFormat::Json), default_filter);
}

/// Runs the chosen subcommand.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    let output = cli.output;
    match cli.command {
        Command::Serve(args) => {
            args.listen.apply_process_settings();
            let config = args.into_config().context("read the flags")?;
            tracing::info!(?config, "starting tessera serve");
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            tessera_data_plane::run(config, shutdown, |_| {}).await
        }
        Command::Bench(BenchCommand::Ort(args)) => {
            tokio::task::spawn_blocking(move || tessera_data_plane::tools::bench::run_ort(&args)).await?
        }
        Command::Bench(BenchCommand::Http(args)) => crate::loadgen::run(crate::loadgen::Protocol::Http, args).await,
        Command::Bench(BenchCommand::Grpc(args)) => crate::loadgen::run(crate::loadgen::Protocol::Grpc, args).await,
        Command::Bench(BenchCommand::Relay(args)) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            tessera_data_plane::tools::relay::run(args, shutdown, |_| {}).await
        }
        Command::Bench(BenchCommand::Placement(args)) => {
            let (placed, took) =
                tessera_control_plane::scheduler::bench::placement(args.workers, args.slices, args.replicas);
            println!(
                "placed {placed} of {} replicas on {} workers x {} slices in {:.1} ms",
                args.replicas,
                args.workers,
                args.slices,
                took.as_secs_f64() * 1e3
            );
            let (placed, took) =
                tessera_control_plane::scheduler::bench::tick(args.workers, args.slices, args.replicas);
            println!(
                "one scheduler tick (placement, rendered configs, events) placed {placed} of {} replicas in {:.1} ms",
                args.replicas,
                took.as_secs_f64() * 1e3
            );
            Ok(())
        }
        Command::Worker(args) => {
            args.listen.apply_process_settings();
            let config = args.into_config().context("read the flags")?;
            tracing::info!(?config, "starting tessera worker");
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            tessera_data_plane::worker::run(config, shutdown, |_| {}).await
        }
        Command::Gateway(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            tessera_data_plane::gateway::run(args, shutdown, |_| {}).await
        }
        Command::Runner(args) => tessera_data_plane::runner::process::run(args).await,
        Command::ControlPlane(args) => {
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            tessera_control_plane::run(args.into_config()?, shutdown).await
        }
        Command::Openapi => {
            print!("{}", tessera_control_plane::openapi_json());
            Ok(())
        }
        Command::Gpus(args) => {
            let source = match args.nvml_library {
                Some(path) => NvmlSource::Library(path),
                None => NvmlSource::System,
            };
            let report = tessera_data_plane::worker::gpu::Gpus::open(&source)?
                .map_or_else(|| serde_json::json!({ "nvml": false, "gpus": [], "slices": [] }), |g| g.report());
            println!("{}", serde_json::to_string_pretty(&report)?);
            Ok(())
        }
        Command::Dev(args) => {
            tessera_data_plane::serve::net::busy_poll::enable(
                tessera_data_plane::serve::net::busy_poll::DEFAULT_WINDOW,
            );
            tessera_data_plane::engine::priority::set_instance_nice(
                tessera_data_plane::engine::priority::DEFAULT_INSTANCE_NICE,
            );
            let shutdown = CancellationToken::new();
            tokio::spawn(cancel_on_signal(shutdown.clone()));
            crate::dev::run(args, shutdown).await
        }
        Command::Login(args) => crate::client::login::run(args).await,
        Command::Whoami(args) => crate::client::whoami::run(args, output).await,
        Command::Models(command) => crate::client::models::run(command, output).await,
        Command::Versions(command) => crate::client::versions::run(command, output).await,
        Command::Aliases(command) => crate::client::aliases::run(command, output).await,
        Command::Deploy(args) => crate::client::deploy::run_deploy(args, output).await,
        Command::Deployments(command) => crate::client::deployments::run(command, output).await,
        Command::Keys(command) => crate::client::keys::run(command, output).await,
        Command::Webhooks(command) => crate::client::webhooks::run(command, output).await,
        Command::Usage(args) => crate::client::billing::run_usage(args, output).await,
        Command::Invoice(args) => crate::client::billing::run_invoice(args, output).await,
        Command::Infer(args) => crate::client::infer::run(args, output).await,
        Command::TlsCert(args) => {
            let hosts: Vec<&str> = if args.hosts.is_empty() {
                tessera_protocol::tls::local::LOOPBACK_HOSTS.to_vec()
            } else {
                args.hosts.iter().map(String::as_str).collect()
            };
            let files = tessera_protocol::tls::local::make(&args.dir, &hosts)
                .with_context(|| format!("make a local certificate in {}", args.dir.display()))?;
            println!("ca   {}", files.ca.display());
            println!("cert {}", files.pair.cert.display());
            println!("key  {}", files.pair.key.display());
            Ok(())
        }
    }
}

/// Cancels `token` on SIGINT or SIGTERM.
async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        () = term => {},
    }
    tracing::info!("shutdown signal received");
    token.cancel();
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[test]
    fn the_command_line_is_well_formed() {
        // Duplicate flag names and the like panic at parse time; this finds them at test time.
        Cli::command().debug_assert();
    }

    #[test]
    fn output_is_a_global_flag_before_or_after_the_verb() {
        let before = Cli::try_parse_from(["tessera", "-o", "json", "models", "list"]).expect("parses");
        assert_eq!(before.output, Output::Json);
        let after = Cli::try_parse_from(["tessera", "deployments", "get", "d", "--output", "json"]).expect("parses");
        assert_eq!(after.output, Output::Json);
        let default = Cli::try_parse_from(["tessera", "whoami"]).expect("parses");
        assert_eq!(default.output, Output::Table);
        assert!(Cli::try_parse_from(["tessera", "-o", "yaml", "whoami"]).is_err());
    }

    #[test]
    fn client_verbs_refuse_bad_arguments_before_any_call() {
        let refused = |args: &[&str]| Cli::try_parse_from(args).is_err();
        assert!(refused(&["tessera", "deployments", "scale", "d", "--replicas", "65"]), "at most 64 replicas");
        assert!(refused(&["tessera", "deployments", "scale", "d"]), "--replicas is required");
        assert!(refused(&["tessera", "keys", "create", "--name", "x", "--role", "owner"]), "roles are a closed set");
        assert!(refused(&["tessera", "invoice", "--period", "2026-13"]), "a month");
        assert!(refused(&["tessera", "usage", "--version", "2"]), "a version needs its model");
        assert!(refused(&["tessera", "deploy", "--model", "m", "--version", "1", "--alias", "a"]), "pin or follow");
        assert!(refused(&["tessera", "aliases", "set", "m", "production"]), "--version is required");
        let moved = Cli::try_parse_from(["tessera", "aliases", "move", "m", "production", "--version", "2"]);
        assert!(moved.is_ok(), "`move` is `set`");
        assert!(Cli::try_parse_from(["tessera", "keys", "revoke", "ci", "--key", "tsk_x", "--yes"]).is_ok());
        let hook = |extra: &[&'static str]| {
            let mut args = vec!["tessera", "webhooks", "create", "--hook-url", "https://h.example"];
            args.extend_from_slice(extra);
            args
        };
        assert!(refused(&hook(&[])), "--event is required");
        assert!(refused(&hook(&["--event", "deployment.exploded"])), "event types are a closed set");
        assert!(Cli::try_parse_from(hook(&["--event", "alias.moved,ping", "--event", "version.uploaded"])).is_ok());
        assert!(refused(&["tessera", "webhooks", "update", "h", "--enable", "--disable"]), "enable or disable");
        assert!(refused(&["tessera", "webhooks", "deliveries", "h", "--status", "lost"]), "statuses are a closed set");
    }
}
