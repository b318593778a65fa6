//! `gpunode-fake-podresources --socket S --pods FILE`: a fake kubelet PodResources server for
//! tests and demos. FILE is a `ListPodResourcesResponse` in JSON, read again on every request.

use std::path::PathBuf;

use clap::Parser;
use gpunode_podresources::fake::{FakeKubelet, from_file, serve};

/// A fake kubelet PodResources server (tests and demos only).
#[derive(Parser)]
struct Args {
    /// The unix socket to create.
    #[arg(long)]
    socket: PathBuf,
    /// The answer to List, as JSON: {"podResources": [{"name", "namespace", "containers":
    /// [{"name", "devices": [{"resourceName", "deviceIds": [...]}]}]}]}.
    #[arg(long)]
    pods: PathBuf,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match serve(&args.socket, FakeKubelet::new(from_file(&args.pods)), shutdown).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gpunode-fake-podresources: {}: {e}", args.socket.display());
            std::process::ExitCode::FAILURE
        }
    }
}
