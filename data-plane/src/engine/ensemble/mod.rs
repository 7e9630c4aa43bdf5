//! Ensembles (Triton's `platform: "ensemble"`): a DAG of the same namespace's models run for one
//! request. Each step is an ordinary inference on its composing model (so that model batches,
//! queues and counts its statistics as for any request); tensors pass between steps as shared
//! `Bytes`, never copied. A request's tensors live in its own map and die with it, so one
//! request's failure cannot leak another's tensors.
//!
//! The ensemble runs where requests arrive (the front, or `serve`'s process): its steps reach
//! their models there, in this process or in the runner that hosts them.

pub mod plan;

use std::collections::HashMap;
use std::sync::Arc;

use futures::future::{BoxFuture, try_join_all};
use tokio::sync::Semaphore;

use crate::engine::infer::{InferRequest, RequestedOutput, ValidInferRequest};
use crate::engine::load_error::LoadError;
use crate::engine::model::LoadedModel;
use crate::engine::model_spec::ModelSpec;
use crate::engine::tensor::{InputTensor, OutputTensor};
use crate::error::{Error, Result};
use crate::trace::Trace;

pub use plan::{Plan, is_ensemble, spec_of};

/// Finds a composing model by name and version (`None`: latest ready), in the ensemble's own
/// namespace: the caller scopes names, so a step can never reach another tenant's model.
pub type Resolve = Arc<dyn Fn(&str, Option<i64>) -> Result<Arc<LoadedModel>> + Send + Sync>;

/// A loaded ensemble: its plan and how it finds its composing models at request time (so a
/// composing model reloaded or rolled forward is used by the next request).
pub struct Ensemble {
    plan: Plan,
    resolve: Resolve,
    /// One gate per step when `max_inflight_requests` is set: a request waits at a step whose
    /// places are taken, as Triton's ensemble scheduler holds requests back.
    step_slots: Vec<Option<Arc<Semaphore>>>,
}

impl Ensemble {
    /// Checks `plan` against the composing models `resolve` finds now; they must be loaded.
    /// A composing model that is not serving is a fetch failure (it may be loading still; a
    /// worker tries again), steps that do not fit are a configuration one.
    pub fn new(spec: &ModelSpec, plan: Plan, resolve: Resolve) -> std::result::Result<Self, LoadError> {
        let mut models = Vec::with_capacity(plan.steps.len());
        let (mut missing, mut why) = (Vec::new(), Vec::new());
        for (i, step) in plan.steps.iter().enumerate() {
            match resolve(&step.model, step.version) {
                Ok(model) => models.push(model),
                Err(e) => {
                    missing.push(step.model.as_str());
                    why.push(format!("{}: {}", step.describe(i), e.message));
                }
            }
        }
        if !missing.is_empty() {
            // Triton's words first, then why each step is missing.
            return Err(LoadError::fetch(format!(
                "ensemble {} contains models that are not available or ambiguous: {} ({})",
                spec.name,
                missing.join(", "),
                why.join("; ")
            )));
        }
        let specs: Vec<&ModelSpec> = models.iter().map(|m| m.spec.as_ref()).collect();
        plan.check_steps(spec, &specs).map_err(LoadError::configuration)?;
        let limit = usize::try_from(plan.max_inflight).unwrap_or(usize::MAX).min(Semaphore::MAX_PERMITS);
        let step_slots = plan.steps.iter().map(|_| (limit > 0).then(|| Arc::new(Semaphore::new(limit)))).collect();
        Ok(Self { plan, resolve, step_slots })
    }

    /// Step `index`'s gate, when the ensemble limits requests in flight per step.
    #[cfg(test)]
    pub(crate) fn step_slots(&self, index: usize) -> Option<Arc<Semaphore>> {
        self.step_slots.get(index).cloned().flatten()
    }

    /// The composing model names.
    pub fn model_names(&self) -> Vec<String> {
        self.plan.model_names().into_iter().map(str::to_string).collect()
    }

    /// Runs `request` (checked against the ensemble's `spec`) through every step, wave by wave,
    /// and returns the requested ensemble outputs.
    pub async fn run(&self, spec: &ModelSpec, request: ValidInferRequest) -> Result<Vec<OutputTensor>> {
        if !request.cuda.is_empty() {
            return Err(Error::invalid(format!(
                "ensemble '{}' takes no inputs or outputs in CUDA shared memory",
                spec.name
            )));
        }
        let mut tensors: HashMap<String, InputTensor> =
            request.inputs.into_iter().flatten().map(|t| (t.name.clone(), t)).collect();
        for wave in &self.plan.waves {
            let steps = wave.iter().map(|&i| self.run_step(spec, i, (&request.id, &request.trace), &tensors));
            for produced in try_join_all(steps).await? {
                tensors.extend(produced.into_iter().map(|t| (t.name.clone(), t)));
            }
        }
        request
            .outputs
            .iter()
            .map(|&i| {
                let name = &spec.outputs[i].name;
                let t = tensors
                    .remove(name)
                    .ok_or_else(|| Error::internal(format!("ensemble '{}' produced no tensor '{name}'", spec.name)))?;
                Ok(OutputTensor { name: t.name, datatype: t.datatype, shape: t.shape, data: t.data })
            })
            .collect()
    }

    /// One step: its inputs taken from the request's tensors under the model's names, its
    /// outputs returned under the ensemble's names.
    fn run_step<'a>(
        &'a self,
        spec: &'a ModelSpec,
        index: usize,
        (id, ensemble_trace): (&str, &Trace),
        tensors: &HashMap<String, InputTensor>,
    ) -> BoxFuture<'a, Result<Vec<InputTensor>>> {
        let ensemble_trace = ensemble_trace.clone();
        let step = &self.plan.steps[index];
        let inputs: Vec<InputTensor> = step
            .inputs
            .iter()
            .filter_map(|(input, tensor)| tensors.get(tensor).map(|t| InputTensor { name: input.clone(), ..t.clone() }))
            .collect();
        let outputs = step.outputs.iter().map(|(o, _)| RequestedOutput { name: o.clone(), ..Default::default() });
        let request = InferRequest { id: id.to_string(), inputs, outputs: outputs.collect(), ..Default::default() };
        let in_step = move |e: Error| {
            let message = format!("in ensemble '{}', {}: {}", spec.name, step.describe(index), e.message);
            Error { message, ..e }
        };
        let slots = self.step_slots.get(index).cloned().flatten();
        Box::pin(async move {
            // Held until the step answers; the gates are never closed, so acquiring cannot fail.
            let _slot = match slots {
                Some(slots) => {
                    Some(slots.acquire_owned().await.map_err(|_| in_step(Error::internal("step gate closed")))?)
                }
                None => None,
            };
            let model = (self.resolve)(&step.model, step.version).map_err(in_step)?;
            // Traced as a child of the ensemble's trace, as Triton traces composing models.
            let trace = ensemble_trace.child(&model.spec.name, model.version);
            let response = model.infer_traced(request, trace).await.map_err(in_step)?;
            let mut produced = Vec::with_capacity(response.outputs.len());
            for out in response.outputs {
                let Some((_, tensor)) = step.outputs.iter().find(|(o, _)| *o == out.name) else { continue };
                produced.push(InputTensor {
                    name: tensor.clone(),
                    datatype: out.datatype,
                    shape: out.shape,
                    data: out.data,
                });
            }
            Ok(produced)
        })
    }
}

#[cfg(test)]
mod tests;
