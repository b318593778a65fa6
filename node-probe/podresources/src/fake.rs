//! A fake kubelet serving `v1.PodResourcesLister/List` on a unix socket, for the probe's tests,
//! the e2e suite and demos. Its answer comes from a function called on every request (for
//! example one that re-reads a JSON file), so a test changes what the "kubelet" says while the
//! probe runs. An `Err` from it is answered with gRPC status UNAVAILABLE.

use std::{
    convert::Infallible,
    future::Future,
    path::Path,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{
    body::Body,
    codegen::http::{Request, Response},
    server::{NamedService, UnaryService},
};

use crate::{LIST_PATH, ListPodResourcesRequest, ListPodResourcesResponse, SERVICE};

/// What the fake kubelet answers to `List`.
pub type Source = Arc<dyn Fn() -> Result<ListPodResourcesResponse, String> + Send + Sync>;

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// The service: `List` answered from `source`, every other method UNIMPLEMENTED.
#[derive(Clone)]
pub struct FakeKubelet {
    source: Source,
}

impl FakeKubelet {
    /// A fake kubelet answering from `source`.
    pub fn new(source: Source) -> Self {
        FakeKubelet { source }
    }
}

impl NamedService for FakeKubelet {
    const NAME: &'static str = SERVICE;
}

struct List(Source);

impl UnaryService<ListPodResourcesRequest> for List {
    type Response = ListPodResourcesResponse;
    type Future = BoxFuture<Result<tonic::Response<ListPodResourcesResponse>, tonic::Status>>;

    fn call(&mut self, _: tonic::Request<ListPodResourcesRequest>) -> Self::Future {
        let answer = (self.0)();
        Box::pin(async move {
            answer
                .map(tonic::Response::new)
                .map_err(tonic::Status::unavailable)
        })
    }
}

impl tower::Service<Request<Body>> for FakeKubelet {
    type Response = Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<Response<Body>, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Body>) -> Self::Future {
        if req.uri().path() != LIST_PATH {
            let path = req.uri().path().to_string();
            return Box::pin(async move { Ok(tonic::Status::unimplemented(path).into_http()) });
        }
        let list = List(self.source.clone());
        Box::pin(async move {
            let mut grpc = tonic::server::Grpc::new(tonic_prost::ProstCodec::default());
            Ok(grpc.unary(list, req).await)
        })
    }
}

/// Serves `kubelet` on a new unix socket at `socket` until `shutdown` completes.
pub async fn serve(
    socket: &Path,
    kubelet: FakeKubelet,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    let listener = UnixListener::bind(socket).map_err(ServeError::Bind)?;
    serve_on(listener, kubelet, shutdown).await
}

async fn serve_on(
    listener: UnixListener,
    kubelet: FakeKubelet,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), ServeError> {
    tonic::transport::Server::builder()
        .add_service(kubelet)
        .serve_with_incoming_shutdown(UnixListenerStream::new(listener), shutdown)
        .await
        .map_err(ServeError::Serve)
}

/// A fake kubelet serving in the background (see [`spawn`]).
pub struct Running {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), ServeError>>,
}

/// Serves `source` on a new unix socket at `socket` (a stale socket file there is removed) in a
/// task of the current runtime. The socket is bound when this returns, so a client may connect
/// at once.
pub fn spawn(socket: &Path, source: Source) -> Result<Running, ServeError> {
    let _ = std::fs::remove_file(socket);
    let listener = UnixListener::bind(socket).map_err(ServeError::Bind)?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(serve_on(listener, FakeKubelet::new(source), async {
        let _ = stopped.await;
    }));
    Ok(Running { stop, task })
}

impl Running {
    /// Stops serving and waits for the server to end.
    pub async fn stop(self) -> Result<(), ServeError> {
        let _ = self.stop.send(());
        self.task.await.map_err(ServeError::Task)?
    }
}

/// Why the fake kubelet stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// The socket could not be created.
    #[error("cannot listen on the socket: {0}")]
    Bind(#[source] std::io::Error),
    /// The server failed.
    #[error("serving failed: {0}")]
    Serve(#[source] tonic::transport::Error),
    /// The background task panicked or was cancelled.
    #[error("the server's task ended abnormally: {0}")]
    Task(#[source] tokio::task::JoinError),
}

/// A source that reads `file` (a `ListPodResourcesResponse` as JSON, camelCase) on every request:
/// a missing or unreadable file is an UNAVAILABLE answer.
pub fn from_file(file: &Path) -> Source {
    let file = file.to_path_buf();
    Arc::new(move || {
        let text = std::fs::read_to_string(&file).map_err(|e| format!("{}: {e}", file.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))
    })
}
