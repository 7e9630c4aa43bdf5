//! BYTES tensor framing (per element a 4-byte little-endian length, then the bytes), as the
//! engine reads it from requests and model outputs.
//!
//! A buffer that parses is exactly its elements written again; one that does not parses up to
//! one error, at the end. The element count agrees with an independent count and with the size
//! check requests go through, and a batch of rows splits into rows that hold their share.

use bytes::Bytes;
use tessera_data_plane::engine::tensor::{
    OutputTensor, bytes_elements, check_data_size, count_bytes_elements, push_bytes_element, row_offsets, slice_rows,
};
use tessera_protocol::DataType;

use super::infer::bytes_element_count;

/// Reads `data` as a serialized BYTES buffer.
pub fn run(data: &[u8]) {
    let elements: Vec<_> = bytes_elements(data).collect();
    let mut written = Vec::new();
    for (i, element) in elements.iter().enumerate() {
        match element {
            Ok(e) => push_bytes_element(&mut written, e).expect("an element read from a buffer fits a prefix"),
            Err(_) => assert_eq!(i + 1, elements.len(), "an error ends the elements"),
        }
    }
    let parsed = elements.iter().all(Result::is_ok);
    if parsed {
        assert_eq!(written, data, "the elements, written again, are not the buffer");
    } else {
        assert!(
            written.len() < data.len() && data.starts_with(&written),
            "the elements before the error are not a prefix"
        );
    }
    let count = count_bytes_elements(data).ok();
    assert_eq!(count, parsed.then_some(elements.len()));
    assert_eq!(count.map(|n| n as u64), bytes_element_count(data));
    let Some(count) = count else {
        assert!(check_data_size("t", DataType::Bytes, 1, data).is_err());
        return;
    };
    assert!(check_data_size("t", DataType::Bytes, count, data).is_ok());
    assert!(check_data_size("t", DataType::Bytes, count + 1, data).is_err());
    for rows in (1..=4).filter(|r| count % r == 0 && count > 0) {
        check_rows(data, count, rows);
    }
}

/// Splits a `[rows, count / rows]` output into rows: each a slice holding `count / rows` elements.
fn check_rows(data: &[u8], count: usize, rows: usize) {
    let tensor = OutputTensor {
        name: "t".into(),
        datatype: DataType::Bytes,
        shape: vec![rows as i64, (count / rows) as i64],
        data: Bytes::copy_from_slice(data),
    };
    let offsets = row_offsets(&tensor, rows).expect("a well-formed batch splits into its rows");
    assert_eq!(offsets.len(), rows + 1);
    assert_eq!((offsets[0], offsets[rows]), (0, data.len()));
    for row in 0..rows {
        let slice = slice_rows(&tensor, &offsets, row, 1);
        assert_eq!(slice.shape, [1, (count / rows) as i64]);
        assert_eq!(count_bytes_elements(&slice.data), Ok(count / rows));
    }
}
