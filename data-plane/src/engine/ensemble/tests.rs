//! Ensembles and the response cache on a multi-tenant manager, as a worker keys versions
//! (`tenant/name`): a step resolves only in its ensemble's tenant, tensors flow through the
//! steps, and one tenant's cached answers never serve another.

use std::sync::Arc;

use bytes::Bytes;
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;
use tessera_protocol::model_config::from_pbtxt;

use crate::engine::infer::InferRequest;
use crate::engine::load_error::LoadErrorKind;
use crate::engine::manager::{ControlMode, ModelManager, scoped_key};
use crate::engine::repository::Repository;
use crate::engine::response_cache::{CacheLimits, ResponseCache};
use crate::engine::tensor::InputTensor;

const TENANT_A: &str = "tenant-a";
const TENANT_B: &str = "tenant-b";

/// `OUT = (IN0 + IN1) - IN1` through two add_sub steps, so the second step reads the first's
/// output.
fn chain(step_model: &str) -> ModelConfig {
    let text = format!(
        r#"name: "chain" platform: "ensemble" max_batch_size: 4
        input [ {{ name: "IN0" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "IN1" data_type: TYPE_FP32 dims: [ 16 ] }} ]
        output [ {{ name: "OUT" data_type: TYPE_FP32 dims: [ 16 ] }}, {{ name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }} ]
        ensemble_scheduling {{ step [
          {{ model_name: "{step_model}" model_version: -1
             input_map {{ key: "INPUT0" value: "IN0" }} input_map {{ key: "INPUT1" value: "IN1" }}
             output_map {{ key: "OUTPUT0" value: "SUM" }} }},
          {{ model_name: "{step_model}" model_version: 1
             input_map {{ key: "INPUT0" value: "SUM" }} input_map {{ key: "INPUT1" value: "IN1" }}
             output_map {{ key: "OUTPUT1" value: "OUT" }} }}
        ] }}"#
    );
    from_pbtxt(&text).expect("a valid ensemble config")
}

/// A config that takes the name it is installed under.
fn unnamed(config: ModelConfig) -> ModelConfig {
    ModelConfig { name: String::new(), ..config }
}

fn fp32(name: &str, values: &[f32]) -> InputTensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    InputTensor { name: name.into(), datatype: DataType::Fp32, shape: vec![1, 16], data: Bytes::from(data) }
}

fn request(in0: &str, in1: &str, a: f32) -> InferRequest {
    InferRequest { inputs: vec![fp32(in0, &[a; 16]), fp32(in1, &[2.0; 16])], ..Default::default() }
}

fn floats(data: &Bytes) -> Vec<f32> {
    data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// A manager with `add_sub` installed for both tenants, `only_b` for tenant B, and a cache.
async fn manager(dir: &tempfile::TempDir) -> Arc<ModelManager> {
    crate::engine::backend::runtime::environment().expect("onnx runtime");
    let file = dir.path().join("add_sub.onnx");
    std::fs::write(&file, crate::tools::onnx_builder::add_sub()).expect("write the model");
    let repo = dir.path().join("repository");
    std::fs::create_dir(&repo).expect("a repository dir");
    let limits = CacheLimits { total_bytes: 1 << 20, tenant_bytes: 1 << 19 };
    let manager = ModelManager::new(Repository::open(&repo).expect("repository"), ControlMode::None)
        .with_response_cache(ResponseCache::enabled(limits));
    let cached = from_pbtxt("response_cache { enable: true }").expect("config");
    for (tenant, name, config) in [
        (TENANT_A, "add_sub", ModelConfig::default()),
        (TENANT_B, "add_sub", ModelConfig::default()),
        (TENANT_B, "only_b", ModelConfig::default()),
        (TENANT_A, "cached", cached.clone()),
        (TENANT_B, "cached", cached.clone()),
    ] {
        let key = scoped_key(Some(tenant), name);
        manager.install_version(&key, name, 1, file.clone(), config, None).await.expect("install");
    }
    Arc::new(manager)
}

#[tokio::test]
async fn a_tenants_ensemble_runs_its_own_steps_and_cannot_name_another_tenants_model() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = manager(&dir).await;
    let key = scoped_key(Some(TENANT_A), "chain");
    manager.install_version(&key, "chain", 1, dir.path().join("none"), chain("add_sub"), None).await.expect("loads");
    let ensemble = manager.get(&key, None).expect("ready");
    let response = ensemble.infer(request("IN0", "IN1", 5.0)).await.expect("runs");
    let outputs: Vec<(&str, Vec<f32>)> = response.outputs.iter().map(|o| (o.name.as_str(), floats(&o.data))).collect();
    assert_eq!(outputs, vec![("OUT", vec![5.0; 16]), ("SUM", vec![7.0; 16])]);
    let steps = manager.get(&scoped_key(Some(TENANT_A), "add_sub"), None).expect("A's add_sub");
    assert_eq!(steps.stats.snapshot("add_sub", "1").inference_count, 2, "both steps ran on tenant A's model");
    let b_steps = manager.get(&scoped_key(Some(TENANT_B), "add_sub"), None).expect("B's add_sub");
    assert_eq!(b_steps.stats.snapshot("add_sub", "1").inference_count, 0, "tenant B's model never ran");

    let other = scoped_key(Some(TENANT_A), "chain_b");
    let e = manager
        .install_version(&other, "chain_b", 1, dir.path().join("none"), unnamed(chain("only_b")), None)
        .await
        .expect_err("only_b is tenant B's");
    assert!(e.message.contains("contains models that are not available or ambiguous: only_b"), "{}", e.message);
    assert_eq!(e.kind, LoadErrorKind::Fetch, "a missing step may still be loading: worth another try");
    assert!(e.message.contains("'only_b' is not found") && !e.message.contains(TENANT_B), "{}", e.message);
}

#[tokio::test]
async fn a_failing_step_fails_only_its_request() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = manager(&dir).await;
    let key = scoped_key(Some(TENANT_A), "chain");
    manager.install_version(&key, "chain", 1, dir.path().join("none"), chain("add_sub"), None).await.expect("loads");
    let ensemble = manager.get(&key, None).expect("ready");
    // The step model goes away under the ensemble: the next request fails naming the step.
    assert!(manager.remove_version(&scoped_key(Some(TENANT_A), "add_sub"), 1).await);
    let e = ensemble.infer(request("IN0", "IN1", 1.0)).await.expect_err("the step is gone");
    assert!(e.message.contains("in ensemble 'chain', step 0 (model 'add_sub')"), "{}", e.message);
    let stats = ensemble.stats.snapshot("chain", "1");
    let fail = stats.inference_stats.and_then(|s| s.fail).map_or(0, |f| f.count);
    assert_eq!(fail, 1);
}

#[tokio::test]
async fn tenants_never_share_cached_answers() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = manager(&dir).await;
    let a = manager.get(&scoped_key(Some(TENANT_A), "cached"), None).expect("A's cached");
    let b = manager.get(&scoped_key(Some(TENANT_B), "cached"), None).expect("B's cached");
    assert!(a.caches_responses() && b.caches_responses());
    let hits = |m: &crate::engine::model::LoadedModel| {
        let s = m.stats.snapshot("cached", "1").inference_stats.expect("stats");
        (s.cache_hit.map_or(0, |d| d.count), s.cache_miss.map_or(0, |d| d.count))
    };
    for _ in 0..2 {
        a.infer(request("INPUT0", "INPUT1", 3.0)).await.expect("runs");
    }
    assert_eq!(hits(&a), (1, 1));
    let answer = b.infer(request("INPUT0", "INPUT1", 3.0)).await.expect("runs");
    assert_eq!(floats(&answer.outputs[0].data), vec![5.0; 16]);
    assert_eq!(hits(&b), (0, 1), "the same request from tenant B misses");
    let cache = manager.response_cache().expect("a cache");
    assert!(cache.tenant_bytes(TENANT_A) > 0 && cache.tenant_bytes(TENANT_B) > 0);
    let plain = manager.get(&scoped_key(Some(TENANT_A), "add_sub"), None).expect("plain");
    assert!(!plain.caches_responses(), "no response_cache in its config, no caching");
}

#[tokio::test]
async fn max_inflight_requests_holds_requests_back_at_a_full_step() {
    let dir = tempfile::tempdir().expect("tempdir");
    let manager = manager(&dir).await;
    let key = scoped_key(Some(TENANT_A), "chain");
    let mut config = chain("add_sub");
    if let Some(tessera_protocol::inference::model_config::SchedulingChoice::EnsembleScheduling(e)) =
        config.scheduling_choice.as_mut()
    {
        e.max_inflight_requests = 1;
    }
    manager.install_version(&key, "chain", 1, dir.path().join("none"), config, None).await.expect("loads");
    let ensemble = manager.get(&key, None).expect("ready");
    let slots = ensemble.as_ensemble().and_then(|e| e.step_slots(1)).expect("step 1 has a gate");
    assert_eq!(slots.available_permits(), 1);

    // Step 1's only place is taken: the request runs step 0, then waits.
    let taken = slots.clone().acquire_owned().await.expect("a place");
    let running = tokio::spawn({
        let ensemble = ensemble.clone();
        async move { ensemble.infer(request("IN0", "IN1", 5.0)).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert!(!running.is_finished(), "the request went past a full step");
    let steps = manager.get(&scoped_key(Some(TENANT_A), "add_sub"), None).expect("A's add_sub");
    assert_eq!(steps.stats.snapshot("add_sub", "1").inference_count, 1, "step 0 ran, step 1 waits");

    drop(taken);
    let response = running.await.expect("joins").expect("runs once the place is free");
    assert_eq!(response.outputs.len(), 2);
    assert_eq!(slots.available_permits(), 1, "the place is given back");

    // Without the setting there is no gate.
    let free = scoped_key(Some(TENANT_A), "chain_free");
    manager
        .install_version(&free, "chain_free", 1, dir.path().join("none"), unnamed(chain("add_sub")), None)
        .await
        .expect("loads");
    let ensemble = manager.get(&free, None).expect("ready");
    assert!(ensemble.as_ensemble().and_then(|e| e.step_slots(0)).is_none());
}
