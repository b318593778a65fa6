//! DCB settings from the kernel: one `RTM_GETDCB` request on a `NETLINK_ROUTE` socket per
//! interface. Reading needs no capability, but the interface must be in the probe's network
//! namespace (hostNetwork), else the kernel answers ENODEV.
//!
//! It only reads (RTM_GETDCB); it never sends a set request.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

use super::dcb::{DcbConfig, DcbError, DcbSource, ieee_request, parse_ieee_reply, reply_seq};

/// rtnetlink answers synchronously; this only bounds a misbehaving kernel.
const REPLY_TIMEOUT: Duration = Duration::from_secs(1);

/// Asks the kernel over netlink.
#[derive(Debug, Default)]
pub struct NetlinkDcb {
    seq: AtomicU32,
}

impl NetlinkDcb {
    /// A source with its own sequence numbers.
    pub fn new() -> Self {
        NetlinkDcb::default()
    }
}

impl DcbSource for NetlinkDcb {
    fn ieee(&self, ifname: &str) -> Result<DcbConfig, DcbError> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed).wrapping_add(1);
        let request = ieee_request(ifname, seq)?;
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        socket.send(&request, 0)?;
        socket.set_non_blocking(true)?;
        let deadline = Instant::now() + REPLY_TIMEOUT;
        loop {
            let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
            match socket.recv(&mut buf, 0) {
                Ok(_) if reply_seq(&buf) == Some(seq) => return parse_ieee_reply(&buf),
                Ok(_) => continue, // a stale message for another request
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(DcbError::NoReply);
                    }
                    std::thread::sleep(Duration::from_millis(1));
                }
                Err(e) => return Err(DcbError::Socket(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Talks to this machine's kernel: loopback has no DCB ops, an unknown name is ENODEV. Skips
    /// when the sandbox forbids netlink sockets.
    #[test]
    fn the_kernel_answers_with_errno() {
        let source = NetlinkDcb::new();
        match source.ieee("lo") {
            Err(DcbError::Socket(e)) => eprintln!("netlink unavailable here, skipped: {e}"),
            Err(DcbError::Kernel { errno }) => {
                assert!(errno == 95 || errno == 19 || errno == 1, "errno {errno}")
            }
            other => panic!("loopback should have no DCB support: {other:?}"),
        }
        match source.ieee("gpunode-none0") {
            Err(DcbError::Socket(_)) => {}
            Err(DcbError::Kernel { errno }) => assert_eq!(errno, 19),
            other => panic!("a missing interface should be ENODEV: {other:?}"),
        }
    }
}
