//! `kubectl gpunode`: a kubectl plugin for the person on call. It reads the live cluster with the
//! user's kubeconfig and RBAC and runs the operator's own evaluation and planning code on it:
//! `status` (every policy on one screen), `why NODE` (the live `gpunode-operator check`), `gpus`
//! (one row per GPU), `approve` / `unapprove` (the node annotation `gpunode.dev/approve`,
//! edited safely), and `close-breaker POLICY` (the policy annotation
//! `gpunode.dev/close-breaker`, naming the open trip).

mod approve;
mod breaker;
mod claims;
mod cli;
mod decision;
mod error;
mod fetch;
mod gpus;
mod live;
mod render;
mod status;
mod why;

use std::{io::Write as _, process::ExitCode};

use clap::Parser;
use kube::Client;

use crate::{
    cli::{Cli, Command},
    error::{Error, exit},
    live::Snapshot,
    render::{output, style::Style},
};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => return fail(&Error::Output(format!("cannot start: {e}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(code) => ExitCode::from(code),
        Err(e) => fail(&e),
    }
}

fn fail(e: &Error) -> ExitCode {
    eprintln!("error: {e}");
    ExitCode::from(e.exit_code())
}

/// Runs the command; `Ok` carries the exit code of a command that ran (0, or 1 when a read found
/// a problem).
async fn run(cli: Cli) -> Result<u8, Error> {
    let client = fetch::client(cli.kubeconfig.as_deref(), cli.context.as_deref()).await?;
    let ns = cli.gpunode_namespace.as_str();
    let style = Style::detect();
    match &cli.command {
        Command::Status { policy, output: o } => {
            let snapshot = Snapshot::read(&client, "", ns).await?;
            let s = status::status(&snapshot, policy.as_deref())?;
            print(&output(o.format, &s, |s| s.text(style))?)?;
            Ok(found(s.all_compliant()))
        }
        Command::Why { node, output: o } => {
            let w = why(&client, ns, node).await?;
            print(&output(o.format, &w, |w| w.text(style))?)?;
            Ok(found(w.compliant()))
        }
        Command::Gpus {
            node,
            selector,
            output: o,
        } => {
            let g = gpus(&client, ns, node.as_deref(), selector.as_deref()).await?;
            print(&output(o.format, &g, |g| g.text(style))?)?;
            Ok(found(g.all_ok()))
        }
        Command::Approve { node, rungs } => edit(&client, ns, node, rungs, approve::Edit::Approve).await,
        Command::Unapprove { node, rungs } => edit(&client, ns, node, rungs, approve::Edit::Unapprove).await,
        Command::CloseBreaker { policy } => {
            print(&breaker::close(&client, policy).await?)?;
            Ok(exit::OK)
        }
    }
}

fn found(ok: bool) -> u8 {
    if ok { exit::OK } else { exit::FOUND }
}

async fn why(client: &Client, ns: &str, name: &str) -> Result<why::Why, Error> {
    let node = fetch::node(client, name).await?;
    let snapshot = Snapshot::read_for(client, &node, ns).await?;
    why::why(&snapshot, &node)
}

async fn gpus(
    client: &Client,
    ns: &str,
    node: Option<&str>,
    selector: Option<&str>,
) -> Result<gpus::Gpus, Error> {
    match node {
        Some(name) => {
            let node = fetch::node(client, name).await?;
            let snapshot = Snapshot::read_for(client, &node, ns).await?;
            gpus::gpus(&snapshot, &[&node], true)
        }
        None => {
            let snapshot = Snapshot::read(client, selector.unwrap_or_default(), ns).await?;
            let nodes: Vec<&k8s_openapi::api::core::v1::Node> = snapshot.nodes.iter().collect();
            gpus::gpus(&snapshot, &nodes, false)
        }
    }
}

async fn edit(
    client: &Client,
    ns: &str,
    node: &str,
    rungs: &[String],
    e: approve::Edit,
) -> Result<u8, Error> {
    let outcome = approve::edit(client, ns, node, rungs, e).await?;
    print(&outcome.text())?;
    Ok(exit::OK)
}

fn print(text: &str) -> Result<(), Error> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        // A closed pipe (`| head`) is not an error of the command.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(Error::Output(e.to_string())),
    }
}
