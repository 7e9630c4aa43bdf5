//! Registering a [`ProviderPlan`]'s execution providers on a session, and saying clearly why
//! one is missing.
//!
//! ONNX Runtime reports a provider "available" when the library was built with it (the CPU
//! build has neither CUDA nor TensorRT); the provider's own library (`libonnxruntime_providers_
//! cuda.so`, next to `libonnxruntime.so`) and what it needs (cuBLAS, cuDNN, `libnvinfer`) load
//! only when the provider is registered. Both steps are checked here and each provider is
//! registered with `error_on_failure`: `ort` would otherwise log the failure and run the model
//! on CPU, which a `KIND_GPU` model must never do quietly.

use ort::ep::{self, ArbitrarilyConfigurableExecutionProvider, ExecutionProvider, ExecutionProviderDispatch};
use ort::session::builder::SessionBuilder;

use super::providers::{ProviderOptions, ProviderPlan};

/// What to run to get the providers.
const SETUP_HINT: &str = "install the GPU build with `scripts/setup-ort.sh --gpu` and set ORT_DYLIB_PATH to the path \
                          it prints";

/// Adds the plan's providers to `builder` (nothing for a CPU plan), TensorRT before CUDA.
pub(super) fn with_providers(mut builder: SessionBuilder, plan: &ProviderPlan) -> Result<SessionBuilder, String> {
    let ProviderPlan::Gpu { tensorrt, cuda } = plan else { return Ok(builder) };
    require::<ep::CUDA>("KIND_GPU needs ONNX Runtime's CUDA execution provider")?;
    if let Some(options) = tensorrt {
        require::<ep::TensorRT>(
            "the tensorrt gpu_execution_accelerator needs ONNX Runtime's TensorRT execution provider",
        )?;
        builder = register(builder, configure(ep::TensorRT::default(), options).build(), "TensorRT")?;
    }
    register(builder, configure(ep::CUDA::default(), cuda).build(), "CUDA")
}

/// Fails with `needs` and the library's path when ONNX Runtime was built without provider `E`.
fn require<E: ExecutionProvider>(needs: &str) -> Result<(), String> {
    let library = super::runtime::library_path().map_or_else(|| "unknown".into(), |p| p.display().to_string());
    match E::is_available() {
        Ok(true) => Ok(()),
        Ok(false) => Err(format!("{needs}, which this ONNX Runtime build ({library}) does not have: {SETUP_HINT}")),
        Err(e) => Err(format!("{needs}, and ONNX Runtime ({library}) could not list its providers: {e}")),
    }
}

fn configure<E: ArbitrarilyConfigurableExecutionProvider>(provider: E, options: &ProviderOptions) -> E {
    options.iter().fold(provider, |p, (key, value)| p.with_arbitrary_config(key, value))
}

/// Registers one provider, one at a time so a failure names it.
fn register(
    builder: SessionBuilder,
    provider: ExecutionProviderDispatch,
    name: &str,
) -> Result<SessionBuilder, String> {
    builder
        .with_execution_providers([provider.error_on_failure()])
        .map_err(|e| registration_error(name, &tidy(e.message())))
}

/// ORT's message without its source locations and its `[ONNXRuntimeError] : 1 : FAIL : ` prefix.
pub(super) fn tidy(message: &str) -> String {
    let stripped = super::onnx::strip_source_locations(message);
    let rest = stripped.strip_prefix("[ONNXRuntimeError] : ").and_then(|r| {
        let (_code, r) = r.split_once(" : ")?;
        let (_name, r) = r.split_once(" : ")?;
        Some(r.to_string())
    });
    rest.unwrap_or(stripped)
}

/// "TensorRT execution provider unavailable: libnvinfer.so.10 not found" when ORT's message says
/// a library did not load, else the provider's name and ORT's message.
pub(super) fn registration_error(provider: &str, message: &str) -> String {
    match missing_library(message) {
        Some(library) => format!(
            "{provider} execution provider unavailable: {library} not found; put its directory on the library path \
             (tessera worker: --cuda-library-dir; tessera serve: LD_LIBRARY_PATH) ({message})"
        ),
        None => format!("{provider} execution provider unavailable: {message}"),
    }
}

/// The library a `dlopen` failure names: `libx.so.N: cannot open shared object file`.
fn missing_library(message: &str) -> Option<&str> {
    let at = message.find(": cannot open shared object file")?;
    let start = message[..at].rfind(|c: char| c.is_whitespace() || c == '\'' || c == '"').map_or(0, |i| i + 1);
    let library = &message[start..at];
    library.contains(".so").then_some(library)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_named() {
        let trt = "Failed to load library libonnxruntime_providers_tensorrt.so with error: libnvinfer.so.10: cannot \
                   open shared object file: No such file or directory";
        let message = registration_error("TensorRT", trt);
        assert!(
            message.starts_with("TensorRT execution provider unavailable: libnvinfer.so.10 not found;"),
            "{message}"
        );
        let cuda = "Failed to load library libonnxruntime_providers_cuda.so with error: libcublasLt.so.13: cannot open \
                    shared object file: No such file or directory";
        let message = registration_error("CUDA", cuda);
        assert!(message.starts_with("CUDA execution provider unavailable: libcublasLt.so.13 not found;"), "{message}");
        assert!(message.contains("--cuda-library-dir"), "{message}");
        assert_eq!(registration_error("CUDA", "boom"), "CUDA execution provider unavailable: boom");
        let ort = "/onnxruntime_src/onnxruntime/core/session/provider_bridge_ort.cc:2043 \
                   onnxruntime::Provider& onnxruntime::ProviderLibrary::Get() [ONNXRuntimeError] : 1 : FAIL : Failed \
                   to load library /x/libonnxruntime_providers_cuda.so with error: libcudart.so.13: cannot open \
                   shared object file: No such file or directory";
        assert_eq!(
            tidy(ort),
            "Failed to load library /x/libonnxruntime_providers_cuda.so with error: libcudart.so.13: cannot open \
             shared object file: No such file or directory"
        );
    }
}
