//! Tensor element types: KServe wire names, Triton config enum values and
//! element sizes, plus overflow-checked element counting for shapes.

use std::fmt;

use crate::inference;

/// A tensor's element type, as named on the KServe v2 wire.
// The control plane's OpenAPI document has always named it `TensorDatatype`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[cfg_attr(feature = "utoipa", derive(utoipa::ToSchema), schema(as = TensorDatatype))]
#[serde(rename_all = "UPPERCASE")]
pub enum DataType {
    /// `BOOL`, one byte per element.
    Bool,
    /// `UINT8`.
    Uint8,
    /// `UINT16`.
    Uint16,
    /// `UINT32`.
    Uint32,
    /// `UINT64`.
    Uint64,
    /// `INT8`.
    Int8,
    /// `INT16`.
    Int16,
    /// `INT32`.
    Int32,
    /// `INT64`.
    Int64,
    /// `FP16` (IEEE half precision).
    Fp16,
    /// `FP32`.
    Fp32,
    /// `FP64`.
    Fp64,
    /// `BYTES`: variable-length elements (`TYPE_STRING` in model configs).
    Bytes,
    /// `BF16` (bfloat16, a Triton addition).
    Bf16,
}

impl DataType {
    /// Every data type, in Triton config enum order.
    pub const ALL: [DataType; 14] = [
        DataType::Bool,
        DataType::Uint8,
        DataType::Uint16,
        DataType::Uint32,
        DataType::Uint64,
        DataType::Int8,
        DataType::Int16,
        DataType::Int32,
        DataType::Int64,
        DataType::Fp16,
        DataType::Fp32,
        DataType::Fp64,
        DataType::Bytes,
        DataType::Bf16,
    ];

    /// Parses a KServe wire name such as `"FP32"` (exact, upper case).
    pub fn from_wire(name: &str) -> Option<Self> {
        Some(match name {
            "BOOL" => DataType::Bool,
            "UINT8" => DataType::Uint8,
            "UINT16" => DataType::Uint16,
            "UINT32" => DataType::Uint32,
            "UINT64" => DataType::Uint64,
            "INT8" => DataType::Int8,
            "INT16" => DataType::Int16,
            "INT32" => DataType::Int32,
            "INT64" => DataType::Int64,
            "FP16" => DataType::Fp16,
            "FP32" => DataType::Fp32,
            "FP64" => DataType::Fp64,
            "BYTES" => DataType::Bytes,
            "BF16" => DataType::Bf16,
            _ => return None,
        })
    }

    /// The KServe wire name, e.g. `"FP32"`.
    pub fn as_wire(self) -> &'static str {
        match self {
            DataType::Bool => "BOOL",
            DataType::Uint8 => "UINT8",
            DataType::Uint16 => "UINT16",
            DataType::Uint32 => "UINT32",
            DataType::Uint64 => "UINT64",
            DataType::Int8 => "INT8",
            DataType::Int16 => "INT16",
            DataType::Int32 => "INT32",
            DataType::Int64 => "INT64",
            DataType::Fp16 => "FP16",
            DataType::Fp32 => "FP32",
            DataType::Fp64 => "FP64",
            DataType::Bytes => "BYTES",
            DataType::Bf16 => "BF16",
        }
    }

    /// Size of one element in bytes; `None` for variable-length `BYTES`.
    pub fn element_size(self) -> Option<usize> {
        match self {
            DataType::Bool | DataType::Uint8 | DataType::Int8 => Some(1),
            DataType::Uint16 | DataType::Int16 | DataType::Fp16 | DataType::Bf16 => Some(2),
            DataType::Uint32 | DataType::Int32 | DataType::Fp32 => Some(4),
            DataType::Uint64 | DataType::Int64 | DataType::Fp64 => Some(8),
            DataType::Bytes => None,
        }
    }

    /// Converts a model-config enum value; `None` for `TYPE_INVALID`.
    pub fn from_config(config: inference::DataType) -> Option<Self> {
        use inference::DataType as C;
        Some(match config {
            C::TypeInvalid => return None,
            C::TypeBool => DataType::Bool,
            C::TypeUint8 => DataType::Uint8,
            C::TypeUint16 => DataType::Uint16,
            C::TypeUint32 => DataType::Uint32,
            C::TypeUint64 => DataType::Uint64,
            C::TypeInt8 => DataType::Int8,
            C::TypeInt16 => DataType::Int16,
            C::TypeInt32 => DataType::Int32,
            C::TypeInt64 => DataType::Int64,
            C::TypeFp16 => DataType::Fp16,
            C::TypeFp32 => DataType::Fp32,
            C::TypeFp64 => DataType::Fp64,
            C::TypeString => DataType::Bytes,
            C::TypeBf16 => DataType::Bf16,
        })
    }

    /// The model-config enum value (`Bytes` becomes `TYPE_STRING`).
    pub fn to_config(self) -> inference::DataType {
        use inference::DataType as C;
        match self {
            DataType::Bool => C::TypeBool,
            DataType::Uint8 => C::TypeUint8,
            DataType::Uint16 => C::TypeUint16,
            DataType::Uint32 => C::TypeUint32,
            DataType::Uint64 => C::TypeUint64,
            DataType::Int8 => C::TypeInt8,
            DataType::Int16 => C::TypeInt16,
            DataType::Int32 => C::TypeInt32,
            DataType::Int64 => C::TypeInt64,
            DataType::Fp16 => C::TypeFp16,
            DataType::Fp32 => C::TypeFp32,
            DataType::Fp64 => C::TypeFp64,
            DataType::Bytes => C::TypeString,
            DataType::Bf16 => C::TypeBf16,
        }
    }

    /// The model-config enum name, e.g. `"TYPE_FP32"` or `"TYPE_STRING"`.
    pub fn config_name(self) -> &'static str {
        self.to_config().as_str_name()
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_wire())
    }
}

/// Why a shape has no valid element count.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ShapeError {
    /// A dimension is negative (variable dimensions are not allowed here).
    #[error("dimension {index} of shape {shape:?} is negative ({dim})")]
    Negative {
        /// Position of the offending dimension.
        index: usize,
        /// Its value.
        dim: i64,
        /// The whole shape.
        shape: Vec<i64>,
    },
    /// The element count does not fit the limit.
    #[error("shape {shape:?} has more than {limit} elements")]
    Overflow {
        /// The whole shape.
        shape: Vec<i64>,
        /// The largest element count allowed.
        limit: usize,
    },
}

/// Largest element count accepted: even at 8 bytes per element the byte size
/// still fits both `usize` and `i64`.
pub const MAX_ELEMENT_COUNT: usize = {
    let by_usize = usize::MAX / 8;
    let by_i64 = (i64::MAX / 8) as u64;
    if (by_usize as u64) < by_i64 { by_usize } else { by_i64 as usize }
};

/// Number of elements of a concrete shape (the empty shape is a scalar: 1).
pub fn element_count(shape: &[i64]) -> Result<usize, ShapeError> {
    let mut count: usize = 1;
    for (index, &dim) in shape.iter().enumerate() {
        let Ok(dim) = usize::try_from(dim) else {
            return Err(ShapeError::Negative { index, dim, shape: shape.to_vec() });
        };
        count = count
            .checked_mul(dim)
            .ok_or_else(|| ShapeError::Overflow { shape: shape.to_vec(), limit: MAX_ELEMENT_COUNT })?;
    }
    if count > MAX_ELEMENT_COUNT {
        return Err(ShapeError::Overflow { shape: shape.to_vec(), limit: MAX_ELEMENT_COUNT });
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn wire_names_round_trip() {
        for dt in DataType::ALL {
            assert_eq!(DataType::from_wire(dt.as_wire()), Some(dt));
            assert_eq!(dt.to_string(), dt.as_wire());
        }
        assert_eq!(DataType::from_wire("fp32"), None);
        assert_eq!(DataType::from_wire("STRING"), None);
        assert_eq!(DataType::from_wire(""), None);
    }

    #[test]
    fn config_enum_round_trips() {
        for dt in DataType::ALL {
            assert_eq!(DataType::from_config(dt.to_config()), Some(dt));
        }
        assert_eq!(DataType::from_config(inference::DataType::TypeInvalid), None);
        assert_eq!(DataType::Bytes.to_config(), inference::DataType::TypeString);
        assert_eq!(DataType::Bytes.config_name(), "TYPE_STRING");
        assert_eq!(DataType::Fp32.config_name(), "TYPE_FP32");
        assert_eq!(DataType::Bf16.config_name(), "TYPE_BF16");
        assert_eq!(inference::DataType::TypeBf16 as i32, 14);
    }

    #[test]
    fn element_sizes() {
        assert_eq!(DataType::Bool.element_size(), Some(1));
        assert_eq!(DataType::Fp16.element_size(), Some(2));
        assert_eq!(DataType::Bf16.element_size(), Some(2));
        assert_eq!(DataType::Int32.element_size(), Some(4));
        assert_eq!(DataType::Uint64.element_size(), Some(8));
        assert_eq!(DataType::Fp64.element_size(), Some(8));
        assert_eq!(DataType::Bytes.element_size(), None);
    }

    #[test]
    fn element_count_basics() {
        assert_eq!(element_count(&[]), Ok(1));
        assert_eq!(element_count(&[2, 3, 4]), Ok(24));
        assert_eq!(element_count(&[0, 5]), Ok(0));
        assert!(matches!(element_count(&[2, -1]), Err(ShapeError::Negative { index: 1, dim: -1, .. })));
        assert!(matches!(element_count(&[i64::MAX, i64::MAX]), Err(ShapeError::Overflow { .. })));
        assert!(matches!(element_count(&[i64::MAX]), Err(ShapeError::Overflow { .. })));
        // Overflow before a zero dimension is still refused.
        assert!(matches!(element_count(&[i64::MAX, i64::MAX, 0]), Err(ShapeError::Overflow { .. })));
        let msg = element_count(&[1, -3]).unwrap_err().to_string();
        assert!(msg.contains("negative"), "{msg}");
    }

    proptest! {
        #[test]
        fn element_count_never_panics(shape in proptest::collection::vec(any::<i64>(), 0..8)) {
            let _ = element_count(&shape);
        }

        #[test]
        fn element_count_bounds_byte_size(shape in proptest::collection::vec(0i64..1 << 20, 0..6)) {
            if let Ok(n) = element_count(&shape) {
                prop_assert!(n <= MAX_ELEMENT_COUNT);
                prop_assert!(n.checked_mul(8).is_some());
                prop_assert!(i64::try_from(n * 8).is_ok());
            }
        }
    }
}
