//! gpunode node-probe.
