//! Flags of the HTTP, gRPC and metrics listeners, shared by `tessera serve` and `tessera worker`.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;

use crate::serve::metrics::MetricsToken;
use crate::serve::net::tls::TlsArgs;

/// Ports of the three endpoints (tritonserver's flag names); `tessera dev` takes only these.
#[derive(Debug, Clone, clap::Args)]
pub struct PortArgs {
    /// HTTP port; 0 picks a free one.
    #[arg(long, env = "TESSERA_HTTP_PORT", default_value_t = 8000)]
    pub http_port: u16,
    /// gRPC port; 0 picks a free one.
    #[arg(long, env = "TESSERA_GRPC_PORT", default_value_t = 8001)]
    pub grpc_port: u16,
    /// Metrics port; 0 picks a free one.
    #[arg(long, env = "TESSERA_METRICS_PORT", default_value_t = 8002)]
    pub metrics_port: u16,
}

impl PortArgs {
    /// The HTTP, gRPC and metrics addresses on one IP.
    pub fn on(&self, ip: IpAddr) -> [SocketAddr; 3] {
        [self.http_port, self.grpc_port, self.metrics_port].map(|port| SocketAddr::new(ip, port))
    }
}

/// Ports and bind addresses of the three endpoints (tritonserver's flag names).
#[derive(Debug, Clone, clap::Args)]
pub struct ListenArgs {
    #[command(flatten)]
    pub ports: PortArgs,
    /// Address the HTTP endpoint binds.
    #[arg(long, env = "TESSERA_HTTP_ADDRESS", default_value = "0.0.0.0")]
    pub http_address: IpAddr,
    /// Address the gRPC endpoint binds.
    #[arg(long, env = "TESSERA_GRPC_ADDRESS", default_value = "0.0.0.0")]
    pub grpc_address: IpAddr,
    /// Address the metrics endpoint binds.
    #[arg(long, env = "TESSERA_METRICS_ADDRESS", default_value = "0.0.0.0")]
    pub metrics_address: IpAddr,
    /// File holding the bearer token the metrics endpoint requires (Prometheus: `authorization:
    /// { credentials_file: FILE }`); without it or `--metrics-token`, metrics are open.
    #[arg(long, env = "TESSERA_METRICS_TOKEN_FILE", conflicts_with = "metrics_token")]
    pub metrics_token_file: Option<PathBuf>,
    /// The bearer token the metrics endpoint requires, given directly (prefer the variable or
    /// the file: a flag shows in `ps`).
    #[arg(long, env = "TESSERA_METRICS_TOKEN", hide_env_values = true)]
    pub metrics_token: Option<MetricsToken>,
    /// Certificate and key of the HTTP, gRPC and metrics endpoints.
    #[command(flatten)]
    pub tls: TlsArgs,
    /// Microseconds an idle server thread keeps polling client connections before it sleeps,
    /// when nothing is in flight: lower latency for low-concurrency clients for some idle CPU;
    /// 0 turns it off.
    #[arg(long, env = "TESSERA_BUSY_POLL_US", default_value_t = crate::serve::net::busy_poll::DEFAULT_WINDOW_US)]
    pub busy_poll_us: u64,
    /// Nice value of model instance threads (-20 to 19), so that network threads waking on
    /// their cores do not keep preempting executions; below 0 needs CAP_SYS_NICE (without it
    /// they stay at normal priority); 0 leaves them alone.
    #[arg(long, env = "TESSERA_INSTANCE_NICE", default_value_t = crate::engine::priority::DEFAULT_INSTANCE_NICE,
          value_parser = clap::value_parser!(i32).range(-20..=19), allow_negative_numbers = true)]
    pub instance_nice: i32,
}

impl ListenArgs {
    /// Where the HTTP endpoint binds.
    pub fn http(&self) -> SocketAddr {
        SocketAddr::new(self.http_address, self.ports.http_port)
    }

    /// Where the gRPC endpoint binds.
    pub fn grpc(&self) -> SocketAddr {
        SocketAddr::new(self.grpc_address, self.ports.grpc_port)
    }

    /// Where the metrics endpoint binds.
    pub fn metrics(&self) -> SocketAddr {
        SocketAddr::new(self.metrics_address, self.ports.metrics_port)
    }

    /// The token the metrics endpoint requires: `--metrics-token-file` read, else
    /// `--metrics-token`.
    pub fn metrics_token(&self) -> std::io::Result<Option<MetricsToken>> {
        match &self.metrics_token_file {
            Some(path) => MetricsToken::from_file(path).map(Some),
            None => Ok(self.metrics_token.clone()),
        }
    }

    /// Applies the process-wide serving settings: busy-polling of client connections
    /// (`--busy-poll-us`) and the priority of instance threads (`--instance-nice`).
    pub fn apply_process_settings(&self) {
        crate::serve::net::busy_poll::enable(std::time::Duration::from_micros(self.busy_poll_us));
        crate::engine::priority::set_instance_nice(self.instance_nice);
    }
}
