//! Model weights onto the GPU: safetensors checkpoints (one file, or shards named by an
//! index) loaded through the staging ring, the files read in place from the page cache.
//!
//! ```no_run
//! use pinlane::weights::{load_safetensors, Checkpoint, LoadOptions};
//! # fn main() -> pinlane::Result<()> {
//! // Everything, by name, on cuda:{LOCAL_RANK}:
//! let weights = load_safetensors("model.safetensors", &LoadOptions::default())?;
//!
//! // Or tensor by tensor as each arrives, placing layers while the rest load:
//! let ckpt = Checkpoint::open("llama/model.safetensors.index.json")?;
//! for item in ckpt.stream(&LoadOptions::default())? {
//!     let (name, tensor) = item?;
//!     // place `tensor` under `name` ...
//! #   let _ = (name, tensor);
//! }
//!
//! // A subset chosen by a predicate: the checkpoint lists its tensors before any is read.
//! let first_layer: Vec<&str> = ckpt
//!     .tensors()
//!     .filter(|t| t.name.starts_with("model.layers.0."))
//!     .map(|t| t.name)
//!     .collect();
//! let layer0 = ckpt.load(&LoadOptions::default().names(first_layer))?;
//! # let _ = layer0;
//! # let _ = weights;
//! # Ok(()) }
//! ```
//!
//! * **Checked first.** [`Checkpoint::open`] maps every file and checks every header
//!   (with the `safetensors` crate) before anything is copied; a bad file is an
//!   [`Error::Checkpoint`](crate::Error::Checkpoint) naming the file, the tensor where
//!   one is at fault, and the kind of fault. A failed [`Checkpoint::load`] returns no
//!   tensor.
//! * **Read in place.** Each tensor is a host tensor over the mapped file, copied by the
//!   staging ring's threads into page-locked slots and on to the device, so page-locked
//!   memory is bounded by the arena, as for any transfer. Tensors are copied in groups
//!   ([`LoadOptions::group_bytes`]), each group one device allocation.
//! * **Ready when handed out.** A tensor is returned once its bytes are on the device (the
//!   host has waited), so it is usable from any stream.
//! * **Dtypes.** Every safetensors dtype pinlane has a type for; the others (float8,
//!   float4, float6, complex) are listed ([`Checkpoint::tensors`]) but loading one is an
//!   error naming it ([`CheckpointFault::UnsupportedDtype`](crate::CheckpointFault::UnsupportedDtype)):
//!   leave them out with [`LoadOptions::names`].
//! * **The files** must not be truncated while a load reads them: as for every loader
//!   that maps files, that makes the read fault (`SIGBUS`). A file written in place after
//!   [`Checkpoint::open`] (a model saved again over it) is refused by the next load or
//!   read ([`CheckpointFault::Io`](crate::CheckpointFault::Io): open it again), and a load
//!   checks its files after each group's copies, before handing that group out, so one
//!   written while it runs is an error too (its length and times tell, by `fstat`; a file
//!   replaced by a rename leaves the mapped one, and its bytes, as they were). The times
//!   are as fine as the file system's clock, so this is a guard against a model saved
//!   over its file, not a proof: a write of the same length within one tick of the open
//!   can go unseen. Nothing else may write a checkpoint while it is open.
//! * **Regular files only.** A checkpoint's files and its index must be regular files (a
//!   FIFO or a device in their place is refused before it is read), and an index holds at
//!   most 64 MiB.

// safetensors stores little-endian bytes, and tensors hold native ones: on a big-endian
// host every multi-byte value would arrive swapped, with no error. CUDA hosts are all
// little-endian; a build for another stops here rather than load wrong values.
#[cfg(target_endian = "big")]
compile_error!("pinlane's `weights` feature needs a little-endian target (safetensors bytes are read as native)");

mod checkpoint;
mod load;

pub use checkpoint::{Checkpoint, TensorInfo};
pub use load::{LoadOptions, Loading};

use crate::error::Result;
use crate::tensor::Tensor;
use std::collections::BTreeMap;
use std::path::Path;

/// Opens the checkpoint at `path` ([`Checkpoint::open`]: a `.safetensors` file, a sharded
/// checkpoint's index, or a directory holding either) and loads it
/// ([`Checkpoint::load`]).
///
/// # Errors
/// As [`Checkpoint::open`] and [`Checkpoint::load`].
pub fn load_safetensors(
    path: impl AsRef<Path>,
    opts: &LoadOptions,
) -> Result<BTreeMap<String, Tensor>> {
    Checkpoint::open(path)?.load(opts)
}
