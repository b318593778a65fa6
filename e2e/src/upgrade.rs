//! The operator of an earlier commit, for the rolling-upgrade fault
//! (`e2e/tests/reliability_upgrade.rs`): `e2e/upgrade-from` names the commit; its source comes
//! from this repository's history (`git archive`, so a shallow clone cannot run it), built once
//! with that commit's own lock file into `~/.cache/gpunode/upgrade/<commit>/` and reused.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use crate::{Error, fixtures::repo_root, tools::stdout_of};

/// The file naming the commit, relative to the repository root.
pub const FROM_FILE: &str = "e2e/upgrade-from";

/// The commit `e2e/upgrade-from` names (its one line that is not a comment: 40 hex digits).
pub fn from_commit() -> Result<String, Error> {
    let path = repo_root().join(FROM_FILE);
    let text =
        std::fs::read_to_string(&path).map_err(|e| Error::Unexpected(format!("{}: {e}", path.display())))?;
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#'))
        .filter(|l| l.len() == 40 && l.chars().all(|c| c.is_ascii_hexdigit()))
        .map(str::to_string)
        .ok_or_else(|| Error::Unexpected(format!("{}: no commit (40 hex digits) named", path.display())))
}

fn cache_root() -> PathBuf {
    std::env::var_os("GPUNODE_CACHE")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/gpunode")))
        .unwrap_or_else(|| PathBuf::from(".cache/gpunode"))
}

/// The earlier commit's `gpunode-operator`, built on first use (minutes: a whole build).
pub fn previous_operator() -> Result<(String, PathBuf), Error> {
    let commit = from_commit()?;
    let dir = cache_root().join("upgrade").join(&commit);
    let bin = dir.join("gpunode-operator");
    if bin.exists() {
        return Ok((commit, bin));
    }
    let src = dir.join("src");
    let _ = std::fs::remove_dir_all(&src);
    std::fs::create_dir_all(&src).map_err(|e| Error::Unexpected(format!("{}: {e}", src.display())))?;
    unpack(&commit, &src)?;
    let target = cache_root().join("upgrade/target");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    stdout_of(
        Command::new(cargo)
            .current_dir(&src)
            .args(["build", "--locked", "-p", "gpunode-operator"])
            .env("CARGO_TARGET_DIR", &target),
        &format!("cargo build -p gpunode-operator at {commit}"),
    )?;
    let tmp = dir.join("gpunode-operator.tmp");
    std::fs::copy(target.join("debug/gpunode-operator"), &tmp)
        .and_then(|_| std::fs::rename(&tmp, &bin))
        .map_err(|e| Error::Unexpected(format!("{}: {e}", bin.display())))?;
    let _ = std::fs::remove_dir_all(&src);
    Ok((commit, bin))
}

/// Writes the tree of `commit` into `dir`.
fn unpack(commit: &str, dir: &Path) -> Result<(), Error> {
    let repo = repo_root();
    stdout_of(
        Command::new("git")
            .arg("-C")
            .arg(&repo)
            .args(["cat-file", "-e", &format!("{commit}^{{commit}}")]),
        &format!("git cat-file -e {commit} (the commit of {FROM_FILE} is not in this clone's history)"),
    )?;
    let script = "git -C \"$1\" archive --format=tar \"$2\" | tar -x -C \"$3\"";
    stdout_of(
        Command::new("sh")
            .args(["-c", script, "unpack"])
            .arg(&repo)
            .arg(commit)
            .arg(dir),
        &format!("git archive {commit} | tar -x"),
    )
    .map(drop)
}
