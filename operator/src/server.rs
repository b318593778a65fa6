//! The operator's HTTP endpoints: `/metrics`, `/healthz` and `/readyz`.
//!
//! - `/metrics`: [`Metrics::encode`] in the OpenMetrics text format.
//! - `/healthz`: 200 while the process serves requests (its runtime is alive).
//! - `/readyz`: 503 until [`Readiness::set_ready`] (caches synced), 200 after, 503 again after
//!   [`Readiness::set_not_ready`] (e.g. while shutting down).
//!
//! It serves what it is handed; it never reads the cluster or changes a decision.

use std::{
    future::Future,
    net::SocketAddr,
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
};

use axum::{
    Router,
    extract::State,
    http::{StatusCode, header},
    response::IntoResponse,
    routing::get,
};
use tokio::net::TcpListener;

use crate::metrics::{CONTENT_TYPE, Metrics};

/// The default listen address of the endpoints.
pub const DEFAULT_ADDR: &str = "0.0.0.0:8080";

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// The address could not be bound.
    #[error("binding {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Serving failed.
    #[error("serving /metrics, /healthz and /readyz: {0}")]
    Serve(#[source] std::io::Error),
}

/// Whether the operator is ready (its caches are synced). Cheap to clone; starts not ready.
#[derive(Clone, Debug, Default)]
pub struct Readiness(Arc<AtomicBool>);

impl Readiness {
    /// Not ready.
    pub fn new() -> Self {
        Readiness::default()
    }

    /// Ready: `/readyz` answers 200.
    pub fn set_ready(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Not ready: `/readyz` answers 503.
    pub fn set_not_ready(&self) {
        self.0.store(false, Ordering::Release);
    }

    /// Whether ready.
    pub fn is_ready(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    readiness: Readiness,
}

/// A bound, not yet serving, HTTP server.
#[derive(Debug)]
pub struct Server {
    listener: TcpListener,
    addr: SocketAddr,
    router: Router,
}

impl Server {
    /// Binds `addr` (port 0 picks a free port; see [`Server::local_addr`]).
    pub async fn bind(
        addr: SocketAddr,
        metrics: Arc<Metrics>,
        readiness: Readiness,
    ) -> Result<Self, ServerError> {
        let listener = TcpListener::bind(addr)
            .await
            .map_err(|source| ServerError::Bind { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| ServerError::Bind { addr, source })?;
        Ok(Server {
            listener,
            addr: bound,
            router: router(metrics, readiness),
        })
    }

    /// The address actually bound.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves until `shutdown` completes, then finishes the requests in flight.
    pub async fn serve<F>(self, shutdown: F) -> Result<(), ServerError>
    where
        F: Future<Output = ()> + Send + 'static,
    {
        tracing::info!(addr = %self.addr, "serving /metrics, /healthz and /readyz");
        axum::serve(self.listener, self.router)
            .with_graceful_shutdown(shutdown)
            .await
            .map_err(ServerError::Serve)
    }
}

/// The routes, for embedding in another server.
pub fn router(metrics: Arc<Metrics>, readiness: Readiness) -> Router {
    Router::new()
        .route("/metrics", get(metrics_handler))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, readiness })
}

async fn metrics_handler(State(state): State<AppState>) -> impl IntoResponse {
    ([(header::CONTENT_TYPE, CONTENT_TYPE)], state.metrics.encode())
}

async fn healthz() -> impl IntoResponse {
    (StatusCode::OK, "ok\n")
}

async fn readyz(State(state): State<AppState>) -> impl IntoResponse {
    if state.readiness.is_ready() {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: caches not synced\n")
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::metrics::{ActionKind, ActionResult};

    struct Reply {
        status: u16,
        headers: String,
        body: String,
    }

    /// A plain HTTP/1.1 GET over a fresh connection.
    async fn get(addr: SocketAddr, path: &str) -> Reply {
        let mut stream = tokio::net::TcpStream::connect(addr)
            .await
            .unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
        stream
            .write_all(request.as_bytes())
            .await
            .unwrap_or_else(|e| panic!("write: {e}"));
        let mut raw = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw))
            .await
            .unwrap_or_else(|_| panic!("GET {path}: no reply"))
            .unwrap_or_else(|e| panic!("read: {e}"));
        let text = String::from_utf8(raw).unwrap_or_else(|e| panic!("utf-8: {e}"));
        let (head, body) = text
            .split_once("\r\n\r\n")
            .unwrap_or_else(|| panic!("no header end in {text:?}"));
        let (status_line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
        let status = status_line
            .split(' ')
            .nth(1)
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("bad status line {status_line:?}"));
        Reply {
            status,
            headers: headers.to_ascii_lowercase(),
            body: body.to_string(),
        }
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness_then_shuts_down() {
        let metrics = Arc::new(Metrics::new());
        metrics.action(ActionKind::Cordon, ActionResult::Ok);
        let readiness = Readiness::new();
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), metrics.clone(), readiness.clone())
            .await
            .unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.serve(async move {
            let _ = stopped.await;
        }));

        let health = get(addr, "/healthz").await;
        assert_eq!(health.status, 200);
        assert_eq!(health.body, "ok\n");

        let before = get(addr, "/readyz").await;
        assert_eq!(before.status, 503, "{}", before.body);
        readiness.set_ready();
        assert_eq!(get(addr, "/readyz").await.status, 200);

        let scrape = get(addr, "/metrics").await;
        assert_eq!(scrape.status, 200);
        assert!(
            scrape
                .headers
                .contains("content-type: application/openmetrics-text; version=1.0.0"),
            "{}",
            scrape.headers
        );
        assert!(
            scrape
                .body
                .contains("gpunode_actions_total{action=\"cordon\",result=\"ok\"} 1\n"),
            "{}",
            scrape.body
        );
        assert!(scrape.body.ends_with("# EOF\n"));

        assert_eq!(get(addr, "/nope").await.status, 404);
        readiness.set_not_ready();
        assert_eq!(get(addr, "/readyz").await.status, 503);

        let _ = stop.send(());
        tokio::time::timeout(Duration::from_secs(10), task)
            .await
            .unwrap_or_else(|_| panic!("the server did not shut down"))
            .unwrap_or_else(|e| panic!("server task: {e}"))
            .unwrap_or_else(|e| panic!("server: {e}"));
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }

    #[tokio::test]
    async fn binding_a_taken_port_is_a_typed_error() {
        let first = Server::bind(
            "127.0.0.1:0".parse().unwrap(),
            Arc::new(Metrics::new()),
            Readiness::new(),
        )
        .await
        .unwrap();
        let taken = first.local_addr();
        match Server::bind(taken, Arc::new(Metrics::new()), Readiness::new()).await {
            Err(ServerError::Bind { addr, .. }) => assert_eq!(addr, taken),
            other => panic!("expected a bind error, got {:?}", other.map(|s| s.local_addr())),
        }
    }
}
