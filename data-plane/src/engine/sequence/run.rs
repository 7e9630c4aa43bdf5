//! Runs one batch of sequence requests on an instance: one row per sequence, each with its
//! request's inputs, the control inputs filled for it and its implicit state; splits the outputs
//! back per request, keeps each sequence's next state and answers.

use bytes::Bytes;
use tokio::time::Instant;

use super::Pending;
use super::Shared;
use super::config::{ControlInput, Encoding, SequenceConfig, Signal};
use super::slots::{Row, SeqId};
use crate::engine::backend::onnx::OnnxSession;
use crate::engine::infer::ValidInferRequest;
use crate::engine::model_spec::{ModelSpec, TensorSpec};
use crate::engine::stats::{Execution, FailReason, nanos};
use crate::engine::tensor::{InputTensor, OutputTensor, row_offsets, slice_rows};
use crate::error::{Error, Result};

/// The spec a sequence model's session runs with: the request inputs, then the control inputs,
/// then the state inputs; the outputs, then the state outputs.
pub(crate) fn run_spec(spec: &ModelSpec, config: &SequenceConfig) -> ModelSpec {
    let mut run = spec.clone();
    let tensor = |name: &str, datatype, dims: &[i64]| TensorSpec {
        name: name.to_string(),
        datatype,
        dims: dims.to_vec(),
        optional: false,
    };
    run.inputs.extend(config.controls.iter().map(|c| tensor(&c.name, c.datatype(), &[1])));
    run.inputs.extend(config.states.iter().map(|s| tensor(&s.input_name, s.datatype, &s.dims)));
    run.outputs.extend(config.states.iter().map(|s| tensor(&s.output_name, s.datatype, &s.dims)));
    run
}

/// The bytes of one row of a control input.
fn control_bytes(control: &ControlInput, id: &SeqId, start: bool, end: bool) -> Vec<u8> {
    let flag = match control.signal {
        Signal::Start => start,
        Signal::End => end,
        // Batches hold no empty rows: every row is ready.
        Signal::Ready => true,
        Signal::CorrId => return corrid_bytes(control, id),
    };
    match control.encoding {
        Encoding::Int32(v) => v[usize::from(flag)].to_le_bytes().to_vec(),
        Encoding::Fp32(v) => v[usize::from(flag)].to_le_bytes().to_vec(),
        Encoding::Bool(v) => vec![u8::from(v[usize::from(flag)])],
        Encoding::Id(_) => Vec::new(),
    }
}

/// The correlation id as the CORRID control's datatype (32-bit types truncate, as in Triton).
fn corrid_bytes(control: &ControlInput, id: &SeqId) -> Vec<u8> {
    use tessera_protocol::DataType;
    let Encoding::Id(dt) = control.encoding else { return Vec::new() };
    match (id, dt) {
        (SeqId::Str(s), _) => string_element(s.as_bytes()),
        (SeqId::Num(n), DataType::Bytes) => string_element(n.to_string().as_bytes()),
        (SeqId::Num(n), DataType::Int64) => (*n as i64).to_le_bytes().to_vec(),
        (SeqId::Num(n), DataType::Uint32) => (*n as u32).to_le_bytes().to_vec(),
        (SeqId::Num(n), DataType::Int32) => (*n as i32).to_le_bytes().to_vec(),
        (SeqId::Num(n), _) => n.to_le_bytes().to_vec(),
    }
}

fn string_element(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + s.len());
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s);
    out
}

/// The control and state tensors of one row, in the run spec's order after the request inputs.
fn row_extras(spec: &ModelSpec, config: &SequenceConfig, row: &Row<Pending>) -> Vec<InputTensor> {
    let batch_dim: &[i64] = if spec.max_batch_size > 0 { &[1] } else { &[] };
    let shape = |dims: &[i64]| [batch_dim, dims].concat();
    let controls = config.controls.iter().map(|c| InputTensor {
        name: c.name.clone(),
        datatype: c.datatype(),
        shape: shape(&[1]),
        data: Bytes::from(control_bytes(c, &row.id, row.item.start, row.item.end)),
    });
    let states = config.states.iter().zip(&row.state).map(|(s, bytes)| InputTensor {
        name: s.input_name.clone(),
        datatype: s.datatype,
        shape: shape(&s.dims),
        data: Bytes::from(bytes.clone()),
    });
    controls.chain(states).collect()
}

/// What one row gets back: its requested outputs and the state it leaves.
type RowResult = Result<(Vec<OutputTensor>, Vec<Vec<u8>>)>;

/// Runs `rows` on `session`, then records statistics, keeps each sequence's new state and
/// answers each request.
pub(super) fn run_batch(session: &mut OnnxSession, shared: &Shared, rows: Vec<Row<Pending>>) {
    let (spec, stats) = (&*shared.spec, &*shared.stats);
    let start = Instant::now();
    match execute(session, shared, &rows) {
        Ok((per_row, mut timings)) => {
            let elapsed = nanos(start.elapsed());
            timings.output_ns = elapsed.saturating_sub(timings.input_ns + timings.infer_ns);
            stats.record_execution(Execution {
                batch_size: rows.len() as u64,
                input_ns: timings.input_ns,
                infer_ns: timings.infer_ns,
                output_ns: timings.output_ns,
            });
            let done = Instant::now();
            for (row, result) in rows.into_iter().zip(per_row) {
                let pending = row.item.payload;
                if pending.request.trace.is_on() {
                    crate::engine::batcher::stamp_run(&pending.request.trace, row.item.enqueued, start, &timings, done);
                }
                stats.queue.record(nanos(start.saturating_duration_since(row.item.enqueued)));
                stats.compute_input.record(timings.input_ns);
                stats.compute_infer.record(timings.infer_ns);
                stats.compute_output.record(timings.output_ns);
                let (answer, state) = match result {
                    Ok((outputs, state)) => {
                        let ns = nanos(done - pending.arrived);
                        stats.success.record(ns);
                        stats.latency_us.observe(ns / 1_000);
                        (Ok(outputs), Some(state))
                    }
                    Err(e) => (Err(e), None),
                };
                shared.sequences.lock().complete(&row.id, row.item.end, state, done);
                // A closed receiver means the client left mid-run; nothing to do then.
                let _ = pending.reply.send(answer);
            }
        }
        Err(e) => {
            tracing::warn!(model = %spec.name, error = %e.message, requests = rows.len(), "sequence execution failed");
            let now = Instant::now();
            for row in rows {
                stats.record_failure_reason(FailReason::Backend);
                shared.sequences.lock().complete(&row.id, row.item.end, None, now);
                let _ = row.item.payload.reply.send(Err(e.clone()));
            }
        }
    }
}

/// Gathers the rows' inputs (one copy each, into the ORT tensors), runs, and splits the outputs.
fn execute(
    session: &mut OnnxSession,
    shared: &Shared,
    rows: &[Row<Pending>],
) -> Result<(Vec<RowResult>, crate::engine::backend::onnx::RunTimings)> {
    let gather = Instant::now();
    let (spec, config, run_spec) = (&*shared.spec, &shared.config, &shared.run_spec);
    let extras: Vec<Vec<InputTensor>> = rows.iter().map(|r| row_extras(spec, config, r)).collect();
    let requests = (0..spec.inputs.len())
        .map(|i| rows.iter().filter_map(|r| r.item.payload.request.inputs[i].as_ref()).collect::<Vec<_>>());
    let extra_count = config.controls.len() + config.states.len();
    let generated = (0..extra_count).map(|j| extras.iter().map(|e| &e[j]).collect::<Vec<_>>());
    let parts: Vec<Vec<&InputTensor>> = requests.chain(generated).collect();
    let mut wanted: Vec<usize> = rows.iter().flat_map(|r| r.item.payload.request.outputs.iter().copied()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let first_state = wanted.len();
    wanted.extend(spec.outputs.len()..run_spec.outputs.len());
    let run_start = Instant::now();
    let (outputs, timings) = session.run(run_spec, &parts, rows.len(), &wanted)?;
    let mut timings = timings;
    timings.input_ns += nanos(run_start.saturating_duration_since(gather));
    // A ragged model's request outputs go back as the dynamic batcher's do (scattered by each
    // request's source input, or by rows); states, one row per sequence, are sliced by rows.
    let ragged = match &spec.ragged {
        Some(r) => {
            let requests: Vec<&ValidInferRequest> = rows.iter().map(|r| &r.item.payload.request).collect();
            Some(crate::engine::ragged::split(r, &requests, &outputs[..first_state], &wanted[..first_state])?)
        }
        None => None,
    };
    let offsets: Vec<Option<Vec<usize>>> = outputs
        .iter()
        .enumerate()
        .map(|(i, o)| match rows.len() == 1 || (ragged.is_some() && i < first_state) {
            true => Ok(None),
            false => row_offsets(o, rows.len()).map(Some),
        })
        .collect::<Result<_>>()?;
    let mut ragged = ragged.map(Vec::into_iter);
    let per_row = rows
        .iter()
        .enumerate()
        .map(|(n, row)| {
            let pick = |i: usize| match &offsets[i] {
                Some(off) => slice_rows(&outputs[i], off, n, 1),
                None => outputs[i].clone(),
            };
            let outs = match ragged.as_mut().and_then(Iterator::next) {
                Some(split) => split,
                None => {
                    let request = &row.item.payload.request;
                    request.outputs.iter().filter_map(|o| wanted.iter().position(|w| w == o)).map(pick).collect()
                }
            };
            let state = config
                .states
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let t = pick(first_state + k);
                    if t.data.len() == s.initial.len() {
                        Ok(t.data.to_vec())
                    } else {
                        Err(Error::internal(format!(
                            "state output '{}' has {} bytes, expected {}",
                            s.output_name,
                            t.data.len(),
                            s.initial.len()
                        )))
                    }
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((outs, state))
        })
        .collect();
    Ok((per_row, timings))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::DataType;

    fn control(signal: Signal, encoding: Encoding) -> ControlInput {
        ControlInput { name: "C".into(), signal, encoding }
    }

    #[test]
    fn controls_encode_their_signal_as_configured() {
        let id = SeqId::Num(0x1_0000_0002);
        let start = control(Signal::Start, Encoding::Int32([0, 1]));
        assert_eq!(control_bytes(&start, &id, true, false), 1i32.to_le_bytes());
        assert_eq!(control_bytes(&start, &id, false, false), 0i32.to_le_bytes());
        let end = control(Signal::End, Encoding::Fp32([0.0, 2.5]));
        assert_eq!(control_bytes(&end, &id, false, true), 2.5f32.to_le_bytes());
        let ready = control(Signal::Ready, Encoding::Bool([false, true]));
        assert_eq!(control_bytes(&ready, &id, false, false), vec![1]);
        let corrid = |dt| control(Signal::CorrId, Encoding::Id(dt));
        assert_eq!(control_bytes(&corrid(DataType::Uint64), &id, false, false), 0x1_0000_0002u64.to_le_bytes());
        assert_eq!(control_bytes(&corrid(DataType::Int32), &id, false, false), 2i32.to_le_bytes(), "truncates");
        let text = SeqId::Str("ab".into());
        assert_eq!(control_bytes(&corrid(DataType::Bytes), &text, false, false), vec![2, 0, 0, 0, b'a', b'b']);
    }
}
