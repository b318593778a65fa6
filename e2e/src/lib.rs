//! gpunode end-to-end test support: fixtures shared by the schema tests and the tests on a real
//! control plane.

pub mod fixtures;
