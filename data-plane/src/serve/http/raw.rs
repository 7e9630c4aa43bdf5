//! Triton's raw binary requests (`Inference-Header-Content-Length: 0`): the whole body is the
//! model's one input, shaped from its configuration, and every output comes back binary.

use crate::engine::infer::InferRequest;
use crate::engine::model_spec::ModelSpec;
use crate::engine::tensor::{InputTensor, push_bytes_element};
use crate::error::{Error, Result};
use bytes::Bytes;

/// Whether `Inference-Header-Content-Length` marks a raw binary request (it is zero).
pub fn is_raw(header_length: Option<&str>) -> bool {
    header_length.is_some_and(|h| h.trim() == "0")
}

/// Builds the request a raw body stands for: the model's single input, its shape the config's
/// dims (after a batch of 1 when the model batches) with the one variable dimension deduced from
/// the body's length. The rules and messages are Triton's.
pub fn decode(body: &Bytes, spec: &ModelSpec) -> Result<InferRequest> {
    let [input] = spec.inputs.as_slice() else {
        return Err(Error::invalid(format!(
            "Raw request must only have 1 input (found 1) to be deduced but got {} inputs in '{}' model configuration",
            spec.inputs.len(),
            spec.name
        )));
    };
    let name = &input.name;
    let mut shape = Vec::with_capacity(input.dims.len() + 1);
    if spec.max_batch_size > 0 {
        shape.push(1);
    }
    let first = shape.len();
    shape.extend_from_slice(&input.dims);
    let mut variable = shape.iter().enumerate().skip(first).filter(|(_, d)| **d < 0).map(|(i, _)| i);
    let axis = variable.next();
    if variable.next().is_some() {
        return Err(Error::invalid(format!(
            "The shape of the raw input '{name}' can not be deduced because there are more than one \
             variable-sized dimension"
        )));
    }
    let data = match input.datatype.element_size() {
        // Only BYTES has no element size: the body is its one element, which gets the 4-byte
        // length every BYTES element carries.
        None => {
            if input.dims != [1] {
                return Err(Error::invalid(format!(
                    "For BYTE datatype raw input '{name}', the model must have input shape [1]"
                )));
            }
            let mut out = Vec::with_capacity(body.len() + 4);
            push_bytes_element(&mut out, body)?;
            Bytes::from(out)
        }
        Some(size) => {
            let size = size as u64;
            // Saturating: config dims may be large enough to overflow, and a saturated size
            // simply never matches the body.
            let bytes = |dims: &[i64]| dims.iter().filter(|d| **d >= 0).fold(size, |n, d| n.saturating_mul(*d as u64));
            if let Some(axis) = axis {
                shape[axis] = (body.len() as u64).checked_div(bytes(&shape)).unwrap_or(0) as i64;
            }
            let expected = bytes(&shape);
            if expected != body.len() as u64 {
                return Err(Error::invalid(format!(
                    "input byte size mismatch for input '{name}' for model '{}'. Expected {expected}, got {}",
                    spec.name,
                    body.len()
                )));
            }
            body.clone()
        }
    };
    Ok(InferRequest {
        inputs: vec![InputTensor { name: name.clone(), datatype: input.datatype, shape, data }],
        ..Default::default()
    })
}

#[cfg(test)]
mod tests {
    use tessera_protocol::DataType;
    use tessera_protocol::inference::ModelConfig;

    use super::*;
    use crate::engine::device::{Device, ExecutionTarget};
    use crate::engine::model_spec::{IoInfo, ModelIo, TensorSpec, complete_and_check};

    /// A batching model named `m` whose one input has `datatype` and `dims` in its config.
    fn spec(datatype: DataType, dims: &[i64], max_batch_size: u32) -> ModelSpec {
        let io = |n: &str| IoInfo { name: n.into(), datatype: Some(DataType::Fp32), shape: vec![-1, -1] };
        let io = ModelIo { inputs: vec![io("x")], outputs: vec![io("y")] };
        let config = ModelConfig { max_batch_size: 8, ..Default::default() };
        let host = ExecutionTarget { cores: 1, device: Device::Host };
        let mut spec = complete_and_check(config, "m", &io, &host).expect("valid spec");
        spec.max_batch_size = max_batch_size;
        spec.inputs = vec![TensorSpec { name: "x".into(), datatype, dims: dims.to_vec(), optional: false }];
        spec
    }

    fn shape_of(spec: &ModelSpec, body: &[u8]) -> Vec<i64> {
        let request = decode(&Bytes::copy_from_slice(body), spec).expect("decodes");
        request.inputs[0].shape.clone()
    }

    #[test]
    fn the_variable_dimension_comes_from_the_length() {
        assert_eq!(shape_of(&spec(DataType::Fp32, &[-1], 8), &[0; 24]), vec![1, 6]);
        assert_eq!(shape_of(&spec(DataType::Int16, &[3, -1], 8), &[0; 24]), vec![1, 3, 4]);
        assert_eq!(shape_of(&spec(DataType::Fp32, &[-1], 0), &[0; 8]), vec![2]);
        assert_eq!(shape_of(&spec(DataType::Uint8, &[2, 2], 0), &[0; 4]), vec![2, 2]);
        assert_eq!(shape_of(&spec(DataType::Fp32, &[-1], 8), &[]), vec![1, 0]);
    }

    #[test]
    fn a_bytes_input_is_the_whole_body_as_one_element() {
        let request = decode(&Bytes::from_static(b"hi"), &spec(DataType::Bytes, &[1], 4)).expect("decodes");
        assert_eq!(request.inputs[0].shape, vec![1, 1]);
        assert_eq!(request.inputs[0].data.as_ref(), b"\x02\x00\x00\x00hi");
    }

    #[test]
    fn refusals_use_tritons_words() {
        let err =
            |s: &ModelSpec, body: &'static [u8]| decode(&Bytes::from_static(body), s).expect_err("refused").message;
        let mut two = spec(DataType::Fp32, &[-1], 8);
        two.inputs.push(two.inputs[0].clone());
        assert_eq!(
            err(&two, b""),
            "Raw request must only have 1 input (found 1) to be deduced but got 2 inputs in 'm' model configuration"
        );
        assert!(err(&spec(DataType::Fp32, &[-1, -1], 8), b"").contains("more than one variable-sized dimension"));
        assert_eq!(
            err(&spec(DataType::Bytes, &[-1], 8), b"a"),
            "For BYTE datatype raw input 'x', the model must have input shape [1]"
        );
        assert_eq!(
            err(&spec(DataType::Int32, &[-1], 8), b"abc"),
            "input byte size mismatch for input 'x' for model 'm'. Expected 0, got 3"
        );
        assert_eq!(
            err(&spec(DataType::Int32, &[2], 0), b"abc"),
            "input byte size mismatch for input 'x' for model 'm'. Expected 8, got 3"
        );
    }

    #[test]
    fn dims_too_large_to_multiply_are_a_mismatch_not_a_panic() {
        let e = decode(&Bytes::from_static(b"abcd"), &spec(DataType::Fp32, &[i64::MAX, i64::MAX, -1], 8))
            .expect_err("refused")
            .message;
        assert!(e.contains("input byte size mismatch for input 'x'"), "{e}");
    }

    #[test]
    fn only_a_zero_header_length_is_raw() {
        assert!(is_raw(Some("0")) && is_raw(Some(" 0 ")));
        assert!(!is_raw(None) && !is_raw(Some("10")) && !is_raw(Some("")));
    }
}
