//! The operator in-process, as most e2e tests run it: the real controller (watches, reconciles,
//! writes) with a client of the chart's operator ServiceAccount, leading from the start.

use std::{sync::Arc, time::Duration};

use gpunode_operator::{controller, leader::Leadership, metrics::Metrics, server::Readiness};
use kube::Client;
use tokio::{sync::oneshot, task::JoinHandle};

use crate::Error;

/// A running in-process operator.
pub struct InProcess {
    handle: JoinHandle<()>,
    stop: oneshot::Sender<()>,
    /// Its Prometheus metrics.
    pub metrics: Arc<Metrics>,
}

impl InProcess {
    /// Starts the controller with `client` (normally [`crate::chart::operator_client`]);
    /// `instance` names it in Events.
    pub fn start(client: &Client, instance: &str) -> InProcess {
        let metrics = Arc::new(Metrics::new());
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(controller::run(
            client.clone(),
            controller::Options {
                instance: instance.to_string(),
                leadership: Leadership::fixed(true),
                metrics: metrics.clone(),
                readiness: Readiness::new(),
                heartbeat_namespace: crate::chart::NAMESPACE.to_string(),
            },
            async move {
                let _ = stopped.await;
            },
        ));
        InProcess {
            handle,
            stop,
            metrics,
        }
    }

    /// Graceful shutdown: in-flight reconciles finish; fails if that takes longer than 10 s.
    pub async fn stop(self) -> Result<(), Error> {
        let _ = self.stop.send(());
        match tokio::time::timeout(Duration::from_secs(10), self.handle).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(Error::Unexpected(format!("operator task: {e}"))),
            Err(_) => Err(Error::Unexpected("operator did not shut down within 10 s".into())),
        }
    }

    /// Kills it mid-work, as SIGKILL would: nothing in flight completes.
    pub async fn kill(self) {
        self.handle.abort();
        let _ = self.handle.await;
    }
}
