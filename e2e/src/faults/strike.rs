//! A leader interrupted between the two writes of one action (a crash point,
//! operator/src/crash.rs), in one of three ways ([`Strike`]):
//! - **crash**: it aborts there and is started again without the point (a container restart);
//! - **partition**: it runs in a network namespace behind the chart's leader fence; its action
//!   is held at the point (`GPUNODE_CRASH_ACTION=hold`, the rest of the process runs on), its
//!   link is cut, the action released (its next write goes nowhere), a fenced follower takes the
//!   Lease over and finishes the action; the link comes back a few seconds later, and whatever
//!   the cut-off leader still sends is refused;
//! - **API outage**: its action is held at the point, the API server is stopped, the action
//!   released (its next write fails), and the API server comes back after [`OUTAGE`]: the same
//!   process carries on.
//!
//! [`Interrupted`] starts the replicas for a strike, applies it and checks that it applied
//! (the action held at the point, the link or the API server really down), and afterwards
//! that the cut-off leader committed nothing once deposed. Without a point, the strike lands
//! when the test applies it (a maintenance window or an approval pending).

use std::time::{Duration, Instant};

use kube::Client;

use super::{
    checks::Check,
    cluster::{self, FaultCluster, Restore},
    crash::{crashed_at, restart_unarmed},
    record::{self, Recovery, Until},
    replica::{self, Launch, Operator},
};
use crate::{Error, netns::Netns, wait};

/// How long the API server stays down in an [`Strike::ApiOutage`]: past the Lease's duration
/// (15 s), so the leader loses it too and must take it back before it may finish the action.
pub const OUTAGE: Duration = Duration::from_secs(20);
/// How long the cut-off leader stays cut off after the follower took over.
const CUT_AFTER_TAKEOVER: Duration = Duration::from_secs(3);
/// The partitioned leaders' subnets, `10.250.<n>.0/30` from here on, one per partition of this
/// process in turn (the host suite's partitions use 10–209).
const SUBNETS: u8 = 230;
/// Partitions made by this process: each gets a namespace and subnet of its own. With one name
/// reused at once after the last run's namespace was deleted, a leader once lost its link
/// seconds after it started, no partition applied (not explained further).
static PARTITIONS: std::sync::atomic::AtomicU8 = std::sync::atomic::AtomicU8::new(0);

/// How the leader is interrupted at its crash point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Strike {
    /// Aborted there, restarted.
    Crash,
    /// Held there, its network cut; a fenced follower takes over.
    Partition,
    /// Held there, the API server stopped for [`OUTAGE`].
    ApiOutage,
}

impl Strike {
    /// Every strike, in the order a scenario runs them.
    pub const ALL: [Strike; 3] = [Strike::Crash, Strike::Partition, Strike::ApiOutage];

    /// The fault class of docs/reliability.md its runs belong to (the class names one recovery
    /// definition: [`Strike::until`]).
    pub fn class(self) -> &'static str {
        match self {
            Strike::Crash => "crash point",
            Strike::Partition => "operator host",
            Strike::ApiOutage => "control plane",
        }
    }

    /// What its recovery is measured until: a replica leads (crash, partition), or the API
    /// server received the leader's next write (outage).
    pub fn until(self) -> Until {
        match self {
            Strike::Crash | Strike::Partition => Until::Leading,
            Strike::ApiOutage => Until::Acting,
        }
    }

    /// The fault as a row of the table names it: `point` of `action`.
    pub fn fault(self, point: &str, action: &str) -> String {
        match self {
            Strike::Crash => format!("leader crashed at {point} ({action}), restarted"),
            Strike::Partition => format!(
                "leader's network cut (netns link down) at {point} ({action}); a fenced follower took over"
            ),
            Strike::ApiOutage => format!(
                "kube-apiserver stopped {} s with the leader at {point} ({action})",
                OUTAGE.as_secs()
            ),
        }
    }

    /// A short tag for names (nodes, waves).
    pub fn tag(self) -> &'static str {
        match self {
            Strike::Crash => "",
            Strike::Partition => "n",
            Strike::ApiOutage => "o",
        }
    }
}

/// The replicas of one strike: the armed leader, and for a partition its namespace and the
/// fenced follower.
pub struct Interrupted {
    strike: Strike,
    point: Option<String>,
    /// The file whose creation releases the held action.
    release: std::path::PathBuf,
    armed: Operator,
    /// Where this incarnation's lines start in the armed replica's log (shared by every process
    /// of its identity).
    log_from: usize,
    follower: Option<Operator>,
    net: Option<Netns>,
    /// When the follower acquired the Lease (a partition).
    acquired: Option<jiff::Timestamp>,
    /// When the leader was surely cut off (the link down, the API server's process gone) and
    /// when that was over (the follower acquired, the API server started again).
    span: (Option<jiff::Timestamp>, Option<jiff::Timestamp>),
}

impl Interrupted {
    /// Starts replica `identity` (Lease namespace `namespace`) with `point` (if any) armed for
    /// `strike` and `env` added; a partition's leader is waited for until it leads. A partition's replicas are `<identity>-a` (in
    /// its network namespace) and `<identity>-b`, both fenced, with their Lease in
    /// `<namespace>-net` (fenced identities of their own: a fence outlives its run).
    pub async fn start(
        fc: &FaultCluster,
        admin: &Client,
        strike: Strike,
        (identity, namespace): (&str, &str),
        point: Option<&str>,
        env: &[(&str, String)],
    ) -> Result<Interrupted, Error> {
        let action = if strike == Strike::Crash { "abort" } else { "hold" };
        let release = fc.dir.join(format!(
            "release-{}-{:06x}",
            identity,
            crate::scratch::rand_suffix()
        ));
        let mut launch = Launch::default();
        if let Some(point) = point {
            launch.env.extend([
                (gpunode_operator::crash::ENV.to_string(), point.to_string()),
                (
                    gpunode_operator::crash::ACTION_ENV.to_string(),
                    action.to_string(),
                ),
                (
                    gpunode_operator::crash::RELEASE_ENV.to_string(),
                    release.display().to_string(),
                ),
            ]);
        }
        launch
            .env
            .extend(env.iter().map(|(k, v)| (k.to_string(), v.clone())));
        let (mut net, mut follower) = (None, None);
        let armed = if strike == Strike::Partition {
            let n = PARTITIONS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % 20;
            let subnet = SUBNETS + n;
            let ns = Netns::create(&format!("gpnstrike{n}"), subnet, cluster::apiserver_addr(fc)?).await?;
            let lease_ns = format!("{namespace}-net");
            launch.prefix = ns.prefix();
            launch.server = Some((format!("https://{}", ns.addr), "localhost".into()));
            launch.metrics_ip = Some(format!("10.250.{subnet}.2"));
            launch.fence = true;
            net = Some(ns);
            let a = Operator::start_with(fc, admin, &format!("{identity}-a"), &lease_ns, launch).await?;
            a.wait_leading(Duration::from_secs(120)).await?;
            let fenced = Launch {
                fence: true,
                env: env.iter().map(|(k, v)| (k.to_string(), v.clone())).collect(),
                ..Launch::default()
            };
            follower =
                Some(Operator::start_with(fc, admin, &format!("{identity}-b"), &lease_ns, fenced).await?);
            a
        } else {
            Operator::start_with(fc, admin, identity, namespace, launch).await?
        };
        Ok(Interrupted {
            strike,
            point: point.map(str::to_string),
            release,
            log_from: armed.log_text().len(),
            armed,
            follower,
            net,
            acquired: None,
            span: (None, None),
        })
    }

    /// Waits until the leader reaches its point (if any) and applies the strike; returns the
    /// checks that it applied and the recovery time.
    pub async fn strike(
        &mut self,
        fc: &FaultCluster,
        admin: &Client,
        timeout: Duration,
    ) -> (Vec<Check>, Recovery) {
        let mut checks = Vec::new();
        if self.strike == Strike::Crash {
            match &self.point {
                Some(point) => checks.push(crashed_at(&mut self.armed, point, timeout).await),
                None => self.armed.kill(),
            }
            let restarted = restart_unarmed(&mut self.armed, timeout)
                .await
                .unwrap_or(u64::MAX);
            return (checks, self.strike.until().after(restarted));
        }
        if let Some(point) = &self.point {
            let held = self.held(point, timeout).await;
            checks.push(Check::new(
                &format!("the leader's action held at {point}"),
                held.is_ok(),
                format!("{held:?}"),
            ));
        }
        let recovery = match self.strike {
            Strike::Partition => self.partition(fc, admin, timeout, &mut checks).await,
            _ => self.outage(fc, admin, timeout, &mut checks).await,
        };
        (checks, recovery)
    }

    /// Lets the held action go on.
    fn let_go(&self) -> Result<(), Error> {
        std::fs::write(&self.release, b"")
            .map_err(|e| Error::Unexpected(format!("{}: {e}", self.release.display())))
    }

    /// Waits until the armed leader logged that its action is held at its point.
    async fn held(&self, point: &str, timeout: Duration) -> Result<(), Error> {
        let line = format!("gpunode crash point {point} reached: holding");
        wait::until(
            &format!("the leader's action to be held at {point}"),
            timeout,
            || async {
                let log = self.armed.log_text();
                let ours = log.get(self.log_from..).unwrap_or_default();
                Ok(ours.contains(&line).then_some(()))
            },
        )
        .await
    }

    /// Cuts the leader's link, releases its held action, waits for the follower to take over, and
    /// restores the link [`CUT_AFTER_TAKEOVER`] later. Recovery: the cut → the follower holds.
    async fn partition(
        &mut self,
        fc: &FaultCluster,
        admin: &Client,
        timeout: Duration,
        checks: &mut Vec<Check>,
    ) -> Recovery {
        let (Some(net), Some(follower)) = (&self.net, &self.follower) else {
            checks.push(Check::new(
                "a partition has its namespace and follower",
                false,
                "none",
            ));
            return self.strike.until().after(u64::MAX);
        };
        let cut_ok = net.partition();
        let cut_at = jiff::Timestamp::now();
        self.span.0 = Some(cut_at);
        let cut = Instant::now();
        let released = self.let_go();
        let acquired = follower.wait_holding(admin, timeout).await;
        let failover = record::elapsed_ms(cut);
        let _ = cluster::hold("the cut-off leader still cut off", CUT_AFTER_TAKEOVER).await;
        let healed_at = jiff::Timestamp::now();
        let healed = net.heal();
        // Requests sent before the cut may still be received just after it.
        let quiet_from = cut_at + jiff::SignedDuration::from_millis(500);
        let user = self.armed.user();
        let reached: Vec<String> = fc
            .audit()
            .unwrap_or_default()
            .iter()
            .filter(|e| e.user == user && e.at >= quiet_from && e.at < healed_at)
            .map(|e| format!("{} {} at {}", e.verb, e.resource, e.at))
            .collect();
        checks.push(Check::new(
            "the link was down: nothing of the cut-off leader reached the API server until it came back",
            cut_ok.is_ok() && released.is_ok() && healed.is_ok() && reached.is_empty(),
            format!(
                "cut {cut_ok:?}, released {released:?}, healed {healed:?}; received meanwhile: {reached:?}"
            ),
        ));
        checks.push(Check::new(
            "the fenced follower took the Lease over",
            acquired.is_ok(),
            format!("{acquired:?}"),
        ));
        self.acquired = acquired.ok();
        self.span.1 = self.acquired;
        self.strike.until().after(failover)
    }

    /// Stops the API server with the leader's action held at its point, releases it, and starts
    /// the API server again after [`OUTAGE`]. Recovery: the start → the leader's next write.
    async fn outage(
        &mut self,
        fc: &FaultCluster,
        admin: &Client,
        timeout: Duration,
        checks: &mut Vec<Check>,
    ) -> Recovery {
        let guard = Restore::new(fc, "kube-apiserver", "start");
        let stopped = fc.ctl("stop", "kube-apiserver").await;
        let down = fc.ctl("pid", "kube-apiserver").await.is_err();
        self.span.0 = down.then(jiff::Timestamp::now);
        let released = self.let_go();
        let _ = cluster::hold("API server outage", OUTAGE).await;
        let started = jiff::Timestamp::now();
        self.span.1 = Some(started);
        let back = fc.ctl("start", "kube-apiserver").await;
        guard.done();
        let answering = fc.wait_api(admin, timeout).await;
        checks.push(Check::new(
            "the API server was down (no process) while the leader went on",
            stopped.is_ok() && down && released.is_ok() && back.is_ok() && answering.is_ok(),
            format!("stop {stopped:?}, down {down}, released {released:?}, start {back:?}, answering {answering:?}"),
        ));
        let user = self.armed.user();
        let next = wait::until("the leader's next write after the outage", timeout, || async {
            Ok(record::first_write_ms(&fc.audit()?, &user, started))
        })
        .await;
        self.strike.until().after(next.unwrap_or(u64::MAX))
    }

    /// When the leader was surely cut off (a partition's link down, an outage's API server
    /// process gone) and when that ended (the follower acquired the Lease, the API server was
    /// started again); `None` for a crash, before the strike, or where it did not apply.
    pub fn span(&self) -> Option<(jiff::Timestamp, jiff::Timestamp)> {
        self.span.0.zip(self.span.1)
    }

    /// The replica that leads: the follower once it took over from a cut-off leader, else the
    /// armed one (restarted after a crash).
    pub fn leader(&mut self) -> &mut Operator {
        match self.follower.as_mut() {
            Some(f) if self.acquired.is_some() => f,
            _ => &mut self.armed,
        }
    }

    /// Stops its replicas gracefully, each releasing the Lease it holds (a partition's follower:
    /// the next run's replicas, of the same identities, then lead at once).
    pub async fn end(mut self) {
        for op in std::iter::once(&mut self.armed).chain(self.follower.as_mut()) {
            if op.alive() {
                let _ = op.terminate();
                let _ = op.wait_exit(Duration::from_secs(15)).await;
            }
        }
    }

    /// Once the action is through: a partitioned leader committed nothing after the follower
    /// acquired and did not take the Lease back; an outage's leader is the same process.
    pub async fn afterwards(&mut self, fc: &FaultCluster, admin: &Client) -> Vec<Check> {
        match self.strike {
            Strike::Crash => Vec::new(),
            Strike::ApiOutage => vec![Check::new(
                "the leader process carried on through the outage (never restarted)",
                self.armed.alive(),
                "same process",
            )],
            Strike::Partition => {
                let user = self.armed.user();
                let since = self.acquired.unwrap_or_else(jiff::Timestamp::now);
                let late: Vec<String> = fc
                    .audit()
                    .unwrap_or_default()
                    .iter()
                    .filter(|e| e.user == user && e.is_write() && e.at >= since && e.succeeded())
                    .map(|e| {
                        format!(
                            "{} {}/{} {} → {}",
                            e.verb, e.resource, e.subresource, e.name, e.code
                        )
                    })
                    .collect();
                let holder = replica::lease(admin, &self.armed.namespace).await.map(|(h, _)| h);
                let follower = self.follower.as_ref().map(|f| f.identity.clone());
                vec![
                    Check::new(
                        "the cut-off leader committed nothing after the follower acquired",
                        self.acquired.is_some() && late.is_empty(),
                        format!("acquired {:?}; committed since: {late:?}", self.acquired),
                    ),
                    Check::new(
                        "the cut-off leader did not take the Lease back once its link returned",
                        holder.is_some() && holder == follower,
                        format!("holder {holder:?}"),
                    ),
                ]
            }
        }
    }
}
