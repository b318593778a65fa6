//! Test support: builds the fake NVML library once per test process and gives each test its own
//! copy with its own fixture, so tests can run in parallel (a copy at a new path is a separate
//! dlopen with separate state; the fixture is the copy's `<lib>.json` sidecar).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The workspace's `node-probe` directory.
pub fn probe_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// A fake-NVML fixture file by name (`healthy-8xh100`).
pub fn nvml_fixture(name: &str) -> PathBuf {
    probe_dir()
        .join("fake-nvml/fixtures")
        .join(format!("{name}.json"))
}

/// A sysfs fixture tree by name (`lossless-8port`); its sysfs root is `<tree>/sys`.
pub fn sysfs_tree(name: &str) -> PathBuf {
    probe_dir().join("tests/fixtures/sysfs").join(name)
}

/// Builds `libfake_nvml.so` (once per process) with the same cargo, into a target directory of
/// its own next to this test's, so it never waits for the lock the running `cargo test` holds.
pub fn fake_nvml_build() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let exe = std::env::current_exe().expect("current_exe");
            // <target>/<profile>/deps/<test binary>
            let target = exe
                .ancestors()
                .nth(3)
                .unwrap_or_else(|| panic!("unexpected test binary path {}", exe.display()))
                .to_path_buf();
            let build_dir = target.join("fake-nvml-build");
            let status = Command::new(env!("CARGO"))
                .args(["build", "--quiet", "-p", "fake-nvml", "--manifest-path"])
                .arg(probe_dir().join("../Cargo.toml"))
                .env("CARGO_TARGET_DIR", &build_dir)
                .status()
                .expect("cannot run cargo to build fake-nvml");
            assert!(status.success(), "cargo build -p fake-nvml failed");
            let lib = build_dir.join("debug/libfake_nvml.so");
            assert!(lib.exists(), "{} missing after the build", lib.display());
            lib
        })
        .clone()
}

/// One private copy of the fake library and its fixture.
pub struct FakeNvml {
    _dir: tempfile::TempDir,
    /// Path to pass as the NVML library.
    pub lib: PathBuf,
    /// The fixture this copy reads (rewrite it to change what NVML says).
    pub fixture: PathBuf,
}

impl FakeNvml {
    /// A copy of the fake library reading a copy of fixture `name`.
    pub fn new(name: &str) -> FakeNvml {
        let text =
            std::fs::read_to_string(nvml_fixture(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
        Self::with_json(&text)
    }

    /// A copy of the fake library reading fixture `name` without its XID events: like the real
    /// library, the fake delivers only events that happen after an event set registered, so a
    /// test starts the collector on this, waits until its XID thread is ready, then lets the
    /// events happen with [`FakeNvml::write_fixture`].
    pub fn without_events(name: &str) -> FakeNvml {
        let fake = Self::new(name);
        fake.edit(|f| {
            if let Some(devices) = f["devices"].as_array_mut() {
                for d in devices {
                    d["events"] = serde_json::json!([]);
                }
            }
        });
        fake
    }

    /// Replaces the fixture with fixture `name` (its events not seen before happen now).
    pub fn write_fixture(&self, name: &str) {
        let text =
            std::fs::read_to_string(nvml_fixture(name)).unwrap_or_else(|e| panic!("fixture {name}: {e}"));
        self.write(&text);
    }

    /// A second copy of the library (a separate load, as another process would have) reading
    /// the same fixture text as this one now.
    pub fn another_instance(&self) -> FakeNvml {
        let text = std::fs::read_to_string(&self.fixture).expect("read fixture");
        Self::with_json(&text)
    }

    /// A copy of the fake library reading `json`.
    pub fn with_json(json: &str) -> FakeNvml {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = tempfile::tempdir().expect("tempdir");
        let lib = dir
            .path()
            .join(format!("libnvidia-ml-{}.so.1", N.fetch_add(1, Ordering::Relaxed)));
        std::fs::copy(fake_nvml_build(), &lib).expect("copy fake library");
        let mut fixture = lib.clone().into_os_string();
        fixture.push(".json");
        let fake = FakeNvml {
            _dir: dir,
            lib,
            fixture: PathBuf::from(fixture),
        };
        fake.write(json);
        fake
    }

    /// Replaces the fixture atomically (the library re-reads it on its next call).
    pub fn write(&self, json: &str) {
        let tmp = self.fixture.with_extension("tmp");
        std::fs::write(&tmp, json).expect("write fixture");
        std::fs::rename(&tmp, &self.fixture).expect("rename fixture");
    }

    /// The fixture as JSON, to edit.
    pub fn json(&self) -> serde_json::Value {
        let text = std::fs::read_to_string(&self.fixture).expect("read fixture");
        serde_json::from_str(&text).expect("parse fixture")
    }

    /// Edits the fixture in place.
    pub fn edit(&self, f: impl FnOnce(&mut serde_json::Value)) {
        let mut json = self.json();
        f(&mut json);
        self.write(&json.to_string());
    }
}

/// Waits for `cond` up to `timeout`, checking every few milliseconds; false on timeout.
pub fn wait_until(timeout: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + timeout;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::park_timeout(std::time::Duration::from_millis(5));
    }
}

/// Path helper for assertions.
pub fn display(p: &Path) -> String {
    p.display().to_string()
}
