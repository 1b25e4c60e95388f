//! Element types: the [`DType`] tag and the [`Element`] trait that ties a Rust type to it.

use std::fmt;

/// The element type of a tensor.
///
/// ```
/// use pinlane::DType;
/// assert_eq!(DType::F32.size(), 4);
/// assert_eq!(DType::Bf16.to_string(), "bf16");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// `bool`: one byte, 0 or 1.
    Bool,
    /// `u8`.
    U8,
    /// `i8`.
    I8,
    /// `i16`.
    I16,
    /// `i32`.
    I32,
    /// `i64`.
    I64,
    /// `u16`.
    U16,
    /// `u32`.
    U32,
    /// `u64`.
    U64,
    /// IEEE half precision (`half::f16`).
    F16,
    /// bfloat16 (`half::bf16`).
    Bf16,
    /// `f32`.
    F32,
    /// `f64`.
    F64,
}

impl DType {
    /// DLPack's description of this dtype (one lane).
    ///
    /// ```
    /// use pinlane::DType;
    /// let d = DType::Bf16.to_dlpack();
    /// assert_eq!((d.bits, d.lanes), (16, 1));
    /// assert_eq!(DType::from_dlpack(d), Some(DType::Bf16));
    /// ```
    pub fn to_dlpack(self) -> dlpark::ffi::DLDataType {
        use dlpark::ffi::DLDataTypeCode as C;
        let (code, bits) = match self {
            DType::Bool => (C::BOOL, 8),
            DType::U8 => (C::UINT, 8),
            DType::I8 => (C::INT, 8),
            DType::I16 => (C::INT, 16),
            DType::I32 => (C::INT, 32),
            DType::I64 => (C::INT, 64),
            DType::U16 => (C::UINT, 16),
            DType::U32 => (C::UINT, 32),
            DType::U64 => (C::UINT, 64),
            DType::F16 => (C::FLOAT, 16),
            DType::Bf16 => (C::BFLOAT, 16),
            DType::F32 => (C::FLOAT, 32),
            DType::F64 => (C::FLOAT, 64),
        };
        dlpark::ffi::DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }

    /// The dtype a DLPack description names, if pinlane has it (one lane; not complex,
    /// float8 or other types pinlane lacks).
    pub fn from_dlpack(t: dlpark::ffi::DLDataType) -> Option<DType> {
        DType::ALL.into_iter().find(|&d| d.to_dlpack() == t)
    }

    /// Every dtype, in declaration order.
    pub const ALL: [DType; 13] = [
        DType::Bool,
        DType::U8,
        DType::I8,
        DType::I16,
        DType::I32,
        DType::I64,
        DType::U16,
        DType::U32,
        DType::U64,
        DType::F16,
        DType::Bf16,
        DType::F32,
        DType::F64,
    ];

    /// Bytes per element.
    pub const fn size(self) -> usize {
        match self {
            DType::Bool | DType::U8 | DType::I8 => 1,
            DType::I16 | DType::U16 | DType::F16 | DType::Bf16 => 2,
            DType::I32 | DType::U32 | DType::F32 => 4,
            DType::I64 | DType::U64 | DType::F64 => 8,
        }
    }

    /// The short name (`"f32"`, `"bf16"`, ...).
    pub const fn name(self) -> &'static str {
        match self {
            DType::Bool => "bool",
            DType::U8 => "u8",
            DType::I8 => "i8",
            DType::I16 => "i16",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::U16 => "u16",
            DType::U32 => "u32",
            DType::U64 => "u64",
            DType::F16 => "f16",
            DType::Bf16 => "bf16",
            DType::F32 => "f32",
            DType::F64 => "f64",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A Rust type that can be a tensor element.
///
/// `bool` is stored as one byte, 0 or 1; it is not `Pod` (other byte values are invalid),
/// so its stored form is `u8`, and bytes other than 0 and 1 are refused where bool
/// tensors are built from raw bytes.
pub trait Element: Copy + Send + Sync + 'static + sealed::Sealed {
    /// The matching dtype.
    const DTYPE: DType;
}

/// What pinlane needs of an element internally; sealed (not nameable outside the crate),
/// so the byte conversions are not public API.
pub(crate) mod sealed {
    pub trait Sealed: Sized {
        /// How the element is stored: `Self` for plain-data types, `u8` for `bool`.
        type Raw: bytemuck::Pod + Send + Sync;
        /// Converts a `Vec` to its stored form: free (the same `Vec`) for plain-data types.
        fn into_raw_vec(values: Vec<Self>) -> Vec<Self::Raw>;
        /// Writes the elements as bytes (native endianness).
        fn to_bytes(values: &[Self]) -> Vec<u8>;
        /// Reads elements back from bytes; `None` when a byte is not a valid value
        /// (only possible for `bool`). `bytes.len()` is a multiple of the size.
        fn from_bytes(bytes: &[u8]) -> Option<Vec<Self>>;
    }
}

macro_rules! pod_element {
    ($($t:ty => $d:ident),* $(,)?) => {$(
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
        impl sealed::Sealed for $t {
            type Raw = $t;
            fn into_raw_vec(values: Vec<Self>) -> Vec<Self> {
                values
            }
            fn to_bytes(values: &[Self]) -> Vec<u8> {
                bytemuck::cast_slice(values).to_vec()
            }
            fn from_bytes(bytes: &[u8]) -> Option<Vec<Self>> {
                Some(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(bytemuck::pod_read_unaligned)
                        .collect(),
                )
            }
        }
    )*};
}

pod_element!(
    u8 => U8, i8 => I8, i16 => I16, i32 => I32, i64 => I64,
    u16 => U16, u32 => U32, u64 => U64,
    half::f16 => F16, half::bf16 => Bf16, f32 => F32, f64 => F64,
);

impl Element for bool {
    const DTYPE: DType = DType::Bool;
}
impl sealed::Sealed for bool {
    type Raw = u8;
    fn into_raw_vec(values: Vec<Self>) -> Vec<u8> {
        values.into_iter().map(u8::from).collect()
    }
    fn to_bytes(values: &[Self]) -> Vec<u8> {
        values.iter().map(|&b| u8::from(b)).collect()
    }
    fn from_bytes(bytes: &[u8]) -> Option<Vec<Self>> {
        bytes
            .iter()
            .map(|&b| match b {
                0 => Some(false),
                1 => Some(true),
                _ => None,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::sealed::Sealed;
    use super::*;

    #[test]
    fn sizes_match_rust_types() {
        assert_eq!(DType::F16.size(), std::mem::size_of::<half::f16>());
        assert_eq!(DType::Bf16.size(), std::mem::size_of::<half::bf16>());
        assert_eq!(DType::I64.size(), std::mem::size_of::<i64>());
        assert_eq!(DType::Bool.size(), std::mem::size_of::<bool>());
        for d in DType::ALL {
            assert!(matches!(d.size(), 1 | 2 | 4 | 8), "{d}");
        }
    }

    #[test]
    fn bool_rejects_bytes_other_than_zero_and_one() {
        assert_eq!(bool::from_bytes(&[0, 1, 1]), Some(vec![false, true, true]));
        assert_eq!(bool::from_bytes(&[0, 2]), None);
    }

    #[test]
    fn element_bytes_round_trip() {
        let v = [1.5f32, -2.0, f32::MAX];
        assert_eq!(f32::from_bytes(&f32::to_bytes(&v)).unwrap(), v);
        let h = [half::bf16::from_f32(3.0), half::bf16::from_f32(-0.5)];
        assert_eq!(
            half::bf16::from_bytes(&half::bf16::to_bytes(&h)).unwrap(),
            h
        );
    }
}
