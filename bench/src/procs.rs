//! Processes measured from outside: peak and current RSS from /proc/<pid>/status, CPU seconds
//! from /proc/<pid>/stat. Their HTTP endpoints (/readyz, /metrics) and free ports come from
//! `gpunode_e2e::http`, the same as the e2e tests use.

use std::{
    path::{Path, PathBuf},
    process::Stdio,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde::{Deserialize, Serialize};
use tokio::process::{Child, Command};

use crate::error::Error;

/// Clock ticks per second of /proc/<pid>/stat (USER_HZ; 100 on every Linux architecture
/// the benchmark runs on, checked with `getconf CLK_TCK` at start-up).
pub fn clock_ticks() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// One reading of a process.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize)]
pub struct Sample {
    /// Resident set size now, MiB.
    pub rss_mib: f64,
    /// Peak resident set size so far (VmHWM), MiB.
    pub hwm_mib: f64,
    /// User + system CPU seconds so far.
    pub cpu_s: f64,
}

/// Reads `/proc/<pid>`; None once the process is gone.
pub fn sample(pid: u32, ticks: f64) -> Option<Sample> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kib = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which may contain spaces) start after the last ')'.
    let rest = stat.rsplit_once(')').map(|(_, r)| r)?;
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); utime is field 14, stime field 15.
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some(Sample {
        rss_mib: kib("VmRSS:") / 1024.0,
        hwm_mib: kib("VmHWM:") / 1024.0,
        cpu_s: (utime + stime) / ticks,
    })
}

/// A process started by the benchmark, sampled once a second.
pub struct Measured {
    /// What it is, for messages.
    pub name: String,
    child: Child,
    pid: u32,
    ticks: f64,
    /// (seconds since start, sample) once a second.
    pub timeline: Arc<Mutex<Vec<(f64, Sample)>>>,
    sampler: tokio::task::JoinHandle<()>,
}

impl Measured {
    /// Starts `program` with `args` and `env`, output written to `log`.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        env: &[(&str, String)],
        log: &Path,
    ) -> Result<Measured, Error> {
        let mut cmd = std::process::Command::new(program);
        cmd.args(args);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Measured::spawn_command(name, cmd, log)
    }

    /// Starts `cmd` (its program, arguments and environment as given), output written to `log`.
    pub fn spawn_command(name: &str, cmd: std::process::Command, log: &Path) -> Result<Measured, Error> {
        let out = std::fs::File::create(log).map_err(Error::io(format!("creating {}", log.display())))?;
        let err = out
            .try_clone()
            .map_err(Error::io(format!("opening {}", log.display())))?;
        let program = cmd.get_program().to_owned();
        let mut cmd = Command::from(cmd);
        cmd.stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .kill_on_drop(true);
        let child = cmd
            .spawn()
            .map_err(Error::io(format!("starting {}", program.display())))?;
        let pid = child
            .id()
            .ok_or_else(|| Error::Other(format!("{name} exited at once (log: {})", log.display())))?;
        let ticks = clock_ticks();
        let timeline: Arc<Mutex<Vec<(f64, Sample)>>> = Arc::default();
        let t = timeline.clone();
        let start = Instant::now();
        let sampler = tokio::spawn(async move {
            let mut every = tokio::time::interval(Duration::from_secs(1));
            loop {
                every.tick().await;
                let Some(s) = sample(pid, ticks) else { break };
                t.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push((start.elapsed().as_secs_f64(), s));
            }
        });
        Ok(Measured {
            name: name.to_string(),
            child,
            pid,
            ticks,
            timeline,
            sampler,
        })
    }

    /// The process id.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Completes when the process exits, with its status.
    pub async fn exited(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// A reading now (zeros if it has exited).
    pub fn now(&mut self) -> Result<Sample, Error> {
        if let Ok(Some(status)) = self.child.try_wait() {
            return Err(Error::Other(format!("{} exited: {status}", self.name)));
        }
        Ok(sample(self.pid, self.ticks).unwrap_or_default())
    }

    /// Stops it with SIGTERM (SIGKILL after 15 s) and returns the last reading before it went.
    pub async fn stop(mut self) -> Sample {
        let last = sample(self.pid, self.ticks).unwrap_or_default();
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        if tokio::time::timeout(Duration::from_secs(15), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
        self.sampler.abort();
        last
    }
}

/// The machine the benchmark runs on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model.
    pub cpu: String,
    /// Online CPUs.
    pub cores: usize,
    /// Memory, GiB.
    pub memory_gib: f64,
    /// Kernel release.
    pub kernel: String,
    /// Component versions (name → version line).
    pub versions: Vec<(String, String)>,
    /// Git commit of the code measured (with "-dirty" if the work tree differs).
    pub commit: String,
    /// When the run started (RFC 3339).
    pub started: String,
}

fn first_line(program: &Path, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .map(|o| {
            let mut s = String::from_utf8_lossy(&o.stdout).into_owned();
            s.push_str(&String::from_utf8_lossy(&o.stderr));
            s.lines().next().unwrap_or_default().trim().to_string()
        })
        .unwrap_or_else(|e| format!("unavailable: {e}"))
}

/// Describes this machine and the given binaries (name, path, version arguments).
pub fn machine(binaries: &[(String, PathBuf, Vec<String>)]) -> Machine {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|v| v.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown".to_string());
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let mem_kib: f64 = meminfo
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    let mut versions: Vec<(String, String)> = binaries
        .iter()
        .map(|(name, path, args)| {
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            (name.clone(), first_line(path, &args))
        })
        .collect();
    versions.push(("rustc".into(), first_line(Path::new("rustc"), &["--version"])));
    versions.push(("go".into(), first_line(Path::new("go"), &["version"])));
    Machine {
        cpu,
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        memory_gib: (mem_kib / 1024.0 / 1024.0 * 10.0).round() / 10.0,
        kernel,
        versions,
        commit: commit(),
        started: jiff::Timestamp::now().to_string(),
    }
}

/// The commit measured: `BENCH_COMMIT` (run.sh sets it when it builds a snapshot of HEAD),
/// else HEAD of the work tree, with "-dirty" when tracked files differ from it.
pub fn commit() -> String {
    if let Ok(c) = std::env::var("BENCH_COMMIT") {
        return c;
    }
    let mut commit = first_line(Path::new("git"), &["rev-parse", "--short=12", "HEAD"]);
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .map(|o| !o.stdout.is_empty())
        .unwrap_or(false);
    if dirty {
        commit.push_str("-dirty");
    }
    commit
}

/// The 1-minute load average.
pub fn load_avg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse().ok()))
        .unwrap_or(0.0)
}
