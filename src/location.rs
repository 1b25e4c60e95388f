//! [`Location`]: where a tensor's bytes live. An identifier type, at the bottom of the
//! crate: it imports nothing of pinlane, so errors and every layer can name it.

use std::fmt;

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Ordinary (pageable) host memory.
    Host,
    /// Page-locked host memory (copied to and from devices without staging).
    Pinned,
    /// Memory of CUDA device N.
    Cuda(usize),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Pinned => f.write_str("pinned host"),
            Location::Cuda(i) => write!(f, "cuda:{i}"),
        }
    }
}
