//! What a policy asks of a GPU's power: the limit the driver enforces, and how long the hardware
//! power brake may hold the clocks down.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::duration::Duration;

/// Requirements on each GPU's enforced power limit and power brake.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.minLimitWatts) || !has(self.maxLimitWatts) || self.minLimitWatts <= self.maxLimitWatts")
    .message("minLimitWatts is above maxLimitWatts")
    .field_path(".minLimitWatts"))]
pub struct PowerRequirements {
    /// Lowest enforced power limit a GPU may run under, as a percentage of its default limit
    /// (drift class Config): 90 means a 700 W H100 capped below 630 W (`nvidia-smi -pl`, a
    /// datacenter power policy) drifted. NVML keeps a limit someone set until it is changed
    /// again or the node reboots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub min_limit_percent_of_default: Option<u32>,

    /// Lowest enforced power limit in watts (drift class Config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5000))]
    pub min_limit_watts: Option<u32>,

    /// Highest enforced power limit in watts (drift class Config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 5000))]
    pub max_limit_watts: Option<u32>,

    /// Longest the hardware power brake (HwPowerBrakeSlowdown: the board or chassis asserted
    /// its power-brake signal, for example a failed power supply) may hold a GPU's clocks down
    /// without a break before the GPU drifts (class Throttle). A brief brake is not drift; one
    /// that lasts is a power-delivery fault. Unset: not checked (`cooling.forbiddenThrottleReasons`
    /// still sees each instant of braking).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_power_brake: Option<Duration>,
}
