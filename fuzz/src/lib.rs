//! Tessera's fuzz targets, for `cargo fuzz` (`fuzz_targets/*.rs` hand each [`targets`] function
//! to libFuzzer). The targets themselves sit in [`targets`] so that the main workspace's tests
//! can replay the seeds and regression inputs through the very same code on stable Rust.

pub mod targets;
