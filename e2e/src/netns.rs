//! A network namespace for one operator replica, so a partition is a real one: its packets to the
//! API server are dropped, its connections hang, and nothing tells the process (unlike SIGSTOP).
//!
//! The namespace reaches the host through a veth pair (`10.250.<n>.2` → `10.250.<n>.1`). The API
//! server listens on loopback only, so a forwarder in the test process listens on the host end
//! and copies each connection to the API server; TLS runs end to end through it (the replica's
//! kubeconfig checks the certificate against `localhost`). [`Netns::partition`] takes the host end
//! of the link down: packets are lost silently both ways, as on a failed switch port.

use std::{net::SocketAddr, process::Command};

use crate::Error;

/// A network namespace with a veth link to the host and a forwarder to one address.
pub struct Netns {
    /// Namespace name.
    pub name: String,
    host_if: String,
    /// The forwarder's address, as the namespace reaches it.
    pub addr: SocketAddr,
    forwarder: tokio::task::JoinHandle<()>,
}

fn ip(args: &[&str]) -> Result<(), Error> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| Error::Unexpected(format!("ip {}: {e}", args.join(" "))))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(Error::Unexpected(format!(
            "ip {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

impl Netns {
    /// Creates namespace `name` (replacing a leftover of that name) on subnet `10.250.<subnet>.0/30`
    /// with a forwarder to `target` (a loopback address). Needs root, as the suite has.
    pub async fn create(name: &str, subnet: u8, target: SocketAddr) -> Result<Netns, Error> {
        let host_if = format!("{}-h", &name[..name.len().min(12)]);
        let ns_if = format!("{}-n", &name[..name.len().min(12)]);
        let _ = ip(&["netns", "del", name]);
        let _ = ip(&["link", "del", &host_if]);
        let host_ip = format!("10.250.{subnet}.1");
        let ns_ip = format!("10.250.{subnet}.2");
        ip(&["netns", "add", name])?;
        ip(&["link", "add", &host_if, "type", "veth", "peer", "name", &ns_if])?;
        ip(&["link", "set", &ns_if, "netns", name])?;
        ip(&["addr", "add", &format!("{host_ip}/30"), "dev", &host_if])?;
        ip(&["link", "set", &host_if, "up"])?;
        ip(&["-n", name, "addr", "add", &format!("{ns_ip}/30"), "dev", &ns_if])?;
        ip(&["-n", name, "link", "set", &ns_if, "up"])?;
        ip(&["-n", name, "link", "set", "lo", "up"])?;
        let listener = tokio::net::TcpListener::bind((host_ip.as_str(), 0))
            .await
            .map_err(|e| Error::Unexpected(format!("binding the forwarder on {host_ip}: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Unexpected(format!("forwarder address: {e}")))?;
        let forwarder = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Ok(Netns {
            name: name.to_string(),
            host_if,
            addr,
            forwarder,
        })
    }

    /// The command prefix that runs a program inside the namespace.
    pub fn prefix(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Cuts the link: every packet between the namespace and the host is dropped.
    pub fn partition(&self) -> Result<(), Error> {
        ip(&["link", "set", &self.host_if, "down"])
    }

    /// Restores the link; connections that have not timed out carry on.
    pub fn heal(&self) -> Result<(), Error> {
        ip(&["link", "set", &self.host_if, "up"])
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.forwarder.abort();
        // Deleting the namespace deletes its end of the veth pair, and with it the host's.
        let _ = ip(&["netns", "del", &self.name]);
        let _ = ip(&["link", "del", &self.host_if]);
    }
}
