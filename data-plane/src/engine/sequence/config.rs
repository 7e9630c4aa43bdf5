//! A model's `sequence_batching` settings, checked at load: the strategy and its knobs, the
//! control inputs the batcher fills (START, END, READY, CORRID) and the implicit state tensors
//! it carries from one request of a sequence to the next.

use std::time::Duration;

use tessera_protocol::DataType;
use tessera_protocol::inference::model_config::SchedulingChoice;
use tessera_protocol::inference::model_sequence_batching::control::Kind;
use tessera_protocol::inference::model_sequence_batching::initial_state::StateData;
use tessera_protocol::inference::model_sequence_batching::{Control, StrategyChoice};
use tessera_protocol::inference::{self, ModelConfig, ModelSequenceBatching};

/// Triton's default for `max_sequence_idle_microseconds` (0 in the config means this).
pub const DEFAULT_IDLE: Duration = Duration::from_secs(1);

/// Most sequences a model may hold at once (slots or candidates): each holds its state in memory.
pub const MAX_SEQUENCES: usize = 65_536;

/// Which requests form a batch.
#[derive(Debug, Clone, PartialEq)]
pub enum Strategy {
    /// A slot per sequence for its lifetime (Triton's default).
    Direct {
        /// How long a batch may wait for more slots to have a request.
        max_queue_delay: Duration,
        /// Fraction of the slots with a request that fires a batch before the delay ends.
        minimum_slot_utilization: f32,
    },
    /// The oldest requests among the candidate sequences, batched dynamically.
    Oldest {
        /// Preferred batch sizes, ascending.
        preferred: Vec<usize>,
        /// How long the oldest request may wait for a fuller batch.
        max_queue_delay: Duration,
    },
}

/// What a control input carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// The request starts a sequence.
    Start,
    /// The request ends its sequence.
    End,
    /// The row carries a request (always true: batches hold no empty rows).
    Ready,
    /// The sequence's correlation id.
    CorrId,
}

/// How a control input encodes its signal.
#[derive(Debug, Clone, PartialEq)]
pub enum Encoding {
    /// `int32_false_true`.
    Int32([i32; 2]),
    /// `fp32_false_true`.
    Fp32([f32; 2]),
    /// `bool_false_true`.
    Bool([bool; 2]),
    /// The correlation id as this datatype (UINT64, INT64, UINT32, INT32 or BYTES).
    Id(DataType),
}

/// One control input tensor the batcher fills for every row of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct ControlInput {
    /// The model input's name.
    pub name: String,
    /// Which signal.
    pub signal: Signal,
    /// How it is encoded.
    pub encoding: Encoding,
}

impl ControlInput {
    /// The tensor's datatype.
    pub fn datatype(&self) -> DataType {
        match self.encoding {
            Encoding::Int32(_) => DataType::Int32,
            Encoding::Fp32(_) => DataType::Fp32,
            Encoding::Bool(_) => DataType::Bool,
            Encoding::Id(dt) => dt,
        }
    }
}

/// An implicit state tensor: the model's `output_name` after one request of a sequence is fed
/// as its `input_name` on the next.
#[derive(Debug, Clone, PartialEq)]
pub struct StateSpec {
    /// Model input that receives the state.
    pub input_name: String,
    /// Model output that produces the next state.
    pub output_name: String,
    /// Element type.
    pub datatype: DataType,
    /// Dims per sequence (without the batch dimension).
    pub dims: Vec<i64>,
    /// The state a sequence starts with: zeros of `dims`, or bytes read from a file.
    pub initial: Vec<u8>,
}

/// A model's checked `sequence_batching`.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceConfig {
    /// How batches form.
    pub strategy: Strategy,
    /// Sequences served at once (slots, or candidates); the rest wait in a backlog.
    pub capacity: usize,
    /// Largest batch one execution carries.
    pub max_batch: usize,
    /// A sequence with no request for this long is released.
    pub idle: Duration,
    /// Control inputs, in config order.
    pub controls: Vec<ControlInput>,
    /// Implicit state tensors, in config order.
    pub states: Vec<StateSpec>,
}

/// The config's `sequence_batching`, if it has one.
pub fn sequence_batching(config: &ModelConfig) -> Option<&ModelSequenceBatching> {
    match &config.scheduling_choice {
        Some(SchedulingChoice::SequenceBatching(sb)) => Some(sb),
        _ => None,
    }
}

impl SequenceConfig {
    /// Reads and checks the `sequence_batching` of a completed config; `instances` is the
    /// number of model instances (the direct strategy has a slot per batch row per instance);
    /// `model_dir` is where `initial_state` data files live (`<model>/initial_state/`).
    pub fn from_config(
        config: &ModelConfig,
        instances: usize,
        model_dir: &std::path::Path,
    ) -> Result<Option<Self>, String> {
        let Some(sb) = sequence_batching(config) else { return Ok(None) };
        let max_batch = usize::try_from(config.max_batch_size).unwrap_or(0).max(1);
        let slots = max_batch.saturating_mul(instances.max(1));
        let (strategy, capacity) = match &sb.strategy_choice {
            None => (Strategy::Direct { max_queue_delay: Duration::ZERO, minimum_slot_utilization: 0.0 }, slots),
            Some(StrategyChoice::Direct(d)) => {
                if !(0.0..=1.0).contains(&d.minimum_slot_utilization) {
                    return Err(format!(
                        "sequence_batching minimum_slot_utilization must be between 0 and 1, got {}",
                        d.minimum_slot_utilization
                    ));
                }
                let delay = Duration::from_micros(d.max_queue_delay_microseconds);
                (
                    Strategy::Direct { max_queue_delay: delay, minimum_slot_utilization: d.minimum_slot_utilization },
                    slots,
                )
            }
            Some(StrategyChoice::Oldest(o)) => {
                let candidates = match usize::try_from(o.max_candidate_sequences) {
                    Ok(0) | Err(_) => {
                        return Err(format!(
                            "sequence_batching oldest strategy needs max_candidate_sequences > 0, got {}",
                            o.max_candidate_sequences
                        ));
                    }
                    Ok(n) => n,
                };
                let preferred = preferred_sizes(&o.preferred_batch_size, max_batch)?;
                let delay = Duration::from_micros(o.max_queue_delay_microseconds);
                (Strategy::Oldest { preferred, max_queue_delay: delay }, candidates)
            }
        };
        if capacity > MAX_SEQUENCES {
            return Err(format!(
                "sequence_batching would hold {capacity} sequences, above the limit of {MAX_SEQUENCES}"
            ));
        }
        let idle = match sb.max_sequence_idle_microseconds {
            0 => DEFAULT_IDLE,
            us => Duration::from_micros(us),
        };
        let controls = sb.control_input.iter().map(control_input).collect::<Result<Vec<_>, _>>()?;
        let states = sb.state.iter().map(|s| state(s, model_dir)).collect::<Result<Vec<_>, _>>()?;
        let mut names: Vec<&str> = controls.iter().map(|c| c.name.as_str()).collect();
        names.extend(states.iter().map(|s| s.input_name.as_str()));
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("sequence_batching names input '{}' more than once", w[0]));
        }
        if let Some(clash) = config.input.iter().find(|i| names.contains(&i.name.as_str())) {
            return Err(format!(
                "input '{}' is both a request input and a sequence_batching control or state input",
                clash.name
            ));
        }
        Ok(Some(Self { strategy, capacity, max_batch, idle, controls, states }))
    }

    /// The datatype of the CORRID control, when the model has one (BYTES: string ids only).
    pub fn corrid_type(&self) -> Option<DataType> {
        self.controls.iter().find_map(|c| match c.encoding {
            Encoding::Id(dt) => Some(dt),
            _ => None,
        })
    }
}

fn preferred_sizes(sizes: &[i32], max_batch: usize) -> Result<Vec<usize>, String> {
    let mut preferred = Vec::with_capacity(sizes.len());
    for p in sizes {
        let p = usize::try_from(*p)
            .ok()
            .filter(|p| (1..=max_batch).contains(p))
            .ok_or_else(|| format!("preferred_batch_size {p} must be between 1 and max_batch_size {max_batch}"))?;
        preferred.push(p);
    }
    preferred.sort_unstable();
    preferred.dedup();
    Ok(preferred)
}

fn control_input(input: &inference::model_sequence_batching::ControlInput) -> Result<ControlInput, String> {
    let name = &input.name;
    if name.is_empty() {
        return Err("sequence_batching control_input needs a name".into());
    }
    let [control] = input.control.as_slice() else {
        return Err(format!(
            "sequence_batching control_input '{name}' must have exactly one control, got {}",
            input.control.len()
        ));
    };
    let signal = match Kind::try_from(control.kind) {
        Ok(Kind::ControlSequenceStart) => Signal::Start,
        Ok(Kind::ControlSequenceEnd) => Signal::End,
        Ok(Kind::ControlSequenceReady) => Signal::Ready,
        Ok(Kind::ControlSequenceCorrid) => Signal::CorrId,
        Err(_) => return Err(format!("sequence_batching control_input '{name}' has an unknown kind {}", control.kind)),
    };
    let encoding =
        if signal == Signal::CorrId { corrid_encoding(name, control)? } else { flag_encoding(name, control)? };
    Ok(ControlInput { name: name.clone(), signal, encoding })
}

fn flag_encoding(name: &str, c: &Control) -> Result<Encoding, String> {
    let lens = [c.int32_false_true.len(), c.fp32_false_true.len(), c.bool_false_true.len()];
    if lens.iter().filter(|n| **n > 0).count() != 1 {
        return Err(format!(
            "sequence_batching control_input '{name}' must set exactly one of int32_false_true, fp32_false_true, bool_false_true"
        ));
    }
    match (&c.int32_false_true[..], &c.fp32_false_true[..], &c.bool_false_true[..]) {
        ([f, t], [], []) => Ok(Encoding::Int32([*f, *t])),
        ([], [f, t], []) => Ok(Encoding::Fp32([*f, *t])),
        ([], [], [f, t]) => Ok(Encoding::Bool([*f, *t])),
        _ => Err(format!(
            "sequence_batching control_input '{name}' must give two values (false, true), got {}",
            lens.iter().sum::<usize>()
        )),
    }
}

fn corrid_encoding(name: &str, c: &Control) -> Result<Encoding, String> {
    let dt = inference::DataType::try_from(c.data_type).ok().and_then(DataType::from_config);
    match dt {
        Some(dt @ (DataType::Uint64 | DataType::Int64 | DataType::Uint32 | DataType::Int32 | DataType::Bytes)) => {
            Ok(Encoding::Id(dt))
        }
        _ => Err(format!(
            "sequence_batching CORRID control_input '{name}' must have data_type TYPE_UINT64, TYPE_INT64, TYPE_UINT32, TYPE_INT32 or TYPE_STRING"
        )),
    }
}

fn state(s: &inference::model_sequence_batching::State, model_dir: &std::path::Path) -> Result<StateSpec, String> {
    let what = format!("sequence_batching state '{}'", s.input_name);
    if s.input_name.is_empty() || s.output_name.is_empty() {
        return Err("sequence_batching state needs input_name and output_name".into());
    }
    let datatype = inference::DataType::try_from(s.data_type)
        .ok()
        .and_then(DataType::from_config)
        .ok_or_else(|| format!("{what} has no valid data_type"))?;
    let Some(size) = datatype.element_size() else {
        return Err(format!("{what}: TYPE_STRING states are not supported"));
    };
    let initial_state = match s.initial_state.as_slice() {
        [] => None,
        [one] => Some(one),
        more => return Err(format!("{what} has {} initial_state entries; at most one is supported", more.len())),
    };
    let dims = match initial_state {
        Some(i) if s.dims.iter().any(|d| *d < 0) => i.dims.clone(),
        _ => s.dims.clone(),
    };
    if dims.iter().any(|d| *d < 0) {
        return Err(format!("{what} has variable dims {dims:?}; give fixed dims or an initial_state with fixed dims"));
    }
    let count = tessera_protocol::element_count(&dims).map_err(|e| format!("{what}: {e}"))?;
    let bytes = count.checked_mul(size).ok_or_else(|| format!("{what} is too large"))?;
    let initial = match initial_state.and_then(|i| i.state_data.as_ref()) {
        None | Some(StateData::ZeroData(_)) => vec![0; bytes],
        Some(StateData::DataFile(file)) => initial_file(&what, model_dir, file, bytes)?,
    };
    Ok(StateSpec { input_name: s.input_name.clone(), output_name: s.output_name.clone(), datatype, dims, initial })
}

/// Reads an `initial_state` data file from `<model>/initial_state/`, as Triton does.
fn initial_file(what: &str, model_dir: &std::path::Path, file: &str, bytes: usize) -> Result<Vec<u8>, String> {
    let name = std::path::Path::new(file);
    if name.components().count() != 1 || !matches!(name.components().next(), Some(std::path::Component::Normal(_))) {
        return Err(format!("{what}: initial_state data_file '{file}' must be a plain file name"));
    }
    let path = model_dir.join("initial_state").join(name);
    let data = std::fs::read(&path).map_err(|e| format!("{what}: cannot read {}: {e}", path.display()))?;
    if data.len() != bytes {
        return Err(format!("{what}: initial_state file '{file}' has {} bytes, expected {bytes}", data.len()));
    }
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_protocol::model_config::from_pbtxt;

    fn read(text: &str) -> Result<Option<SequenceConfig>, String> {
        SequenceConfig::from_config(&from_pbtxt(text).expect("parses"), 2, std::path::Path::new("/nonexistent"))
    }

    const CONTROLS: &str = r#"
      control_input [
        { name: "START" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] },
        { name: "READY" control [ { kind: CONTROL_SEQUENCE_READY fp32_false_true: [ 0, 1 ] } ] },
        { name: "END" control [ { kind: CONTROL_SEQUENCE_END bool_false_true: [ false, true ] } ] },
        { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] }
      ]"#;

    #[test]
    fn direct_is_the_default_with_a_slot_per_row_per_instance() {
        let c = read(&format!("max_batch_size: 4 sequence_batching {{ {CONTROLS} }}")).expect("valid").expect("some");
        assert_eq!(c.capacity, 8);
        assert_eq!(c.idle, DEFAULT_IDLE);
        assert!(matches!(c.strategy, Strategy::Direct { .. }));
        let kinds: Vec<_> = c.controls.iter().map(|c| (c.signal, c.encoding.clone())).collect();
        assert_eq!(
            kinds,
            vec![
                (Signal::Start, Encoding::Int32([0, 1])),
                (Signal::Ready, Encoding::Fp32([0.0, 1.0])),
                (Signal::End, Encoding::Bool([false, true])),
                (Signal::CorrId, Encoding::Id(DataType::Uint64)),
            ]
        );
        assert_eq!(c.corrid_type(), Some(DataType::Uint64));
        assert_eq!(read("max_batch_size: 4").expect("no sequence batching"), None);
    }

    #[test]
    fn oldest_reads_candidates_preferred_sizes_and_delay() {
        let c = read(
            "max_batch_size: 4 sequence_batching { max_sequence_idle_microseconds: 5000 oldest { \
             max_candidate_sequences: 16 preferred_batch_size: [ 4, 2 ] max_queue_delay_microseconds: 100 } }",
        )
        .expect("valid")
        .expect("some");
        assert_eq!(c.capacity, 16);
        assert_eq!(c.idle, Duration::from_micros(5000));
        assert_eq!(c.strategy, Strategy::Oldest { preferred: vec![2, 4], max_queue_delay: Duration::from_micros(100) });
    }

    #[test]
    fn states_start_as_zeros_of_their_dims() {
        let c = read(
            "max_batch_size: 2 sequence_batching { state [ { input_name: \"S_IN\" output_name: \"S_OUT\" \
             data_type: TYPE_FP32 dims: [ 3 ] } ] }",
        )
        .expect("valid")
        .expect("some");
        assert_eq!(c.states[0].initial, vec![0u8; 12]);
        let c = read(
            "max_batch_size: 2 sequence_batching { state [ { input_name: \"S_IN\" output_name: \"S_OUT\" \
             data_type: TYPE_INT32 dims: [ -1 ] initial_state [ { data_type: TYPE_INT32 dims: [ 2 ] zero_data: true name: \"z\" } ] } ] }",
        )
        .expect("valid")
        .expect("some");
        assert_eq!((c.states[0].dims.clone(), c.states[0].initial.len()), (vec![2], 8));
    }

    #[test]
    fn bad_sequence_settings_are_refused_with_a_reason() {
        for (text, needle) in [
            ("max_batch_size: 4 sequence_batching { oldest { } }", "max_candidate_sequences"),
            (
                "max_batch_size: 4 sequence_batching { oldest { max_candidate_sequences: 4 preferred_batch_size: [ 9 ] } }",
                "preferred_batch_size 9",
            ),
            (
                "max_batch_size: 4 sequence_batching { control_input [ { name: \"S\" control [ { kind: CONTROL_SEQUENCE_START } ] } ] }",
                "exactly one of",
            ),
            (
                "max_batch_size: 4 sequence_batching { control_input [ { name: \"S\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 1 ] } ] } ] }",
                "two values",
            ),
            (
                "max_batch_size: 4 sequence_batching { control_input [ { name: \"C\" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_FP32 } ] } ] }",
                "CORRID",
            ),
            (
                "max_batch_size: 4 sequence_batching { state [ { input_name: \"A\" output_name: \"B\" data_type: TYPE_FP32 dims: [ -1 ] } ] }",
                "variable dims",
            ),
            (
                "max_batch_size: 4 sequence_batching { direct { minimum_slot_utilization: 2 } }",
                "minimum_slot_utilization",
            ),
            (
                "max_batch_size: 4 input [ { name: \"S\" data_type: TYPE_INT32 dims: [ 1 ] } ] sequence_batching { control_input [ { name: \"S\" control [ { kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] } ] } ] }",
                "both a request input",
            ),
        ] {
            let err = read(text).expect_err(text);
            assert!(err.contains(needle), "{text}: {err}");
        }
    }
}
