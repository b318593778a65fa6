//! The one way tests and the bench talk to gpunode's HTTP servers on loopback (/metrics, /readyz,
//! /healthz): a free address to bind them to, a plain HTTP/1.0 GET, and the values of the
//! Prometheus text exposition that /metrics answers.

use std::{net::SocketAddr, time::Duration};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Error;

/// How long one GET may take in all: a paused (SIGSTOP) server accepts the connection and never
/// answers, and a caller's wait must get its turn again.
const GET_TIMEOUT: Duration = Duration::from_secs(5);

/// A free address on 127.0.0.1 (bound and released; the server binds it right after).
pub fn free_addr() -> Result<SocketAddr, Error> {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map_err(|e| Error::Unexpected(format!("binding a free port: {e}")))
}

/// One answer: its status code and body.
#[derive(Debug, Clone)]
pub struct Response {
    /// The status code.
    pub status: u16,
    /// The body.
    pub body: String,
}

/// A plain HTTP/1.0 GET of `path` at `addr`; an error when nothing answers within 5 s.
pub async fn get(addr: SocketAddr, path: &str) -> Result<Response, Error> {
    let what = format!("GET http://{addr}{path}");
    let exchange = async {
        let mut s = tokio::net::TcpStream::connect(addr).await?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(GET_TIMEOUT, exchange)
        .await
        .map_err(|_| Error::Unexpected(format!("{what}: no answer within {GET_TIMEOUT:?}")))?
        .map_err(|e| Error::Unexpected(format!("{what}: {e}")))?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| Error::Unexpected(format!("{what}: no status line in {head:?}")))?;
    Ok(Response {
        status,
        body: body.to_string(),
    })
}

/// `GET /metrics` at `addr`: the text exposition.
pub async fn scrape(addr: SocketAddr) -> Result<String, Error> {
    let r = get(addr, "/metrics").await?;
    if r.status == 200 {
        Ok(r.body)
    } else {
        Err(Error::Unexpected(format!(
            "GET http://{addr}/metrics answered {}",
            r.status
        )))
    }
}

/// The samples of `text` as (series with its labels, value); comments and unparsable lines
/// are passed over.
fn samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter(|l| !l.starts_with('#')).filter_map(|l| {
        let (series, value) = l.rsplit_once(' ')?;
        Some((series, value.trim().parse().ok()?))
    })
}

/// The sum of every sample named `name` (a counter's `_total`, a gauge), over all its label
/// sets; None when there is no such sample.
pub fn sum(text: &str, name: &str) -> Option<f64> {
    samples(text)
        .filter(|(series, _)| series.split('{').next() == Some(name))
        .map(|(_, v)| v)
        .reduce(|a, b| a + b)
}

/// The value of one series, named exactly with its labels (`name{a="b"}`, or a bare `name`).
pub fn series(text: &str, series: &str) -> Option<f64> {
    samples(text).find(|(s, _)| *s == series).map(|(_, v)| v)
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP gpunode_leader Whether this replica leads.\n\
        # TYPE gpunode_leader gauge\n\
        gpunode_leader 1\n\
        gpunode_node_writes_total{kind=\"taint\"} 2\n\
        gpunode_node_writes_total{kind=\"label\"} 3\n\
        gpunode_node_writes_total_other 100\n\
        gpunode_reconcile_duration_seconds_sum 0.5\n\
        # EOF\n";

    #[test]
    fn sums_a_family_over_its_label_sets_and_nothing_else() {
        assert_eq!(sum(TEXT, "gpunode_node_writes_total"), Some(5.0));
        assert_eq!(sum(TEXT, "gpunode_leader"), Some(1.0));
        assert_eq!(sum(TEXT, "gpunode_node_writes"), None);
        assert_eq!(sum(TEXT, "gpunode_absent"), None);
    }

    #[test]
    fn reads_one_series_by_its_exact_name() {
        assert_eq!(
            series(TEXT, "gpunode_node_writes_total{kind=\"label\"}"),
            Some(3.0)
        );
        assert_eq!(series(TEXT, "gpunode_reconcile_duration_seconds_sum"), Some(0.5));
        assert_eq!(series(TEXT, "gpunode_node_writes_total"), None);
    }
}
