//! The error counters of an RDMA port that a report counts over the last hour
//! ([`PortErrorRates`]): one typed name per counter, shared by the probe that counts them and
//! the checks that judge them, with the report field and the kernel name of each.

use serde::{Deserialize, Serialize};

use crate::report::PortErrorRates;

/// One error counter of a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum ErrorCounter {
    /// `counters/link_downed`: link flaps.
    LinkDowned,
    /// `counters/symbol_error`.
    SymbolErrors,
    /// `counters/link_error_recovery`.
    LinkErrorRecovery,
    /// `counters/port_rcv_errors`.
    RcvErrors,
    /// `counters/port_xmit_discards`.
    XmitDiscards,
    /// `counters/excessive_buffer_overrun_errors`.
    BufferOverruns,
    /// `counters/local_link_integrity_errors`.
    LinkIntegrityErrors,
    /// ethtool `rx_discards_phy`.
    RxDiscards,
    /// ethtool `rx_out_of_buffer`, else `hw_counters/out_of_buffer`.
    OutOfBuffer,
    /// ethtool `tx_pause_storm_warning_events`.
    PauseStormWarnings,
    /// ethtool `tx_pause_storm_error_events`.
    PauseStormErrors,
}

impl ErrorCounter {
    /// Every counter, in the report's order.
    pub const ALL: [ErrorCounter; 11] = [
        ErrorCounter::LinkDowned,
        ErrorCounter::SymbolErrors,
        ErrorCounter::LinkErrorRecovery,
        ErrorCounter::RcvErrors,
        ErrorCounter::XmitDiscards,
        ErrorCounter::BufferOverruns,
        ErrorCounter::LinkIntegrityErrors,
        ErrorCounter::RxDiscards,
        ErrorCounter::OutOfBuffer,
        ErrorCounter::PauseStormWarnings,
        ErrorCounter::PauseStormErrors,
    ];

    /// The report field, as a port's `errors` name it (`errorRates.linkDowned`).
    pub fn field(self) -> &'static str {
        match self {
            ErrorCounter::LinkDowned => "errorRates.linkDowned",
            ErrorCounter::SymbolErrors => "errorRates.symbolErrors",
            ErrorCounter::LinkErrorRecovery => "errorRates.linkErrorRecovery",
            ErrorCounter::RcvErrors => "errorRates.rcvErrors",
            ErrorCounter::XmitDiscards => "errorRates.xmitDiscards",
            ErrorCounter::BufferOverruns => "errorRates.bufferOverruns",
            ErrorCounter::LinkIntegrityErrors => "errorRates.linkIntegrityErrors",
            ErrorCounter::RxDiscards => "errorRates.rxDiscards",
            ErrorCounter::OutOfBuffer => "errorRates.outOfBuffer",
            ErrorCounter::PauseStormWarnings => "errorRates.pauseStormWarnings",
            ErrorCounter::PauseStormErrors => "errorRates.pauseStormErrors",
        }
    }

    /// The kernel's or driver's name, which the person on call looks up.
    pub fn kernel_name(self) -> &'static str {
        match self {
            ErrorCounter::LinkDowned => "link_downed",
            ErrorCounter::SymbolErrors => "symbol_error",
            ErrorCounter::LinkErrorRecovery => "link_error_recovery",
            ErrorCounter::RcvErrors => "port_rcv_errors",
            ErrorCounter::XmitDiscards => "port_xmit_discards",
            ErrorCounter::BufferOverruns => "excessive_buffer_overrun_errors",
            ErrorCounter::LinkIntegrityErrors => "local_link_integrity_errors",
            ErrorCounter::RxDiscards => "rx_discards_phy",
            ErrorCounter::OutOfBuffer => "out_of_buffer",
            ErrorCounter::PauseStormWarnings => "tx_pause_storm_warning_events",
            ErrorCounter::PauseStormErrors => "tx_pause_storm_error_events",
        }
    }
}

impl PortErrorRates {
    /// The count of `counter`, when reported.
    pub fn get(&self, counter: ErrorCounter) -> Option<u64> {
        *self.slot(counter)
    }

    /// Sets the count of `counter`.
    pub fn set(&mut self, counter: ErrorCounter, count: Option<u64>) {
        *self.slot_mut(counter) = count;
    }

    fn slot(&self, counter: ErrorCounter) -> &Option<u64> {
        match counter {
            ErrorCounter::LinkDowned => &self.link_downed,
            ErrorCounter::SymbolErrors => &self.symbol_errors,
            ErrorCounter::LinkErrorRecovery => &self.link_error_recovery,
            ErrorCounter::RcvErrors => &self.rcv_errors,
            ErrorCounter::XmitDiscards => &self.xmit_discards,
            ErrorCounter::BufferOverruns => &self.buffer_overruns,
            ErrorCounter::LinkIntegrityErrors => &self.link_integrity_errors,
            ErrorCounter::RxDiscards => &self.rx_discards,
            ErrorCounter::OutOfBuffer => &self.out_of_buffer,
            ErrorCounter::PauseStormWarnings => &self.pause_storm_warnings,
            ErrorCounter::PauseStormErrors => &self.pause_storm_errors,
        }
    }

    fn slot_mut(&mut self, counter: ErrorCounter) -> &mut Option<u64> {
        match counter {
            ErrorCounter::LinkDowned => &mut self.link_downed,
            ErrorCounter::SymbolErrors => &mut self.symbol_errors,
            ErrorCounter::LinkErrorRecovery => &mut self.link_error_recovery,
            ErrorCounter::RcvErrors => &mut self.rcv_errors,
            ErrorCounter::XmitDiscards => &mut self.xmit_discards,
            ErrorCounter::BufferOverruns => &mut self.buffer_overruns,
            ErrorCounter::LinkIntegrityErrors => &mut self.link_integrity_errors,
            ErrorCounter::RxDiscards => &mut self.rx_discards,
            ErrorCounter::OutOfBuffer => &mut self.out_of_buffer,
            ErrorCounter::PauseStormWarnings => &mut self.pause_storm_warnings,
            ErrorCounter::PauseStormErrors => &mut self.pause_storm_errors,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_counter_has_its_own_field_in_the_report() {
        let mut rates = PortErrorRates::default();
        for (i, counter) in ErrorCounter::ALL.into_iter().enumerate() {
            rates.set(counter, Some(i as u64 + 1));
        }
        for (i, counter) in ErrorCounter::ALL.into_iter().enumerate() {
            assert_eq!(rates.get(counter), Some(i as u64 + 1), "{counter:?}");
        }
        // The field names are the report's JSON names.
        let json = serde_json::to_value(&rates).unwrap_or_default();
        for counter in ErrorCounter::ALL {
            let key = counter.field().trim_start_matches("errorRates.");
            assert!(json.get(key).is_some(), "{key} is not a field of errorRates");
        }
    }
}
