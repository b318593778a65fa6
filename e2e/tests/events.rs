//! gpunode's Events on the real API server: every planned event becomes an Event of its own.
//! One pass can plan several events of one reason for one node (two taints added, two GPUs
//! quarantined); each must reach a person with its own note, not be folded into the first one's
//! series (kube's Recorder counts a repeat by reason and object, not by note).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeSet, sync::Arc, time::Duration};

use gpunode_e2e::{cluster::admin_client, nodes, scratch::rand_suffix, wait};
use gpunode_operator::{
    events::Publisher, leader::Leadership, metrics::Metrics, plan::PlannedEvent, reasons::Reason,
};
use k8s_openapi::api::core::v1::Node;
use kube::{Api, api::DeleteParams, runtime::events::Reporter};

const DEADLINE: Duration = Duration::from_secs(60);

#[tokio::test]
async fn events_of_one_reason_in_one_pass_each_keep_their_note() {
    let client = admin_client().await.unwrap();
    let name = format!("events-{:06x}", rand_suffix());
    let node = nodes::create_one(&client, &name).await.unwrap();
    let publisher = Publisher::start(
        client.clone(),
        Reporter {
            controller: "gpunode-operator".into(),
            instance: Some("e2e-events".into()),
        },
        Leadership::fixed(true),
        Arc::new(Metrics::new()),
    );
    let notes = [
        "added taint gpunode.dev/drift=xid:NoSchedule",
        "added taint gpunode.dev/drift=thermal:NoSchedule",
    ];
    let planned: Vec<PlannedEvent> = notes
        .iter()
        .map(|n| PlannedEvent {
            warning: true,
            reason: Reason::Tainted,
            note: n.to_string(),
        })
        .collect();
    publisher.publish(&node, &planned);

    let want: BTreeSet<String> = notes.iter().map(|n| n.to_string()).collect();
    let seen = wait::until("an Event for each note", DEADLINE, || async {
        let seen: BTreeSet<String> = nodes::events(&client, &name)
            .await?
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("Tainted"))
            .filter_map(|e| e.note)
            .collect();
        Ok((seen == want).then_some(seen))
    })
    .await;
    // On failure, say what was there: a folded series shows as one note counted twice.
    if seen.is_err() {
        let ours: Vec<(Option<String>, Option<i32>)> = nodes::events(&client, &name)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.note, e.series.map(|s| s.count)))
            .collect();
        panic!("expected the Events {want:?}; found (note, series count): {ours:?}");
    }
    let _ = Api::<Node>::all(client.clone())
        .delete(&name, &DeleteParams::default())
        .await;
}
