//! What the two inference-request targets share: a model to check requests against, request
//! comparison, and an independent statement of what a checked request holds.

use std::sync::OnceLock;

use tessera_data_plane::engine::device::{Device, ExecutionTarget};
use tessera_data_plane::engine::infer::{InferRequest, ValidInferRequest};
use tessera_data_plane::engine::model_spec::{IoInfo, ModelIo, ModelSpec, complete_and_check};
use tessera_protocol::DataType;
use tessera_protocol::inference::ModelConfig;

/// A batching model (up to 8) with an input of each kind of element: fixed size, floats, half
/// floats, BYTES and BOOL, with fixed and variable dims.
pub fn spec() -> &'static ModelSpec {
    static SPEC: OnceLock<ModelSpec> = OnceLock::new();
    SPEC.get_or_init(|| {
        let info = |name: &str, datatype, shape: &[i64]| IoInfo {
            name: name.into(),
            datatype: Some(datatype),
            shape: shape.to_vec(),
        };
        let io = ModelIo {
            inputs: vec![
                info("INT", DataType::Int32, &[-1, 4]),
                info("FP", DataType::Fp32, &[-1, -1]),
                info("HALF", DataType::Fp16, &[-1, 2]),
                info("TEXT", DataType::Bytes, &[-1, -1]),
                info("FLAG", DataType::Bool, &[-1, 1]),
            ],
            outputs: vec![info("OUT", DataType::Fp32, &[-1, 4])],
        };
        let config = ModelConfig { max_batch_size: 8, ..Default::default() };
        complete_and_check(config, "fuzz", &io, &ExecutionTarget { cores: 1, device: Device::Host })
            .expect("the fuzz model is a valid model")
    })
}

/// Whether two decoded requests carry the same id, parameters, tensors and outputs.
pub fn same(a: &InferRequest, b: &InferRequest) -> bool {
    a.id == b.id
        && a.parameters == b.parameters
        && a.inputs.len() == b.inputs.len()
        && a.inputs
            .iter()
            .zip(&b.inputs)
            .all(|(x, y)| x.name == y.name && x.datatype == y.datatype && x.shape == y.shape && x.data == y.data)
        && a.outputs.len() == b.outputs.len()
        && a.outputs.iter().zip(&b.outputs).all(|(x, y)| x.name == y.name && x.parameters == y.parameters)
}

/// Checks `request` against the fuzz model; when it passes, asserts what that promises the
/// batcher and backend, counted here independently of the engine: every input the model's type,
/// a batch dimension within the limit, the rest matching the model's dims, and exactly as many
/// bytes (or length-prefixed BYTES elements) as the shape says.
pub fn check_against_model(request: InferRequest) -> bool {
    let spec = spec();
    let Ok(valid) = ValidInferRequest::new(request, spec) else { return false };
    assert!((1..=8).contains(&valid.batch_size), "batch size {}", valid.batch_size);
    for (input, want) in valid.inputs.iter().zip(&spec.inputs) {
        let input = input.as_ref().expect("the fuzz model has no optional inputs");
        assert_eq!((input.name.as_str(), input.datatype), (want.name.as_str(), want.datatype));
        let (batch, dims) = input.shape.split_first().expect("a batching model's inputs have a batch dimension");
        assert_eq!(*batch as usize, valid.batch_size);
        assert_eq!(dims.len(), want.dims.len());
        assert!(dims.iter().zip(&want.dims).all(|(got, want)| *want == -1 || got == want));
        let elements = input.shape.iter().try_fold(1u64, |n, d| n.checked_mul(u64::try_from(*d).ok()?));
        let elements = elements.expect("a checked shape has a countable number of elements");
        match input.datatype.element_size() {
            Some(size) => assert_eq!(input.data.len() as u64, elements * size as u64),
            None => assert_eq!(bytes_element_count(&input.data), Some(elements)),
        }
    }
    true
}

/// The number of elements in a serialized BYTES buffer, `None` when a length prefix runs past it.
pub fn bytes_element_count(mut data: &[u8]) -> Option<u64> {
    let mut count = 0;
    while !data.is_empty() {
        let prefix: [u8; 4] = data.get(..4)?.try_into().ok()?;
        let len = u32::from_le_bytes(prefix) as usize;
        data = data.get(4..)?.get(len..)?;
        count += 1;
    }
    Some(count)
}
