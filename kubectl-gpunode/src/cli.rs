//! The command line: `kubectl gpunode status|why|gpus|approve|unapprove|close-breaker`.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};

macro_rules! exit_codes {
    () => {
        "Exit codes:
  0  done; a read found nothing wrong
  1  a read found a problem: a node drifted or unknown, a GPU drifting or quarantined
  2  usage or bad input (an unknown flag, a bad selector, a rung the node does not wait for)
  3  not found: no such node or policy, or a node no GpuNodePolicy governs
  4  the cluster refused or could not be asked: forbidden (RBAC), another API error, no kubeconfig"
    };
}

#[cfg(test)]
const EXIT_CODES: &str = exit_codes!();

const MAIN_AFTER: &str = concat!(
    "Examples:
  kubectl gpunode status                    every policy on one screen
  kubectl gpunode why h100-xid              what gpunode decided about a node, and why
  kubectl gpunode gpus -l nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3
  kubectl gpunode approve h100-xid Drain    approve a rung the node waits for
  kubectl gpunode close-breaker POLICY      close a policy's open circuit breaker

It reads the cluster with your kubeconfig ($KUBECONFIG, ~/.kube/config, or --kubeconfig) and
your RBAC: get/list on nodes, gpunodereports, gpunodepolicies; list on leases for probe
heartbeats and on DRA ResourceSlices and DeviceTaintRules when served; patch on nodes to approve,
and on gpunodepolicies to close a breaker.

",
    exit_codes!()
);

/// What gpunode decided about a cluster's GPU nodes, why, and the approvals it waits for.
#[derive(Debug, Parser)]
#[command(name = "kubectl-gpunode", bin_name = "kubectl gpunode", version, after_help = MAIN_AFTER)]
pub struct Cli {
    /// The kubeconfig to use (default: $KUBECONFIG, then ~/.kube/config, then in-cluster).
    #[arg(long, global = true, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,

    /// The kubeconfig context to use (default: its current context).
    #[arg(long, global = true, value_name = "NAME")]
    pub context: Option<String>,

    /// The namespace of the probes' heartbeat Leases (the chart's release namespace), read when
    /// Leases cannot be listed across namespaces.
    #[arg(
        long,
        global = true,
        value_name = "NAMESPACE",
        default_value = "gpunode-system"
    )]
    pub gpunode_namespace: String,

    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Per policy: nodes by state, the disruption budget, the circuit breaker, maintenance
    /// windows, pending approvals, repairs and nodes that need a person.
    #[command(after_help = STATUS_AFTER)]
    Status {
        /// Only this policy (default: every policy).
        policy: Option<String>,
        /// Output format.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// What gpunode decided about one node and why: its drifts, what is done, what waits and
    /// for what, and when that changes.
    #[command(after_help = WHY_AFTER)]
    Why {
        /// The node.
        node: String,
        /// Output format.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// One row per GPU: node, index, UUID, product, state, drifts, quarantine, pods.
    #[command(after_help = GPUS_AFTER)]
    Gpus {
        /// Only this node.
        node: Option<String>,
        /// Only nodes matching this label selector (as kubectl's -l).
        #[arg(short = 'l', long, value_name = "SELECTOR", conflicts_with = "node")]
        selector: Option<String>,
        /// Output format.
        #[command(flatten)]
        output: OutputArgs,
    },
    /// Approve rungs the node waits for (annotation gpunode.dev/approve), keeping those
    /// approved already.
    #[command(after_help = APPROVE_AFTER)]
    Approve {
        /// The node.
        node: String,
        /// Rungs: rule actions (Taint, Cordon, Drain) or repair step names.
        #[arg(required = true, value_name = "RUNG")]
        rungs: Vec<String>,
    },
    /// Withdraw approvals from a node (annotation gpunode.dev/approve), keeping the others.
    #[command(after_help = UNAPPROVE_AFTER)]
    Unapprove {
        /// The node.
        node: String,
        /// Rungs to withdraw.
        #[arg(required = true, value_name = "RUNG")]
        rungs: Vec<String>,
    },
    /// Close a policy's open circuit breaker (annotation gpunode.dev/close-breaker set to the
    /// trip's status.circuitBreaker.openedAt).
    #[command(after_help = CLOSE_BREAKER_AFTER)]
    CloseBreaker {
        /// The GpuNodePolicy.
        policy: String,
    },
}

/// `-o text|json|yaml`.
#[derive(Debug, Args, Clone, Copy)]
pub struct OutputArgs {
    /// Output format: a table for people, or the same data as JSON or YAML (stable field names).
    #[arg(short = 'o', long = "output", value_enum, default_value_t = Format::Text)]
    pub format: Format,
}

/// An output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Format {
    /// Tables and lines for people (colour only on a terminal, never with NO_COLOR).
    Text,
    /// JSON.
    Json,
    /// YAML.
    Yaml,
}

const STATUS_AFTER: &str = "Examples:
  kubectl gpunode status                  every policy
  kubectl gpunode status h100-training    one policy
  kubectl gpunode status -o json          the same data for scripts

Counts and the plan are the operator's own evaluation and planning code run on what the
cluster holds now (nodes, reports, heartbeats, DeviceTaintRules).

Exit codes: 0 every node compliant, 1 some node drifted or unknown, 3 no such policy,
4 forbidden or API error.";

const WHY_AFTER: &str = "Examples:
  kubectl gpunode why h100-xid
  kubectl gpunode why h100-roce -o yaml

The node's policy is the one its gpunode.dev/policy label names, else the first (by name)
whose nodeSelector matches it. What waits names why: the disruption budget, the circuit
breaker, a maintenance window, an approval, a conflict, dry run or pause.

Exit codes: 0 compliant, 1 drifted or unknown, 3 no such node or no policy governs it,
4 forbidden or API error.";

const GPUS_AFTER: &str = "Examples:
  kubectl gpunode gpus                    every node with a GpuNodeReport
  kubectl gpunode gpus h100-xid
  kubectl gpunode gpus -l nvidia.com/gpu.product=NVIDIA-H100-80GB-HBM3

STATE is the GPU's verdict under its node's policy (ok, drifted, unknown; - when no policy
governs the node). QUARANTINE is gpunode's DeviceTaintRule on the GPU's DRA device, or the
node annotation gpunode.dev/unhealthy-gpus on a device-plugin node. PODS are listed when the
node's probe reads the kubelet's PodResources API.

Exit codes: 0 no GPU drifting, unknown or quarantined, 1 some GPU is, 2 bad selector,
3 no such node or report, 4 forbidden or API error.";

const APPROVE_AFTER: &str = "Examples:
  kubectl gpunode approve h100-xid Drain
  kubectl gpunode approve h100-xid Drain reboot

Only rungs the node waits for are accepted (the error names those it does wait for). The
annotation keeps the rungs approved already, and the write carries the node's
resourceVersion, so an edit made meanwhile is read again, never overwritten.

Exit codes: 0 approved, 2 a rung the node does not wait for, 3 no such node or no policy
governs it, 4 forbidden or API error.";

const UNAPPROVE_AFTER: &str = "Examples:
  kubectl gpunode unapprove h100-xid Drain

Removes the rungs from the annotation gpunode.dev/approve and keeps the others (the annotation
goes when none is left). An action already taken stays: approval only starts one.

Exit codes: 0 withdrawn, 2 a rung that is not approved on the node, 3 no such node,
4 forbidden or API error.";

const CLOSE_BREAKER_AFTER: &str = "Examples:
  kubectl gpunode close-breaker h100-training

The breaker latches: once open it stays open until closed (spec.disruption.circuitBreaker.reset:
Automatic also closes it once the drifted nodes fall back under the threshold). This sets the
policy annotation gpunode.dev/close-breaker to the trip's status.circuitBreaker.openedAt, so an
annotation left behind cannot close a later trip. Drifts that began before the close do not open
it again; the queued disruptions then go ahead within the budget and the fleet cap.

Exit codes: 0 closing, 2 the breaker is closed, 3 no such policy, 4 forbidden or API error.";

/// The exit code table, for tests that check `--help` documents it.
#[cfg(test)]
pub fn exit_codes() -> &'static str {
    EXIT_CODES
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn the_command_line_is_consistent_and_documents_the_exit_codes() {
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains(exit_codes()), "{help}");
    }

    #[test]
    fn a_node_and_a_selector_together_are_refused() {
        let e = Cli::try_parse_from(["kubectl-gpunode", "gpus", "n", "-l", "a=b"]).err();
        assert!(e.is_some());
    }

    #[test]
    fn approve_needs_a_rung() {
        assert!(Cli::try_parse_from(["kubectl-gpunode", "approve", "n"]).is_err());
        assert!(Cli::try_parse_from(["kubectl-gpunode", "approve", "n", "Drain"]).is_ok());
    }
}
