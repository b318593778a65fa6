//! A slow API server on the reliability cluster (never the shared `test` cluster): the operator
//! (one process) reaches the API server through toxiproxy, whose `latency` toxic holds every
//! chunk of the answers, watch events included, for a fixed delay with jitter, through a whole
//! wave: three nodes drift at once under `maxUnavailable: 1`, each is drained and heals.
//! The delays are `GPUNODE_REL_LATENCIES_MS` (default `250,1000`; `make reliability-long`
//! adds 3000), jitter a fifth of each. Per delay the checks: the delay really applied (the
//! median `GET /version` through the slowed proxy against one straight to the API server), the
//! replica kept its Lease throughout (slow renewals are not lost ones), the wave completed, and
//! the wave's invariants (budget at every instant, no pod evicted twice, none after its eviction
//! was committed, every pod evicted once, the end state). Recovery: the toxic added → the wave
//! complete (the wave's whole length under the delay).

// clippy.toml allows unwrap and expect in #[test] fns only; this crate's helper fns fail the
// test the same way (a panic naming what broke), so the allow covers the whole test crate.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use gpunode_e2e::faults::{
    checks::Check,
    cluster::{self, FaultCluster},
    proxy::{self, Toxiproxy},
    record::{self, Recorder, Run, Until},
    replica::{self, Launch, Operator},
    wave::{Wave, WaveSpec},
};
use kube::Client;

const CLASS: &str = "slow control plane";
const DEADLINE: Duration = Duration::from_secs(120);
/// The proxy's name in toxiproxy.
const PROXY: &str = "apiserver";

fn latencies() -> Vec<u64> {
    std::env::var("GPUNODE_REL_LATENCIES_MS")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| "250,1000".into())
        .split(',')
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("GPUNODE_REL_LATENCIES_MS: {v:?} is not milliseconds: {e}"))
        })
        .collect()
}

#[tokio::test]
async fn a_slow_api_server_delays_a_wave_but_breaks_none_of_its_rules() {
    let (fc, client) = FaultCluster::up().await.unwrap();
    let mut rec = Recorder::new(env!("CARGO_TARGET_TMPDIR"), "latency");
    let toxi = Toxiproxy::start(&fc).await.unwrap();
    let listen = toxi.proxy(PROXY, cluster::apiserver_addr(&fc).unwrap()).unwrap();
    for ms in latencies() {
        slow_wave(&fc, &client, &toxi, listen, &mut rec, ms).await;
    }
    rec.assert_clean();
}

async fn slow_wave(
    fc: &FaultCluster,
    client: &Client,
    toxi: &Toxiproxy,
    listen: std::net::SocketAddr,
    rec: &mut Recorder,
    ms: u64,
) {
    let (latency, jitter) = (Duration::from_millis(ms), Duration::from_millis(ms / 5));
    let ns = format!("rel-lat{ms}");
    let launch = Launch {
        server: Some((format!("https://{listen}"), "localhost".into())),
        ..Launch::default()
    };
    let mut op = Operator::start_with(fc, client, &ns, &ns, launch).await.unwrap();
    op.wait_leading(DEADLINE).await.unwrap();
    let held = replica::lease(client, &ns).await;
    let wave = Wave::setup(client, &WaveSpec::drain(&format!("lat{ms}"), 3, 2))
        .await
        .unwrap();
    let monitor = wave.monitor();
    wave.wait_all("compliant", DEADLINE).await.unwrap();

    let through = proxy::client_through(fc, listen, latency).await.unwrap();
    let direct = proxy::round_trip(client, 5).await.unwrap();
    // Its connection opened before the delay (as the operator's are): under 3 s a chunk, a
    // handshake through the proxy outlasted the client's 20-s read timeout (make
    // reliability-long at 220a8ac).
    through.apiserver_version().await.unwrap();
    toxi.slow_down(PROXY, latency, jitter).unwrap();
    let slowed = proxy::round_trip(&through, 5).await.unwrap();
    let toxics = toxi.inspect(PROXY).unwrap_or_default();
    let start = Instant::now();
    wave.drift_all().await.unwrap();
    // Each node's drain takes some tens of requests, one after another.
    let driven = wave.drive(DEADLINE + latency * 240).await;
    let wave_ms = record::elapsed_ms(start);
    // A toxic that is not there (it never applied) is the first check's to report.
    let _ = toxi.speed_up(PROXY);
    driven.unwrap();

    let mut checks = vec![
        Check::new(
            "the delay applied: answers through the proxy came the delay later",
            slowed >= latency.saturating_sub(jitter) && direct < latency / 2,
            format!(
                "median GET /version: {} ms straight, {} ms through the slowed proxy; toxiproxy: {}",
                direct.as_millis(),
                slowed.as_millis(),
                toxics.split_whitespace().collect::<Vec<_>>().join(" ")
            ),
        ),
        Check::new(
            "the replica kept its Lease through the slowness (one acquisition)",
            held.is_some() && replica::lease(client, &ns).await == held,
            format!("held {held:?}"),
        ),
        Check::new(
            "operator process survived without restart",
            op.alive(),
            format!("exit status: {:?}", op.exited()),
        ),
    ];
    checks.extend(wave.run_checks(fc, &monitor, 1, &wave.all_pods()).await.unwrap());
    rec.push(Run {
        class: CLASS.into(),
        fault: format!(
            "API server answering {ms} ms ± {} ms late (toxiproxy latency on every answer and watch event) through a wave",
            jitter.as_millis()
        ),
        seed: None,
        checks,
        recovery: Some(Until::WaveUnderFault.after(wave_ms)),
    })
    .unwrap();
    wave.cleanup().await;
    op.kill();
}
