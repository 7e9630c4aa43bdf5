//! Execution backends. ONNX Runtime (CPU now; CUDA/TensorRT providers when a GPU exists) is the one.

pub mod onnx;
pub mod runtime;
mod strings;
