//! Tensors as they travel through the engine: raw little-endian bytes plus name, datatype and shape.
//!
//! BYTES tensors use Triton's serialized form: per element a 4-byte little-endian length, then the bytes.

use bytes::Bytes;
use tessera_protocol::DataType;

use crate::error::{Error, Result};

/// An input tensor as received from a client, not yet checked against a model.
#[derive(Debug, Clone)]
pub struct InputTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Full shape, including the batch dimension when the model batches.
    pub shape: Vec<i64>,
    /// Row-major little-endian bytes (length-prefixed elements for BYTES).
    pub data: Bytes,
}

/// An output tensor produced by a model.
#[derive(Debug, Clone)]
pub struct OutputTensor {
    /// Tensor name.
    pub name: String,
    /// Element type.
    pub datatype: DataType,
    /// Full shape.
    pub shape: Vec<i64>,
    /// Row-major little-endian bytes (length-prefixed elements for BYTES).
    pub data: Bytes,
}

/// Counts the elements of a shape, naming the tensor in the error.
pub fn checked_element_count(tensor: &str, shape: &[i64]) -> Result<usize> {
    tessera_protocol::element_count(shape)
        .map_err(|e| Error::invalid(format!("invalid shape {} for tensor '{tensor}': {e}", fmt_shape(shape))))
}

/// Formats a shape the way Triton prints it, e.g. `[-1,16]`.
pub fn fmt_shape(shape: &[i64]) -> String {
    let dims: Vec<String> = shape.iter().map(i64::to_string).collect();
    format!("[{}]", dims.join(","))
}

/// Iterates over the elements of a serialized BYTES buffer, rejecting prefixes that run past the end.
pub fn bytes_elements(data: &[u8]) -> BytesElements<'_> {
    BytesElements { rest: data, index: 0 }
}

/// Iterator returned by [`bytes_elements`].
pub struct BytesElements<'a> {
    rest: &'a [u8],
    index: usize,
}

impl<'a> Iterator for BytesElements<'a> {
    type Item = std::result::Result<&'a [u8], String>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.rest.is_empty() {
            return None;
        }
        let index = self.index;
        self.index += 1;
        let Some((prefix, tail)) = self.rest.split_first_chunk::<4>() else {
            self.rest = &[];
            return Some(Err(format!("BYTES element {index} has a truncated 4-byte length prefix")));
        };
        let len = u32::from_le_bytes(*prefix) as usize;
        if len > tail.len() {
            self.rest = &[];
            return Some(Err(format!(
                "BYTES element {index} declares {len} bytes but only {} remain in the buffer",
                tail.len()
            )));
        }
        let (element, rest) = tail.split_at(len);
        self.rest = rest;
        Some(Ok(element))
    }
}

/// Counts BYTES elements, failing on any malformed length prefix.
pub fn count_bytes_elements(data: &[u8]) -> std::result::Result<usize, String> {
    let mut count = 0;
    for element in bytes_elements(data) {
        element?;
        count += 1;
    }
    Ok(count)
}

/// Appends one element in serialized BYTES form.
pub fn push_bytes_element(out: &mut Vec<u8>, element: &[u8]) -> Result<()> {
    let len = u32::try_from(element.len()).map_err(|_| Error::invalid("a BYTES element is larger than 4 GiB"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(element);
    Ok(())
}

/// Checks that `data` holds exactly `count` elements of `datatype`, naming `tensor` in the error.
pub fn check_data_size(tensor: &str, datatype: DataType, count: usize, data: &[u8]) -> Result<()> {
    match datatype.element_size() {
        Some(size) => {
            let expected = count
                .checked_mul(size)
                .ok_or_else(|| Error::invalid(format!("byte size of input '{tensor}' overflows")))?;
            if data.len() != expected {
                return Err(Error::invalid(format!(
                    "unexpected total byte size {} for input '{tensor}', expecting {expected}",
                    data.len()
                )));
            }
        }
        None => {
            let actual = count_bytes_elements(data).map_err(|e| Error::invalid(format!("input '{tensor}': {e}")))?;
            if actual != count {
                return Err(Error::invalid(format!(
                    "unexpected number of BYTES elements {actual} for input '{tensor}', expecting {count}"
                )));
            }
        }
    }
    Ok(())
}

/// Byte offsets of each row (first-dimension slice) of a batched output, `rows + 1` entries.
pub fn row_offsets(tensor: &OutputTensor, rows: usize) -> Result<Vec<usize>> {
    let first = tensor.shape.first().copied().unwrap_or(-1);
    if rows == 0 || first != rows as i64 {
        return Err(Error::internal(format!(
            "output '{}' has shape {} but the batch has {rows} rows",
            tensor.name,
            fmt_shape(&tensor.shape)
        )));
    }
    let data = &tensor.data[..];
    if let Some(size) = tensor.datatype.element_size() {
        let row_bytes = data.len() / rows;
        if row_bytes * rows != data.len() || !row_bytes.is_multiple_of(size) {
            return Err(Error::internal(format!("output '{}' does not split into {rows} rows", tensor.name)));
        }
        return Ok((0..=rows).map(|r| r * row_bytes).collect());
    }
    let count = checked_element_count(&tensor.name, &tensor.shape)?;
    let per_row = count / rows;
    let mut offsets = Vec::with_capacity(rows + 1);
    offsets.push(0);
    let mut consumed = 0usize;
    for (i, element) in bytes_elements(data).enumerate() {
        let element = element.map_err(Error::internal)?;
        consumed += 4 + element.len();
        if (i + 1) % per_row.max(1) == 0 {
            offsets.push(consumed);
        }
    }
    if per_row == 0 {
        offsets = vec![0; rows + 1];
    }
    if offsets.len() != rows + 1 {
        return Err(Error::internal(format!("output '{}' does not split into {rows} rows", tensor.name)));
    }
    Ok(offsets)
}

/// Rows `start..start + rows` of a batched output, sharing its buffer (no copy).
pub fn slice_rows(tensor: &OutputTensor, offsets: &[usize], start: usize, rows: usize) -> OutputTensor {
    let mut shape = tensor.shape.clone();
    if let Some(first) = shape.first_mut() {
        *first = rows as i64;
    }
    OutputTensor {
        name: tensor.name.clone(),
        datatype: tensor.datatype,
        shape,
        data: tensor.data.slice(offsets[start]..offsets[start + rows]),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn serialize(elements: &[&[u8]]) -> Vec<u8> {
        let mut out = Vec::new();
        for e in elements {
            push_bytes_element(&mut out, e).expect("small element");
        }
        out
    }

    #[test]
    fn bytes_round_trip_including_empty_and_non_ascii() {
        let data = serialize(&[b"", "héllo".as_bytes(), b"x"]);
        let elements: Vec<&[u8]> = bytes_elements(&data).map(|e| e.expect("valid")).collect();
        assert_eq!(elements, vec![&b""[..], "héllo".as_bytes(), &b"x"[..]]);
    }

    #[test]
    fn length_prefix_past_the_end_is_rejected() {
        let mut data = serialize(&[b"abc"]);
        data[0] = 200;
        let err = count_bytes_elements(&data).expect_err("overrun");
        assert!(err.contains("declares 200 bytes"), "{err}");
        assert!(count_bytes_elements(&[1, 0]).expect_err("truncated").contains("truncated"));
    }

    #[test]
    fn data_size_is_checked_for_fixed_and_bytes_types() {
        check_data_size("x", DataType::Fp32, 4, &[0; 16]).expect("fits");
        let err = check_data_size("x", DataType::Fp32, 4, &[0; 15]).expect_err("short");
        assert!(err.message.contains("expecting 16"), "{}", err.message);
        let data = serialize(&[b"a", b"b"]);
        check_data_size("s", DataType::Bytes, 2, &data).expect("two elements");
        assert!(check_data_size("s", DataType::Bytes, 3, &data).is_err());
    }

    #[test]
    fn batched_outputs_split_into_rows_without_copying() {
        let fixed = OutputTensor {
            name: "y".into(),
            datatype: DataType::Int16,
            shape: vec![3, 2],
            data: Bytes::from(vec![1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0]),
        };
        let offsets = row_offsets(&fixed, 3).expect("splits");
        let part = slice_rows(&fixed, &offsets, 1, 2);
        assert_eq!(part.shape, vec![2, 2]);
        assert_eq!(part.data.as_ref(), &[3, 0, 4, 0, 5, 0, 6, 0]);
        assert!(row_offsets(&fixed, 2).is_err(), "shape says 3 rows");
        let strings = OutputTensor {
            name: "s".into(),
            datatype: DataType::Bytes,
            shape: vec![2, 1],
            data: Bytes::from(serialize(&[b"ab", b"c"])),
        };
        let offsets = row_offsets(&strings, 2).expect("splits");
        assert_eq!(slice_rows(&strings, &offsets, 1, 1).data.as_ref(), &serialize(&[b"c"])[..]);
    }

    #[test]
    fn shapes_format_like_triton() {
        assert_eq!(fmt_shape(&[-1, 16]), "[-1,16]");
        assert!(checked_element_count("t", &[-2, 3]).is_err());
        assert!(checked_element_count("t", &[i64::MAX, i64::MAX]).is_err());
    }
}
