//! Events for people, published off the reconcile path by one bounded worker.
//!
//! An Event is a record for people: awaiting it held every other node's action behind one more
//! API round trip (the scale benchmark's reaction p99 at 1,000 nodes), and a task per node would
//! grow without bound while the API server is slow. Batches wait in a bounded queue; when it is
//! full (thousands of nodes changing while the API server struggles) new ones are dropped and
//! counted (`gpunode_reconcile_errors_total{kind="event"}`): node labels, the condition and the
//! policy status still say everything an Event would.
//!
//! It never blocks a reconcile and never retries a dropped Event.

use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, ObjectReference};
use kube::{
    Client, Resource, ResourceExt,
    runtime::events::{Event, EventType, Recorder, Reporter},
};
use tokio::sync::mpsc;
use tracing::warn;

use crate::{
    leader::Leadership,
    metrics::{ErrorKind, Metrics},
    plan::PlannedEvent,
};

/// Node batches waiting to be published.
const QUEUE: usize = 4096;
/// Batches published at once.
const CONCURRENCY: usize = 8;

struct Batch {
    reference: ObjectReference,
    node: String,
    events: Vec<PlannedEvent>,
}

/// The sending side; cheap to share.
pub struct Publisher {
    tx: mpsc::Sender<Batch>,
    metrics: Arc<Metrics>,
}

impl Publisher {
    /// Starts the worker, which runs until the publisher is dropped.
    pub fn start(
        client: Client,
        reporter: Reporter,
        leadership: Leadership,
        metrics: Arc<Metrics>,
    ) -> Publisher {
        let (tx, rx) = mpsc::channel(QUEUE);
        let worker_metrics = metrics.clone();
        tokio::spawn(
            futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|b| (b, rx)) })
                .for_each_concurrent(CONCURRENCY, move |batch| {
                    let (client, reporter, leadership, metrics) = (
                        client.clone(),
                        reporter.clone(),
                        leadership.clone(),
                        worker_metrics.clone(),
                    );
                    async move { publish_now(&client, &reporter, &leadership, &metrics, batch).await }
                }),
        );
        Publisher { tx, metrics }
    }

    /// Queues a node's events; never waits.
    pub fn publish(&self, node: &Node, events: &[PlannedEvent]) {
        if events.is_empty() {
            return;
        }
        let batch = Batch {
            reference: node.object_ref(&()),
            node: node.name_any(),
            events: events.to_vec(),
        };
        if let Err(e) = self.tx.try_send(batch) {
            let node = match &e {
                mpsc::error::TrySendError::Full(b) | mpsc::error::TrySendError::Closed(b) => b.node.clone(),
            };
            warn!(node, "event queue full: this node's events are dropped");
            self.metrics.reconcile_error(ErrorKind::Event);
        }
    }
}

async fn publish_now(
    client: &Client,
    reporter: &Reporter,
    leadership: &Leadership,
    metrics: &Metrics,
    batch: Batch,
) {
    for e in &batch.events {
        // Fenced like every other write: none from a replica whose term has passed.
        if !leadership.is_leader() {
            return;
        }
        let event = Event {
            type_: if e.warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: e.reason.to_string(),
            note: Some(e.note.chars().take(1000).collect()),
            action: e.reason.to_string(),
            secondary: None,
        };
        // A Recorder of its own for each Event: a shared one counts an Event with the reason
        // and object of an earlier one (within 6 minutes) as a repeat of it, keeping only the
        // first note, so the second of two taints added in one pass, or of two GPUs
        // quarantined, would never be told. gpunode plans an event only on a transition, so
        // there is no noise for a series to fold.
        let recorder = Recorder::new(client.clone(), reporter.clone());
        if let Err(err) = recorder.publish(&event, &batch.reference).await {
            warn!(node = %batch.node, error = %err, "publishing an event failed");
            metrics.reconcile_error(ErrorKind::Event);
        }
    }
}
