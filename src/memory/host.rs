//! [`HostBuf`]: pageable host memory of one tensor.

/// Bytes of a host buffer, whatever `Vec` they came in.
trait HostBytes: Send + Sync {
    fn all_bytes(&self) -> &[u8];
}

impl<T: bytemuck::Pod + Send + Sync> HostBytes for Vec<T> {
    fn all_bytes(&self) -> &[u8] {
        bytemuck::cast_slice(self)
    }
}

/// Pageable host memory: the `Vec` a tensor was built from (kept as is, no copy), or a
/// zeroed buffer of 8-byte words for bytes pinlane writes itself.
///
/// # Memory layout
///
/// ```text
///  data: Vec<T> (or Vec<u64>) ─► [ b0 b1 ... b(nbytes-1) | padding up to a whole word ]
///                                 └──────── bytes() ────┘
/// ```
///
/// The start is aligned for `T` (or 8 for `Vec<u64>`), so typed views of every dtype
/// are aligned.
pub(crate) struct HostBuf {
    data: Box<dyn HostBytes>,
    nbytes: usize,
}

impl HostBuf {
    /// Takes a `Vec` without copying it.
    pub(crate) fn from_vec<T: bytemuck::Pod + Send + Sync>(v: Vec<T>) -> HostBuf {
        let nbytes = std::mem::size_of_val(v.as_slice());
        HostBuf {
            data: Box::new(v),
            nbytes,
        }
    }

    /// A zeroed buffer of `nbytes`, aligned to 8, to be filled through `fill`.
    pub(crate) fn zeroed_with(nbytes: usize, fill: impl FnOnce(&mut [u8])) -> HostBuf {
        let mut words = vec![0u64; nbytes.div_ceil(8)];
        fill(&mut bytemuck::cast_slice_mut(&mut words)[..nbytes]);
        HostBuf {
            data: Box::new(words),
            nbytes,
        }
    }

    /// Takes words already filled with `nbytes` bytes (`words` holds at least that many).
    pub(crate) fn from_words(words: Vec<u64>, nbytes: usize) -> HostBuf {
        debug_assert!(words.len() * 8 >= nbytes);
        let nbytes = nbytes.min(words.len() * 8);
        HostBuf {
            data: Box::new(words),
            nbytes,
        }
    }

    /// A copy of `bytes`, aligned to 8.
    pub(crate) fn copy_of(bytes: &[u8]) -> HostBuf {
        Self::zeroed_with(bytes.len(), |dst| dst.copy_from_slice(bytes))
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.data.all_bytes()[..self.nbytes]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn from_vec_keeps_bytes_and_alignment() {
        let b = HostBuf::from_vec(vec![1.0f64, 2.0]);
        assert_eq!(b.bytes().len(), 16);
        assert_eq!(b.bytes().as_ptr() as usize % 8, 0);
        assert_eq!(bytemuck::cast_slice::<u8, f64>(b.bytes()), &[1.0, 2.0]);
    }

    #[test]
    fn copy_of_odd_length_is_exact() {
        let b = HostBuf::copy_of(&[1, 2, 3]);
        assert_eq!(b.bytes(), &[1, 2, 3]);
        assert_eq!(b.bytes().as_ptr() as usize % 8, 0);
        assert_eq!(HostBuf::copy_of(&[]).bytes(), &[] as &[u8]);
    }
}
