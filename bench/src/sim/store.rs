//! The synthetic API server's objects: each collection (`/api/v1/nodes`, a namespace's Leases)
//! as a map from name to the object's JSON, one resourceVersion counter for everything (as etcd
//! gives), and the recent changes of each collection kept for watches that start a little behind
//! (older than that: 410 Gone, and the client lists again, as with a real API server).
//!
//! Objects are kept serialized: 100,000 kubelet-sized Nodes as `serde_json::Value`s would take
//! several GB; as text they take what their bytes take. A write parses one object, changes it
//! and serializes it again.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    sync::{Arc, Mutex, PoisonError},
};

use axum::body::Bytes;
use serde_json::Value;
use tokio::sync::broadcast;

/// Changes of a collection kept for watches that start behind.
const HISTORY: usize = 100_000;
/// Changes a slow watch may fall behind before it is ended (the client watches again).
const WATCH_BUFFER: usize = 65_536;

/// One stored object.
#[derive(Clone)]
pub struct Stored {
    /// Its JSON, with that resourceVersion.
    pub json: Arc<str>,
    /// What the last server-side apply to it held (the fields that manager owns).
    pub applied: Option<Arc<Value>>,
}

/// One change as a watch sends it: a whole line of the watch's stream.
#[derive(Clone, Debug)]
pub struct Change {
    /// The resourceVersion it made.
    pub rv: u64,
    /// `{"type":...,"object":...}` and a newline.
    pub line: Bytes,
}

/// A collection: its objects by name, its recent changes, and its watchers.
pub struct Collection {
    objects: BTreeMap<String, Stored>,
    history: VecDeque<Change>,
    /// The resourceVersion of the oldest change a watch can still start after.
    oldest: u64,
    watchers: broadcast::Sender<Change>,
}

impl Collection {
    fn new(rv: u64) -> Collection {
        Collection {
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            oldest: rv,
            watchers: broadcast::channel(WATCH_BUFFER).0,
        }
    }
}

/// A page of a list.
pub struct Page {
    /// The resourceVersion the list is at.
    pub rv: u64,
    /// The objects' JSON.
    pub items: Vec<Arc<str>>,
    /// The name to continue after, when there is more.
    pub next: Option<String>,
}

/// Where a watch starts.
pub enum Start {
    /// The changes after the resourceVersion asked for, and the receiver of later ones.
    From(Vec<Change>, broadcast::Receiver<Change>),
    /// That resourceVersion is older than the changes kept.
    Gone,
}

/// What a write did.
pub enum Written {
    /// The object as stored now.
    Ok(Arc<str>),
    /// No such object.
    NotFound,
    /// It exists already (create).
    Exists,
    /// The resourceVersion the write was conditioned on is not the object's.
    Conflict,
}

/// Every collection, and the resourceVersion counter.
#[derive(Default)]
pub struct Store {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    rv: u64,
    collections: HashMap<String, Collection>,
}

impl Inner {
    /// Stores `obj` as object `name` of `path` at the next resourceVersion and tells watchers
    /// (`kind`: ADDED or MODIFIED); returns its JSON.
    fn put(
        &mut self,
        path: &str,
        name: String,
        mut obj: Value,
        applied: Option<Arc<Value>>,
        kind: &str,
    ) -> Arc<str> {
        self.rv += 1;
        let rv = self.rv;
        stamp(&mut obj, rv, kind == "ADDED");
        let json: Arc<str> = obj.to_string().into();
        let c = self.collection(path);
        c.objects.insert(
            name,
            Stored {
                json: json.clone(),
                applied,
            },
        );
        Store::changed(c, rv, kind, &json);
        json
    }

    fn collection(&mut self, path: &str) -> &mut Collection {
        let rv = self.rv;
        self.collections
            .entry(path.to_string())
            .or_insert_with(|| Collection::new(rv))
    }
}

/// Sets `metadata.resourceVersion` (and a uid and creation time on a new object).
fn stamp(obj: &mut Value, rv: u64, new: bool) {
    let meta = &mut obj["metadata"];
    meta["resourceVersion"] = Value::from(rv.to_string());
    if new && meta.get("uid").is_none() {
        let name = meta["name"].as_str().unwrap_or_default().to_string();
        meta["uid"] = Value::from(format!("sim-{rv}-{name}"));
    }
    if new && meta.get("creationTimestamp").is_none() {
        meta["creationTimestamp"] = Value::from(jiff::Timestamp::now().to_string());
    }
}

fn line(kind: &str, json: &str) -> Bytes {
    Bytes::from(format!("{{\"type\":\"{kind}\",\"object\":{json}}}\n"))
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Records a change of `path` made at `rv` and tells its watchers.
    fn changed(c: &mut Collection, rv: u64, kind: &str, json: &str) {
        let change = Change {
            rv,
            line: line(kind, json),
        };
        if c.history.len() == HISTORY
            && let Some(dropped) = c.history.pop_front()
        {
            c.oldest = dropped.rv;
        }
        c.history.push_back(change.clone());
        // No watcher is no error.
        let _ = c.watchers.send(change);
    }

    /// Creates objects in bulk (the fleet before the operator starts): no watcher sees them
    /// but through a list.
    pub fn seed(&self, path: &str, objects: impl IntoIterator<Item = Value>) {
        let mut inner = self.lock();
        for mut obj in objects {
            inner.rv += 1;
            let rv = inner.rv;
            stamp(&mut obj, rv, true);
            let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
            let json: Arc<str> = obj.to_string().into();
            let c = inner.collection(path);
            c.objects.insert(name, Stored { json, applied: None });
            c.oldest = rv;
        }
    }

    /// A page of `path`'s objects after `after`, at most `limit` of them (0: all).
    pub fn list(&self, path: &str, after: Option<&str>, limit: usize) -> Page {
        let mut inner = self.lock();
        let rv = inner.rv;
        let c = inner.collection(path);
        let range = match after {
            Some(a) => c
                .objects
                .range::<str, _>((std::ops::Bound::Excluded(a), std::ops::Bound::Unbounded)),
            None => c.objects.range::<str, _>(..),
        };
        let take = if limit == 0 { usize::MAX } else { limit };
        let mut items = Vec::new();
        let mut last = None;
        let mut more = false;
        for (name, s) in range {
            if items.len() == take {
                more = true;
                break;
            }
            items.push(s.json.clone());
            last = Some(name.clone());
        }
        Page {
            rv,
            items,
            next: if more { last } else { None },
        }
    }

    /// One object.
    pub fn get(&self, path: &str, name: &str) -> Option<Stored> {
        self.lock().collection(path).objects.get(name).cloned()
    }

    /// Every object of `path` now, the resourceVersion they are at, and the receiver of the
    /// changes after them: a streamed list (`sendInitialEvents`).
    pub fn snapshot(&self, path: &str) -> (Vec<Arc<str>>, u64, broadcast::Receiver<Change>) {
        let mut inner = self.lock();
        let rv = inner.rv;
        let c = inner.collection(path);
        let all = c.objects.values().map(|s| s.json.clone()).collect();
        (all, rv, c.watchers.subscribe())
    }

    /// Where a watch of `path` from `rv` starts.
    pub fn watch(&self, path: &str, rv: u64) -> Start {
        let mut inner = self.lock();
        let c = inner.collection(path);
        if rv < c.oldest {
            return Start::Gone;
        }
        let behind = c.history.iter().filter(|ch| ch.rv > rv).cloned().collect();
        Start::From(behind, c.watchers.subscribe())
    }

    /// Creates `obj` in `path`.
    pub fn create(&self, path: &str, obj: Value) -> Written {
        let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let mut inner = self.lock();
        if inner.collection(path).objects.contains_key(&name) {
            return Written::Exists;
        }
        Written::Ok(inner.put(path, name, obj, None, "ADDED"))
    }

    /// Changes object `name` of `path` with `change`, which gets the object and what the last
    /// apply to it held, and says whether the write is refused (a failed precondition).
    pub fn update(
        &self,
        path: &str,
        name: &str,
        change: impl FnOnce(&mut Value, &mut Option<Arc<Value>>) -> bool,
    ) -> Written {
        let mut inner = self.lock();
        let Some(stored) = inner.collection(path).objects.get(name).cloned() else {
            return Written::NotFound;
        };
        let Ok(mut obj) = serde_json::from_str::<Value>(&stored.json) else {
            return Written::NotFound;
        };
        let mut applied = stored.applied;
        if !change(&mut obj, &mut applied) {
            return Written::Conflict;
        }
        Written::Ok(inner.put(path, name.to_string(), obj, applied, "MODIFIED"))
    }

    /// Deletes object `name` of `path`.
    pub fn delete(&self, path: &str, name: &str) -> Written {
        let mut inner = self.lock();
        inner.rv += 1;
        let rv = inner.rv;
        let c = inner.collection(path);
        let Some(stored) = c.objects.remove(name) else {
            return Written::NotFound;
        };
        Store::changed(c, rv, "DELETED", &stored.json);
        Written::Ok(stored.json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn named(name: &str) -> Value {
        serde_json::json!({"metadata": {"name": name}})
    }

    #[test]
    fn a_list_pages_in_name_order_and_a_watch_starts_after_its_version() {
        let store = Store::default();
        store.seed("/c", ["b", "a", "c"].map(named));
        let first = store.list("/c", None, 2);
        assert_eq!(first.items.len(), 2);
        assert_eq!(first.next.as_deref(), Some("b"));
        let rest = store.list("/c", first.next.as_deref(), 2);
        assert_eq!((rest.items.len(), rest.next), (1, None));
        let Written::Ok(_) = store.update("/c", "a", |o, _| {
            o["spec"] = Value::from(1);
            true
        }) else {
            panic!("update failed");
        };
        let Start::From(behind, _) = store.watch("/c", first.rv) else {
            panic!("gone");
        };
        assert_eq!(behind.len(), 1, "the one change after the list");
        assert!(
            std::str::from_utf8(&behind[0].line)
                .unwrap()
                .starts_with("{\"type\":\"MODIFIED\"")
        );
        assert!(
            matches!(store.watch("/c", 0), Start::Gone),
            "before the seeded objects"
        );
        assert!(matches!(store.update("/c", "a", |_, _| false), Written::Conflict));
    }
}
