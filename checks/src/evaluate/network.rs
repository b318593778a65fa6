//! `network.*`: RDMA devices and the RoCE lossless settings of their ports.

use std::{
    borrow::Cow,
    collections::{BTreeMap, BTreeSet},
};

use gpunode_crds::{
    DriftClass, ObservedTrust, PortState, TrustMode,
    policy::NetworkRequirements,
    report::{CollectorName, RdmaDevice},
};

use super::{
    check, fabric,
    findings::{Context, Findings, field_error, list, missing_reason},
    glob::glob_match,
};

pub(super) fn check(req: &NetworkRequirements, ctx: &Context<'_>, f: &mut Findings) {
    let budgets = fabric::budgets(req);
    let mut checks = asked(req);
    checks.extend(fabric::asked(&budgets));
    if let Some(reason) = ctx.collector_failure(CollectorName::Network) {
        f.all_unknown(&checks, &reason);
        return;
    }
    let Some(network) = &ctx.status.network else {
        f.all_unknown(&checks, "not reported");
        return;
    };

    let pattern = &req.rdma.device_pattern;
    let ports: Vec<&RdmaDevice> = network
        .rdma_devices
        .iter()
        .filter(|d| glob_match(pattern, &d.device))
        .collect();

    // A device's name says which port it is, unless the device has several ports listed.
    let mut ports_per_device: BTreeMap<&str, usize> = BTreeMap::new();
    for port in &ports {
        *ports_per_device.entry(port.device.as_str()).or_default() += 1;
    }

    // minDevices counts devices, not ports: a dual-port NIC is one device.
    let min = req.rdma.min_devices;
    if usize::try_from(min).is_ok_and(|min| ports_per_device.len() < min) {
        let devices: Vec<&str> = ports_per_device.keys().copied().collect();
        f.drift(
            DriftClass::Network,
            check::NETWORK_RDMA_MIN_DEVICES,
            None,
            None,
            format!(">= {min} devices matching {pattern:?}"),
            if devices.is_empty() {
                "0".to_string()
            } else {
                format!("{} ({})", devices.len(), devices.join(", "))
            },
        );
    }

    let masks = Masks {
        pfc: mask(&req.pfc_priorities),
        ecn: mask(&req.ecn_priorities),
    };
    for port in ports {
        let label = if ports_per_device.get(port.device.as_str()).copied().unwrap_or(0) > 1 {
            Cow::Owned(format!("{}/{}", port.device, port.port))
        } else {
            Cow::Borrowed(port.device.as_str())
        };
        each_port(req, &masks, port, &label, f);
        fabric::each_port(&budgets, port, &label, f);
    }
}

/// The network checks the policy asks for.
fn asked(req: &NetworkRequirements) -> Vec<&'static str> {
    [
        (req.rdma.min_devices > 0, check::NETWORK_RDMA_MIN_DEVICES),
        (req.roce_v2 == Some(true), check::NETWORK_ROCE_V2),
        (!req.pfc_priorities.is_empty(), check::NETWORK_PFC_PRIORITIES),
        (req.trust.is_some(), check::NETWORK_TRUST),
        (!req.ecn_priorities.is_empty(), check::NETWORK_ECN_PRIORITIES),
        (req.min_mtu.is_some(), check::NETWORK_MIN_MTU),
        (req.min_rate_gbps.is_some(), check::NETWORK_MIN_RATE_GBPS),
        (true, check::NETWORK_PORT_STATE),
    ]
    .into_iter()
    .filter_map(|(asked, name)| asked.then_some(name))
    .collect()
}

/// The policy's priority lists as bit sets, computed once per node rather than per port.
struct Masks {
    pfc: [u64; 4],
    ecn: [u64; 4],
}

/// A set of priorities as bits: comparing two of them allocates nothing.
fn mask(priorities: &[u8]) -> [u64; 4] {
    let mut m = [0u64; 4];
    for p in priorities {
        m[usize::from(*p / 64)] |= 1 << (p % 64);
    }
    m
}

fn is_subset(a: &[u64; 4], b: &[u64; 4]) -> bool {
    a.iter().zip(b).all(|(a, b)| a & !b == 0)
}

fn each_port(req: &NetworkRequirements, masks: &Masks, port: &RdmaDevice, label: &str, f: &mut Findings) {
    let dev = Some(label);
    let unknown = |f: &mut Findings, check: &str, field: &str| {
        f.unknown(
            check,
            None,
            format!("{label}: {}", missing_reason(&port.errors, field)),
        );
    };
    let drift = |f: &mut Findings, check: &str, expected: String, actual: String| {
        f.drift(DriftClass::Network, check, None, dev, expected, actual);
    };

    if req.roce_v2 == Some(true) {
        match port.roce_v2_gid {
            None => unknown(f, check::NETWORK_ROCE_V2, "roceV2Gid"),
            Some(false) => drift(
                f,
                check::NETWORK_ROCE_V2,
                "a RoCE v2 GID".to_string(),
                "no RoCE v2 GID".to_string(),
            ),
            Some(true) => {}
        }
    }

    if !req.pfc_priorities.is_empty() {
        match &port.pfc_priorities {
            None => unknown(f, check::NETWORK_PFC_PRIORITIES, "pfcPriorities"),
            Some(have) if mask(have) != masks.pfc => {
                let want: BTreeSet<u8> = req.pfc_priorities.iter().copied().collect();
                let have: BTreeSet<u8> = have.iter().copied().collect();
                drift(f, check::NETWORK_PFC_PRIORITIES, list(&want), list(&have));
            }
            Some(_) => {}
        }
    }

    if let Some(want) = req.trust {
        match port.trust {
            None => unknown(f, check::NETWORK_TRUST, "trust"),
            Some(ObservedTrust::Unknown) => f.unknown(
                check::NETWORK_TRUST,
                None,
                format!("{label}: trust mode could not be read"),
            ),
            Some(ObservedTrust::Dscp) if want != TrustMode::Dscp => {
                drift(
                    f,
                    check::NETWORK_TRUST,
                    trust(want).to_string(),
                    "dscp".to_string(),
                );
            }
            Some(ObservedTrust::Pcp) if want != TrustMode::Pcp => {
                drift(
                    f,
                    check::NETWORK_TRUST,
                    trust(want).to_string(),
                    "pcp".to_string(),
                );
            }
            Some(_) => {}
        }
    }

    if !req.ecn_priorities.is_empty() {
        match &port.ecn_priorities {
            None if field_error(&port.errors, "ecnPriorities").is_some() => {
                unknown(f, check::NETWORK_ECN_PRIORITIES, "ecnPriorities");
            }
            None => f.unknown(
                check::NETWORK_ECN_PRIORITIES,
                None,
                format!("{label}: ECN not reported (no NVIDIA OFED ECN settings)"),
            ),
            Some(have) if !is_subset(&masks.ecn, &mask(have)) => {
                let want: BTreeSet<u8> = req.ecn_priorities.iter().copied().collect();
                let have: BTreeSet<u8> = have.iter().copied().collect();
                drift(
                    f,
                    check::NETWORK_ECN_PRIORITIES,
                    format!("enabled on {}", list(&want)),
                    format!("enabled on {}", list(&have)),
                );
            }
            Some(_) => {}
        }
    }

    if let Some(min) = req.min_mtu {
        match port.mtu {
            None => unknown(f, check::NETWORK_MIN_MTU, "mtu"),
            Some(mtu) if mtu < min => drift(f, check::NETWORK_MIN_MTU, format!(">= {min}"), mtu.to_string()),
            Some(_) => {}
        }
    }

    if let Some(min) = req.min_rate_gbps {
        match port.rate_gbps {
            None => unknown(f, check::NETWORK_MIN_RATE_GBPS, "rateGbps"),
            Some(rate) if rate < min => drift(
                f,
                check::NETWORK_MIN_RATE_GBPS,
                format!(">= {min} Gb/s"),
                format!("{rate} Gb/s"),
            ),
            Some(_) => {}
        }
    }

    match port.state.as_deref() {
        None => unknown(f, check::NETWORK_PORT_STATE, "state"),
        Some(state) if !port_state_is(state, req.port_state) => drift(
            f,
            check::NETWORK_PORT_STATE,
            port_state(req.port_state).to_string(),
            state.to_string(),
        ),
        Some(_) => {}
    }
}

/// Compares a reported port state with the policy's, case-insensitively, also accepting the
/// sysfs form with its numeric prefix (`4: ACTIVE`).
fn port_state_is(reported: &str, want: PortState) -> bool {
    let reported = reported.trim();
    let name = match reported.split_once(':') {
        Some((num, name)) if !num.is_empty() && num.trim().bytes().all(|b| b.is_ascii_digit()) => name.trim(),
        _ => reported,
    };
    name.eq_ignore_ascii_case(port_state(want))
}

fn port_state(state: PortState) -> &'static str {
    match state {
        PortState::Active => "Active",
        PortState::Armed => "Armed",
        PortState::Init => "Init",
        PortState::Down => "Down",
    }
}

fn trust(mode: TrustMode) -> &'static str {
    match mode {
        TrustMode::Dscp => "dscp",
        TrustMode::Pcp => "pcp",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_states_compare_case_insensitively_with_or_without_the_sysfs_number() {
        for reported in ["Active", "ACTIVE", "active", "4: ACTIVE", " 4:ACTIVE "] {
            assert!(port_state_is(reported, PortState::Active), "{reported:?}");
        }
        for reported in [
            "DOWN",
            "1: DOWN",
            "ACTIVE_DEFER",
            "5: ACTIVE_DEFER",
            "x: ACTIVE",
            "",
        ] {
            assert!(!port_state_is(reported, PortState::Active), "{reported:?}");
        }
        assert!(port_state_is("1: DOWN", PortState::Down));
    }
}
