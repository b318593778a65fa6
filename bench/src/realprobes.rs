//! Reaction as users live it: real `gpunode-probe` processes (release build, the fake NVML
//! library, the chart's probe ServiceAccount with its own-node admission policy, default
//! intervals) on some of the benchmark's nodes, beside the load-generated fleet. An XID is
//! injected through the fake NVML (it reaches the probe's event set as a real one would); the
//! probe's woken observation, its report, the operator's pass and the taint follow. Timed from
//! the probe's own log line for that observation (`observed reason="xid"`, microseconds, this
//! machine's clock) to the benchmark's node watch seeing the taint. Then the node "reboots": the
//! probe is restarted on a new boot id with a healthy fixture, the fatal XID belongs to the old
//! boot, its first report is clean and the taint goes.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use gpunode_e2e::probe::{Host, Probe};
use jiff::Timestamp;
use kube::Client;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::error::Error;
use crate::procs;
use crate::results::Latency;
use crate::tracker::Tracker;

/// How far apart the probes' injections of one round are spread.
const STAGGER: Duration = Duration::from_secs(3);
/// The XID injected: 79, the GPU has fallen off the bus (fatal in every policy).
const XID: u32 = 79;
/// nvmlEventTypeXidCriticalError.
const XID_EVENT: u32 = 8;
/// The first boot; the k-th reboot starts `boot-k`.
const BOOT0: &str = "boot-0";
/// The probe's shortest gap between report writes (`PublishConfig::min_gap`, not a flag).
const MIN_GAP: Duration = Duration::from_secs(1);
/// How long a probe has run before its node gets an XID: a fault arrives on a node in service,
/// not on one that booted a second ago. It also paces the other probes' reboots (a process start,
/// a new TLS connection, a policy list-watch, a first report and the operator's untaint each):
/// injected a second after each reboot, 16 probes rebooted about ten times a second and the
/// XIDs were timed in that storm, not beside a fleet in service.
const IN_SERVICE: Duration = Duration::from_secs(5);
/// The probes log their observations (debug) as JSON lines.
const PROBE_LOG: &str = "info,gpunode_probe::publish=debug";

/// Real probes, one per node.
pub struct RealProbes {
    hosts: Vec<Host>,
    probes: Vec<Probe>,
    /// Where each probe's log is kept (`<node>.log`, every boot's in turn), to explain a slow
    /// sample.
    logs: PathBuf,
}

/// Appends a probe's log to `<dir>/<node>.log` (best effort: the figures are taken already).
fn keep_log(dir: &Path, node: &str, probe: &Probe) {
    use std::io::Write;
    let path = dir.join(format!("{node}.log"));
    let kept = std::fs::create_dir_all(dir).and_then(|()| {
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)?;
        probe.lines().iter().try_for_each(|l| writeln!(f, "{l}"))
    });
    if let Err(e) = kept {
        warn!(node, error = %e, "keeping a real probe's log");
    }
}

pub use crate::results::Measured;

/// The timestamp of a JSON log line whose message is `message` (and, if given, whose reason is
/// `reason`).
fn stamped(line: &str, message: &str, reason: Option<&str>) -> Option<Timestamp> {
    let v: Value = serde_json::from_str(line).ok()?;
    let fields = v.get("fields")?;
    if fields.get("message")?.as_str()? != message {
        return None;
    }
    if let Some(reason) = reason
        && fields.get("reason")?.as_str()? != reason
    {
        return None;
    }
    v.get("timestamp")?.as_str()?.parse().ok()
}

/// The first such line at or after `after`.
fn first_after(lines: &[String], after: Timestamp, message: &str, reason: Option<&str>) -> Option<Timestamp> {
    lines
        .iter()
        .find_map(|line| stamped(line, message, reason).filter(|at| *at >= after))
}

/// The probe's observation of an XID (`observed reason="xid"`) at or after `after`.
fn xid_observation(lines: &[String], after: Timestamp) -> Option<Timestamp> {
    first_after(lines, after, "observed", Some("xid"))
}

/// The first report write (`published`) at or after `after`.
fn publish_after(lines: &[String], after: Timestamp) -> Option<Timestamp> {
    first_after(lines, after, "published", None)
}

/// The probe's last report write (`published`).
fn last_publish(lines: &[String]) -> Option<Timestamp> {
    lines
        .iter()
        .rev()
        .find_map(|line| stamped(line, "published", None))
}

/// Waits until the probe has run [`IN_SERVICE`] since `up` and its last report write is
/// `MIN_GAP` old (at most 5 s more): the probe writes its report at most once a second
/// (`min_gap`, the XID-storm bound), so an XID in the second after a write waits for that bound
/// by design. The benchmark times an XID on a quiet probe in service, as a fault on a healthy
/// node arrives.
async fn quiet(probe: &Probe, up: Instant) {
    tokio::time::sleep_until((up + IN_SERVICE).into()).await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        let since = last_publish(&probe.lines()).map(|t| ms(t, Timestamp::now()));
        if since.is_none_or(|ms| ms >= MIN_GAP.as_secs_f64() * 1000.0) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await; // poll interval
    }
}

/// Probe `i`'s wait before its injection `k`: spread over `STAGGER`, a different place each
/// round (a multiplicative hash of the two), the same in every run.
fn offset(i: usize, k: usize) -> Duration {
    let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (k as u64).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    let spread = STAGGER.as_millis() as u64;
    Duration::from_millis((h >> 32) % spread.max(1))
}

fn ms(from: Timestamp, to: Timestamp) -> f64 {
    (to.as_nanosecond() - from.as_nanosecond()) as f64 / 1e6
}

impl RealProbes {
    /// Starts a probe for each of `names` (their reports are written within a second); their
    /// logs are kept under `logs`.
    pub async fn start(admin: &Client, names: &[String], logs: &Path) -> Result<RealProbes, Error> {
        // A fresh directory: the logs are appended to, boot after boot.
        let _ = std::fs::remove_dir_all(logs);
        let (mut hosts, mut probes) = (Vec::new(), Vec::new());
        for name in names {
            let host = Host::prepare(admin, name).await?;
            let probe = host.start_probe_at_defaults(
                BOOT0,
                &[OsStr::new("--log-format"), OsStr::new("json")],
                PROBE_LOG,
            )?;
            hosts.push(host);
            probes.push(probe);
        }
        info!(probes = probes.len(), "real probes started");
        Ok(RealProbes {
            hosts,
            probes,
            logs: logs.to_path_buf(),
        })
    }

    /// CPU seconds and peak RSS of each probe now.
    pub fn sample(&self) -> Vec<procs::Sample> {
        let ticks = procs::clock_ticks();
        self.probes
            .iter()
            .map(|p| procs::sample(p.pid(), ticks).unwrap_or_default())
            .collect()
    }

    /// `rounds` XIDs per probe, the probes in parallel.
    pub async fn reaction(&mut self, tracker: &Tracker, rounds: usize) -> Measured {
        let count = self.hosts.len();
        let probes = std::mem::take(&mut self.probes);
        let logs = &self.logs;
        let runs = self.hosts.iter().zip(probes).enumerate().map(|(i, (host, mut probe))| async move {
            let (mut obs, mut inj, mut failed) = (Vec::new(), Vec::new(), 0usize);
            let (mut to_pub, mut pub_to) = (Vec::new(), Vec::new());
            let mut up = Instant::now();
            for k in 0..rounds {
                let name = host.node.clone();
                quiet(&probe, up).await;
                // Out of step: the probes would otherwise inject together, round after round,
                // and their samples be a few bursts rather than independent faults.
                tokio::time::sleep(offset(i, k)).await;
                let (t_inject, i_inject) = (Timestamp::now(), Instant::now());
                let id = 1000 + k as u64;
                if let Err(e) = host.edit_fixture(|f| {
                    f["devices"][0]["events"] = json!([{"id": id, "type": XID_EVENT, "xid": XID}]);
                }) {
                    warn!(node = %name, error = %e, "injecting an XID");
                    failed += 1;
                    continue;
                }
                let tainted = tracker
                    .wait("taint after an XID", Duration::from_secs(60), |s| {
                        s.nodes
                            .get(&name)
                            .filter(|e| e.tainted && e.taint_changed_at > i_inject)
                            .map(|e| e.taint_changed_wall)
                    })
                    .await;
                let lines = probe.lines();
                match (tainted, xid_observation(&lines, t_inject)) {
                    (Ok(t), Some(seen)) => {
                        obs.push(ms(seen, t));
                        inj.push(ms(t_inject, t));
                        if let Some(written) = publish_after(&lines, seen).filter(|w| *w <= t) {
                            to_pub.push(ms(seen, written));
                            pub_to.push(ms(written, t));
                        }
                    }
                    (t, seen) => {
                        warn!(node = %name, taint = ?t.err(), observed = ?seen, "an XID did not end in a taint");
                        failed += 1;
                    }
                }
                // A reboot: every process starts again, the probe too, on a new boot id with
                // healthy GPUs; the fatal XID belonged to the old boot, and the taint goes.
                let reboot = Instant::now();
                keep_log(logs, &name, &probe);
                let _ = probe.kill();
                let (was, boot) = (format!("boot-{k}"), format!("boot-{}", k + 1));
                let restarted = host.reboot(&was, &boot).and_then(|()| {
                    host.start_probe_at_defaults(
                        &boot,
                        &[OsStr::new("--log-format"), OsStr::new("json")],
                        PROBE_LOG,
                    )
                });
                up = Instant::now();
                probe = match restarted {
                    Ok(p) => p,
                    Err(e) => {
                        warn!(node = %name, error = %e, "rebooting");
                        return (obs, inj, to_pub, pub_to, failed + 1, None);
                    }
                };
                let cleared = tracker
                    .wait("taint gone after a reboot", Duration::from_secs(60), |s| {
                        s.nodes
                            .get(&name)
                            .filter(|e| !e.tainted && e.taint_changed_at > reboot)
                            .map(|_| ())
                    })
                    .await;
                if cleared.is_err() {
                    warn!(node = %name, "the taint stayed after a reboot");
                    failed += 1;
                    break;
                }
            }
            keep_log(logs, &host.node, &probe);
            (obs, inj, to_pub, pub_to, failed, Some(probe))
        });
        let mut m = Measured {
            probes: count,
            ..Measured::default()
        };
        let (mut obs, mut inj, mut to_pub, mut pub_to) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (o, i, tp, pt, f, probe) in futures::future::join_all(runs).await {
            obs.extend(o);
            inj.extend(i);
            to_pub.extend(tp);
            pub_to.extend(pt);
            m.failures += f;
            self.probes.extend(probe);
        }
        m.observation_to_taint = Latency::of(&obs);
        m.injection_to_taint = Latency::of(&inj);
        m.observation_to_publish = Latency::of(&to_pub);
        m.publish_to_taint = Latency::of(&pub_to);
        m
    }

    /// Kills the probes and removes their files and pods.
    pub async fn stop(self, admin: &Client) {
        for p in self.probes {
            let _ = p.kill();
        }
        for h in &self.hosts {
            h.cleanup(admin).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::offset;

    #[test]
    fn the_probes_inject_out_of_step() {
        let round: Vec<_> = (0..16).map(|i| offset(i, 3)).collect();
        let distinct: std::collections::BTreeSet<_> = round.iter().collect();
        assert!(distinct.len() >= 12, "{round:?}");
        assert!(round.iter().all(|d| *d < super::STAGGER), "{round:?}");
        assert_ne!(offset(5, 0), offset(5, 1));
    }

    use super::*;

    #[test]
    fn the_last_write_is_the_last_published_line() {
        let lines = [
            r#"{"timestamp":"2026-12-02T10:00:00.100000Z","fields":{"message":"published","reason":"first observation"}}"#,
            r#"{"timestamp":"2026-12-02T10:00:03Z","fields":{"message":"observed","reason":"interval"}}"#,
        ]
        .map(String::from);
        assert_eq!(
            last_publish(&lines),
            Some("2026-12-02T10:00:00.1Z".parse().unwrap())
        );
        assert_eq!(last_publish(&[]), None);
    }

    #[test]
    fn the_write_of_an_observation_is_the_first_published_line_after_it() {
        let lines = [
            r#"{"timestamp":"2026-12-02T10:00:00.100000Z","fields":{"message":"published","reason":"interval"}}"#,
            r#"{"timestamp":"2026-12-02T10:00:01.000000Z","fields":{"message":"observed","reason":"xid"}}"#,
            r#"{"timestamp":"2026-12-02T10:00:01.040000Z","fields":{"message":"published","reason":"xid"}}"#,
        ]
        .map(String::from);
        let seen: Timestamp = "2026-12-02T10:00:01Z".parse().unwrap();
        assert_eq!(
            publish_after(&lines, seen),
            Some("2026-12-02T10:00:01.04Z".parse().unwrap())
        );
        assert_eq!(
            publish_after(&lines, "2026-12-02T10:00:02Z".parse().unwrap()),
            None
        );
    }

    #[test]
    fn the_observation_is_the_first_xid_line_after_the_injection() {
        let lines = [
            r#"{"timestamp":"2026-12-02T10:00:00.100000Z","level":"DEBUG","fields":{"message":"observed","reason":"xid"}}"#,
            r#"{"timestamp":"2026-12-02T10:00:01.000000Z","level":"DEBUG","fields":{"message":"observed","reason":"interval"}}"#,
            "not json",
            r#"{"timestamp":"2026-12-02T10:00:01.250000Z","level":"DEBUG","fields":{"message":"observed","reason":"xid"}}"#,
        ]
        .map(String::from);
        let after: Timestamp = "2026-12-02T10:00:00.500Z".parse().unwrap();
        let seen = xid_observation(&lines, after).unwrap();
        assert_eq!(seen, "2026-12-02T10:00:01.25Z".parse::<Timestamp>().unwrap());
        assert!((ms(after, seen) - 750.0).abs() < 1e-6);
        let late: Timestamp = "2026-12-02T10:00:02Z".parse().unwrap();
        assert!(xid_observation(&lines, late).is_none());
    }
}
