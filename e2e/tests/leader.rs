//! Leader election on the real API server of the local control plane (`gpunode-e2e` starts or
//! reuses it): one leader among candidates, takeover after a crash only once the Lease expired,
//! a leader cut off from the API server stepping down before anyone else takes over, and an
//! immediate handover on graceful shutdown.
//!
//! `GPUNODE_CLUSTER_NAME=test cargo test -p gpunode-e2e --test leader`

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use gpunode_e2e::{cluster::admin_config, scratch::Scratch, wait};
use gpunode_operator::leader::{LeaderConfig, LeaderError, Leadership};
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client, Config};
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{oneshot, watch},
    task::JoinHandle,
    time::Instant,
};

const LEASE: &str = "gpunode-operator";
const SETUP: Duration = Duration::from_secs(30);

/// Lease 3 s, renew deadline 2 s, retry 0.5 s.
const LEASE_DURATION: Duration = Duration::from_secs(3);
const RENEW_DEADLINE: Duration = Duration::from_secs(2);
const RETRY_PERIOD: Duration = Duration::from_millis(500);
/// Scheduling, request latency and polling slack on a busy test machine.
const MARGIN: Duration = Duration::from_secs(2);

fn config(namespace: &str, identity: &str) -> LeaderConfig {
    LeaderConfig::new(namespace, LEASE, identity).with_timing(LEASE_DURATION, RENEW_DEADLINE, RETRY_PERIOD)
}

async fn cluster() -> (Config, Client) {
    let config = admin_config().await.unwrap();
    let client = Client::try_from(config.clone()).unwrap();
    (config, client)
}

/// Every flip of a candidate's flag, with when it was seen.
type Timeline = Arc<Mutex<Vec<(Instant, &'static str, bool)>>>;

/// One replica running the election in a task.
struct Candidate {
    name: &'static str,
    leadership: Leadership,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), LeaderError>>,
}

impl Candidate {
    fn spawn(name: &'static str, client: Client, config: LeaderConfig, timeline: &Timeline) -> Self {
        let leadership = Leadership::new();
        let mut flips = leadership.subscribe();
        let log = timeline.clone();
        tokio::spawn(async move {
            while flips.changed().await.is_ok() {
                let now = *flips.borrow_and_update();
                log.lock().unwrap().push((Instant::now(), name, now));
            }
        });
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let leadership = leadership.clone();
            async move {
                leadership
                    .run(client, config, async move {
                        let _ = stopped.await;
                    })
                    .await
            }
        });
        Candidate {
            name,
            leadership,
            stop: Some(stop),
            task,
        }
    }

    fn is_leader(&self) -> bool {
        self.leadership.is_leader()
    }

    /// Waits until the flag reads `want`; returns when that was.
    async fn until_leader(&self, want: bool, within: Duration) -> Instant {
        let mut rx = self.leadership.subscribe();
        tokio::time::timeout(within, rx.wait_for(|v| *v == want))
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "{} did not become {} within {within:?}",
                    self.name,
                    if want { "leader" } else { "follower" }
                )
            })
            .unwrap();
        Instant::now()
    }

    /// Graceful shutdown: steps down and releases the Lease.
    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        tokio::time::timeout(SETUP, &mut self.task)
            .await
            .unwrap_or_else(|_| panic!("{} did not shut down", self.name))
            .unwrap()
            .unwrap();
        assert!(!self.is_leader(), "{} still leads after stopping", self.name);
    }

    /// Like SIGKILL: no step-down write, no release.
    async fn kill(self) {
        self.task.abort();
        let _ = self.task.await;
    }
}

/// Watches that both candidates never lead at once (as seen through their flags); check it
/// with [`no_two_leaders`].
fn forbid_two_leaders(a: &Candidate, b: &Candidate) -> JoinHandle<()> {
    let (mut ra, mut rb) = (a.leadership.subscribe(), b.leadership.subscribe());
    let (la, lb) = (a.leadership.clone(), b.leadership.clone());
    tokio::spawn(async move {
        loop {
            let both = *ra.borrow_and_update() && *rb.borrow_and_update();
            assert!(!both, "two leaders at once");
            assert!(!(la.is_leader() && lb.is_leader()), "two leaders at once");
            tokio::select! {
                r = ra.changed() => if r.is_err() { return },
                r = rb.changed() => if r.is_err() { return },
            }
        }
    })
}

/// Stops the watch of [`forbid_two_leaders`], failing the test if it saw two leaders.
async fn no_two_leaders(guard: JoinHandle<()>) {
    guard.abort();
    if let Err(e) = guard.await
        && e.is_panic()
    {
        std::panic::resume_unwind(e.into_panic());
    }
}

async fn lease(api: &Api<Lease>) -> Option<Lease> {
    api.get_opt(LEASE).await.unwrap()
}

fn holder(lease: &Lease) -> Option<&str> {
    lease.spec.as_ref()?.holder_identity.as_deref()
}

fn transitions(lease: &Lease) -> i32 {
    lease
        .spec
        .as_ref()
        .and_then(|s| s.lease_transitions)
        .unwrap_or_default()
}

/// Waits until `count` renewals of `who` were written after this call.
async fn renewals(api: &Api<Lease>, who: &str, count: usize) {
    let seen = lease(api)
        .await
        .and_then(|l| l.metadata.resource_version)
        .unwrap_or_default();
    // (last resourceVersion seen, renewals still to see)
    let progress = Arc::new(Mutex::new((seen, count)));
    wait::until(
        &format!("{count} renewals by {who}"),
        RETRY_PERIOD * (count as u32 + 1) + MARGIN,
        || {
            let api = api.clone();
            let progress = progress.clone();
            async move {
                let Some(l) = lease(&api).await else {
                    return Ok(None);
                };
                let version = l.metadata.resource_version.clone().unwrap_or_default();
                let mut p = progress.lock().unwrap();
                if version != p.0 {
                    assert_eq!(holder(&l), Some(who), "the Lease changed hands");
                    p.0 = version;
                    p.1 = p.1.saturating_sub(1);
                }
                Ok((p.1 == 0).then_some(()))
            }
        },
    )
    .await
    .unwrap();
}

/// Waits until exactly one of two candidates leads; returns (leader, follower).
async fn one_leader(a: Candidate, b: Candidate) -> (Candidate, Candidate) {
    let deadline = LEASE_DURATION + RETRY_PERIOD + MARGIN;
    let (mut ra, mut rb) = (a.leadership.subscribe(), b.leadership.subscribe());
    tokio::time::timeout(deadline, async {
        tokio::select! {
            _ = ra.wait_for(|v| *v) => {},
            _ = rb.wait_for(|v| *v) => {},
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no leader within {deadline:?}"));
    if a.is_leader() { (a, b) } else { (b, a) }
}

#[tokio::test]
async fn two_candidates_elect_exactly_one_leader() {
    let (_, client) = cluster().await;
    let ns = Scratch::new(&client, "leader-one").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let timeline = Timeline::default();
    let a = Candidate::spawn("a", client.clone(), config(&ns.name, "a"), &timeline);
    let b = Candidate::spawn("b", client.clone(), config(&ns.name, "b"), &timeline);
    let guard = forbid_two_leaders(&a, &b);

    let (leader, follower) = one_leader(a, b).await;
    assert!(!follower.is_leader());
    let written = lease(&api).await.expect("no Lease");
    assert_eq!(holder(&written), Some(leader.name));
    let spec = written.spec.clone().unwrap_or_default();
    assert_eq!(spec.lease_duration_seconds, Some(3));
    assert!(spec.acquire_time.is_some() && spec.renew_time.is_some());

    // Several renewal rounds later, still the same single leader.
    renewals(&api, leader.name, 4).await;
    assert!(leader.is_leader());
    assert!(!follower.is_leader());
    assert!(
        timeline
            .lock()
            .unwrap()
            .iter()
            .all(|(_, who, _)| *who == leader.name),
        "the follower's flag never moved"
    );

    no_two_leaders(guard).await;
    follower.stop().await;
    leader.stop().await;
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn a_crashed_leader_is_replaced_once_its_lease_expires() {
    let (_, client) = cluster().await;
    let ns = Scratch::new(&client, "leader-crash").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let timeline = Timeline::default();
    let a = Candidate::spawn("a", client.clone(), config(&ns.name, "a"), &timeline);
    let b = Candidate::spawn("b", client.clone(), config(&ns.name, "b"), &timeline);
    let guard = forbid_two_leaders(&a, &b);
    let (leader, follower) = one_leader(a, b).await;
    renewals(&api, leader.name, 1).await;
    let before = transitions(&lease(&api).await.expect("no Lease"));

    let handle = leader.leadership.clone();
    let crashed = Instant::now();
    leader.kill().await;
    assert!(!handle.is_leader(), "an aborted election must drop the flag");

    let took_over = follower
        .until_leader(true, LEASE_DURATION + RETRY_PERIOD + MARGIN)
        .await;
    let after = took_over - crashed;
    eprintln!("crash: {} took over {after:?} after the crash", follower.name);
    // The crashed leader renewed at most one retry period before the crash, so its Lease ran
    // until at least `lease - retry` after it: taking over earlier would break safety.
    assert!(
        after >= LEASE_DURATION - RETRY_PERIOD - Duration::from_millis(200),
        "took over {after:?} after the crash, before the Lease could expire"
    );
    let written = lease(&api).await.expect("no Lease");
    assert_eq!(holder(&written), Some(follower.name));
    assert_eq!(transitions(&written), before + 1);

    no_two_leaders(guard).await;
    follower.stop().await;
    ns.delete().await.unwrap();
}

/// A TCP proxy to the API server that can cut its clients off: on `partition`, open
/// connections are dropped and new ones are accepted but never answered.
struct Proxy {
    addr: std::net::SocketAddr,
    partitioned: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Proxy {
    async fn start(upstream: String) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (partitioned, state) = watch::channel(false);
        let task = tokio::spawn(async move {
            while let Ok((mut downstream, _)) = listener.accept().await {
                let mut state = state.clone();
                let upstream = upstream.clone();
                tokio::spawn(async move {
                    if *state.borrow_and_update() {
                        // Accepted, never answered: the client's request hangs.
                        let _ = state.wait_for(|p| !*p).await;
                        return;
                    }
                    let Ok(mut up) = TcpStream::connect(&upstream).await else {
                        return;
                    };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut downstream, &mut up) => {},
                        _ = state.wait_for(|p| *p) => {},
                    }
                });
            }
        });
        Proxy {
            addr,
            partitioned,
            task,
        }
    }

    fn partition(&self, cut: bool) {
        self.partitioned.send_replace(cut);
    }
}

#[tokio::test]
async fn a_leader_that_cannot_renew_steps_down_before_anyone_takes_over() {
    let (admin, client) = cluster().await;
    let ns = Scratch::new(&client, "leader-partition").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    let upstream = admin
        .cluster_url
        .authority()
        .map(|a| a.to_string())
        .expect("the API server URL has no host:port");
    let proxy = Proxy::start(upstream).await;
    let mut cut_off = admin.clone();
    cut_off.cluster_url = format!("https://{}", proxy.addr).parse().unwrap();
    let cut_off = Client::try_from(cut_off).unwrap();

    let timeline = Timeline::default();
    let a = Candidate::spawn("a", cut_off, config(&ns.name, "a"), &timeline);
    a.until_leader(true, SETUP).await;
    let b = Candidate::spawn("b", client.clone(), config(&ns.name, "b"), &timeline);
    let guard = forbid_two_leaders(&a, &b);
    // b has seen a renew a few times and follows.
    renewals(&api, "a", 2).await;
    assert!(a.is_leader() && !b.is_leader());

    proxy.partition(true);
    let cut = Instant::now();
    let stepped_down = a.until_leader(false, RENEW_DEADLINE + MARGIN).await;
    assert!(!a.is_leader());
    let took_over = b
        .until_leader(true, LEASE_DURATION + 2 * RETRY_PERIOD + MARGIN)
        .await;

    // a stopped within its renew deadline of its last renewal (at most one retry period before
    // the cut), and strictly before b started.
    assert!(
        stepped_down - cut <= RENEW_DEADLINE + Duration::from_millis(300),
        "a stepped down {:?} after losing the API server",
        stepped_down - cut
    );
    let events = timeline.lock().unwrap().clone();
    let a_off = events
        .iter()
        .find(|(_, who, v)| *who == "a" && !*v)
        .map(|(t, ..)| *t)
        .expect("a never stepped down");
    let b_on = events
        .iter()
        .find(|(_, who, v)| *who == "b" && *v)
        .map(|(t, ..)| *t)
        .expect("b never took over");
    eprintln!(
        "partition: a stepped down at +{:?}, b took over at +{:?}",
        a_off - cut,
        b_on - cut
    );
    assert!(
        a_off < b_on,
        "a stepped down at +{:?}, b took over at +{:?}",
        a_off - cut,
        b_on - cut
    );
    assert!(took_over - cut >= LEASE_DURATION - RETRY_PERIOD - Duration::from_millis(200));
    let written = lease(&api).await.expect("no Lease");
    assert_eq!(holder(&written), Some("b"));

    // Reconnected, a sees b's live Lease and stays a follower.
    proxy.partition(false);
    renewals(&api, "b", 4).await;
    assert!(!a.is_leader() && b.is_leader());

    no_two_leaders(guard).await;
    a.stop().await;
    b.stop().await;
    proxy.task.abort();
    ns.delete().await.unwrap();
}

#[tokio::test]
async fn a_graceful_shutdown_hands_over_at_once() {
    let (_, client) = cluster().await;
    let ns = Scratch::new(&client, "leader-release").await.unwrap();
    let api: Api<Lease> = Api::namespaced(client.clone(), &ns.name);
    // A long Lease: a handover faster than it can only come from the release.
    let long = |id: &str| {
        LeaderConfig::new(&ns.name, LEASE, id).with_timing(
            Duration::from_secs(20),
            Duration::from_secs(15),
            RETRY_PERIOD,
        )
    };
    let timeline = Timeline::default();
    let a = Candidate::spawn("a", client.clone(), long("a"), &timeline);
    let b = Candidate::spawn("b", client.clone(), long("b"), &timeline);
    let guard = forbid_two_leaders(&a, &b);
    let (leader, follower) = {
        let deadline = Duration::from_secs(20) + MARGIN;
        let (mut ra, mut rb) = (a.leadership.subscribe(), b.leadership.subscribe());
        tokio::time::timeout(deadline, async {
            tokio::select! {
                _ = ra.wait_for(|v| *v) => {},
                _ = rb.wait_for(|v| *v) => {},
            }
        })
        .await
        .unwrap_or_else(|_| panic!("no leader within {deadline:?}"));
        if a.is_leader() { (a, b) } else { (b, a) }
    };
    renewals(&api, leader.name, 1).await;
    let before = transitions(&lease(&api).await.expect("no Lease"));

    let stopping = Instant::now();
    let leader_name = leader.name;
    leader.stop().await;
    let took_over = follower.until_leader(true, RETRY_PERIOD + MARGIN).await;
    assert!(
        took_over - stopping < Duration::from_secs(5),
        "handover took {:?}",
        took_over - stopping
    );
    eprintln!(
        "release: handover {:?} after the stop began",
        took_over - stopping
    );
    let written = lease(&api).await.expect("no Lease");
    assert_eq!(holder(&written), Some(follower.name));
    assert_ne!(holder(&written), Some(leader_name));
    assert_eq!(transitions(&written), before + 1);

    no_two_leaders(guard).await;
    follower.stop().await;
    // The last one out leaves a free Lease behind.
    let last = lease(&api).await.expect("no Lease");
    assert_eq!(holder(&last), None);
    ns.delete().await.unwrap();
}

/// No cluster needed: configuration errors and a second `run` are refused up front.
#[tokio::test]
async fn run_refuses_bad_configs_and_a_second_run() {
    let dead = Client::try_from(Config::new("https://127.0.0.1:1".parse().unwrap())).unwrap();
    let leadership = Leadership::new();
    let bad = LeaderConfig::new("ns", LEASE, "a").with_timing(
        Duration::from_secs(3),
        Duration::from_secs(3),
        RETRY_PERIOD,
    );
    assert!(matches!(
        leadership.run(dead.clone(), bad, async {}).await,
        Err(LeaderError::Config(_))
    ));

    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn({
        let leadership = leadership.clone();
        let dead = dead.clone();
        async move {
            leadership
                .run(dead, config("ns", "a"), async move {
                    let _ = stopped.await;
                })
                .await
        }
    });
    // A run against an unreachable API server keeps retrying and never leads.
    let retrying = leadership.subscribe();
    wait::until("the first run to start", SETUP, || {
        let l = leadership.clone();
        async move { Ok(l.is_running().then_some(())) }
    })
    .await
    .unwrap();
    assert!(matches!(
        leadership.run(dead.clone(), config("ns", "a"), async {}).await,
        Err(LeaderError::AlreadyRunning)
    ));
    assert!(!leadership.is_leader());
    assert!(!retrying.has_changed().unwrap());
    let _ = stop.send(());
    tokio::time::timeout(SETUP, running)
        .await
        .expect("the run did not stop")
        .unwrap()
        .unwrap();
    assert!(!*retrying.borrow());
    assert!(!leadership.is_running());
    assert!(matches!(
        Leadership::fixed(true)
            .run(dead, config("ns", "a"), async {})
            .await,
        Err(LeaderError::AlreadyRunning)
    ));
}
