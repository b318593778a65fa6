//! gpunode-probe: observes this GPU node and publishes its GpuNodeReport.
//! `gpunode-probe --once -o yaml` prints one observation without a cluster.
//!
//! Nothing but the entry point: every decision lives in the library.

use std::process::ExitCode;

use clap::Parser;
use gpunode_probe::app;
use gpunode_probe::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

fn init_tracing(config: &Config) {
    // --once prints the report on stdout; keep stderr quiet unless asked.
    let default = if config.once { "warn" } else { "info" };
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr);
    match config.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
}

/// Completes on SIGTERM or SIGINT.
async fn termination() {
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
    tokio::select! {
        () = term => tracing::info!("SIGTERM"),
        r = tokio::signal::ctrl_c() => match r {
            Ok(()) => tracing::info!("SIGINT"),
            Err(e) => tracing::warn!(error = %e, "cannot listen for SIGINT"),
        },
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let config = Config::parse();
    init_tracing(&config);
    match gpunode_probe::crash::arm_from_env() {
        Ok(Some(point)) => tracing::warn!(
            point,
            "crash point armed: the process aborts there (or holds the action, with GPUNODE_CRASH_ACTION=hold)"
        ),
        Ok(None) => {}
        Err(e) => {
            eprintln!("gpunode-probe: {e}");
            return ExitCode::FAILURE;
        }
    }
    if config.chown_state_dir.is_some() {
        return match app::prepare_state_dir(&config) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("gpunode-probe: {e}");
                ExitCode::FAILURE
            }
        };
    }
    if config.once {
        return match tokio::task::spawn_blocking(move || app::once(&config)).await {
            Ok(Ok(text)) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Ok(Err(e)) => {
                eprintln!("gpunode-probe: {e}");
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("gpunode-probe: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let client = match kube::Client::try_default().await {
        Ok(client) => client,
        Err(e) => {
            tracing::error!(error = %e, "no Kubernetes client configuration (in-cluster or KUBECONFIG)");
            return ExitCode::FAILURE;
        }
    };
    match app::run(config, client, termination()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "gpunode-probe failed");
            ExitCode::FAILURE
        }
    }
}
