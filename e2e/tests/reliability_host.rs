//! Faults of an operator replica's host, with the replicas as real processes:
//! - a real network partition: the leader runs in its own network namespace and its link to the
//!   API server goes down at a seeded point of a held drain (packets dropped, connections hang,
//!   the process is never told); the follower takes over; when the link comes back the old leader
//!   must commit nothing and must not take the Lease back (`GPUNODE_REL_PARTITIONS` seeds);
//! - clock skew: a follower whose wall clock runs 20 s ahead of the leader's (more than the Lease
//!   duration) must not take over while the leader renews, and one 20 s ahead or behind must take
//!   over within the Lease duration once the leader dies (libfaketime, wall clock only, as NTP
//!   skew is);
//! - OOM: the leader is killed by the kernel under its cgroup memory limit mid-drain and
//!   restarted, as the kubelet restarts a container.
//!
//! After each, the wave's invariants (budget at every instant, no eviction repeated or after its
//! commit, a person's cordon, other controllers' markers, final markers) and who wrote when.

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_e2e::{
    audit,
    faults::{
        checks::Check,
        cluster::{self, FaultCluster},
        late,
        record::{self, Recorder, Run, Until},
        replica::{self, Launch, Operator},
        wave::{self, Wave, WaveSpec},
    },
    netns::Netns,
    remediator, wait,
};
use kube::{Api, Client, api::PostParams};
use serde_json::json;

const CLASS: &str = "operator host";
const DEADLINE: Duration = Duration::from_secs(120);
/// The skew, more than the Lease duration (15 s) so a wall clock alone would get it wrong.
const SKEW_SECS: i64 = 20;

fn partitions() -> u64 {
    std::env::var("GPUNODE_REL_PARTITIONS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
}

#[tokio::test]
async fn partitions_skewed_clocks_and_oom_kills_lose_and_repeat_nothing() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "host");
    for seed in 0..partitions() {
        network_partition(&fc, &client, &mut rec, seed).await;
    }
    clock_skew(&fc, &client, &mut rec, SKEW_SECS).await;
    clock_skew(&fc, &client, &mut rec, -SKEW_SECS).await;
    oom_kill(&fc, &client, &mut rec).await;
    rec.assert_clean();
}

async fn drain_started(wave: &Wave) {
    wave.drain_started(&[], DEADLINE).await.unwrap();
}

/// Writes by `user` received at or after `since`: all of them, and those the API server committed.
fn writes_since(fc: &FaultCluster, user: &str, since: jiff::Timestamp) -> (Vec<String>, usize) {
    let audit = fc.audit().unwrap();
    let late: Vec<&audit::AuditEvent> = audit
        .iter()
        .filter(|e| e.user == user && e.is_write() && e.at >= since)
        .collect();
    let committed = late.iter().filter(|e| e.succeeded()).count();
    (
        late.iter()
            .map(|e| {
                format!(
                    "{} {}/{} {} → {}",
                    e.verb, e.resource, e.subresource, e.name, e.code
                )
            })
            .collect(),
        committed,
    )
}

async fn network_partition(fc: &FaultCluster, client: &Client, rec: &mut Recorder, seed: u64) {
    let ns = format!("rel-net{seed}");
    // The remediation object among the late writes is a FakeReboot.
    remediator::install(client).await.unwrap();
    let target = cluster::apiserver_addr(fc).unwrap();
    let subnet = u8::try_from(10 + seed % 200).unwrap_or(10);
    let net = Netns::create(&format!("gpnrel{seed}"), subnet, target)
        .await
        .unwrap();
    let launch = Launch {
        prefix: net.prefix(),
        server: Some((format!("https://{}", net.addr), "localhost".into())),
        metrics_ip: Some(format!("10.250.{subnet}.2")),
        // Behind the chart's leader fence: a late request that reaches the API server after
        // the takeover is refused there, whatever the replica's own clock said when it left.
        fence: true,
        ..Launch::default()
    };
    let a = Operator::start_with(fc, client, &format!("rel-net{seed}-a"), &ns, launch)
        .await
        .unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let fenced = Launch {
        fence: true,
        ..Launch::default()
    };
    let b = Operator::start_with(fc, client, &format!("rel-net{seed}-b"), &ns, fenced)
        .await
        .unwrap();
    let mut spec = WaveSpec::drain(&format!("net{seed}"), 3, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    drain_started(&wave).await;
    // A seeded point of the held drain's retry cycle, possibly mid-request.
    let point = wave::mix(2000 + seed) % 5000;
    cluster::hold("partition point", Duration::from_millis(point))
        .await
        .unwrap();
    net.partition().unwrap();
    let cut = Instant::now();
    let acquired = b.wait_holding(client, DEADLINE).await.unwrap();
    let failover = record::elapsed_ms(cut);
    // What the cut-off leader could still send once its link returns: every kind of write, with
    // its own token, after the new leader acquired. The fence must refuse each (audit log).
    let targets = late::Targets::in_wave(&wave, &format!("rel-net{seed}-late"));
    let deposed = late::deposed_writes(fc, &a.client_as(fc).await.unwrap(), &a.user(), &targets, acquired)
        .await
        .unwrap();
    // The old leader stays cut off a little longer, then its link comes back: whatever it had
    // queued in its sockets now reaches the API server.
    cluster::hold("partition after the failover", Duration::from_secs(3))
        .await
        .unwrap();
    net.heal().unwrap();
    cluster::hold("old leader reconnected", Duration::from_secs(8))
        .await
        .unwrap();
    let holder_after = replica::lease(client, &ns).await.map(|(h, _)| h);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE).await.unwrap();
    let mut checks = wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap();
    checks.extend(deposed);
    let (late, committed) = writes_since(fc, &a.user(), acquired);
    checks.push(Check::new(
        "old leader committed nothing after the new one acquired the Lease",
        committed == 0,
        format!("{committed} committed of its late requests {late:?}"),
    ));
    checks.push(Check::new(
        "old leader did not take the Lease back when the link returned",
        holder_after.as_deref() == Some(b.identity.as_str()),
        format!("holder {holder_after:?}"),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: "leader's network partitioned (netns link down) at a seeded point of a held drain".into(),
        seed: Some(seed),
        checks,
        recovery: Some(Until::Leading.after(failover)),
    })
    .unwrap();
    wave.cleanup().await;
    drop((a, b, net));
}

async fn clock_skew(fc: &FaultCluster, client: &Client, rec: &mut Recorder, skew: i64) {
    let tag = if skew > 0 { "ahead of" } else { "behind" };
    let short = if skew > 0 { "ahead" } else { "behind" };
    let ns = format!("rel-skew-{short}");
    let a = Operator::start(fc, client, &format!("rel-skew-{short}-a"), &ns)
        .await
        .unwrap();
    a.wait_leading(DEADLINE).await.unwrap();
    let since = jiff::Timestamp::now();
    let launch = Launch {
        env: gpunode_e2e::faults::clock::skewed(skew).unwrap(),
        ..Launch::default()
    };
    let mut b = Operator::start_with(fc, client, &format!("rel-skew-{short}-b"), &ns, launch)
        .await
        .unwrap();
    // One wave for the leader, one for the skewed follower once it has taken over.
    let wave = Wave::setup(client, &WaveSpec::drain(&format!("skew{short}"), 3, 2))
        .await
        .unwrap();
    let later = Wave::setup(client, &WaveSpec::drain(&format!("skew{short}b"), 3, 2))
        .await
        .unwrap();
    let (monitor, later_monitor) = (wave.monitor(), later.monitor());
    for w in [&wave, &later] {
        w.wait_all("compliant", DEADLINE).await.unwrap();
    }
    // A whole wave under the leader while the skewed follower watches the Lease for longer than
    // its duration.
    wave.drift_all().await.unwrap();
    wave.drive(DEADLINE).await.unwrap();
    let watched = jiff::Timestamp::now().duration_since(since);
    if watched.as_secs() < 20 {
        cluster::hold(
            "the follower watching the Lease",
            Duration::from_secs(u64::try_from(20 - watched.as_secs()).unwrap_or(0)),
        )
        .await
        .unwrap();
    }
    let (early, _) = writes_since(fc, &b.user(), since);
    let holder = replica::lease(client, &ns).await.map(|(h, _)| h);
    // The leader dies; the skewed follower must take over.
    let mut a = a;
    a.kill();
    let killed = Instant::now();
    b.wait_holding(client, DEADLINE).await.unwrap();
    let takeover = record::elapsed_ms(killed);
    // The skew really applied: the follower stamped its acquisition with its own wall clock.
    let acquired = replica::lease(client, &ns).await.map(|(_, at)| at);
    let stamped = acquired.map(|at| at.duration_since(jiff::Timestamp::now()).as_secs_f64());
    b.wait_leading(DEADLINE).await.unwrap();
    // Work for the new leader: a wave of its own, carried through with its clock.
    later.drift_all().await.unwrap();
    later.drive(DEADLINE).await.unwrap();
    let mut checks = wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap();
    checks.extend(
        later
            .run_checks(fc, &later_monitor, 1, &later.all_pods())
            .await
            .unwrap(),
    );
    checks.push(Check::new(
        "a skewed follower wrote nothing while the leader renewed",
        early.is_empty() && holder.as_deref() == Some(a.identity.as_str()),
        format!(
            "holder {holder:?} after {} s; follower's writes {early:?}",
            jiff::Timestamp::now().duration_since(since).as_secs()
        ),
    ));
    checks.push(Check::new(
        "the follower's wall clock was skewed (its Lease acquireTime)",
        stamped.is_some_and(|d| (d - skew as f64).abs() <= 3.0),
        format!("acquireTime minus the real time at takeover: {stamped:?} s, skew {skew:+} s"),
    ));
    // The Lease duration by the follower's own monotonic clock, a retry, and a margin for a
    // loaded machine: the skew must add nothing.
    let bound = 15_000 + 2_000 + 5_000;
    checks.push(Check::new(
        "the skewed follower took over after the leader died",
        takeover <= bound && b.alive(),
        format!("took over {takeover} ms after the kill (bound {bound} ms)"),
    ));
    rec.push(Run {
        class: CLASS.into(),
        fault: format!(
            "follower's wall clock {} s {tag} the leader's, then the leader killed",
            skew.unsigned_abs()
        ),
        seed: None,
        checks,
        recovery: Some(Until::Leading.after(takeover)),
    })
    .unwrap();
    wave.cleanup().await;
    later.cleanup().await;
}

/// A memory cgroup (v1 or v2) for one process, removed on drop.
struct MemoryCgroup {
    dir: std::path::PathBuf,
    v2: bool,
}

impl MemoryCgroup {
    fn create(name: &str) -> Result<MemoryCgroup, String> {
        let v1 = std::path::Path::new("/sys/fs/cgroup/memory");
        let (dir, v2) = if v1.is_dir() {
            (v1.join(name), false)
        } else {
            (std::path::Path::new("/sys/fs/cgroup").join(name), true)
        };
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        Ok(MemoryCgroup { dir, v2 })
    }

    fn write(&self, file: &str, value: &str) -> Result<(), String> {
        std::fs::write(self.dir.join(file), value).map_err(|e| format!("{file} = {value}: {e}"))
    }

    fn read(&self, file: &str) -> String {
        std::fs::read_to_string(self.dir.join(file)).unwrap_or_default()
    }

    /// Moves `pid` in. Under v1 the memory it already uses stays charged where it was unless
    /// the kernel still supports moving charges (recent ones refuse), so the limit then bounds
    /// what it allocates from now on.
    fn add(&self, pid: u32) -> Result<(), String> {
        if !self.v2 {
            let _ = self.write("memory.move_charge_at_immigrate", "3");
        }
        self.write("cgroup.procs", &pid.to_string())
    }

    fn usage(&self) -> u64 {
        let f = if self.v2 {
            "memory.current"
        } else {
            "memory.usage_in_bytes"
        };
        self.read(f).trim().parse().unwrap_or(0)
    }

    fn limit(&self, bytes: u64) -> Result<(), String> {
        let f = if self.v2 {
            "memory.max"
        } else {
            "memory.limit_in_bytes"
        };
        self.write(f, &bytes.to_string())
    }

    /// OOM kills in this cgroup so far.
    fn oom_kills(&self) -> u64 {
        let f = if self.v2 {
            "memory.events"
        } else {
            "memory.oom_control"
        };
        self.read(f)
            .lines()
            .find_map(|l| l.strip_prefix("oom_kill "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0)
    }
}

impl Drop for MemoryCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

async fn oom_kill(fc: &FaultCluster, client: &Client, rec: &mut Recorder) {
    let ns = "rel-oom";
    let mut op = Operator::start(fc, client, "rel-oom", ns).await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let mut spec = WaveSpec::drain("oom", 3, 2);
    spec.pdb = true;
    let wave = Wave::setup(client, &spec).await.unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();
    wave.drift_all().await.unwrap();
    drain_started(&wave).await;
    let cg = MemoryCgroup::create(&format!("gpunode-rel-oom-{}", std::process::id())).unwrap();
    cg.add(op.pid().unwrap_or(0)).unwrap();
    // The limit sits just above what it uses now; the cluster then grows by nodes it caches
    // (each with 8 KiB of annotations), so its memory must grow past the limit.
    let usage = cg.usage();
    cg.limit(usage + (1 << 20)).unwrap();
    let filler_names: Vec<String> = (0..300).map(|i| format!("{}-fill{i}", wave.id)).collect();
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let pad = "x".repeat(8192);
    let grow = async {
        for name in &filler_names {
            let node = serde_json::from_value(json!({
                "apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {wave::FILLER_LABEL: "true"},
                             "annotations": {"rel.gpunode.test/pad": pad}},
            }))
            .unwrap();
            let _ = nodes.create(&PostParams::default(), &node).await;
        }
    };
    let oom = async {
        wait::until("the kernel to OOM-kill the operator", DEADLINE, || async {
            Ok((cg.oom_kills() > 0).then_some(()))
        })
        .await
    };
    let (_, killed) = tokio::join!(grow, oom);
    let killed_ok = killed.is_ok();
    let status = {
        let exiting = std::sync::Mutex::new(&mut op);
        wait::until("the OOM-killed process to exit", DEADLINE, || async {
            Ok(exiting
                .lock()
                .map_err(|_| gpunode_e2e::Error::Unexpected("poisoned".into()))?
                .exited())
        })
        .await
    };
    let detail = format!(
        "limit 1 MiB above the {:.1} MiB charged to its cgroup; oom_kill {}; exit {status:?}",
        usage as f64 / f64::from(1 << 20),
        cg.oom_kills()
    );
    drop(cg);
    // The kubelet restarts the container (same pod name, its own Lease back at once).
    op.spawn().unwrap();
    let restarted = Instant::now();
    op.wait_leading(DEADLINE).await.unwrap();
    let recovery = record::elapsed_ms(restarted);
    wave.release_pdb().await.unwrap();
    wave.drive(DEADLINE).await.unwrap();
    let mut checks = vec![Check::new(
        "the kernel OOM-killed the operator mid-drain",
        killed_ok,
        detail,
    )];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: "leader OOM-killed under its memory limit mid-drain, restarted".into(),
        seed: None,
        checks,
        recovery: Some(Until::Leading.after(recovery)),
    })
    .unwrap();
    for name in &filler_names {
        let _ = nodes.delete(name, &Default::default()).await;
    }
    wave.cleanup().await;
}
