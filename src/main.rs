//! The `tessera` binary: parses the command line and starts a role.

mod cli;
mod client;
mod dev;
mod loadgen;

use clap::Parser;

/// mimalloc instead of glibc malloc: request buffers are allocated on one thread and freed on
/// another, which glibc handles with lock-protected arenas and frequent consolidation.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let client = cli.command.is_client();
    // Client verbs talk to people: warnings only, and an error is the one line below.
    cli::init_logging(cli.log_format, if client { "warn" } else { "info,ort=warn" });
    // A runner reads its one socket and hands batches to instance threads: one async thread
    // is enough, and keeps each hand-off on the thread that read the request.
    let built = if cli.command.is_runner() || cli.command.threads() == Some(1) {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .on_thread_park(tessera_data_plane::serve::net::busy_poll::before_park)
            .build()
    } else {
        let mut builder = tokio::runtime::Builder::new_multi_thread();
        if let Some(n) = cli.command.threads() {
            builder.worker_threads(n);
        }
        builder.enable_all().on_thread_park(tessera_data_plane::serve::net::busy_poll::before_park).build()
    };
    let runtime = match built {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: failed to start the async runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(cli::run(cli)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            if !client {
                tracing::error!(error = format!("{e:#}"), "tessera failed");
            }
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
