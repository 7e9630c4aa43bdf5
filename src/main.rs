//! The `tessera` binary: parses the command line and starts a role.

mod cli;
mod loadgen;

use clap::Parser;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    cli::init_logging(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: failed to start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = format!("{e:#}"), "tessera failed");
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
