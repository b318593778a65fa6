//! The GpuNodePolicies the operator checks, from a read-only list/watch, so that the probe
//! publishes at once whatever would change the operator's verdict ([`crate::change::decide`]).
//!
//! [`watch_policies`] keeps a [`Known`] up to date: `Some` (all policies, possibly none) once
//! the watch has listed, `None` until then and whenever it fails. `None` makes the probe fall
//! back to the band heuristic, so a probe whose RBAC lacks `list`/`watch` on gpunodepolicies
//! (a chart older than the probe) keeps publishing as before: it warns once, the
//! `gpunode_probe_policy_watch_synced` metric says 0, and the watch retries with backoff.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::StreamExt;
use gpunode_crds::GpuNodePolicy;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use tokio::sync::watch;

use crate::change::KnownPolicy;
use crate::state::ProbeState;

/// The policies the probe decides by; `None` while it does not know them.
pub type Known = Option<Arc<Vec<KnownPolicy>>>;

/// Watches every GpuNodePolicy until `shutdown` completes, publishing each complete view to the
/// returned receiver (which starts at `None`).
pub fn watch_policies(
    client: Client,
    state: Arc<ProbeState>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> watch::Receiver<Known> {
    let (tx, rx) = watch::channel(None);
    let api: Api<GpuNodePolicy> = Api::all(client);
    tokio::spawn(async move {
        tokio::select! {
            () = shutdown => {}
            () = run(api, tx, state) => {}
        }
    });
    rx
}

/// Whether a watch error is the API server refusing the probe (RBAC), which retrying alone
/// does not cure.
fn forbidden(e: &watcher::Error) -> bool {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(s))
        | watcher::Error::WatchStartFailed(kube::Error::Api(s))
        | watcher::Error::WatchFailed(kube::Error::Api(s)) => s.code == 403,
        watcher::Error::WatchError(s) => s.code == 403,
        _ => false,
    }
}

/// Publishes `new` unless it equals what the receivers hold: only a change of what the probe
/// decides by (a policy's spec, a policy added or removed) wakes the publish loop. The operator
/// rewrites a policy's status up to once a second while nodes change, and each rewrite is a
/// watch event; waking on those made the probe observe every second and held a following XID
/// back behind that observation.
fn send_if_changed(tx: &watch::Sender<Known>, new: Known) -> bool {
    tx.send_if_modified(|held| {
        if *held == new {
            false
        } else {
            *held = new;
            true
        }
    })
}

async fn run(api: Api<GpuNodePolicy>, tx: watch::Sender<Known>, state: Arc<ProbeState>) {
    // Policies by name; `listing` buffers a relist until it is complete.
    let mut current: BTreeMap<String, KnownPolicy> = BTreeMap::new();
    let mut listing: Option<BTreeMap<String, KnownPolicy>> = None;
    let mut synced = false;
    let mut warned_forbidden = false;
    let known = |m: &BTreeMap<String, KnownPolicy>| Some(Arc::new(m.values().cloned().collect::<Vec<_>>()));
    let entry = |p: GpuNodePolicy| {
        (
            p.name_any(),
            KnownPolicy {
                name: p.name_any(),
                spec: p.spec,
            },
        )
    };
    let mut events = std::pin::pin!(watcher::watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listing = Some(BTreeMap::new()),
            Ok(Event::InitApply(p)) => {
                let (name, policy) = entry(p);
                listing.get_or_insert_with(BTreeMap::new).insert(name, policy);
            }
            Ok(Event::InitDone) => {
                current = listing.take().unwrap_or_default();
                if !synced {
                    tracing::info!(
                        policies = current.len(),
                        "policy watch synced: publishing by the operator's checks"
                    );
                }
                synced = true;
                warned_forbidden = false;
                state.set_policies(Some(current.len()));
                send_if_changed(&tx, known(&current));
            }
            Ok(Event::Apply(p)) => {
                let (name, policy) = entry(p);
                current.insert(name, policy);
                if synced {
                    state.set_policies(Some(current.len()));
                    send_if_changed(&tx, known(&current));
                }
            }
            Ok(Event::Delete(p)) => {
                current.remove(&p.name_any());
                if synced {
                    state.set_policies(Some(current.len()));
                    send_if_changed(&tx, known(&current));
                }
            }
            Err(e) => {
                state.record_policy_watch_error();
                // Events may have been missed: until the next complete list, decide as if no
                // policy were known (the band heuristic publishes more, never less).
                if synced {
                    tracing::warn!(error = %e, "policy watch failed; publishing by temperature bands until it lists again");
                }
                synced = false;
                listing = None;
                state.set_policies(None);
                tx.send_replace(None);
                if forbidden(&e) {
                    if !warned_forbidden {
                        tracing::warn!(error = %e, "may not list/watch gpunodepolicies (RBAC); publishing by temperature bands (grant get/list/watch on gpunodepolicies to the probe)");
                        warned_forbidden = true;
                    }
                } else {
                    tracing::debug!(error = %e, "policy watch error; retrying");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(code: u16) -> kube::core::Status {
        kube::core::Status::failure("refused", "Forbidden").with_code(code)
    }

    fn policy(name: &str, max_celsius: i32) -> KnownPolicy {
        KnownPolicy {
            name: name.into(),
            spec: serde_json::from_value(serde_json::json!({"cooling": {"maxGpuCelsius": max_celsius}}))
                .unwrap(),
        }
    }

    #[test]
    fn only_a_change_of_what_the_probe_decides_by_wakes_the_loop() {
        let (tx, mut rx) = watch::channel::<Known>(None);
        let one = |c| Some(Arc::new(vec![policy("p", c)]));
        assert!(send_if_changed(&tx, one(85)), "first view");
        assert!(rx.has_changed().unwrap());
        rx.borrow_and_update();
        // The same specs again (a status rewrite, a relist): nothing to wake for.
        assert!(!send_if_changed(&tx, one(85)));
        assert!(!rx.has_changed().unwrap());
        assert!(send_if_changed(&tx, one(80)), "a spec changed");
        assert!(send_if_changed(&tx, None), "the watch failed: fall back");
        assert!(send_if_changed(&tx, one(80)), "listed again");
    }

    #[test]
    fn only_a_403_counts_as_forbidden() {
        let api = |code| kube::Error::Api(Box::new(status(code)));
        assert!(forbidden(&watcher::Error::InitialListFailed(api(403))));
        assert!(forbidden(&watcher::Error::WatchStartFailed(api(403))));
        assert!(forbidden(&watcher::Error::WatchError(Box::new(status(403)))));
        assert!(!forbidden(&watcher::Error::InitialListFailed(api(500))));
        assert!(!forbidden(&watcher::Error::WatchError(Box::new(status(410)))));
        assert!(!forbidden(&watcher::Error::NoResourceVersion));
    }
}
