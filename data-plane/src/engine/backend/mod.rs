//! Execution backends. ONNX Runtime (its CPU provider; CUDA and TensorRT on GPUs) is the one.

mod ep;
pub mod onnx;
pub mod providers;
pub mod runtime;
mod strings;
