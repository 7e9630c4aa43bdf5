//! BYTES tensors as ONNX string tensors, byte-exact. The `ort` crate's string helpers go through
//! C strings (no NUL bytes) and UTF-8; KServe BYTES are arbitrary bytes, so these call ONNX
//! Runtime's length-aware string API directly.

use ort::AsPointer;
use ort::memory::Allocator;
use ort::sys::{OrtStatusPtr, OrtValue};
use ort::value::{DynTensor, DynValue, TensorElementType};

use crate::engine::tensor::{InputTensor, bytes_elements, push_bytes_element};

/// Turns an ORT status into a `Result`, releasing it.
fn check(status: OrtStatusPtr) -> Result<(), String> {
    if status.0.is_null() {
        return Ok(());
    }
    let api = ort::api();
    // SAFETY: a non-null status came from ORT; we read its message and release it exactly once.
    let message = unsafe {
        let msg = (api.GetErrorMessage)(status.0);
        let text = if msg.is_null() {
            "unknown ONNX Runtime error".to_string()
        } else {
            std::ffi::CStr::from_ptr(msg).to_string_lossy().into_owned()
        };
        (api.ReleaseStatus)(status.0);
        text
    };
    Err(message)
}

/// Builds a string tensor of `shape` from serialized BYTES parts, copying each element once.
pub fn build(parts: &[&InputTensor], shape: Vec<i64>) -> Result<DynValue, String> {
    let mut tensor = DynTensor::new(&Allocator::default(), TensorElementType::String, shape)
        .map_err(|e| format!("failed to allocate string tensor: {e}"))?;
    let api = ort::api();
    let value: *mut OrtValue = tensor.ptr_mut();
    let mut index = 0usize;
    for part in parts {
        for element in bytes_elements(&part.data) {
            let element = element.map_err(|e| format!("input '{}': {e}", part.name))?;
            let mut buffer: *mut std::ffi::c_char = std::ptr::null_mut();
            // SAFETY: `value` is a live string tensor with at least `index + 1` elements (the
            // request check proved the element count); ORT resizes element `index` to exactly
            // `element.len()` bytes and hands back its buffer, which we fill completely.
            unsafe {
                check((api.GetResizedStringTensorElementBuffer)(value, index, element.len(), &mut buffer))?;
                if !element.is_empty() {
                    std::ptr::copy_nonoverlapping(element.as_ptr(), buffer.cast::<u8>(), element.len());
                }
            }
            index += 1;
        }
    }
    Ok(tensor.into())
}

/// Serializes a string tensor output into BYTES form (length-prefixed elements).
pub fn extract(value: &DynValue, count: usize) -> Result<Vec<u8>, String> {
    let api = ort::api();
    let ptr: *const OrtValue = value.ptr();
    let mut total = 0usize;
    // SAFETY: `ptr` is a live string tensor of `count` elements; ORT writes `total` content bytes
    // and `count` offsets into buffers we size accordingly.
    let (content, offsets) = unsafe {
        check((api.GetStringTensorDataLength)(ptr, &mut total))?;
        let mut content = vec![0u8; total];
        let mut offsets = vec![0usize; count];
        if count > 0 {
            check((api.GetStringTensorContent)(ptr, content.as_mut_ptr().cast(), total, offsets.as_mut_ptr(), count))?;
        }
        (content, offsets)
    };
    let mut out = Vec::with_capacity(total + 4 * count);
    for i in 0..count {
        let start = offsets[i];
        let end = offsets.get(i + 1).copied().unwrap_or(total);
        let element = content.get(start..end).ok_or("ONNX Runtime returned inconsistent string offsets")?;
        push_bytes_element(&mut out, element).map_err(|e| e.message)?;
    }
    Ok(out)
}
