//! How the report cache keeps a report: what every reconcile pass reads of it (its version, when
//! it was observed, its GPUs and their pods) as plain fields, and the rest (trimmed, [`super::trim`])
//! as LZ4-compressed JSON, decoded only when the report is evaluated. A verdict is remembered
//! until the report changes or its time runs out ([`crate::cache`]), so a steady pass decodes
//! none; and the report event that changes a verdict is evaluated from the object the watch
//! delivered, before it is compacted. At 5,000 nodes the cached reports were most of the
//! operator's memory: the H100 fixture is 7.3 KB as Rust structs and 2 KB compressed.
//!
//! It may not change what a report says: a decoded report equals the trimmed one it kept.

use std::{borrow::Cow, sync::Arc};

use gpunode_crds::GpuNodeReport;
use jiff::Timestamp;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::{Resource, core::ClusterResourceScope, runtime::watcher};

use super::gpus::{gpu_pods, gpu_views};
use crate::plan::{GpuPods, GpuView};

/// A report as the watch delivers it: readable or not.
type GuardedReport = kube::core::DeserializeGuard<GpuNodeReport>;

/// A report as the cache keeps it.
#[derive(Clone, Debug)]
pub struct CachedReport {
    /// Its name and resourceVersion only.
    metadata: ObjectMeta,
    /// When its probe observed it (a readable report that says).
    observed_at: Option<Timestamp>,
    /// The GPUs it lists, by index and UUID (shared with every pass's view of the node).
    gpus: Arc<[GpuView]>,
    /// The pods it says hold each GPU.
    pods: Option<GpuPods>,
    body: Body,
}

#[derive(Clone, Debug)]
enum Body {
    /// The trimmed report as JSON, LZ4-compressed (its size prepended).
    Readable(Box<[u8]>),
    /// Why it did not deserialize.
    Unreadable(String),
}

/// Why a cached report could not be given back whole.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The report did not deserialize when it arrived.
    #[error("the GpuNodeReport cannot be read: {0}")]
    Unreadable(String),
    /// Its compressed form did not decode (a bug: it was encoded here).
    #[error("the cached GpuNodeReport does not decode: {0}")]
    Corrupt(String),
}

impl CachedReport {
    /// Compacts a report as the watch delivered it (already trimmed).
    pub fn new(guarded: &GuardedReport) -> CachedReport {
        let meta = guarded.meta();
        let metadata = ObjectMeta {
            name: meta.name.clone(),
            resource_version: meta.resource_version.clone(),
            ..ObjectMeta::default()
        };
        match &guarded.0 {
            Ok(report) => match serde_json::to_vec(report) {
                Ok(json) => CachedReport {
                    metadata,
                    observed_at: report
                        .status
                        .as_ref()
                        .and_then(|s| s.observed_at.as_ref())
                        .map(|t| t.0),
                    gpus: gpu_views(Some(report)).into(),
                    pods: gpu_pods(Some(report)),
                    body: Body::Readable(lz4_flex::compress_prepend_size(&json).into_boxed_slice()),
                },
                // A report that deserialized always serializes; kept as unreadable if not.
                Err(e) => CachedReport::unreadable(metadata, e.to_string()),
            },
            Err(e) => CachedReport::unreadable(metadata, e.error.clone()),
        }
    }

    fn unreadable(metadata: ObjectMeta, reason: String) -> CachedReport {
        CachedReport {
            metadata,
            observed_at: None,
            gpus: Arc::default(),
            pods: None,
            body: Body::Unreadable(reason),
        }
    }

    /// The whole (trimmed) report, decoded.
    pub fn report(&self) -> Result<GpuNodeReport, Error> {
        match &self.body {
            Body::Unreadable(reason) => Err(Error::Unreadable(reason.clone())),
            Body::Readable(compressed) => {
                let json = lz4_flex::decompress_size_prepended(compressed)
                    .map_err(|e| Error::Corrupt(e.to_string()))?;
                serde_json::from_slice(&json).map_err(|e| Error::Corrupt(e.to_string()))
            }
        }
    }

    /// When its probe observed it, if it is readable and says.
    pub fn observed_at(&self) -> Option<Timestamp> {
        self.observed_at
    }

    /// The GPUs it lists.
    pub fn gpus(&self) -> &Arc<[GpuView]> {
        &self.gpus
    }

    /// The pods it says hold each GPU ([`gpu_pods`]).
    pub fn pods(&self) -> Option<&GpuPods> {
        self.pods.as_ref()
    }

    /// Bytes it holds beyond its inline size, for the tests of what compaction saves.
    #[cfg(test)]
    fn compressed_len(&self) -> usize {
        match &self.body {
            Body::Readable(b) => b.len(),
            Body::Unreadable(r) => r.len(),
        }
    }
}

impl Resource for CachedReport {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(dt: &()) -> Cow<'_, str> {
        GpuNodeReport::kind(dt)
    }

    fn group(dt: &()) -> Cow<'_, str> {
        GpuNodeReport::group(dt)
    }

    fn version(dt: &()) -> Cow<'_, str> {
        GpuNodeReport::version(dt)
    }

    fn plural(dt: &()) -> Cow<'_, str> {
        GpuNodeReport::plural(dt)
    }

    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }

    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// A watch event of reports as the cache keeps them.
pub fn event(e: &watcher::Event<GuardedReport>) -> watcher::Event<CachedReport> {
    use watcher::Event as E;
    match e {
        E::Apply(r) => E::Apply(CachedReport::new(r)),
        E::Delete(r) => E::Delete(CachedReport::new(r)),
        E::Init => E::Init,
        E::InitApply(r) => E::InitApply(CachedReport::new(r)),
        E::InitDone => E::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::core::DeserializeGuard;

    fn fixture() -> GpuNodeReport {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/fixtures/evaluate/healthy-h100-report.yaml"
        );
        let text = std::fs::read_to_string(path).unwrap();
        let mut r: GpuNodeReport = serde_yaml::from_str(&text).unwrap();
        r.metadata.resource_version = Some("42".to_string());
        crate::observe::trim::report(&mut r);
        r
    }

    #[test]
    fn a_compacted_report_decodes_to_the_report_it_was_made_from() {
        let report = fixture();
        let cached = CachedReport::new(&DeserializeGuard(Ok(report.clone())));
        assert_eq!(cached.report().unwrap(), report);
        assert_eq!(cached.meta().resource_version.as_deref(), Some("42"));
        assert_eq!(cached.meta().name, report.metadata.name);
        assert_eq!(&cached.gpus()[..], gpu_views(Some(&report)).as_slice());
        assert_eq!(cached.pods(), gpu_pods(Some(&report)).as_ref());
        assert!(cached.observed_at().is_some());
        assert_eq!(
            cached.observed_at(),
            report
                .status
                .as_ref()
                .and_then(|s| s.observed_at.as_ref())
                .map(|t| t.0)
        );
        // What it is for: the H100 fixture's JSON is about 9 KB; compressed, it is a fraction.
        let json = serde_json::to_vec(&report).unwrap().len();
        assert!(
            cached.compressed_len() * 3 < json,
            "{} compressed bytes of {json}",
            cached.compressed_len()
        );
    }

    #[test]
    fn an_unreadable_report_stays_unreadable_with_its_reason() {
        let bad: GuardedReport = serde_json::from_value(serde_json::json!({
            "apiVersion": "gpunode.dev/v1alpha1", "kind": "GpuNodeReport",
            "metadata": {"name": "n1", "resourceVersion": "7"},
            "spec": {"nodeName": 3},
        }))
        .unwrap();
        assert!(bad.0.is_err(), "the fixture must not deserialize");
        let cached = CachedReport::new(&bad);
        assert!(matches!(cached.report(), Err(Error::Unreadable(_))));
        assert_eq!(cached.meta().resource_version.as_deref(), Some("7"));
        assert!(cached.gpus().is_empty() && cached.pods().is_none() && cached.observed_at().is_none());
        let err = cached.report().unwrap_err().to_string();
        assert!(err.starts_with("the GpuNodeReport cannot be read: "), "{err}");
        assert!(err.contains("integer `3`"), "{err}");
    }
}
