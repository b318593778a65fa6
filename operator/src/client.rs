//! The operator's Kubernetes client: kube's own request stack (base URI, authentication with
//! token refresh, extra headers, timeouts, TLS from the kubeconfig, HTTP/1.1) on a TCP
//! connector with `TCP_NODELAY`, as Go's net package (so client-go) sets it.
//!
//! kube 5 leaves Nagle's algorithm on. A TLS connection's first request then waits for the ACK
//! of the handshake's last flight before it is sent, and the API server's kernel delays that
//! ACK by up to 40 ms: measured on the scale benchmark's API server, 42 ms between a fresh
//! operator's TCP connect and its first request reaching the API server, which answered in
//! 3 ms. A burst of `--apply-concurrency` writes after a quiet spell opens that many
//! connections and paid that wait.
//!
//! It builds the client; it sends no request of its own.

use hyper_util::{
    client::legacy::{Client as HyperClient, connect::HttpConnector},
    rt::TokioExecutor,
};
use kube::{Client, Config, client::ConfigExt};
use tower::{BoxError, ServiceBuilder};
use tower_http::trace::TraceLayer;

/// A client for `config`, as `kube::Client::try_from` builds it but with `TCP_NODELAY` set.
/// Not handled here, as the operator never needs them: a proxy URL (an error names it),
/// kube's retry layer (the operator turns it off), response compression (not enabled) and the
/// expiry of an exec plugin's client certificate (in a pod the operator uses its token).
pub fn build(config: Config) -> Result<Client, kube::Error> {
    if let Some(proxy) = &config.proxy_url {
        return Err(kube::Error::ProxyProtocolUnsupported {
            proxy_url: Box::new(proxy.clone()),
        });
    }
    let mut tcp = HttpConnector::new();
    tcp.enforce_http(false);
    tcp.set_nodelay(true);
    let https = config.rustls_https_connector_with_connector(tcp)?;
    let mut connector = hyper_timeout::TimeoutConnector::new(https);
    connector.set_connect_timeout(config.connect_timeout);
    connector.set_read_timeout(config.read_timeout);
    connector.set_write_timeout(config.write_timeout);
    connector.set_reset_reader_on_write(config.reset_reader_on_write);
    let hyper = HyperClient::builder(TokioExecutor::new()).build(connector);
    let service = ServiceBuilder::new()
        .layer(config.base_uri_layer())
        .option_layer(config.auth_layer()?)
        .layer(config.extra_headers_layer()?)
        // Each request as a debug span with its latency (target tower_http::trace).
        .layer(TraceLayer::new_for_http())
        .map_err(BoxError::from)
        .service(hyper);
    Ok(Client::new(service, config.default_namespace))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test]
    async fn a_request_reaches_the_configured_server_with_the_configured_token() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let server = tokio::spawn(async move {
            let (mut sock, _) = listener.accept().await.unwrap();
            let (mut buf, mut got) = (vec![0u8; 4096], Vec::new());
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = sock.read(&mut buf).await.unwrap();
                assert!(n > 0, "the client closed before a whole request");
                got.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"major":"1","minor":"35","gitVersion":"v1.35.0","gitCommit":"","gitTreeState":"","buildDate":"","goVersion":"","compiler":"","platform":""}"#;
            let response = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                body.len()
            );
            sock.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8_lossy(&got).to_lowercase()
        });
        let mut config = Config::new(format!("http://{addr}/").parse().unwrap());
        config.auth_info.token = Some("t0k".to_string().into());
        let client = build(config).unwrap();
        let version = client.apiserver_version().await.unwrap();
        assert_eq!(version.git_version, "v1.35.0");
        let request = server.await.unwrap();
        assert!(request.starts_with("get /version "), "{request}");
        assert!(request.contains("authorization: bearer t0k"), "{request}");
    }

    #[test]
    fn a_proxy_url_is_refused_naming_it() {
        let mut config = Config::new("https://127.0.0.1:6443".parse().unwrap());
        config.proxy_url = Some("http://proxy.example:3128".parse().unwrap());
        let Err(err) = build(config) else {
            panic!("a client was built for a proxy it does not use");
        };
        let err = err.to_string();
        assert!(err.contains("proxy.example"), "{err}");
    }
}
