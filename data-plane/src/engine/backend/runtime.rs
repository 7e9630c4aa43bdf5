//! Finding and loading the ONNX Runtime shared library once per process.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use ort::environment::Environment;

/// The ONNX Runtime release this build pins (the `api-31` feature needs at least this).
pub const ORT_VERSION: &str = "1.31.1";
/// File name of the pinned library as shipped in the `onnxruntime` wheel.
pub const ORT_LIBRARY: &str = "libonnxruntime.so.1.31.1";

static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();
/// The library [`environment`] loaded: providers load from its directory, and messages name it.
static LIBRARY: OnceLock<PathBuf> = OnceLock::new();

/// The process-wide ONNX Runtime environment, loading the library on first use.
pub fn environment() -> Result<&'static Environment, String> {
    ENVIRONMENT.get_or_init(init).as_ref().map_err(Clone::clone)
}

/// The ONNX Runtime library this process loaded, once [`environment`] succeeded.
pub fn library_path() -> Option<&'static Path> {
    LIBRARY.get().map(PathBuf::as_path)
}

/// The library this process would load (without loading it): where a worker's runners will
/// find ONNX Runtime and its execution providers.
pub fn locate() -> Option<PathBuf> {
    library_path().map(Path::to_path_buf).or_else(|| locate_library().ok())
}

fn init() -> Result<Environment, String> {
    let path = locate_library()?;
    tracing::info!(path = %path.display(), "loading onnx runtime");
    let builder =
        ort::init_from(&path).map_err(|e| format!("failed to load ONNX Runtime from {}: {e}", path.display()))?;
    let _ = LIBRARY.set(path.clone());
    builder.with_name("tessera").build().map_err(|e| format!("failed to create the ONNX Runtime environment: {e}"))
}

/// Where the library is looked for, in order: `ORT_DYLIB_PATH`, next to the binary, the setup cache.
pub fn candidate_paths() -> Vec<PathBuf> {
    let mut paths = Vec::new();
    if let Some(p) = std::env::var_os("ORT_DYLIB_PATH") {
        paths.push(PathBuf::from(p));
        return paths;
    }
    if let Some(dir) = std::env::current_exe().ok().and_then(|p| p.parent().map(Path::to_path_buf)) {
        paths.push(dir.join(ORT_LIBRARY));
        paths.push(dir.join("../lib").join(ORT_LIBRARY));
    }
    paths.push(cache_dir().join("onnxruntime").join(ORT_VERSION).join(ORT_LIBRARY));
    paths
}

/// `$TESSERA_CACHE`, else `$HOME/.cache/tessera`.
fn cache_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TESSERA_CACHE") {
        return PathBuf::from(dir);
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
    home.join(".cache").join("tessera")
}

fn locate_library() -> Result<PathBuf, String> {
    let candidates = candidate_paths();
    if let Some(found) = candidates.iter().find(|p| p.is_file()) {
        return Ok(found.clone());
    }
    let tried: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
    Err(format!(
        "ONNX Runtime library not found (tried: {}). Run ./scripts/setup-ort.sh to install {ORT_LIBRARY} \
         from the onnxruntime=={ORT_VERSION} wheel, or set ORT_DYLIB_PATH to its path",
        tried.join(", ")
    ))
}
