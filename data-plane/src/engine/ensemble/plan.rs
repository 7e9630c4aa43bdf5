//! An ensemble's `ensemble_scheduling` checked into a [`Plan`]: its steps, the order they can
//! run in (waves of steps whose inputs are all known), and the ensemble's own [`ModelSpec`].
//! Pure: the composing models are checked against the plan by [`Plan::check_steps`] once they
//! are loaded.

use std::collections::{BTreeMap, BTreeSet};

use tessera_protocol::DataType;
use tessera_protocol::inference::model_config::SchedulingChoice;
use tessera_protocol::inference::{self, ModelConfig};

use crate::engine::model_spec::{ModelSpec, TensorSpec};
use crate::engine::repository::valid_model_name;

pub use tessera_protocol::model_config::{ENSEMBLE_PLATFORM as PLATFORM, is_ensemble};

/// One step: a composing model and how its tensors map to the ensemble's.
#[derive(Debug, Clone, PartialEq)]
pub struct Step {
    /// The composing model's name (in the ensemble's namespace).
    pub model: String,
    /// The version to run; `None` = the latest ready one (`-1` in the config).
    pub version: Option<i64>,
    /// (model input, ensemble tensor), sorted by model input.
    pub inputs: Vec<(String, String)>,
    /// (model output, ensemble tensor), sorted by model output.
    pub outputs: Vec<(String, String)>,
}

impl Step {
    /// How messages name this step.
    pub fn describe(&self, index: usize) -> String {
        format!("step {index} (model '{}')", self.model)
    }
}

/// A checked ensemble: its steps and the waves they run in.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Steps in config order.
    pub steps: Vec<Step>,
    /// Indices into `steps`: each wave needs only ensemble inputs and earlier waves' outputs,
    /// so a wave's steps run concurrently.
    pub waves: Vec<Vec<usize>>,
    /// Requests that may be at one step at once, across the ensemble's requests (Triton's
    /// `max_inflight_requests`); 0: no limit.
    pub max_inflight: u32,
}

/// Builds the ensemble's spec from its config: every input and output must be declared with a
/// type and dims (there is no model file to complete them from).
pub fn spec_of(mut config: ModelConfig, name: &str) -> Result<ModelSpec, String> {
    if config.name.is_empty() {
        config.name = name.to_string();
    } else if config.name != name {
        return Err(format!("config name '{}' does not match the model directory name '{name}'", config.name));
    }
    if !config.backend.is_empty() {
        return Err(format!("an ensemble has no backend, but the configuration names '{}'", config.backend));
    }
    config.platform = PLATFORM.into();
    if config.max_batch_size < 0 {
        return Err(format!("max_batch_size must be >= 0, got {}", config.max_batch_size));
    }
    if config.model_transaction_policy.as_ref().is_some_and(|p| p.decoupled) {
        return Err("decoupled ensembles are not supported".into());
    }
    let inputs = config
        .input
        .iter()
        .map(|i| tensor("input", &i.name, i.data_type, &i.dims).map(|t| TensorSpec { optional: i.optional, ..t }))
        .collect::<Result<Vec<_>, _>>()?;
    let outputs =
        config.output.iter().map(|o| tensor("output", &o.name, o.data_type, &o.dims)).collect::<Result<Vec<_>, _>>()?;
    if inputs.is_empty() || outputs.is_empty() {
        return Err("an ensemble must declare its inputs and outputs in the configuration".into());
    }
    Ok(ModelSpec {
        name: name.to_string(),
        max_batch_size: config.max_batch_size as u32,
        inputs,
        outputs,
        instances: Vec::new(),
        accelerators: Default::default(),
        intra_op_threads: 1,
        spinning: false,
        config,
        ragged: None,
    })
}

fn tensor(role: &str, name: &str, data_type: i32, dims: &[i64]) -> Result<TensorSpec, String> {
    let datatype = inference::DataType::try_from(data_type)
        .ok()
        .and_then(DataType::from_config)
        .ok_or_else(|| format!("ensemble {role} '{name}' has no valid data_type"))?;
    if dims.is_empty() || dims.iter().any(|d| *d < -1 || *d == 0) {
        return Err(format!("ensemble {role} '{name}' needs dims of -1 or positive sizes, got {dims:?}"));
    }
    Ok(TensorSpec { name: name.to_string(), datatype, dims: dims.to_vec(), optional: false })
}

impl Plan {
    /// Checks the steps of `spec`'s `ensemble_scheduling` against its inputs and outputs:
    /// every tensor a step reads is an ensemble input or another step's output, each tensor is
    /// produced once, every ensemble output is produced, and the steps form no cycle.
    pub fn new(spec: &ModelSpec) -> Result<Self, String> {
        let Some(SchedulingChoice::EnsembleScheduling(ensembling)) = &spec.config.scheduling_choice else {
            return Err("an ensemble needs an ensemble_scheduling section".into());
        };
        if ensembling.step.is_empty() {
            return Err("ensemble_scheduling has no step".into());
        }
        let steps = ensembling.step.iter().enumerate().map(|(i, s)| step(i, s)).collect::<Result<Vec<_>, _>>()?;
        let mut producer: BTreeMap<&str, usize> = BTreeMap::new();
        let inputs: BTreeSet<&str> = spec.inputs.iter().map(|t| t.name.as_str()).collect();
        for (i, s) in steps.iter().enumerate() {
            for (_, tensor) in &s.outputs {
                if inputs.contains(tensor.as_str()) {
                    return Err(format!("{} writes '{tensor}', which is an ensemble input", s.describe(i)));
                }
                if let Some(first) = producer.insert(tensor, i) {
                    return Err(format!("ensemble tensor '{tensor}' is produced by both step {first} and step {i}"));
                }
            }
        }
        for (i, s) in steps.iter().enumerate() {
            if let Some((input, tensor)) =
                s.inputs.iter().find(|(_, t)| !inputs.contains(t.as_str()) && !producer.contains_key(t.as_str()))
            {
                return Err(format!(
                    "{} input '{input}' reads ensemble tensor '{tensor}', which is neither an ensemble input \
                     nor any step's output",
                    s.describe(i)
                ));
            }
        }
        if let Some(out) = spec.outputs.iter().find(|o| !producer.contains_key(o.name.as_str())) {
            return Err(format!("ensemble output '{}' is not produced by any step", out.name));
        }
        let waves = waves(&steps, &producer)?;
        Ok(Self { steps, waves, max_inflight: ensembling.max_inflight_requests })
    }

    /// Checks each step against its composing model's spec (`models[i]` for step `i`): the
    /// mapped names exist, every required model input is fed, datatypes agree along each
    /// tensor, and a batching ensemble's composing models batch at least as far.
    pub fn check_steps(&self, spec: &ModelSpec, models: &[&ModelSpec]) -> Result<(), String> {
        let mut types: BTreeMap<&str, (DataType, String)> = spec
            .inputs
            .iter()
            .map(|t| (t.name.as_str(), (t.datatype, format!("ensemble input '{}'", t.name))))
            .collect();
        for &i in self.waves.iter().flatten() {
            let (step, model) = (&self.steps[i], models[i]);
            let at = step.describe(i);
            if spec.max_batch_size > model.max_batch_size {
                return Err(format!(
                    "{at}: the ensemble's max_batch_size {} is above the model's {}",
                    spec.max_batch_size, model.max_batch_size
                ));
            }
            for (input, tensor) in &step.inputs {
                let t = model
                    .inputs
                    .iter()
                    .find(|t| &t.name == input)
                    .ok_or_else(|| format!("{at}: '{input}' is not an input of model '{}'", model.name))?;
                if let Some((dt, from)) = types.get(tensor.as_str())
                    && *dt != t.datatype
                {
                    return Err(format!(
                        "{at}: input '{input}' is {} but {from} gives '{tensor}' as {}",
                        t.datatype.config_name(),
                        dt.config_name()
                    ));
                }
            }
            if let Some(missing) =
                model.inputs.iter().find(|t| !t.optional && !step.inputs.iter().any(|(i, _)| *i == t.name))
            {
                return Err(format!("{at}: required input '{}' of model '{}' is not mapped", missing.name, model.name));
            }
            for (output, tensor) in &step.outputs {
                let t = model
                    .outputs
                    .iter()
                    .find(|t| &t.name == output)
                    .ok_or_else(|| format!("{at}: '{output}' is not an output of model '{}'", model.name))?;
                types.insert(tensor, (t.datatype, format!("{at} output '{output}'")));
            }
        }
        for out in &spec.outputs {
            if let Some((dt, from)) = types.get(out.name.as_str())
                && *dt != out.datatype
            {
                return Err(format!(
                    "ensemble output '{}' is {} but {from} produces {}",
                    out.name,
                    out.datatype.config_name(),
                    dt.config_name()
                ));
            }
        }
        Ok(())
    }

    /// The composing model names, each once.
    pub fn model_names(&self) -> BTreeSet<&str> {
        self.steps.iter().map(|s| s.model.as_str()).collect()
    }
}

fn step(index: usize, s: &inference::model_ensembling::Step) -> Result<Step, String> {
    if !valid_model_name(&s.model_name) {
        return Err(format!("step {index} names no valid model: '{}'", s.model_name));
    }
    let version = match s.model_version {
        -1 => None,
        v if v >= 0 => Some(v),
        v => return Err(format!("step {index} (model '{}') has an invalid model_version {v}", s.model_name)),
    };
    if s.output_map.is_empty() {
        return Err(format!("step {index} (model '{}') has an empty output_map", s.model_name));
    }
    let sorted = |m: &std::collections::HashMap<String, String>| {
        let mut v: Vec<(String, String)> = m.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        v.sort();
        v
    };
    Ok(Step { model: s.model_name.clone(), version, inputs: sorted(&s.input_map), outputs: sorted(&s.output_map) })
}

/// Kahn's algorithm over tensors: a step is ready once every tensor it reads is known.
fn waves(steps: &[Step], producer: &BTreeMap<&str, usize>) -> Result<Vec<Vec<usize>>, String> {
    let mut done = vec![false; steps.len()];
    let mut waves = Vec::new();
    while done.iter().any(|d| !d) {
        let ready: Vec<usize> = (0..steps.len())
            .filter(|&i| !done[i])
            .filter(|&i| steps[i].inputs.iter().all(|(_, t)| producer.get(t.as_str()).is_none_or(|&p| done[p])))
            .collect();
        if ready.is_empty() {
            let stuck: Vec<String> = (0..steps.len()).filter(|&i| !done[i]).map(|i| steps[i].describe(i)).collect();
            return Err(format!("the ensemble's steps form a cycle: {}", stuck.join(", ")));
        }
        for &i in &ready {
            done[i] = true;
        }
        waves.push(ready);
    }
    Ok(waves)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::model_config::from_pbtxt;

    const PIPELINE: &str = r#"
        name: "pipeline"
        platform: "ensemble"
        max_batch_size: 8
        input [ { name: "IN0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "IN1" data_type: TYPE_FP32 dims: [ 16 ] } ]
        output [ { name: "SUM" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "DIFF" data_type: TYPE_FP32 dims: [ 16 ] } ]
        ensemble_scheduling {
          step [
            { model_name: "add_sub" model_version: -1
              input_map { key: "INPUT0" value: "scaled" } input_map { key: "INPUT1" value: "IN1" }
              output_map { key: "OUTPUT0" value: "SUM" } output_map { key: "OUTPUT1" value: "DIFF" } },
            { model_name: "scale" model_version: 1
              input_map { key: "INPUT0" value: "IN0" } output_map { key: "OUTPUT0" value: "scaled" } }
          ]
        }"#;

    fn plan_of(text: &str) -> Result<(ModelSpec, Plan), String> {
        let config = from_pbtxt(text).map_err(|e| e.to_string())?;
        let spec = spec_of(config, "pipeline")?;
        let plan = Plan::new(&spec)?;
        Ok((spec, plan))
    }

    fn model(name: &str, inputs: &[&str], outputs: &[&str], datatype: DataType) -> ModelSpec {
        let t = |n: &&str| TensorSpec { name: n.to_string(), datatype, dims: vec![16], optional: false };
        ModelSpec {
            name: name.into(),
            max_batch_size: 8,
            inputs: inputs.iter().map(t).collect(),
            outputs: outputs.iter().map(t).collect(),
            instances: Vec::new(),
            accelerators: Default::default(),
            intra_op_threads: 1,
            spinning: false,
            config: ModelConfig::default(),
            ragged: None,
        }
    }

    #[test]
    fn steps_are_ordered_by_what_they_read() {
        let (spec, plan) = plan_of(PIPELINE).expect("a valid ensemble");
        assert_eq!(plan.waves, vec![vec![1], vec![0]], "scale runs before add_sub reads its output");
        assert_eq!(plan.steps[1].version, Some(1));
        assert_eq!(plan.steps[0].version, None);
        assert_eq!(spec.platform(), "ensemble");
        let add_sub = model("add_sub", &["INPUT0", "INPUT1"], &["OUTPUT0", "OUTPUT1"], DataType::Fp32);
        let scale = model("scale", &["INPUT0"], &["OUTPUT0"], DataType::Fp32);
        plan.check_steps(&spec, &[&add_sub, &scale]).expect("the models fit");
    }

    #[test]
    fn composing_models_that_do_not_fit_are_named() {
        let (spec, plan) = plan_of(PIPELINE).expect("a valid ensemble");
        let scale = model("scale", &["INPUT0"], &["OUTPUT0"], DataType::Fp32);
        let wrong_name = model("add_sub", &["A", "INPUT1"], &["OUTPUT0", "OUTPUT1"], DataType::Fp32);
        let e = plan.check_steps(&spec, &[&wrong_name, &scale]).expect_err("no INPUT0");
        assert!(e.contains("'INPUT0' is not an input of model 'add_sub'"), "{e}");
        let ints = model("add_sub", &["INPUT0", "INPUT1"], &["OUTPUT0", "OUTPUT1"], DataType::Int32);
        let e = plan.check_steps(&spec, &[&ints, &scale]).expect_err("types differ");
        assert!(e.contains("TYPE_INT32") && e.contains("TYPE_FP32"), "{e}");
        let mut small = model("add_sub", &["INPUT0", "INPUT1"], &["OUTPUT0", "OUTPUT1"], DataType::Fp32);
        small.max_batch_size = 2;
        let e = plan.check_steps(&spec, &[&small, &scale]).expect_err("batches less");
        assert!(e.contains("max_batch_size 8 is above the model's 2"), "{e}");
        let extra = model("add_sub", &["INPUT0", "INPUT1", "INPUT2"], &["OUTPUT0", "OUTPUT1"], DataType::Fp32);
        let e = plan.check_steps(&spec, &[&extra, &scale]).expect_err("unfed input");
        assert!(e.contains("required input 'INPUT2'"), "{e}");
    }

    #[test]
    fn broken_graphs_are_refused_with_the_reason() {
        let unknown = PIPELINE.replace("value: \"IN0\"", "value: \"NOWHERE\"");
        let e = plan_of(&unknown).expect_err("reads nothing");
        assert!(e.contains("'NOWHERE'") && e.contains("neither an ensemble input"), "{e}");
        let cycle = PIPELINE.replace("value: \"IN0\"", "value: \"SUM\"");
        let e = plan_of(&cycle).expect_err("cycle");
        assert!(e.contains("cycle"), "{e}");
        let twice = PIPELINE.replace("key: \"OUTPUT0\" value: \"scaled\"", "key: \"OUTPUT0\" value: \"SUM\"");
        let e = plan_of(&twice).expect_err("two producers");
        assert!(e.contains("'SUM' is produced by both"), "{e}");
        let unproduced = PIPELINE.replace("name: \"DIFF\"", "name: \"OTHER\"");
        let e = plan_of(&unproduced).expect_err("an output nobody writes");
        assert!(e.contains("ensemble output 'OTHER' is not produced"), "{e}");
        let no_io = r#"name: "pipeline" platform: "ensemble" ensemble_scheduling { step [ { model_name: "m" } ] }"#;
        assert!(plan_of(no_io).expect_err("no io").contains("inputs and outputs"));
        let bad_version = PIPELINE.replace("model_version: 1", "model_version: -7");
        assert!(plan_of(&bad_version).expect_err("version").contains("invalid model_version -7"));
        let traversal = PIPELINE.replace("model_name: \"scale\"", "model_name: \"../x\"");
        assert!(plan_of(&traversal).expect_err("path").contains("no valid model"));
    }
}
