//! Every name and label value that gpunode persists, derived in one place, so that the operator
//! and the node-probe (and every release of either) derive the same ones.
//!
//! What it holds: pure functions from a node's, GPU's or policy's name to the name of an object
//! gpunode writes or to the value of a label it sets. What it may not do: I/O, keep state, or
//! change a derivation that a release has used. Objects written under an earlier derivation are
//! found by their labels and annotations (gpunode's `managed-by` label and the node), never by
//! recomputing their names: a new derivation must keep reading what the old one wrote.
//!
//! | object | name | label values |
//! | --- | --- | --- |
//! | DeviceTaintRule | [`device_rule_name`] | node, GPU and policy through [`label_value`]; the full node name and GPU UUID in annotations |
//! | GpuResetRequest | [`reset_request_name`] | node and policy through [`label_value`] |
//! | remediation object (NodeHealthCheck convention) | [`remediation_name`] | node and policy through [`label_value`] |
//! | validation Job and its pod | [`validation_job_name`] | node and policy through [`label_value`] |
//! | probe heartbeat Lease | [`heartbeat_lease_name`] (the chart's admission policy spells the same rule) | fixed |
//! | GpuNodeReport | the node's name (the CRD's validation rule requires it) | none |
//! | Node | the node's own | `gpunode.dev/policy` through [`label_value`]; the others are fixed words |
//!
//! The operator's leader election Lease has a fixed name (a flag), and Events are named by the
//! API client that records them; neither is derived.
//!
//! # The digest
//!
//! [`digest`]`(parts, n)` is the first `n` lowercase hexadecimal digits of the SHA-256 (FIPS
//! 180-4) of the parts' UTF-8 bytes joined by one NUL byte (`0x00`, which no Kubernetes name
//! contains). SHA-256 is fixed by its standard, so every release on every platform derives the
//! same digest from the same parts. (`std::hash::DefaultHasher`, which derived some names before,
//! is documented to change between Rust releases.) Names and label values carry 16 digits (64
//! bits); validation Job names, which also carry their start time, 5.
//!
//! # Label values
//!
//! [`label_value`]`(s)` is `s` itself when it is a valid label value: empty, or at most 63
//! characters of `[A-Za-z0-9._-]` that begin and end with a letter or digit. Every node name of
//! at most 63 characters is one. Otherwise it is `<head>-<digest(s, 16)>`: `<head>` is `s` with
//! every character outside `[A-Za-z0-9._-]` replaced by `-`, cut to its first 46 characters and
//! stripped of anything but letters and digits at both ends (the value is the digest alone when
//! nothing is left). Two names that share their first 63 characters so get different values.
//!
//! # Object names
//!
//! [`object_name`]`(parts)` is the parts joined by `-` when that is a valid object name (a DNS
//! subdomain as Kubernetes validates it: at most 253 characters, dot-separated parts of
//! `[a-z0-9-]` that begin and end with a letter or digit). Otherwise it is `<head>-<digest(parts, 16)>`: `<head>` is the joined
//! parts in lower case with every character outside `[a-z0-9-]` replaced by `-`, stripped of `-`
//! at both ends and cut to its first 236 characters (then stripped of `-` at its end again).

use sha2::{Digest, Sha256};

/// Longest label value.
pub const MAX_LABEL_VALUE: usize = 63;
/// Longest object name (a DNS subdomain).
pub const MAX_NAME: usize = 253;
/// Longest DNS label (a Job's name, which becomes its pods' `job-name` label).
pub const MAX_DNS_LABEL: usize = 63;
/// Digits of the digest in a hashed name or label value.
pub const DIGEST_DIGITS: usize = 16;
/// Digits of the digest in a validation Job's name.
const JOB_DIGEST_DIGITS: usize = 5;
/// The field manager of every object and field the operator writes (server-side apply, and
/// the `managedFields` entry by which it recognises its own cordon).
pub const OPERATOR_FIELD_MANAGER: &str = "gpunode-operator";
/// Prefix of a probe heartbeat Lease's name; the rest is the node's name.
pub const LEASE_PREFIX: &str = "gpunode-probe-";
/// Prefix of every validation Job's name (and so of its pods').
pub const JOB_PREFIX: &str = "gpunode-validation-";

/// The first `digits` (at most 64) lowercase hexadecimal digits of the SHA-256 of `parts`
/// joined by a NUL byte.
pub fn digest(parts: &[&str], digits: usize) -> String {
    let mut h = Sha256::new();
    for (i, p) in parts.iter().enumerate() {
        if i > 0 {
            h.update([0u8]);
        }
        h.update(p.as_bytes());
    }
    let mut out = String::with_capacity(64);
    for b in h.finalize().iter() {
        out.push(hex_digit(b >> 4));
        out.push(hex_digit(b & 0xf));
    }
    out.truncate(digits);
    out
}

fn hex_digit(n: u8) -> char {
    char::from_digit(u32::from(n), 16).unwrap_or('0')
}

/// Whether `s` may be a label's value as it is.
pub fn is_label_value(s: &str) -> bool {
    s.is_empty()
        || (s.len() <= MAX_LABEL_VALUE
            && s.chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
            && starts_and_ends_alphanumeric(s))
}

/// Whether `s` may be an object's name (a DNS subdomain as Kubernetes validates it: at most 253
/// characters, dot-separated parts of `[a-z0-9-]` that begin and end with a letter or digit).
pub fn is_object_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_NAME && s.split('.').all(is_name_part)
}

fn is_name_part(s: &str) -> bool {
    s.chars()
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && starts_and_ends_alphanumeric(s)
}

/// Whether `s` is a DNS label (at most 63 characters of `[a-z0-9-]`, beginning and ending with a
/// letter or digit).
pub fn is_dns_label(s: &str) -> bool {
    s.len() <= MAX_DNS_LABEL && is_name_part(s)
}

fn starts_and_ends_alphanumeric(s: &str) -> bool {
    s.starts_with(|c: char| c.is_ascii_alphanumeric()) && s.ends_with(|c: char| c.is_ascii_alphanumeric())
}

/// `s` as a label value (see the module's documentation).
pub fn label_value(s: &str) -> String {
    if is_label_value(s) {
        return s.to_string();
    }
    let head: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
                c
            } else {
                '-'
            }
        })
        .take(MAX_LABEL_VALUE - DIGEST_DIGITS - 1)
        .collect();
    with_digest(head.trim_matches(|c: char| !c.is_ascii_alphanumeric()), &[s])
}

/// `<head>-<digest>`, or the digest alone when `head` is empty.
fn with_digest(head: &str, parts: &[&str]) -> String {
    let digest = digest(parts, DIGEST_DIGITS);
    if head.is_empty() {
        digest
    } else {
        format!("{head}-{digest}")
    }
}

/// An object name made of `parts` (see the module's documentation).
pub fn object_name(parts: &[&str]) -> String {
    let joined = parts.join("-");
    if is_object_name(&joined) {
        return joined;
    }
    let lower: String = joined
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    let head: String = lower
        .trim_matches('-')
        .chars()
        .take(MAX_NAME - DIGEST_DIGITS - 1)
        .collect();
    with_digest(head.trim_end_matches('-'), parts)
}

/// The DeviceTaintRule that quarantines `gpu` (its UUID) of `node`:
/// `gpunode-<node>-<uuid in lower case>` through [`object_name`].
pub fn device_rule_name(node: &str, gpu: &str) -> String {
    object_name(&["gpunode", node, &gpu.to_ascii_lowercase()])
}

/// The GpuResetRequest that resets GPU `index` of `node`: `<node>-gpu-<index>`. `None` when
/// that is longer than an object name may be (a node name over 247 characters): such a node's
/// GPUs are not reset.
pub fn reset_request_name(node: &str, index: u32) -> Option<String> {
    let name = format!("{node}-gpu-{index}");
    (!node.is_empty() && name.len() <= MAX_NAME).then_some(name)
}

/// The remediation object a repair step makes for `node` from a template: named after the node,
/// the NodeHealthCheck convention that remediators (medik8s and others) read.
pub fn remediation_name(node: &str) -> String {
    node.to_string()
}

/// The heartbeat Lease of `node`'s probe: `gpunode-probe-<node>`. `None` when that name would be
/// longer than an object name may be (a node name over 239 characters): such a probe heartbeats
/// by writing its whole report instead. The chart's admission policy lets a probe write only
/// the Lease of this name.
pub fn heartbeat_lease_name(node: &str) -> Option<String> {
    let name = format!("{LEASE_PREFIX}{node}");
    (!node.is_empty() && name.len() <= MAX_NAME).then_some(name)
}

/// The Job that validates `node`, started at `started` (seconds since the Unix epoch): a DNS
/// label, `gpunode-validation-<node>-<digest([node], 5)>-<started in base 36>`, the node's name in
/// lower case with every character outside `[a-z0-9]` replaced by `-` and cut to fit 63
/// characters. The digest tells apart two long names that share a beginning.
pub fn validation_job_name(node: &str, started: i64) -> String {
    let when = base36(u64::try_from(started).unwrap_or(0));
    let hash = digest(&[node], JOB_DIGEST_DIGITS);
    let room = MAX_DNS_LABEL - JOB_PREFIX.len() - "--".len() - hash.len() - when.len();
    let part: String = node
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .take(room)
        .collect();
    format!("{JOB_PREFIX}{}-{hash}-{when}", part.trim_end_matches('-'))
}

fn base36(mut n: u64) -> String {
    let mut out = Vec::new();
    loop {
        out.push(char::from_digit(u32::try_from(n % 36).unwrap_or(0), 36).unwrap_or('0'));
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.iter().rev().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fixed inputs, fixed outputs: a change of any of these renames objects that exist.
    #[test]
    fn test_vectors() {
        // SHA-256("") begins e3b0c442 98fc1c14 (FIPS 180-4's empty message).
        assert_eq!(digest(&[""], 16), "e3b0c44298fc1c14");
        assert_eq!(digest(&["node-1"], 16), "35971be6e9bb024a");
        assert_eq!(digest(&["gpu-node-1"], 5), "4e7f7");
        let a = "a".repeat(63);
        assert_eq!(label_value("node-1"), "node-1");
        assert_eq!(
            label_value(&format!("{a}-1")),
            format!("{}-606ca9e37ea4edc6", "a".repeat(46))
        );
        assert_eq!(
            label_value(&format!("{a}-2")),
            format!("{}-b8c0b1b487311218", "a".repeat(46))
        );
        assert_eq!(device_rule_name("n1", "GPU-ABC-5"), "gpunode-n1-gpu-abc-5");
        assert_eq!(
            device_rule_name(&"n".repeat(250), "GPU-1"),
            format!("gpunode-{}-5b49a788db38ceea", "n".repeat(228))
        );
        assert_eq!(
            device_rule_name(&format!("{}.example.com", "n".repeat(70)), "GPU-1"),
            format!("gpunode-{}.example.com-gpu-1", "n".repeat(70)),
            "a valid name, however long its parts"
        );
        assert_eq!(
            device_rule_name("n1", "MIG-GPU-1/1/0"),
            "gpunode-n1-mig-gpu-1-1-0-1d479ee0f9802e13",
            "not a valid name: its beginning and a digest"
        );
        assert_eq!(reset_request_name("gpu-07", 3).as_deref(), Some("gpu-07-gpu-3"));
        assert_eq!(
            heartbeat_lease_name("gpu-node-07").as_deref(),
            Some("gpunode-probe-gpu-node-07")
        );
        assert_eq!(remediation_name("gpu-node-07"), "gpu-node-07");
        // 2026-12-02T10:00:00Z.
        assert_eq!(
            validation_job_name("gpu-node-1", 1_796_205_600),
            "gpunode-validation-gpu-node-1-4e7f7-tpex40"
        );
    }
}
