//! CustomResourceDefinition generation. The YAML committed under `charts/gpunode/crds/` must
//! equal what this produces; a test in the operator crate checks it.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

use crate::{GpuNodePolicy, GpuNodeReport, GpuResetRequest};

/// First lines of every generated file.
pub const HEADER: &str = "# Generated from the Rust types in crds/ by `gpunode-operator crds`. Do not edit:\n\
# change the types and run `make crds`.\n";

/// The `format`s the API server knows; schemars also writes Rust's (`uint32`, `uint8`, ...),
/// which the API server ignores with a warning on every `helm install` and `kubectl apply`.
const KNOWN_FORMATS: [&str; 8] = [
    "int32",
    "int64",
    "float",
    "double",
    "byte",
    "date",
    "date-time",
    "duration",
];

/// The range a Rust integer format stands for, kept as minimum/maximum when the format goes
/// (no maximum for 64 bits: the API server reads bounds as floats, and 2^63-1 is not one).
fn integer_range(format: &str) -> Option<(i64, Option<i64>)> {
    Some(match format {
        "uint8" => (0, Some(u8::MAX.into())),
        "uint16" => (0, Some(u16::MAX.into())),
        "uint32" => (0, Some(u32::MAX.into())),
        "uint64" | "uint" => (0, None),
        "int8" => (i8::MIN.into(), Some(i8::MAX.into())),
        "int16" => (i16::MIN.into(), Some(i16::MAX.into())),
        _ => return None,
    })
}

/// Replaces every format the API server does not know by the range it stood for.
fn known_formats_only(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            let unknown = map
                .get("format")
                .and_then(|f| f.as_str())
                .filter(|f| !KNOWN_FORMATS.contains(f))
                .map(str::to_string);
            if let Some(format) = unknown {
                map.remove("format");
                if let Some((min, max)) = integer_range(&format) {
                    map.entry("minimum").or_insert(min.into());
                    if let Some(max) = max {
                        map.entry("maximum").or_insert(max.into());
                    }
                }
            }
            map.values_mut().for_each(known_formats_only);
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(known_formats_only),
        _ => {}
    }
}

fn without_unknown_formats(crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let Ok(mut value) = serde_json::to_value(&crd) else {
        return crd;
    };
    known_formats_only(&mut value);
    serde_json::from_value(value).unwrap_or(crd)
}

/// Every CRD with the file name it is committed under.
pub fn crds() -> Vec<(String, CustomResourceDefinition)> {
    [GpuNodePolicy::crd(), GpuNodeReport::crd(), GpuResetRequest::crd()]
        .into_iter()
        .map(without_unknown_formats)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn formats(v: &serde_json::Value, out: &mut Vec<String>) {
        match v {
            serde_json::Value::Object(map) => {
                if let Some(f) = map.get("format").and_then(|f| f.as_str()) {
                    out.push(f.to_string());
                }
                map.values().for_each(|v| formats(v, out));
            }
            serde_json::Value::Array(items) => items.iter().for_each(|v| formats(v, out)),
            _ => {}
        }
    }

    #[test]
    fn every_format_is_one_the_api_server_knows() {
        for (name, crd) in crds() {
            let value = serde_json::to_value(&crd).unwrap_or_default();
            let mut found = Vec::new();
            formats(&value, &mut found);
            let unknown: Vec<&String> = found
                .iter()
                .filter(|f| !KNOWN_FORMATS.contains(&f.as_str()))
                .collect();
            assert!(unknown.is_empty(), "{name}: unknown formats {unknown:?}");
        }
    }

    #[test]
    fn an_unsigned_format_becomes_its_range() {
        let mut v = serde_json::json!({"type": "integer", "format": "uint8", "maximum": 7});
        known_formats_only(&mut v);
        assert_eq!(
            v,
            serde_json::json!({"type": "integer", "minimum": 0, "maximum": 7})
        );
    }
}
