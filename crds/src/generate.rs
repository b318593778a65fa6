//! CustomResourceDefinition generation. The YAML committed under `charts/gpunode/crds/` must
//! equal what this produces; a test in the operator crate checks it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{GpuNodePolicy, GpuNodeReport};

/// First lines of every generated file.
pub const HEADER: &str = "# Generated from the Rust types in crds/ by `gpunode-operator crds`. Do not edit:\n\
# change the types and run `make crds`.\n";

/// Every CRD with the file name it is committed under.
pub fn crds() -> Vec<(String, CustomResourceDefinition)> {
    [GpuNodePolicy::crd(), GpuNodeReport::crd()]
        .into_iter()
        .map(|crd| {
            (
                format!("{}.yaml", crd.metadata.name.clone().unwrap_or_default()),
                crd,
            )
        })
        .collect()
}

/// One CRD as the YAML document that is committed.
pub fn to_yaml(crd: &CustomResourceDefinition) -> Result<String, serde_yaml::Error> {
    Ok(format!("{HEADER}{}", serde_yaml::to_string(crd)?))
}

/// Every CRD as one multi-document YAML stream, for `kubectl apply -f -`.
pub fn all_yaml() -> Result<String, serde_yaml::Error> {
    let docs = crds()
        .iter()
        .map(|(_, crd)| serde_yaml::to_string(crd))
        .collect::<Result<Vec<_>, _>>()?;
    Ok(format!("{HEADER}---\n{}", docs.join("---\n")))
}
