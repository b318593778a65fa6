//! A scratch namespace per test, labelled so leftovers on a shared cluster are easy to find.

use k8s_openapi::api::core::v1::Namespace;
use kube::{
    Api, Client,
    api::{DeleteParams, PostParams},
};

use crate::Error;

/// Label carried by every namespace the tests create.
pub const E2E_LABEL: &str = "gpunode.dev/e2e";

/// A namespace that exists for one test.
pub struct Scratch {
    /// Its name.
    pub name: String,
    client: Client,
}

impl Scratch {
    /// Creates a namespace named after `test` with a random suffix.
    pub async fn new(client: &Client, test: &str) -> Result<Self, Error> {
        let slug: String = test
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() {
                    c.to_ascii_lowercase()
                } else {
                    '-'
                }
            })
            .take(40)
            .collect();
        let name = format!("e2e-{}-{:06x}", slug.trim_matches('-'), rand_suffix());
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": {"name": name, "labels": {E2E_LABEL: "true"}},
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await?;
        Ok(Scratch {
            name,
            client: client.clone(),
        })
    }

    /// Deletes the namespace (and everything in it) without waiting.
    pub async fn delete(self) -> Result<(), Error> {
        Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await?;
        Ok(())
    }
}

/// Six hex digits that differ between calls and processes.
pub fn rand_suffix() -> u32 {
    use std::hash::{BuildHasher, RandomState};
    (RandomState::new().hash_one(std::time::SystemTime::now()) & 0xff_ffff) as u32
}
