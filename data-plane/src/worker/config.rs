//! `tessera worker` flags and the configuration they build.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use crate::engine::response_cache::{self, CacheLimits};
use crate::serve::metrics::MetricsToken;
use crate::serve::net::listen::ListenArgs;
use crate::serve::net::tls::{CaArgs, CertFiles};
use crate::serve::server::DEFAULT_MAX_INPUT_SIZE;
use crate::serve::shared_memory::{self, ShmPolicy, TenantLimits};
use crate::trace::TraceConfig;
use crate::worker::gpu::NvmlSource;

/// The credential a worker presents to the control plane; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct WorkerToken(String);

impl WorkerToken {
    /// Wraps a token.
    pub fn new(token: impl Into<String>) -> Self {
        Self(token.into())
    }

    /// The token itself, for the `authorization` metadata.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for WorkerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("WorkerToken(<redacted>)")
    }
}

impl From<String> for WorkerToken {
    fn from(token: String) -> Self {
        Self(token)
    }
}

/// `tessera worker` flags.
#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    /// Control plane URL (its REST port also serves the agent gRPC service), e.g. `http://127.0.0.1:8080`
    /// or `https://cp.example:8080`.
    #[arg(long, env = "TESSERA_CONTROL_PLANE", value_parser = parse_control_plane)]
    pub control_plane: String,
    /// Trust for an https control plane.
    #[command(flatten)]
    pub ca: CaArgs,
    /// Credential this worker presents to the control plane (its `--worker-token`).
    #[arg(long, env = "TESSERA_WORKER_TOKEN", hide_env_values = true)]
    pub worker_token: WorkerToken,
    /// Stable worker id; default: generated once and kept in the data directory.
    #[arg(long, env = "TESSERA_WORKER_ID", value_parser = parse_worker_id)]
    pub worker_id: Option<String>,
    /// Directory for the worker id, the artifact cache (`cache/`) and the usage spool (`usage/`).
    #[arg(long, env = "TESSERA_DATA_DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Ports and bind addresses of the HTTP, gRPC and metrics endpoints.
    #[command(flatten)]
    pub listen: ListenArgs,
    /// Host name or address clients reach this worker at (the endpoints sent when registering).
    #[arg(long, env = "TESSERA_ADVERTISE_HOST", default_value = "127.0.0.1")]
    pub advertise_host: String,
    /// CPU slices to offer: the cores are shared evenly between them.
    #[arg(long, env = "TESSERA_CPU_SLICES", default_value_t = DEFAULT_CPU_SLICES)]
    pub cpu_slices: u32,
    /// Memory of each CPU slice in bytes; default: total RAM divided by `--cpu-slices`.
    #[arg(long, env = "TESSERA_SLICE_MEMORY_BYTES")]
    pub slice_memory_bytes: Option<u64>,
    /// Simulated GPU / MIG inventory (JSON, see `worker::inventory`) instead of NVML's: with it
    /// the worker does not use NVML at all.
    #[arg(long, env = "TESSERA_INVENTORY", conflicts_with = "nvml_library")]
    pub inventory: Option<PathBuf>,
    /// NVML library to load (e.g. a driver's `libnvidia-ml.so.1` outside the library path);
    /// failing to load it fails the start. Default: the system's `libnvidia-ml.so.1` when there
    /// is one, else a CPU-only worker.
    #[arg(long, env = "TESSERA_NVML_LIBRARY")]
    pub nvml_library: Option<PathBuf>,
    /// Seconds an API key lookup is cached before it is checked again.
    #[arg(long, env = "TESSERA_KEY_CACHE_SECS", default_value_t = 60)]
    pub key_cache_secs: u64,
    /// Milliseconds between usage shipments to the control plane (the spool under
    /// `<data-dir>/usage/` keeps what is not acknowledged yet).
    #[arg(long, env = "TESSERA_USAGE_SHIP_INTERVAL_MS", default_value_t = DEFAULT_USAGE_SHIP_INTERVAL_MS)]
    pub usage_ship_interval_ms: u64,
    /// Seconds a runner process left with no versions (its tenant's last replica left the slice)
    /// lives on before it exits.
    #[arg(long, env = "TESSERA_RUNNER_IDLE_EXIT_SECS", default_value_t = crate::runner::DEFAULT_IDLE_EXIT.as_secs())]
    pub runner_idle_exit_secs: u64,
    /// Inference requests one tenant may have in flight on this worker; one more gets 429 /
    /// RESOURCE_EXHAUSTED.
    #[arg(long, env = "TESSERA_TENANT_MAX_IN_FLIGHT", default_value_t = crate::serve::tenant_gate::DEFAULT_TENANT_MAX_IN_FLIGHT)]
    pub tenant_max_in_flight: usize,
    /// MiB of each shared-memory arena a runner gets (one for requests, one for answers):
    /// tensors from 64 KiB cross in it instead of through the runner's socket; 0 turns it off.
    #[arg(long, env = "TESSERA_RUNNER_SHM_MIB", default_value_t = crate::runner::shm::DEFAULT_ARENA_BYTES >> 20)]
    pub runner_shm_mib: usize,
    /// Where tenants' models run: a runner process per (tenant, slice), or inside the worker.
    #[arg(long, env = "TESSERA_ISOLATION", value_enum, default_value_t = Isolation::Runner)]
    pub isolation: Isolation,
    /// Let tenants register system and CUDA shared memory regions and pass tensors through them
    /// (system keys must start with `/<tenant-name>:`); off, the shared memory calls answer as
    /// Triton's do with `--allow-client-shm=false`.
    #[arg(long, env = "TESSERA_ALLOW_CLIENT_SHM", default_value_t = false, action = clap::ArgAction::Set, num_args = 0..=1, default_missing_value = "true")]
    pub allow_client_shm: bool,
    /// Shared memory regions (system and CUDA) one tenant may have registered at once.
    #[arg(long, env = "TESSERA_CLIENT_SHM_MAX_REGIONS", default_value_t = shared_memory::DEFAULT_MAX_REGIONS_PER_TENANT)]
    pub client_shm_max_regions: usize,
    /// MiB of shared memory regions (system and CUDA) one tenant may have registered at once.
    #[arg(long, env = "TESSERA_CLIENT_SHM_MAX_MIB", default_value_t = shared_memory::DEFAULT_MAX_MIB_PER_TENANT)]
    pub client_shm_max_mib: u64,
    /// MiB the response cache (models with `response_cache { enable: true }`) holds in all on
    /// this worker; 0 turns it off.
    #[arg(long, env = "TESSERA_RESPONSE_CACHE_MIB", default_value_t = response_cache::DEFAULT_TOTAL_BYTES >> 20)]
    pub response_cache_mib: u64,
    /// MiB of the response cache one tenant's answers may hold; the least recently used go first.
    #[arg(long, env = "TESSERA_RESPONSE_CACHE_TENANT_MIB", default_value_t = response_cache::DEFAULT_TENANT_BYTES >> 20)]
    pub response_cache_tenant_mib: u64,
    /// A directory of CUDA libraries (cuBLAS, cuDNN, cudart; TensorRT's libnvinfer) that GPU and
    /// MIG runners load ONNX Runtime's CUDA and TensorRT providers with; repeat the flag, or give
    /// several separated by ':' in the environment variable.
    #[arg(long = "cuda-library-dir", env = "TESSERA_CUDA_LIBRARY_DIRS", value_delimiter = ':', value_parser = parse_library_dir)]
    pub cuda_library_dirs: Vec<PathBuf>,
    /// Tracing at start, as `tessera serve --trace-config` (tritonserver's keys); only a platform
    /// admin reads or changes the trace settings at run time.
    #[arg(long = "trace-config", env = "TESSERA_TRACE_CONFIG", value_delimiter = ';')]
    pub trace_config: Vec<String>,
}

/// Where a worker runs its tenants' models.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Isolation {
    /// One runner process per (tenant, slice), limited to the slice's cores and memory.
    Runner,
    /// Inside the worker process (no fault isolation between tenants).
    InProcess,
}

/// Default `--data-dir`.
pub const DEFAULT_DATA_DIR: &str = "./.tessera-worker";
/// Default `--usage-ship-interval-ms`.
pub const DEFAULT_USAGE_SHIP_INTERVAL_MS: u64 = 2_000;
/// Default `--cpu-slices`.
pub const DEFAULT_CPU_SLICES: u32 = 2;

/// Everything a worker needs; built from [`WorkerArgs`] or directly (tests, `tessera dev`).
#[derive(Debug, Clone)]
pub struct WorkerConfig {
    /// Control plane URL (`http://host:port` or `https://host:port`).
    pub control_plane: String,
    /// A PEM certificate trusted besides the system's roots when the control plane is https.
    pub ca_cert: Option<PathBuf>,
    /// Credential presented on every agent call.
    pub worker_token: WorkerToken,
    /// Fixed worker id; `None` = the one kept in the data directory.
    pub worker_id: Option<String>,
    /// Data directory (worker id, `cache/`, `repository/`, `usage/`).
    pub data_dir: PathBuf,
    /// HTTP listen address.
    pub http_addr: SocketAddr,
    /// gRPC listen address.
    pub grpc_addr: SocketAddr,
    /// Metrics listen address.
    pub metrics_addr: SocketAddr,
    /// Host put in the advertised endpoints.
    pub advertise_host: String,
    /// Number of CPU slices.
    pub cpu_slices: u32,
    /// Memory per CPU slice; `None` = total RAM / `cpu_slices`.
    pub slice_memory_bytes: Option<u64>,
    /// Simulated GPU / MIG inventory file.
    pub inventory: Option<PathBuf>,
    /// Where NVML comes from (GPU and MIG slices, their health, GPU metrics).
    pub nvml: NvmlSource,
    /// How long an API key lookup is trusted before it is checked again.
    pub key_cache_ttl: Duration,
    /// Largest accepted inference request (HTTP body, gRPC message).
    pub max_input_size: usize,
    /// Time between usage shipments.
    pub usage_ship_interval: Duration,
    /// The `tessera` binary runners are started from; `None` runs models inside the worker.
    pub runner_exe: Option<PathBuf>,
    /// How long a runner with no versions lives on.
    pub runner_idle_exit: Duration,
    /// Bytes of each of a runner's shared-memory arenas (0: none).
    pub runner_shm_bytes: usize,
    /// Requests one tenant may have in flight.
    pub tenant_max_in_flight: usize,
    /// Bearer token the metrics endpoint requires; `None`: open.
    pub metrics_token: Option<MetricsToken>,
    /// Whether tenants may use system shared memory, and how much.
    pub client_shm: ShmPolicy,
    /// The response cache's limits, in all and per tenant.
    pub response_cache: CacheLimits,
    /// CUDA library directories put on GPU runners' `LD_LIBRARY_PATH`.
    pub cuda_library_dirs: Vec<PathBuf>,
    /// Certificate and key the HTTP, gRPC and metrics endpoints present; `None`: plain HTTP.
    pub tls: Option<CertFiles>,
    /// Tracing at start.
    pub trace: TraceConfig,
}

impl WorkerConfig {
    /// A worker on loopback with free ports and default slices: what tests and `tessera dev` run.
    pub fn local(control_plane: impl Into<String>, worker_token: WorkerToken, data_dir: impl Into<PathBuf>) -> Self {
        let any = SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), 0);
        Self {
            control_plane: control_plane.into(),
            ca_cert: None,
            worker_token,
            worker_id: None,
            data_dir: data_dir.into(),
            http_addr: any,
            grpc_addr: any,
            metrics_addr: any,
            advertise_host: Ipv4Addr::LOCALHOST.to_string(),
            cpu_slices: DEFAULT_CPU_SLICES,
            slice_memory_bytes: None,
            inventory: None,
            nvml: NvmlSource::Off,
            key_cache_ttl: Duration::from_secs(60),
            max_input_size: DEFAULT_MAX_INPUT_SIZE,
            usage_ship_interval: Duration::from_millis(DEFAULT_USAGE_SHIP_INTERVAL_MS),
            runner_exe: None,
            runner_idle_exit: crate::runner::DEFAULT_IDLE_EXIT,
            runner_shm_bytes: crate::runner::shm::DEFAULT_ARENA_BYTES,
            tenant_max_in_flight: crate::serve::tenant_gate::DEFAULT_TENANT_MAX_IN_FLIGHT,
            metrics_token: None,
            client_shm: ShmPolicy::worker(false, default_shm_limits()),
            response_cache: CacheLimits {
                total_bytes: response_cache::DEFAULT_TOTAL_BYTES,
                tenant_bytes: response_cache::DEFAULT_TENANT_BYTES,
            },
            cuda_library_dirs: Vec::new(),
            tls: None,
            trace: TraceConfig::default(),
        }
    }
}

impl WorkerArgs {
    /// The configuration these flags describe, with the metrics token file read; runners
    /// start from this very binary.
    pub fn into_config(self) -> std::io::Result<WorkerConfig> {
        let metrics_token = self.listen.metrics_token()?;
        let tls = self.listen.tls.files();
        let runner_exe = match self.isolation {
            Isolation::Runner => Some(std::env::current_exe()?),
            Isolation::InProcess => None,
        };
        Ok(WorkerConfig {
            control_plane: self.control_plane,
            ca_cert: self.ca.ca_cert,
            worker_token: self.worker_token,
            worker_id: self.worker_id,
            data_dir: self.data_dir,
            http_addr: self.listen.http(),
            grpc_addr: self.listen.grpc(),
            metrics_addr: self.listen.metrics(),
            advertise_host: self.advertise_host,
            cpu_slices: self.cpu_slices,
            slice_memory_bytes: self.slice_memory_bytes,
            nvml: match (&self.inventory, self.nvml_library) {
                (Some(_), _) => NvmlSource::Off,
                (None, Some(path)) => NvmlSource::Library(path),
                (None, None) => NvmlSource::System,
            },
            inventory: self.inventory,
            key_cache_ttl: Duration::from_secs(self.key_cache_secs),
            max_input_size: DEFAULT_MAX_INPUT_SIZE,
            usage_ship_interval: Duration::from_millis(self.usage_ship_interval_ms.max(1)),
            runner_exe,
            runner_idle_exit: Duration::from_secs(self.runner_idle_exit_secs),
            runner_shm_bytes: self.runner_shm_mib.saturating_mul(1 << 20),
            tenant_max_in_flight: self.tenant_max_in_flight.max(1),
            metrics_token,
            client_shm: ShmPolicy::worker(
                self.allow_client_shm,
                TenantLimits {
                    max_regions: self.client_shm_max_regions,
                    max_bytes: self.client_shm_max_mib.saturating_mul(1 << 20),
                },
            ),
            response_cache: CacheLimits {
                total_bytes: self.response_cache_mib.saturating_mul(1 << 20),
                tenant_bytes: self.response_cache_tenant_mib.saturating_mul(1 << 20),
            },
            cuda_library_dirs: self.cuda_library_dirs,
            tls,
            trace: TraceConfig::parse(&self.trace_config).map_err(std::io::Error::other)?,
        })
    }
}

/// The per-tenant shared memory caps by default.
fn default_shm_limits() -> TenantLimits {
    TenantLimits {
        max_regions: shared_memory::DEFAULT_MAX_REGIONS_PER_TENANT,
        max_bytes: shared_memory::DEFAULT_MAX_MIB_PER_TENANT << 20,
    }
}

/// Accepts `http://` and `https://` URLs with a host.
pub(crate) fn parse_control_plane(url: &str) -> Result<String, String> {
    let uri: http::Uri = url.parse().map_err(|e| format!("not a URL: {e}"))?;
    match (uri.scheme_str(), uri.host()) {
        (Some("http" | "https"), Some(_)) => Ok(url.trim_end_matches('/').to_string()),
        _ => Err("expected http://HOST:PORT or https://HOST:PORT".into()),
    }
}

/// A library directory: absolute (runners start elsewhere) and free of ':' (it joins a path list).
fn parse_library_dir(dir: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(dir);
    if !path.is_absolute() || dir.contains(':') {
        return Err("give an absolute directory without ':'".into());
    }
    Ok(path)
}

/// Worker ids are short and safe in URLs and file names.
pub fn parse_worker_id(id: &str) -> Result<String, String> {
    let ok = !id.is_empty()
        && id.len() <= 128
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && !id.starts_with('.');
    if ok { Ok(id.to_string()) } else { Err("use 1-128 characters of A-Z, a-z, 0-9, '-', '_', '.'".into()) }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: WorkerArgs,
    }

    #[test]
    fn a_token_beginning_with_a_dash_is_given_with_an_equals_sign() {
        // URL-safe random tokens begin with '-' one time in 64: scripts pass `--flag=value`.
        let base = ["w", "--control-plane", "http://cp:8080"];
        assert!(Cli::try_parse_from(base.iter().copied().chain(["--worker-token", "-_x"])).is_err());
        let cli = Cli::try_parse_from(base.iter().copied().chain(["--worker-token=-_x"])).expect("parses");
        assert_eq!(cli.args.into_config().expect("config").worker_token.expose(), "-_x");
    }

    #[test]
    fn defaults_follow_the_contract() {
        let cli = Cli::try_parse_from(["w", "--control-plane", "http://cp:8080/", "--worker-token", "s3cret"])
            .expect("minimal flags parse");
        let config = cli.args.into_config().expect("the test binary has a path");
        assert!(config.runner_exe.is_some(), "tenants run in runner processes by default");
        assert_eq!(config.control_plane, "http://cp:8080");
        assert_eq!(config.http_addr, "0.0.0.0:8000".parse().expect("addr"));
        assert_eq!(config.grpc_addr.port(), 8001);
        assert_eq!(config.metrics_addr.port(), 8002);
        assert_eq!(config.advertise_host, "127.0.0.1");
        assert_eq!(config.cpu_slices, 2);
        assert_eq!(config.key_cache_ttl, Duration::from_secs(60));
        assert_eq!(config.usage_ship_interval, Duration::from_secs(2));
        assert_eq!(config.data_dir, PathBuf::from("./.tessera-worker"));
        assert_eq!(config.nvml, NvmlSource::System, "the system's NVML when there is one");
        assert!(!format!("{config:?}").contains("s3cret"), "the token is redacted");
        assert!(!config.client_shm.allow, "client shared memory is off unless asked for");
        assert_eq!(config.client_shm.tenants, Some(default_shm_limits()));
        assert!(config.cuda_library_dirs.is_empty());
    }

    #[test]
    fn cuda_library_dirs_are_absolute() {
        let base = ["w", "--control-plane", "http://cp:8080", "--worker-token", "t"];
        let flags = [&base[..], &["--cuda-library-dir", "/opt/cuda/lib", "--cuda-library-dir=/opt/cudnn/lib"]].concat();
        let cli = Cli::try_parse_from(flags).expect("parses");
        assert_eq!(cli.args.cuda_library_dirs, [PathBuf::from("/opt/cuda/lib"), PathBuf::from("/opt/cudnn/lib")]);
        assert!(Cli::try_parse_from([&base[..], &["--cuda-library-dir", "lib"]].concat()).is_err());
    }

    #[test]
    fn nvml_comes_from_the_named_library_and_never_with_a_simulated_inventory() {
        let parse = |extra: &[&str]| {
            let base = ["w", "--control-plane", "http://cp:1", "--worker-token", "t"];
            Cli::try_parse_from(base.iter().chain(extra)).map(|cli| cli.args.into_config().expect("config").nvml)
        };
        assert_eq!(
            parse(&["--nvml-library", "/opt/nvml.so"]).expect("parses"),
            NvmlSource::Library("/opt/nvml.so".into())
        );
        assert_eq!(parse(&["--inventory", "gpus.json"]).expect("parses"), NvmlSource::Off);
        assert!(parse(&["--inventory", "gpus.json", "--nvml-library", "/opt/nvml.so"]).is_err(), "one source of GPUs");
    }

    #[test]
    fn bad_urls_and_ids_are_refused() {
        let parse = |url: &str, id: &str| {
            Cli::try_parse_from(["w", "--control-plane", url, "--worker-token", "t", "--worker-id", id]).map(|_| ())
        };
        assert!(parse("http://cp:1", "w-1").is_ok());
        assert!(parse("cp:8080", "w-1").is_err());
        assert!(parse("ftp://cp", "w-1").is_err());
        assert!(parse("http://cp:1", "../x").is_err());
        assert!(parse("http://cp:1", "").is_err());
    }
}
