//! Which ONNX Runtime execution providers a session gets.
//!
//! A config's `optimization { execution_accelerators { gpu_execution_accelerator: [...] } }` is
//! read with the names of Triton's onnxruntime backend: `tensorrt` (TensorRT first, CUDA as the
//! fallback for what TensorRT cannot run) and `cuda` (options of the CUDA provider), plus the
//! CUDA parameters Triton still reads from the model's `parameters` (`cudnn_conv_algo_search`,
//! `gpu_mem_limit`, `arena_extend_strategy`, `do_copy_in_default_stream`). [`Accelerators`] is
//! that mapping, done once per version when its config is checked: a pure function of the
//! config, so a bad name or value fails the load naming it before any session is built.
//! [`Accelerators::plan`] then gives one instance's [`ProviderPlan`]: ORT's own option keys
//! and values, with the instance's device and memory cap; building the session from it is
//! `onnx.rs`'s part.
//!
//! `cpu_execution_accelerator` (Triton's `openvino`) is refused: this server's ONNX Runtime
//! has no CPU provider but the default one.

use std::collections::BTreeMap;
use std::path::{Component, Path};

use tessera_protocol::inference::ModelConfig;
use tessera_protocol::inference::model_optimization_policy::execution_accelerators::Accelerator;

use crate::engine::device::{Device, InstanceDevice};

/// ORT's CUDA arena growth that suits a capped, shared device (see [`Accelerators::plan`]).
pub const DEFAULT_ARENA_EXTEND_STRATEGY: &str = "kSameAsRequested";

/// Provider option keys and values, in ORT's names, sorted (so plans compare and log stably).
pub type ProviderOptions = BTreeMap<String, String>;

/// The providers of one session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProviderPlan {
    /// ONNX Runtime's default CPU provider only.
    Cpu,
    /// The CUDA provider (after TensorRT, when asked for); nodes neither supports run on CPU.
    Gpu {
        /// TensorRT provider options, registered before CUDA; `None` without TensorRT.
        tensorrt: Option<ProviderOptions>,
        /// CUDA provider options, `device_id` included.
        cuda: ProviderOptions,
    },
}

impl ProviderPlan {
    /// Names for logs: `cpu`, `cuda:0`, `tensorrt+cuda:1`.
    pub fn describe(&self) -> String {
        match self {
            ProviderPlan::Cpu => "cpu".into(),
            ProviderPlan::Gpu { tensorrt, cuda } => {
                let device = cuda.get("device_id").map_or("0", String::as_str);
                let trt = if tensorrt.is_some() { "tensorrt+" } else { "" };
                format!("{trt}cuda:{device}")
            }
        }
    }
}

/// A version's execution accelerators, checked and in ORT's terms.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Accelerators {
    /// TensorRT options when the config asks for TensorRT.
    tensorrt: Option<ProviderOptions>,
    /// CUDA options from the `cuda` accelerator and the deprecated model parameters.
    cuda: ProviderOptions,
    /// A worker slice: paths stay inside the version's directory, caches default to it.
    confined: bool,
}

/// The deprecated CUDA options Triton reads from the model's `parameters`.
const CUDA_MODEL_PARAMETERS: [&str; 4] =
    ["cudnn_conv_algo_search", "gpu_mem_limit", "arena_extend_strategy", "do_copy_in_default_stream"];

/// CUDA provider options a `cuda` accelerator may set (ORT's own names, as Triton passes them).
const CUDA_OPTIONS: [&str; 11] = [
    "cudnn_conv_algo_search",
    "gpu_mem_limit",
    "arena_extend_strategy",
    "do_copy_in_default_stream",
    "cudnn_conv_use_max_workspace",
    "cudnn_conv1d_pad_to_nc1d",
    "enable_cuda_graph",
    "enable_skip_layer_norm_strict_mode",
    "use_tf32",
    "prefer_nhwc",
    "use_ep_level_unified_stream",
];

/// TensorRT options whose values are paths: relative ones are taken from the version's directory.
const TRT_PATH_OPTIONS: [&str; 3] = ["trt_engine_cache_path", "trt_timing_cache_path", "trt_ep_context_file_path"];

/// How a TensorRT parameter of Triton's maps to ORT's option.
enum TrtValue {
    Bool,
    /// A whole number, at least 0.
    Count,
    /// A whole number, negative allowed (`trt_auxiliary_streams`: -1 = heuristics).
    Int,
    Text,
    /// A path, checked by [`check_path`].
    Path,
}

/// Triton's TensorRT parameters besides `precision_mode`: (Triton name, ORT option, value kind).
const TRT_PARAMETERS: [(&str, &str, TrtValue); 29] = [
    ("max_workspace_size_bytes", "trt_max_workspace_size", TrtValue::Count),
    ("trt_max_partition_iterations", "trt_max_partition_iterations", TrtValue::Count),
    ("trt_min_subgraph_size", "trt_min_subgraph_size", TrtValue::Count),
    ("int8_calibration_table_name", "trt_int8_calibration_table_name", TrtValue::Text),
    ("int8_use_native_calibration_table", "trt_int8_use_native_calibration_table", TrtValue::Bool),
    ("trt_dla_enable", "trt_dla_enable", TrtValue::Bool),
    ("trt_dla_core", "trt_dla_core", TrtValue::Count),
    ("trt_engine_cache_enable", "trt_engine_cache_enable", TrtValue::Bool),
    ("trt_engine_cache_path", "trt_engine_cache_path", TrtValue::Path),
    ("trt_engine_cache_prefix", "trt_engine_cache_prefix", TrtValue::Text),
    ("trt_dump_subgraphs", "trt_dump_subgraphs", TrtValue::Bool),
    ("trt_force_sequential_engine_build", "trt_force_sequential_engine_build", TrtValue::Bool),
    ("trt_context_memory_sharing_enable", "trt_context_memory_sharing_enable", TrtValue::Bool),
    ("trt_layer_norm_fp32_fallback", "trt_layer_norm_fp32_fallback", TrtValue::Bool),
    ("trt_timing_cache_enable", "trt_timing_cache_enable", TrtValue::Bool),
    ("trt_timing_cache_path", "trt_timing_cache_path", TrtValue::Path),
    ("trt_force_timing_cache", "trt_force_timing_cache", TrtValue::Bool),
    ("trt_detailed_build_log", "trt_detailed_build_log", TrtValue::Bool),
    ("trt_build_heuristics_enable", "trt_build_heuristics_enable", TrtValue::Bool),
    ("trt_sparsity_enable", "trt_sparsity_enable", TrtValue::Bool),
    ("trt_builder_optimization_level", "trt_builder_optimization_level", TrtValue::Count),
    ("trt_auxiliary_streams", "trt_auxiliary_streams", TrtValue::Int),
    ("trt_tactic_sources", "trt_tactic_sources", TrtValue::Text),
    ("trt_extra_plugin_lib_paths", "trt_extra_plugin_lib_paths", TrtValue::Text),
    ("trt_profile_min_shapes", "trt_profile_min_shapes", TrtValue::Text),
    ("trt_profile_max_shapes", "trt_profile_max_shapes", TrtValue::Text),
    ("trt_profile_opt_shapes", "trt_profile_opt_shapes", TrtValue::Text),
    ("trt_cuda_graph_enable", "trt_cuda_graph_enable", TrtValue::Bool),
    ("trt_ep_context_file_path", "trt_ep_context_file_path", TrtValue::Path),
];

/// TensorRT options a worker slice refuses: they load code into the runner or write files
/// outside the version's directory, which one tenant must not do on a shared worker.
const TRT_REFUSED_ON_SLICES: [&str; 2] = ["trt_extra_plugin_lib_paths", "trt_dump_subgraphs"];

impl Accelerators {
    /// Reads and checks the config's accelerators for a load on `device`.
    pub fn from_config(config: &ModelConfig, device: &Device) -> Result<Self, String> {
        let mut out = Self { confined: device.is_slice(), ..Self::default() };
        for key in CUDA_MODEL_PARAMETERS {
            if let Some(p) = config.parameters.get(key) {
                let value = cuda_value(key, &p.string_value).map_err(|e| format!("parameter {e}"))?;
                out.cuda.insert(key.to_string(), value);
            }
        }
        let Some(accelerators) = config.optimization.as_ref().and_then(|o| o.execution_accelerators.as_ref()) else {
            return Ok(out);
        };
        if let Some(cpu) = accelerators.cpu_execution_accelerator.first() {
            return Err(format!(
                "cpu_execution_accelerator '{}' is not supported: this server runs ONNX Runtime's default CPU \
                 provider (remove it from optimization.execution_accelerators)",
                cpu.name
            ));
        }
        let mut seen = Vec::new();
        for accelerator in &accelerators.gpu_execution_accelerator {
            if seen.contains(&accelerator.name.as_str()) {
                return Err(format!("gpu_execution_accelerator '{}' is listed twice", accelerator.name));
            }
            seen.push(accelerator.name.as_str());
            match accelerator.name.as_str() {
                "tensorrt" => out.tensorrt = Some(tensorrt_options(accelerator, out.confined)?),
                "cuda" => out.cuda.extend(cuda_options(accelerator)?),
                other => {
                    return Err(format!(
                        "unknown gpu_execution_accelerator '{other}': this server knows 'tensorrt' and 'cuda'"
                    ));
                }
            }
        }
        Ok(out)
    }

    /// Whether the config asks for TensorRT.
    pub fn wants_tensorrt(&self) -> bool {
        self.tensorrt.is_some()
    }

    /// The providers of one instance on `device`; `model_dir` is the version's directory.
    ///
    /// GPU instances grow their arena by what is asked (`kSameAsRequested`) unless the config
    /// says otherwise: ORT's default doubles each extension, so an arena near its cap asks for
    /// far more than it needs and fails (or crowds the slice's other instances and versions)
    /// long before the memory really runs out. Warm-up makes a few more allocations instead.
    /// A slice's per-instance cap bounds `gpu_mem_limit`; the config may only ask for less.
    pub fn plan(&self, device: InstanceDevice, model_dir: &Path) -> ProviderPlan {
        let InstanceDevice::Gpu { device_id, memory_limit_bytes } = device else {
            return ProviderPlan::Cpu;
        };
        let mut cuda = ProviderOptions::new();
        cuda.insert("arena_extend_strategy".into(), DEFAULT_ARENA_EXTEND_STRATEGY.into());
        cuda.extend(self.cuda.clone());
        cuda.insert("device_id".into(), device_id.to_string());
        if let Some(cap) = memory_limit_bytes {
            let asked = cuda.get("gpu_mem_limit").and_then(|v| v.parse::<u64>().ok()).unwrap_or(u64::MAX);
            cuda.insert("gpu_mem_limit".into(), asked.min(cap).to_string());
        }
        let tensorrt = self.tensorrt.as_ref().map(|options| {
            let mut trt = options.clone();
            trt.insert("device_id".into(), device_id.to_string());
            for key in TRT_PATH_OPTIONS {
                if let Some(path) = trt.get_mut(key) {
                    *path = model_dir.join(path.as_str()).display().to_string();
                }
            }
            // A runner's working directory is the worker's, shared by every tenant.
            if self.confined {
                for (enabled, path) in [
                    ("trt_engine_cache_enable", "trt_engine_cache_path"),
                    ("trt_timing_cache_enable", "trt_timing_cache_path"),
                ] {
                    if trt.get(enabled).is_some_and(|v| v == "1") && !trt.contains_key(path) {
                        trt.insert(path.into(), model_dir.display().to_string());
                    }
                }
            }
            trt
        });
        ProviderPlan::Gpu { tensorrt, cuda }
    }
}

/// The TensorRT accelerator's parameters as ORT options.
fn tensorrt_options(accelerator: &Accelerator, confined: bool) -> Result<ProviderOptions, String> {
    let mut options = ProviderOptions::new();
    for (key, value) in sorted(accelerator) {
        let bad = |why: String| format!("tensorrt accelerator parameter {key}: {why}");
        // ORT takes options as C strings.
        if value.contains('\0') {
            return Err(bad("the value holds a NUL byte".into()));
        }
        if key == "precision_mode" {
            let flag = match value.trim() {
                "FP32" => None,
                "FP16" => Some("trt_fp16_enable"),
                "BF16" => Some("trt_bf16_enable"),
                "INT8" => Some("trt_int8_enable"),
                other => return Err(bad(format!("'{other}' is not one of FP32, FP16, BF16, INT8"))),
            };
            if let Some(flag) = flag {
                options.insert(flag.into(), "1".into());
            }
            continue;
        }
        let Some((_, ort_key, kind)) = TRT_PARAMETERS.iter().find(|(name, ..)| *name == key) else {
            return Err(format!(
                "unknown tensorrt accelerator parameter '{key}' (Triton's onnxruntime backend names: precision_mode, {})",
                TRT_PARAMETERS.iter().map(|(name, ..)| *name).collect::<Vec<_>>().join(", ")
            ));
        };
        if confined && TRT_REFUSED_ON_SLICES.contains(ort_key) {
            return Err(bad("not allowed on a worker (it loads code or writes outside the model's directory)".into()));
        }
        let value = match kind {
            TrtValue::Bool => parse_bool(value).map(str::to_string),
            TrtValue::Count => {
                value.trim().parse::<u64>().map(|n| n.to_string()).map_err(|_| whole(value, "0 or more"))
            }
            TrtValue::Int => value.trim().parse::<i64>().map(|n| n.to_string()).map_err(|_| whole(value, "any")),
            TrtValue::Text if key == "int8_calibration_table_name" && value.contains('/') => {
                Err("a file name in the engine cache directory, not a path".into())
            }
            TrtValue::Text => Ok(value.to_string()),
            TrtValue::Path => check_path(value, confined).map(str::to_string),
        }
        .map_err(bad)?;
        options.insert((*ort_key).to_string(), value);
    }
    Ok(options)
}

/// The CUDA accelerator's parameters as ORT options.
fn cuda_options(accelerator: &Accelerator) -> Result<ProviderOptions, String> {
    let mut options = ProviderOptions::new();
    for (key, value) in sorted(accelerator) {
        if key == "device_id" {
            return Err("cuda accelerator parameter device_id: the instance group's gpus choose the device".into());
        }
        if !CUDA_OPTIONS.contains(&key) {
            return Err(format!("unknown cuda accelerator parameter '{key}' (accepted: {})", CUDA_OPTIONS.join(", ")));
        }
        let value = cuda_value(key, value).map_err(|e| format!("cuda accelerator parameter {e}"))?;
        options.insert(key.to_string(), value);
    }
    Ok(options)
}

/// One CUDA option's value in ORT's form; Triton's numeric spellings of the enums are accepted.
fn cuda_value(key: &str, value: &str) -> Result<String, String> {
    let v = value.trim();
    let bad = |expected: &str| format!("{key}: '{value}' is not {expected}");
    match key {
        "cudnn_conv_algo_search" => match v.to_ascii_uppercase().as_str() {
            "0" | "EXHAUSTIVE" => Ok("EXHAUSTIVE".into()),
            "1" | "HEURISTIC" => Ok("HEURISTIC".into()),
            "2" | "DEFAULT" => Ok("DEFAULT".into()),
            _ => Err(bad("EXHAUSTIVE (0), HEURISTIC (1) or DEFAULT (2)")),
        },
        "arena_extend_strategy" => match v {
            "0" | "kNextPowerOfTwo" => Ok("kNextPowerOfTwo".into()),
            "1" | "kSameAsRequested" => Ok("kSameAsRequested".into()),
            _ => Err(bad("kNextPowerOfTwo (0) or kSameAsRequested (1)")),
        },
        "gpu_mem_limit" => match v.parse::<u64>() {
            Ok(n) if n > 0 => Ok(n.to_string()),
            _ => Err(bad("a number of bytes above 0")),
        },
        _ => parse_bool(value).map(str::to_string).map_err(|e| format!("{key}: {e}")),
    }
}

/// Triton's booleans: `1`/`0`/`true`/`false` (any case), as ORT's `1`/`0`.
fn parse_bool(value: &str) -> Result<&'static str, String> {
    match value.trim().to_ascii_lowercase().as_str() {
        "1" | "true" => Ok("1"),
        "0" | "false" => Ok("0"),
        _ => Err(format!("'{value}' is not a boolean (true, false, 1 or 0)")),
    }
}

fn whole(value: &str, range: &str) -> String {
    format!("'{value}' is not a whole number ({range})")
}

/// A path parameter: never through `..`; absolute only outside worker slices (on a worker it
/// would reach files of the worker or of other tenants). Relative paths are taken from the
/// version's directory.
fn check_path(value: &str, confined: bool) -> Result<&str, String> {
    let path = Path::new(value);
    if value.is_empty() {
        return Err("an empty path".into());
    }
    if path.components().any(|c| c == Component::ParentDir) {
        return Err(format!("'{value}' goes through '..'"));
    }
    if confined && path.is_absolute() {
        return Err(format!("'{value}' is absolute; on a worker give a path inside the model's directory"));
    }
    Ok(value)
}

/// An accelerator's parameters in name order, so the first bad one reported is always the same.
fn sorted(accelerator: &Accelerator) -> Vec<(&str, &str)> {
    let mut params: Vec<(&str, &str)> = accelerator.parameters.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    params.sort_unstable();
    params
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::model_config::from_pbtxt;

    const HOST: Device = Device::Host;

    fn slice() -> Device {
        Device::GpuSlice { slice: "MIG-1".into(), mig: true, memory_limit_bytes: 8 << 30 }
    }

    fn accelerators(text: &str, device: &Device) -> Result<Accelerators, String> {
        Accelerators::from_config(&from_pbtxt(text).expect("parses"), device)
    }

    fn gpu(device_id: i32, memory_limit_bytes: Option<u64>) -> InstanceDevice {
        InstanceDevice::Gpu { device_id, memory_limit_bytes }
    }

    fn options(pairs: &[(&str, &str)]) -> ProviderOptions {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn tensorrt_parameters_map_to_ort_options_with_cuda_behind() {
        let text = r#"optimization { execution_accelerators { gpu_execution_accelerator: [ {
            name: "tensorrt"
            parameters { key: "precision_mode" value: "FP16" }
            parameters { key: "max_workspace_size_bytes" value: "1073741824" }
            parameters { key: "trt_max_partition_iterations" value: "1000" }
            parameters { key: "trt_min_subgraph_size" value: "3" }
            parameters { key: "trt_engine_cache_enable" value: "true" }
            parameters { key: "trt_engine_cache_path" value: "trt-cache" }
            parameters { key: "trt_timing_cache_enable" value: "1" }
            parameters { key: "trt_auxiliary_streams" value: "-1" } } ] } }"#;
        let acc = accelerators(text, &HOST).expect("valid");
        assert!(acc.wants_tensorrt());
        let plan = acc.plan(gpu(1, None), Path::new("/models/m/1"));
        let expected_trt = options(&[
            ("device_id", "1"),
            ("trt_auxiliary_streams", "-1"),
            ("trt_engine_cache_enable", "1"),
            ("trt_engine_cache_path", "/models/m/1/trt-cache"),
            ("trt_fp16_enable", "1"),
            ("trt_max_partition_iterations", "1000"),
            ("trt_max_workspace_size", "1073741824"),
            ("trt_min_subgraph_size", "3"),
            ("trt_timing_cache_enable", "1"),
        ]);
        let expected_cuda = options(&[("arena_extend_strategy", "kSameAsRequested"), ("device_id", "1")]);
        assert_eq!(plan, ProviderPlan::Gpu { tensorrt: Some(expected_trt), cuda: expected_cuda });
        assert_eq!(plan.describe(), "tensorrt+cuda:1");
        // CPU instances of the same version ignore GPU accelerators, as in Triton.
        assert_eq!(acc.plan(InstanceDevice::Cpu, Path::new("/m")), ProviderPlan::Cpu);
    }

    #[test]
    fn on_a_slice_caches_stay_in_the_model_directory_and_the_cap_bounds_the_arena() {
        let text = r#"parameters { key: "gpu_mem_limit" value: { string_value: "99999999999" } }
            optimization { execution_accelerators { gpu_execution_accelerator: [ {
            name: "tensorrt" parameters { key: "precision_mode" value: "INT8" }
            parameters { key: "trt_engine_cache_enable" value: "1" } } ] } }"#;
        let acc = accelerators(text, &slice()).expect("valid");
        let ProviderPlan::Gpu { tensorrt: Some(trt), cuda } = acc.plan(gpu(0, Some(4 << 30)), Path::new("/cache/v1"))
        else {
            panic!("a GPU plan with TensorRT");
        };
        assert_eq!(trt.get("trt_engine_cache_path").map(String::as_str), Some("/cache/v1"));
        assert_eq!(trt.get("trt_int8_enable").map(String::as_str), Some("1"));
        assert_eq!(cuda.get("gpu_mem_limit").map(String::as_str), Some("4294967296"));
        // The config may ask for less than the cap.
        let small = accelerators(r#"parameters { key: "gpu_mem_limit" value: { string_value: "1024" } }"#, &slice())
            .expect("valid");
        let ProviderPlan::Gpu { cuda, tensorrt: None } = small.plan(gpu(0, Some(4 << 30)), Path::new("/m")) else {
            panic!("a CUDA plan");
        };
        assert_eq!(cuda.get("gpu_mem_limit").map(String::as_str), Some("1024"));
    }

    #[test]
    fn cuda_options_come_from_the_accelerator_and_the_deprecated_parameters() {
        let text = r#"parameters { key: "cudnn_conv_algo_search" value: { string_value: "1" } }
            parameters { key: "arena_extend_strategy" value: { string_value: "0" } }
            parameters { key: "do_copy_in_default_stream" value: { string_value: "0" } }
            optimization { execution_accelerators { gpu_execution_accelerator: [ {
            name: "cuda" parameters { key: "cudnn_conv_algo_search" value: "DEFAULT" }
            parameters { key: "use_tf32" value: "false" }
            parameters { key: "use_ep_level_unified_stream" value: "TRUE" } } ] } }"#;
        let acc = accelerators(text, &HOST).expect("valid");
        let plan = acc.plan(gpu(0, None), Path::new("/m"));
        let cuda = options(&[
            ("arena_extend_strategy", "kNextPowerOfTwo"),
            ("cudnn_conv_algo_search", "DEFAULT"),
            ("device_id", "0"),
            ("do_copy_in_default_stream", "0"),
            ("use_ep_level_unified_stream", "1"),
            ("use_tf32", "0"),
        ]);
        assert_eq!(plan, ProviderPlan::Gpu { tensorrt: None, cuda });
        assert_eq!(plan.describe(), "cuda:0");
    }

    #[test]
    fn bad_names_and_values_are_refused_naming_them() {
        let trt = |params: &str| {
            format!(
                r#"optimization {{ execution_accelerators {{ gpu_execution_accelerator: [ {{ name: "tensorrt" {params} }} ] }} }}"#
            )
        };
        let cuda = |params: &str| {
            format!(
                r#"optimization {{ execution_accelerators {{ gpu_execution_accelerator: [ {{ name: "cuda" {params} }} ] }} }}"#
            )
        };
        let cases = [
            (trt(r#"parameters { key: "precision_mode" value: "FP8" }"#), "precision_mode: 'FP8' is not one of"),
            (trt(r#"parameters { key: "max_workspace_size_bytes" value: "lots" }"#), "max_workspace_size_bytes"),
            (trt(r#"parameters { key: "trt_min_subgraph_size" value: "-2" }"#), "trt_min_subgraph_size"),
            (trt(r#"parameters { key: "trt_engine_cache_enable" value: "yes" }"#), "trt_engine_cache_enable"),
            (trt(r#"parameters { key: "trt_engine_cache_path" value: "../x" }"#), "goes through '..'"),
            (trt(r#"parameters { key: "int8_calibration_table_name" value: "a/b" }"#), "int8_calibration_table_name"),
            (trt(r#"parameters { key: "warp_speed" value: "1" }"#), "unknown tensorrt accelerator parameter 'warp_speed'"),
            (cuda(r#"parameters { key: "gpu_mem_limit" value: "0" }"#), "gpu_mem_limit: '0'"),
            (cuda(r#"parameters { key: "arena_extend_strategy" value: "2" }"#), "arena_extend_strategy: '2'"),
            (cuda(r#"parameters { key: "device_id" value: "1" }"#), "device_id"),
            (cuda(r#"parameters { key: "sdpa_kernel" value: "1" }"#), "unknown cuda accelerator parameter 'sdpa_kernel'"),
            (
                r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "rocm" } ] } }"#.into(),
                "unknown gpu_execution_accelerator 'rocm'",
            ),
            (
                r#"optimization { execution_accelerators { gpu_execution_accelerator: [ { name: "cuda" }, { name: "cuda" } ] } }"#
                    .into(),
                "listed twice",
            ),
            (
                r#"optimization { execution_accelerators { cpu_execution_accelerator: [ { name: "openvino" } ] } }"#.into(),
                "cpu_execution_accelerator 'openvino' is not supported",
            ),
            (r#"parameters { key: "cudnn_conv_algo_search" value: { string_value: "7" } }"#.into(), "parameter cudnn_conv_algo_search"),
        ];
        for (text, needle) in cases {
            let err = accelerators(&text, &HOST).expect_err(&text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }

    #[test]
    fn worker_slices_refuse_what_reaches_outside_the_model() {
        let trt = |key: &str, value: &str| {
            format!(
                r#"optimization {{ execution_accelerators {{ gpu_execution_accelerator: [ {{ name: "tensorrt"
                parameters {{ key: "{key}" value: "{value}" }} }} ] }} }}"#
            )
        };
        for (key, value) in [
            ("trt_engine_cache_path", "/tmp/cache"),
            ("trt_extra_plugin_lib_paths", "/tmp/evil.so"),
            ("trt_dump_subgraphs", "1"),
        ] {
            let text = trt(key, value);
            let err = accelerators(&text, &slice()).expect_err(&text);
            assert!(err.contains(key), "{err}");
            // `tessera serve` belongs to one operator, as Triton does.
            accelerators(&text, &HOST).expect("allowed on the host");
        }
    }
}
