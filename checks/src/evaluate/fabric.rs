//! `network.infiniband.*`, `network.maxPauseStormEventsPerHour` and `network.maxDiscardsPerHour`:
//! each port's error counters over the last hour against the policy's budgets.
//!
//! The probe publishes per port how much each counter rose over the last hour
//! (`errorRates`). A counter it did not publish is not judged: older kernels and drivers lack
//! some of them, and a port without a counter is not a broken port. Only a counter the probe
//! tried and failed to read (an `errors` entry naming it) makes its check Unknown.

use gpunode_crds::{DriftClass, ErrorCounter, policy::NetworkRequirements, report::RdmaDevice};

use super::{
    check,
    findings::{Findings, field_error},
};

/// One budget the policy sets: the check, the counter it judges and the most per hour.
#[derive(Debug, Clone, Copy)]
pub(super) struct Budget {
    check: &'static str,
    counter: ErrorCounter,
    limit: u32,
}

/// The budgets the policy sets, in a stable order.
pub(super) fn budgets(req: &NetworkRequirements) -> Vec<Budget> {
    let ib = req.infiniband.clone().unwrap_or_default();
    [
        (
            check::NETWORK_IB_MAX_LINK_DOWNED,
            ErrorCounter::LinkDowned,
            ib.max_link_downed_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_SYMBOL_ERRORS,
            ErrorCounter::SymbolErrors,
            ib.max_symbol_errors_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_LINK_ERROR_RECOVERY,
            ErrorCounter::LinkErrorRecovery,
            ib.max_link_error_recovery_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_RCV_ERRORS,
            ErrorCounter::RcvErrors,
            ib.max_rcv_errors_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_XMIT_DISCARDS,
            ErrorCounter::XmitDiscards,
            ib.max_xmit_discards_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_BUFFER_OVERRUNS,
            ErrorCounter::BufferOverruns,
            ib.max_buffer_overruns_per_hour,
        ),
        (
            check::NETWORK_IB_MAX_LINK_INTEGRITY_ERRORS,
            ErrorCounter::LinkIntegrityErrors,
            ib.max_link_integrity_errors_per_hour,
        ),
        (
            check::NETWORK_MAX_PAUSE_STORM_EVENTS,
            ErrorCounter::PauseStormErrors,
            req.max_pause_storm_events_per_hour,
        ),
        (
            check::NETWORK_MAX_DISCARDS,
            ErrorCounter::RxDiscards,
            req.max_discards_per_hour,
        ),
        (
            check::NETWORK_MAX_DISCARDS,
            ErrorCounter::OutOfBuffer,
            req.max_discards_per_hour,
        ),
    ]
    .into_iter()
    .filter_map(|(check, counter, limit)| {
        limit.map(|limit| Budget {
            check,
            counter,
            limit,
        })
    })
    .collect()
}

/// The check names of `budgets`, each once.
pub(super) fn asked(budgets: &[Budget]) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = budgets.iter().map(|b| b.check).collect();
    names.dedup();
    names
}

/// Judges one port's counters against every budget; `label` names the device as the other
/// network checks do.
pub(super) fn each_port(budgets: &[Budget], port: &RdmaDevice, label: &str, f: &mut Findings) {
    for budget in budgets {
        judge(budget, port, label, f);
    }
}

fn judge(budget: &Budget, port: &RdmaDevice, label: &str, f: &mut Findings) {
    let counter = budget.counter;
    let rates = port.error_rates.as_ref();
    let Some(observed) = rates.and_then(|r| r.get(counter)) else {
        // Unknown only when reading it failed; a counter the kernel lacks is not judged.
        let failed = field_error(&port.errors, counter.field()).or_else(|| {
            rates
                .is_none()
                .then(|| field_error(&port.errors, "errorRates"))
                .flatten()
        });
        if let Some(error) = failed {
            f.unknown(budget.check, None, format!("{label}: {}", error.reason));
        }
        return;
    };
    if observed > u64::from(budget.limit) {
        let window = rates.map_or(0, |r| r.window_minutes);
        f.drift(
            DriftClass::Network,
            budget.check,
            None,
            Some(label),
            format!("<= {} per hour", budget.limit),
            format!(
                "{observed} ({} on port {}, last {window}m)",
                counter.kernel_name(),
                port.port
            ),
        );
    }
}

#[cfg(test)]
mod tests {
    use gpunode_crds::{
        GpuNodePolicySpec, GpuNodeReport, GpuNodeReportSpec, GpuNodeReportStatus,
        policy::PortErrorBudgets,
        report::{CollectorName, CollectorStatus, FieldError, NetworkStatus, PortErrorRates},
    };
    use jiff::Timestamp;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::*;
    use crate::verdict::{NodeState, Verdict};

    fn now() -> Timestamp {
        Timestamp::from_second(1_800_000_000).unwrap()
    }

    /// Budgets a platform team might set for an NDR fabric.
    fn policy() -> GpuNodePolicySpec {
        GpuNodePolicySpec {
            network: Some(NetworkRequirements {
                infiniband: Some(PortErrorBudgets {
                    max_link_downed_per_hour: Some(2),
                    max_symbol_errors_per_hour: Some(100),
                    max_link_error_recovery_per_hour: Some(5),
                    max_rcv_errors_per_hour: Some(1000),
                    max_xmit_discards_per_hour: Some(1000),
                    max_buffer_overruns_per_hour: Some(10),
                    max_link_integrity_errors_per_hour: Some(10),
                }),
                max_pause_storm_events_per_hour: Some(0),
                max_discards_per_hour: Some(1000),
                ..NetworkRequirements::default()
            }),
            ..GpuNodePolicySpec::default()
        }
    }

    /// Counters of a healthy port that still moves a little, as real links do.
    fn healthy_rates() -> PortErrorRates {
        PortErrorRates {
            window_minutes: 60,
            link_downed: Some(0),
            symbol_errors: Some(12),
            link_error_recovery: Some(1),
            rcv_errors: Some(40),
            xmit_discards: Some(300),
            buffer_overruns: Some(0),
            link_integrity_errors: Some(0),
            rx_discards: Some(7),
            out_of_buffer: Some(90),
            pause_storm_warnings: Some(1),
            pause_storm_errors: Some(0),
        }
    }

    fn port(i: u32, rates: Option<PortErrorRates>) -> RdmaDevice {
        RdmaDevice {
            device: format!("mlx5_{i}"),
            port: 1,
            state: Some("Active".into()),
            error_rates: rates,
            ..RdmaDevice::default()
        }
    }

    fn verdict(ports: Vec<RdmaDevice>) -> Verdict {
        let mut report = GpuNodeReport::new(
            "n1",
            GpuNodeReportSpec {
                node_name: "n1".into(),
            },
        );
        report.status = Some(GpuNodeReportStatus {
            observed_at: Some(Time(now())),
            collectors: vec![CollectorStatus {
                name: CollectorName::Network,
                ok: true,
                error: None,
                error_kind: None,
                duration_ms: 1,
            }],
            network: Some(NetworkStatus { rdma_devices: ports }),
            ..GpuNodeReportStatus::default()
        });
        crate::evaluate::evaluate(&policy(), Some(&report), now())
    }

    #[test]
    fn healthy_counters_moving_at_normal_rates_never_drift() {
        let v = verdict((0..8).map(|i| port(i, Some(healthy_rates()))).collect());
        assert_eq!(v.state, NodeState::Compliant, "{v:?}");
    }

    #[test]
    fn a_flapping_link_drifts_naming_device_port_counter_rate_and_limit() {
        let mut ports: Vec<_> = (0..8).map(|i| port(i, Some(healthy_rates()))).collect();
        ports[3].error_rates = Some(PortErrorRates {
            link_downed: Some(7),
            ..healthy_rates()
        });
        let v = verdict(ports);
        assert_eq!(v.state, NodeState::Drifted);
        assert_eq!(v.drifts.len(), 1, "{v:?}");
        assert_eq!(v.drifts[0].class, DriftClass::Network);
        assert_eq!(
            v.drifts[0].message(),
            "mlx5_3: network.infiniband.maxLinkDownedPerHour: expected <= 2 per hour, \
             got 7 (link_downed on port 1, last 60m)"
        );
    }

    #[test]
    fn each_counter_over_its_budget_drifts_under_its_own_check() {
        let over = [
            (
                PortErrorRates {
                    symbol_errors: Some(101),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_SYMBOL_ERRORS,
            ),
            (
                PortErrorRates {
                    link_error_recovery: Some(6),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_LINK_ERROR_RECOVERY,
            ),
            (
                PortErrorRates {
                    rcv_errors: Some(1001),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_RCV_ERRORS,
            ),
            (
                PortErrorRates {
                    xmit_discards: Some(1001),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_XMIT_DISCARDS,
            ),
            (
                PortErrorRates {
                    buffer_overruns: Some(11),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_BUFFER_OVERRUNS,
            ),
            (
                PortErrorRates {
                    link_integrity_errors: Some(11),
                    ..healthy_rates()
                },
                check::NETWORK_IB_MAX_LINK_INTEGRITY_ERRORS,
            ),
            (
                PortErrorRates {
                    pause_storm_errors: Some(1),
                    ..healthy_rates()
                },
                check::NETWORK_MAX_PAUSE_STORM_EVENTS,
            ),
            (
                PortErrorRates {
                    rx_discards: Some(5000),
                    ..healthy_rates()
                },
                check::NETWORK_MAX_DISCARDS,
            ),
            (
                PortErrorRates {
                    out_of_buffer: Some(5000),
                    ..healthy_rates()
                },
                check::NETWORK_MAX_DISCARDS,
            ),
        ];
        for (rates, want) in over {
            let v = verdict(vec![port(0, Some(rates.clone()))]);
            let checks: Vec<&str> = v.drifts.iter().map(|d| d.check.as_str()).collect();
            assert_eq!(checks, vec![want], "{rates:?}");
        }
    }

    #[test]
    fn a_pause_storm_names_the_watchdog_counter() {
        let v = verdict(vec![port(
            2,
            Some(PortErrorRates {
                window_minutes: 12,
                pause_storm_errors: Some(3),
                ..healthy_rates()
            }),
        )]);
        assert_eq!(
            v.drifts[0].message(),
            "mlx5_2: network.maxPauseStormEventsPerHour: expected <= 0 per hour, \
             got 3 (tx_pause_storm_error_events on port 1, last 12m)"
        );
    }

    #[test]
    fn missing_counters_are_not_judged() {
        // An older kernel: no counters at all, or only some of them.
        let some = PortErrorRates {
            window_minutes: 60,
            link_downed: Some(0),
            ..PortErrorRates::default()
        };
        let v = verdict(vec![port(0, None), port(1, Some(some))]);
        assert_eq!(v.state, NodeState::Compliant, "{v:?}");
    }

    #[test]
    fn a_counter_that_could_not_be_read_is_unknown() {
        let mut broken = port(0, Some(healthy_rates()));
        broken.error_rates = Some(PortErrorRates {
            symbol_errors: None,
            ..healthy_rates()
        });
        broken.errors = vec![FieldError {
            field: "errorRates.symbolErrors".into(),
            reason: "counters/symbol_error: Is a directory".into(),
        }];
        let v = verdict(vec![broken]);
        assert_eq!(v.state, NodeState::Unknown, "{v:?}");
        assert_eq!(v.unknowns[0].check, check::NETWORK_IB_MAX_SYMBOL_ERRORS);
        assert!(
            v.unknowns[0].reason.contains("mlx5_0: counters/symbol_error"),
            "{v:?}"
        );
    }

    #[test]
    fn no_budget_no_check() {
        let spec = GpuNodePolicySpec {
            network: Some(NetworkRequirements::default()),
            ..GpuNodePolicySpec::default()
        };
        assert!(budgets(spec.network.as_ref().unwrap()).is_empty());
        assert_eq!(asked(&budgets(&policy().network.unwrap())).len(), 9);
    }
}
