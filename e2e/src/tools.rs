//! The binaries `e2e/cluster/build.sh` builds (helm, promtool, the control plane): a variable set
//! in the environment (`GPUNODE_HELM=/path`) wins, else the line `build.sh --print-env` prints
//! for it. `--print-env` runs once per test process.

use std::{collections::BTreeMap, path::PathBuf, process::Command, sync::OnceLock};

use crate::{Error, fixtures::repo_root};

/// The path `var` names (e.g. `GPUNODE_PROMTOOL`): from the environment, else from
/// `e2e/cluster/build.sh --print-env`.
pub fn built(var: &str) -> Result<PathBuf, Error> {
    if let Some(p) = std::env::var_os(var).filter(|p| !p.is_empty()) {
        return Ok(PathBuf::from(p));
    }
    let script = repo_root().join("e2e/cluster/build.sh");
    let env = print_env().as_ref().map_err(|e| Error::Unexpected(e.clone()))?;
    env.get(var)
        .map(PathBuf::from)
        .ok_or_else(|| Error::Unexpected(format!("{} --print-env names no {var}", script.display())))
}

/// promtool (Prometheus's rule checker and rule unit tester).
pub fn promtool() -> Result<PathBuf, Error> {
    built("GPUNODE_PROMTOOL")
}

/// `export NAME=value` lines of `build.sh --print-env`, by name.
fn print_env() -> &'static Result<BTreeMap<String, String>, String> {
    static ENV: OnceLock<Result<BTreeMap<String, String>, String>> = OnceLock::new();
    ENV.get_or_init(|| {
        let script = repo_root().join("e2e/cluster/build.sh");
        let out = Command::new(&script)
            .arg("--print-env")
            .output()
            .map_err(|e| format!("running {} --print-env: {e}", script.display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} --print-env failed (build the cluster binaries with `make cluster-build`): {}",
                script.display(),
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.strip_prefix("export ")?.split_once('='))
            .map(|(k, v)| {
                // printf %q quotes only paths with unusual characters; ours have none.
                let v = v.trim().trim_matches('"').trim_matches('\'');
                (k.to_string(), v.to_string())
            })
            .collect())
    })
}

/// Runs `cmd` and returns its stdout; a failure to start it, or an exit other than 0, is an error
/// naming `what` (e.g. `kubectl get nodes`) with its stderr.
pub fn stdout_of(cmd: &mut Command, what: &str) -> Result<String, Error> {
    let out = cmd
        .output()
        .map_err(|e| Error::Unexpected(format!("running {what}: {e}")))?;
    if !out.status.success() {
        return Err(Error::Unexpected(format!(
            "{what} failed ({}):\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}
