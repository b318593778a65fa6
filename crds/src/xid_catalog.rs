//! NVIDIA's XID catalogue: the immediate resolution NVIDIA publishes for each XID, as data.
//!
//! Source: "Analyzing Xid Errors with the Xid Catalog", NVIDIA,
//! <https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html>, table "Xids", column
//! "Resolution Bucket (Immediate Action)", for Ampere and newer GPUs. Edition used: the one
//! covering XIDs 1-172 (driver branch R610), read December 2026 ([`XID_CATALOG_VERSION`]).
//!
//! How each row was checked (the page could only be read in part):
//! - XIDs 1-13 against the page's own text.
//! - XIDs 14-161 against two transcriptions of the catalogue that agree on them: NVIDIA's
//!   NVSentinel (`distros/kubernetes/nvsentinel/charts/gpu-health-monitor/xiderrorsmapping.csv`,
//!   commit 6f8b0fc; it spells CONTACT_SUPPORT as UNEXPECTED_ERR_REPORT_ISSUE) and a table of
//!   the R610 edition. Their mnemonics differ for 108 and 137; NVSentinel's are kept.
//! - Unverified, the two disagree: 108 (IGNORE here, NVSentinel CONTACT_SUPPORT) and 160
//!   (IGNORE here, NVSentinel RESTART_BM). The R610 edition's value is used.
//! - Unverified spelling: XID 154's resolution (`XID_154`; NVSentinel writes a sentence).
//! - Left out: 162-172, which the R610 edition lists without a resolution. An XID not in the
//!   table has no resolution, so it drifts only when `fatalXids` lists it.
//!
//! XIDs the catalogue marks "Unused" on current GPUs have CONTACT_SUPPORT, as the catalogue says.
//! To update: change the rows and [`XID_CATALOG_VERSION`] together; the tests keep the table
//! sorted and free of duplicates.

use crate::xid_resolution::XidResolution::{self, *};

/// The catalogue edition this table follows.
pub const XID_CATALOG_VERSION: &str = "nvidia-xid-catalog-r610";

/// One XID of the catalogue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct XidEntry {
    /// The XID number.
    pub xid: u32,
    /// The driver's name for it (`ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS`).
    pub mnemonic: &'static str,
    /// What NVIDIA says to do right away.
    pub resolution: XidResolution,
}

const fn entry(xid: u32, mnemonic: &'static str, resolution: XidResolution) -> XidEntry {
    XidEntry {
        xid,
        mnemonic,
        resolution,
    }
}

/// The catalogue entry of `xid`, if NVIDIA lists one.
pub fn lookup(xid: u32) -> Option<&'static XidEntry> {
    CATALOG
        .binary_search_by_key(&xid, |e| e.xid)
        .ok()
        .and_then(|i| CATALOG.get(i))
}

/// The resolution NVIDIA gives `xid`, if it lists one.
pub fn resolution(xid: u32) -> Option<XidResolution> {
    lookup(xid).map(|e| e.resolution)
}

/// The catalogue, sorted by XID.
#[rustfmt::skip]
pub const CATALOG: &[XidEntry] = &[
    entry(1, "ROBUST_CHANNEL_FIFO_ERROR_FIFO_METHOD", ContactSupport),
    entry(2, "ROBUST_CHANNEL_FIFO_ERROR_SW_METHOD", ContactSupport),
    entry(3, "ROBUST_CHANNEL_FIFO_ERROR_UNK_METHOD", ContactSupport),
    entry(4, "ROBUST_CHANNEL_FIFO_ERROR_CHANNEL_BUSY", ContactSupport),
    entry(5, "ROBUST_CHANNEL_FIFO_ERROR_RUNOUT_OVERFLOW", ContactSupport),
    entry(6, "ROBUST_CHANNEL_FIFO_ERROR_PARSE_ERR", ContactSupport),
    entry(7, "ROBUST_CHANNEL_FIFO_ERROR_PTE_ERR", ContactSupport),
    entry(8, "ROBUST_CHANNEL_FIFO_ERROR_IDLE_TIMEOUT", RestartApp),
    entry(9, "ROBUST_CHANNEL_GR_ERROR_INSTANCE", ContactSupport),
    entry(10, "ROBUST_CHANNEL_GR_ERROR_SINGLE_STEP", ContactSupport),
    entry(11, "ROBUST_CHANNEL_GR_ERROR_MISSING_HW", RestartApp),
    entry(12, "ROBUST_CHANNEL_GR_ERROR_SW_METHOD", ContactSupport),
    entry(13, "ROBUST_CHANNEL_GR_EXCEPTION", RestartApp),
    entry(14, "ROBUST_CHANNEL_FAKE_ERROR", Ignore),
    entry(15, "ROBUST_CHANNEL_SCANLINE_TIMEOUT", ContactSupport),
    entry(16, "ROBUST_CHANNEL_VBLANK_CALLBACK_TIMEOUT", ContactSupport),
    entry(17, "ROBUST_CHANNEL_PARAMETER_ERROR", ContactSupport),
    entry(18, "ROBUST_CHANNEL_BUS_MASTER_TIMEOUT_ERROR", ContactSupport),
    entry(19, "ROBUST_CHANNEL_DISP_MISSED_NOTIFIER", ContactSupport),
    entry(20, "ROBUST_CHANNEL_MPEG_ERROR_SW_METHOD", ContactSupport),
    entry(21, "ROBUST_CHANNEL_ME_ERROR_SW_METHOD", ContactSupport),
    entry(22, "ROBUST_CHANNEL_VP_ERROR_SW_METHOD", ContactSupport),
    entry(23, "ROBUST_CHANNEL_RC_LOGGING_ENABLED", ContactSupport),
    entry(24, "ROBUST_CHANNEL_GR_SEMAPHORE_TIMEOUT", ContactSupport),
    entry(25, "ROBUST_CHANNEL_GR_ILLEGAL_NOTIFY", RestartApp),
    entry(26, "ROBUST_CHANNEL_FIFO_ERROR_FBISTATE_TIMEOUT", ContactSupport),
    entry(27, "ROBUST_CHANNEL_VP_ERROR", ContactSupport),
    entry(28, "ROBUST_CHANNEL_VP2_ERROR", ContactSupport),
    entry(29, "ROBUST_CHANNEL_BSP_ERROR", ContactSupport),
    entry(30, "ROBUST_CHANNEL_BAD_ADDR_ACCESS", ContactSupport),
    entry(31, "ROBUST_CHANNEL_FIFO_ERROR_MMU_ERR_FLT", RestartApp),
    entry(32, "ROBUST_CHANNEL_PBDMA_ERROR", RestartApp),
    entry(33, "ROBUST_CHANNEL_SEC_ERROR", ContactSupport),
    entry(34, "ROBUST_CHANNEL_MSVLD_ERROR", ContactSupport),
    entry(35, "ROBUST_CHANNEL_MSPDEC_ERROR", ContactSupport),
    entry(36, "ROBUST_CHANNEL_MSPPP_ERROR", ContactSupport),
    entry(37, "ROBUST_CHANNEL_FECS_ERR_UNIMP_FIRMWARE_METHOD", Ignore),
    entry(38, "ROBUST_CHANNEL_FECS_ERR_WATCHDOG_TIMEOUT", Ignore),
    entry(39, "ROBUST_CHANNEL_CE0_ERROR", RestartApp),
    entry(40, "ROBUST_CHANNEL_CE1_ERROR", RestartApp),
    entry(41, "ROBUST_CHANNEL_CE2_ERROR", RestartApp),
    entry(42, "ROBUST_CHANNEL_VIC_ERROR", ContactSupport),
    entry(43, "ROBUST_CHANNEL_RESETCHANNEL_VERIF_ERROR", Ignore),
    entry(44, "ROBUST_CHANNEL_GR_FAULT_DURING_CTXSW", Ignore),
    entry(45, "ROBUST_CHANNEL_PREEMPTIVE_REMOVAL", WorkflowXid45),
    entry(46, "ROBUST_CHANNEL_GPU_TIMEOUT_ERROR", ResetGpu),
    entry(47, "ROBUST_CHANNEL_NVENC0_ERROR", ContactSupport),
    entry(48, "ROBUST_CHANNEL_GPU_ECC_DBE", WorkflowXid48),
    entry(49, "SILENT_RUNNING_CONSTANT_LEVEL_SET_BY_REGISTRY", ContactSupport),
    entry(50, "SILENT_RUNNING_LEVEL_TRANSITION_DUE_TO_RC_ERROR", ContactSupport),
    entry(51, "SILENT_RUNNING_STRESS_TEST_FAILURE", ContactSupport),
    entry(52, "SILENT_RUNNING_LEVEL_TRANS_DUE_TO_TEMP_RISE", ContactSupport),
    entry(53, "SILENT_RUNNING_TEMP_REDUCED_CLOCKING", ContactSupport),
    entry(54, "SILENT_RUNNING_PWR_REDUCED_CLOCKING", CheckMechanicals),
    entry(55, "SILENT_RUNNING_TEMPERATURE_READ_ERROR", ContactSupport),
    entry(56, "DISPLAY_CHANNEL_EXCEPTION", ContactSupport),
    entry(57, "FB_LINK_TRAINING_FAILURE_ERROR", ContactSupport),
    entry(58, "FB_MEMORY_ERROR", ContactSupport),
    entry(59, "PMU_ERROR", ContactSupport),
    entry(60, "ROBUST_CHANNEL_SEC2_ERROR", RestartApp),
    entry(61, "PMU_BREAKPOINT", ContactSupport),
    entry(62, "PMU_HALT_ERROR", ResetGpu),
    entry(63, "INFOROM_DRAM_RETIREMENT_EVENT", Ignore),
    entry(64, "INFOROM_DRAM_RETIREMENT_FAILURE", ResetGpu),
    entry(65, "ROBUST_CHANNEL_NVENC1_ERROR", ContactSupport),
    entry(66, "ROBUST_CHANNEL_FECS_ERR_REG_ACCESS_VIOLATION", Ignore),
    entry(67, "ROBUST_CHANNEL_FECS_ERR_VERIF_VIOLATION", Ignore),
    entry(68, "ROBUST_CHANNEL_NVDEC0_ERROR", RestartApp),
    entry(69, "ROBUST_CHANNEL_GR_CLASS_ERROR", RestartApp),
    entry(70, "ROBUST_CHANNEL_CE3_ERROR", RestartApp),
    entry(71, "ROBUST_CHANNEL_CE4_ERROR", RestartApp),
    entry(72, "ROBUST_CHANNEL_CE5_ERROR", RestartApp),
    entry(73, "ROBUST_CHANNEL_NVENC2_ERROR", ContactSupport),
    entry(74, "NVLINK_ERROR", WorkflowNvlinkErr),
    entry(75, "ROBUST_CHANNEL_CE6_ERROR", RestartApp),
    entry(76, "ROBUST_CHANNEL_CE7_ERROR", RestartApp),
    entry(77, "ROBUST_CHANNEL_CE8_ERROR", RestartApp),
    entry(78, "VGPU_START_ERROR", UpdateSwfw),
    entry(79, "ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS", RestartBm),
    entry(80, "PBDMA_PUSHBUFFER_CRC_MISMATCH", RestartApp),
    entry(81, "ROBUST_CHANNEL_VGA_SUBSYSTEM_ERROR", ContactSupport),
    entry(82, "ROBUST_CHANNEL_NVJPG0_ERROR", RestartApp),
    entry(83, "ROBUST_CHANNEL_NVDEC1_ERROR", RestartApp),
    entry(84, "ROBUST_CHANNEL_NVDEC2_ERROR", RestartApp),
    entry(85, "ROBUST_CHANNEL_CE9_ERROR", RestartApp),
    entry(86, "ROBUST_CHANNEL_OFA0_ERROR", RestartApp),
    entry(87, "NVTELEMETRY_DRIVER_REPORT", ContactSupport),
    entry(88, "ROBUST_CHANNEL_NVDEC3_ERROR", RestartApp),
    entry(89, "ROBUST_CHANNEL_NVDEC4_ERROR", RestartApp),
    entry(90, "LTC_ERROR", ContactSupport),
    entry(91, "RESERVED_XID", ContactSupport),
    entry(92, "EXCESSIVE_SBE_INTERRUPTS", Ignore),
    entry(93, "INFOROM_ERASE_LIMIT_EXCEEDED", Ignore),
    entry(94, "ROBUST_CHANNEL_CONTAINED_ERROR", RestartApp),
    entry(95, "ROBUST_CHANNEL_UNCONTAINED_ERROR", ResetGpu),
    entry(96, "ROBUST_CHANNEL_NVDEC5_ERROR", RestartApp),
    entry(97, "ROBUST_CHANNEL_NVDEC6_ERROR", RestartApp),
    entry(98, "ROBUST_CHANNEL_NVDEC7_ERROR", RestartApp),
    entry(99, "ROBUST_CHANNEL_NVJPG1_ERROR", RestartApp),
    entry(100, "ROBUST_CHANNEL_NVJPG2_ERROR", RestartApp),
    entry(101, "ROBUST_CHANNEL_NVJPG3_ERROR", RestartApp),
    entry(102, "ROBUST_CHANNEL_NVJPG4_ERROR", RestartApp),
    entry(103, "ROBUST_CHANNEL_NVJPG5_ERROR", RestartApp),
    entry(104, "ROBUST_CHANNEL_NVJPG6_ERROR", RestartApp),
    entry(105, "ROBUST_CHANNEL_NVJPG7_ERROR", RestartApp),
    entry(106, "SMBPBI_TEST_MESSAGE", Ignore),
    entry(107, "SMBPBI_TEST_MESSAGE_SILENT", Ignore),
    entry(108, "DESTINATION_FLA_TRANSLATION_ERROR", Ignore),  // unverified: sources disagree
    entry(109, "ROBUST_CHANNEL_CTXSW_TIMEOUT_ERROR", ResetGpu),
    entry(110, "SEC_FAULT_ERROR", ResetGpu),
    entry(111, "BUNDLE_ERROR_EVENT", ContactSupport),
    entry(112, "DISP_SUPERVISOR_ERROR", ContactSupport),
    entry(113, "DP_LT_FAILURE", ContactSupport),
    entry(114, "HEAD_RG_UNDERFLOW", ContactSupport),
    entry(115, "CORE_CHANNEL_REGS", ContactSupport),
    entry(116, "WINDOW_CHANNEL_REGS", ContactSupport),
    entry(117, "CURSOR_CHANNEL_REGS", ContactSupport),
    entry(118, "HEAD_REGS", ContactSupport),
    entry(119, "GSP_RPC_TIMEOUT", ResetGpu),
    entry(120, "GSP_ERROR", ResetGpu),
    entry(121, "C2C_ERROR", Ignore),
    entry(122, "SPI_PMU_RPC_READ_FAIL", ContactSupport),
    entry(123, "SPI_PMU_RPC_WRITE_FAIL", ContactSupport),
    entry(124, "SPI_PMU_RPC_ERASE_FAIL", ContactSupport),
    entry(125, "INFOROM_FS_ERROR", ContactSupport),
    entry(126, "ROBUST_CHANNEL_CE10_ERROR", RestartApp),
    entry(127, "ROBUST_CHANNEL_CE11_ERROR", RestartApp),
    entry(128, "ROBUST_CHANNEL_CE12_ERROR", RestartApp),
    entry(129, "ROBUST_CHANNEL_CE13_ERROR", RestartApp),
    entry(130, "ROBUST_CHANNEL_CE14_ERROR", RestartApp),
    entry(131, "ROBUST_CHANNEL_CE15_ERROR", RestartApp),
    entry(132, "ROBUST_CHANNEL_CE16_ERROR", RestartApp),
    entry(133, "ROBUST_CHANNEL_CE17_ERROR", RestartApp),
    entry(134, "ROBUST_CHANNEL_CE18_ERROR", RestartApp),
    entry(135, "ROBUST_CHANNEL_CE19_ERROR", RestartApp),
    entry(136, "ALI_TRAINING_FAIL", ResetGpu),
    entry(137, "NVLINK_FLA_PRIV_ERR", Ignore),
    entry(138, "ROBUST_CHANNEL_DLA_ERROR", ContactSupport),
    entry(139, "ROBUST_CHANNEL_OFA1_ERROR", RestartApp),
    entry(140, "UNRECOVERABLE_ECC_ERROR_ESCAPE", ResetGpu),
    entry(141, "ROBUST_CHANNEL_FAST_PATH_ERROR", Ignore),
    entry(142, "ROBUST_CHANNEL_NVENC3_ERROR", ContactSupport),
    entry(143, "GPU_INIT_ERROR", ResetGpu),
    entry(144, "NVLINK_SAW_ERROR", WorkflowNvlink5Err),
    entry(145, "NVLINK_RLW_ERROR", WorkflowNvlink5Err),
    entry(146, "NVLINK_TLW_ERROR", WorkflowNvlink5Err),
    entry(147, "NVLINK_TREX_ERROR", WorkflowNvlink5Err),
    entry(148, "NVLINK_NVLPW_CTRL_ERROR", WorkflowNvlink5Err),
    entry(149, "NVLINK_NETIR_ERROR", WorkflowNvlink5Err),
    entry(150, "NVLINK_MSE_ERROR", WorkflowNvlink5Err),
    entry(151, "ROBUST_CHANNEL_KEY_ROTATION_ERROR", RestartVm),
    entry(152, "ROBUST_CHANNEL_DLA_SMMU_ERROR", Ignore),
    entry(153, "ROBUST_CHANNEL_DLA_TIMEOUT", Ignore),
    entry(154, "GPU_RECOVERY_ACTION_CHANGED", Xid154),
    entry(155, "NVLINK_SW_DEFINED_ERROR", ResetGpu),
    entry(156, "RESOURCE_RETIREMENT_EVENT", ResetGpu),
    entry(157, "RESOURCE_RETIREMENT_FAILURE", Ignore),
    entry(158, "GPU_FATAL_TIMEOUT", ResetGpu),
    entry(159, "ROBUST_CHANNEL_CHI_NON_DATA_ERROR", CheckUvm),
    entry(160, "CHANNEL_RETIREMENT_EVENT", Ignore),  // unverified: sources disagree
    entry(161, "CHANNEL_RETIREMENT_FAILURE", Ignore),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn is_sorted_without_duplicates() {
        assert!(CATALOG.windows(2).all(|w| w[0].xid < w[1].xid));
        assert_eq!(CATALOG.len(), 161);
    }

    #[test]
    fn the_rows_the_policy_examples_rely_on() {
        // A contained ECC error ends one application; an uncontained one needs a reset.
        assert_eq!(resolution(94), Some(RestartApp));
        assert_eq!(resolution(95), Some(ResetGpu));
        assert_eq!(resolution(79), Some(RestartBm));
        assert_eq!(resolution(48), Some(WorkflowXid48));
        assert_eq!(resolution(13), Some(RestartApp));
        assert_eq!(resolution(63), Some(Ignore));
        assert_eq!(resolution(61), Some(ContactSupport));
        assert_eq!(resolution(147), Some(WorkflowNvlink5Err));
        assert_eq!(resolution(162), None);
        assert_eq!(resolution(0), None);
        assert_eq!(
            lookup(79).map(|e| e.mnemonic),
            Some("ROBUST_CHANNEL_GPU_HAS_FALLEN_OFF_THE_BUS")
        );
    }
}
