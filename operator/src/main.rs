//! `gpunode-operator`: run the operator, print its CRDs, or check a report offline.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use gpunode_operator::crdgen;

#[derive(Parser)]
#[command(
    name = "gpunode-operator",
    version,
    about = "Keeps GPU nodes in the state their GpuNodePolicies declare"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the CustomResourceDefinitions as YAML (pipe into `kubectl apply -f -`).
    Crds {
        /// Also write one file per CRD into this directory (the chart keeps them in
        /// charts/gpunode/crds).
        #[arg(long, value_name = "DIR")]
        write: Option<PathBuf>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Crds { write } => {
            let result = crdgen::render_all().and_then(|yaml| {
                if let Some(dir) = write {
                    crdgen::write_all(&dir)?;
                }
                Ok(yaml)
            });
            match result {
                Ok(yaml) => {
                    print!("{yaml}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("gpunode-operator crds: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
