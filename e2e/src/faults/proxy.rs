//! [`Toxiproxy`]: Shopify's TCP fault proxy (`e2e/cluster/build.sh toxiproxy`) between an
//! operator replica and the API server, for the API latency fault. The proxy forwards bytes
//! untouched (TLS goes end to end, the API server's certificate names 127.0.0.1), and a
//! `latency` toxic holds every chunk of the API server's answers for its latency (± jitter):
//! each response and each watch event reach the replica that much later.

use std::{
    net::SocketAddr,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use kube::Client;

use super::{cluster::FaultCluster, io};
use crate::{Error, tools, wait};

/// A toxiproxy server of this test process, killed on drop.
pub struct Toxiproxy {
    server: Child,
    /// Its control API (`toxiproxy-cli --host`).
    api: SocketAddr,
    cli: PathBuf,
}

impl Toxiproxy {
    /// Starts the server on a free loopback port (its log under the cluster's logs) and waits
    /// until its control API answers.
    pub async fn start(fc: &FaultCluster) -> Result<Toxiproxy, Error> {
        let bin = tools::built("GPUNODE_TOXIPROXY_SERVER")?;
        let cli = tools::built("GPUNODE_TOXIPROXY_CLI")?;
        let api = crate::http::free_addr()?;
        let path = fc.dir.join("logs/toxiproxy.log");
        let log = std::fs::File::create(&path).map_err(io(path.display()))?;
        let err = log.try_clone().map_err(io(path.display()))?;
        let server = Command::new(&bin)
            .args(["-host", "127.0.0.1", "-port", &api.port().to_string()])
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(err)
            .spawn()
            .map_err(|e| Error::Unexpected(format!("starting {}: {e}", bin.display())))?;
        let proxy = Toxiproxy { server, api, cli };
        wait::until("toxiproxy to answer", Duration::from_secs(30), || async {
            Ok(proxy.run(&["list"]).ok())
        })
        .await?;
        Ok(proxy)
    }

    fn run(&self, args: &[&str]) -> Result<String, Error> {
        let host = format!("http://{}", self.api);
        tools::stdout_of(
            Command::new(&self.cli).args(["--host", &host]).args(args),
            &format!("toxiproxy-cli {}", args.join(" ")),
        )
    }

    /// A proxy `name` to `upstream` on a free loopback port; returns where it listens.
    pub fn proxy(&self, name: &str, upstream: SocketAddr) -> Result<SocketAddr, Error> {
        let listen = crate::http::free_addr()?;
        self.run(&[
            "create",
            "--listen",
            &listen.to_string(),
            "--upstream",
            &upstream.to_string(),
            name,
        ])?;
        Ok(listen)
    }

    /// Delays every chunk the upstream sends through proxy `name` by `latency` ± `jitter`
    /// (the toxic `slow`, downstream).
    pub fn slow_down(&self, name: &str, latency: Duration, jitter: Duration) -> Result<(), Error> {
        self.run(&[
            "toxic",
            "add",
            "--type",
            "latency",
            "--toxicName",
            "slow",
            "--downstream",
            "--attribute",
            &format!("latency={}", latency.as_millis()),
            "--attribute",
            &format!("jitter={}", jitter.as_millis()),
            name,
        ])
        .map(drop)
    }

    /// Removes the toxic `slow` of proxy `name`.
    pub fn speed_up(&self, name: &str) -> Result<(), Error> {
        self.run(&["toxic", "remove", "--toxicName", "slow", name])
            .map(drop)
    }

    /// What the server says about proxy `name` and its toxics.
    pub fn inspect(&self, name: &str) -> Result<String, Error> {
        self.run(&["inspect", name])
    }
}

impl Drop for Toxiproxy {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A client with the admin's credentials that reaches the API server through `listen`, its
/// timeouts stretched for answers `latency` late.
pub async fn client_through(
    fc: &FaultCluster,
    listen: SocketAddr,
    latency: Duration,
) -> Result<Client, Error> {
    let mut config = fc.config().await?;
    config.cluster_url = format!("https://{listen}")
        .parse()
        .map_err(|e| Error::Unexpected(format!("proxy address {listen}: {e}")))?;
    // Every chunk of an answer comes `latency` late, one after another: a request whose
    // answer spans a few chunks (a TLS handshake's flight does) takes several times it.
    config.read_timeout = config.read_timeout.map(|t| t + latency * 10);
    config.connect_timeout = config.connect_timeout.map(|t| t + latency * 10);
    Ok(Client::try_from(config)?)
}

/// The median time of `n` `GET /version` through `client`, each on the connection the client
/// keeps (the first one's handshake is not counted).
pub async fn round_trip(client: &Client, n: usize) -> Result<Duration, Error> {
    client.apiserver_version().await?;
    let mut took = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        client.apiserver_version().await?;
        took.push(start.elapsed());
    }
    took.sort();
    took.get(n / 2)
        .copied()
        .ok_or_else(|| Error::Unexpected("no round trip measured".into()))
}
