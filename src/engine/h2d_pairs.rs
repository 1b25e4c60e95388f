//! [`H2dPairs`]: a serving loop's sources bound to their destinations once, so that each
//! step skips the pairing and the checks that depend only on the two batches.

use super::h2d_into;
use super::into::IntoOptions;
use super::Transfer;
use crate::batch::Batch;
use crate::error::Result;
use crate::tensor::Tensor;

/// Host tensors bound to the device tensors they are copied into, checked once: what
/// [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) checks at every call
/// (the structures, each pair's dtype and size, one device, no two destinations
/// overlapping) is checked by [`H2dPairs::new`], and each [`H2dPairs::copy`] goes straight
/// to the copies. For a serving loop that feeds the same static buffers from the same
/// host tensors (rewritten in place between steps) step after step.
///
/// Holds clones of both sides (a tensor's clone shares its memory), so the destinations
/// stay allocated and the sources readable while the pairs live: memory page-locked in
/// place (`Tensor::register_pinned_many`) stays registered, and blocks of pinlane's
/// page-locked pool stay out of it, until the pairs are dropped, where a call of
/// `transfer_tensor_h2d_into` holds them only until its copies have run. Each copy
/// checks again what may change between steps (a source a D2H is still writing, an
/// earlier failure, the stream), and reads each source's bytes as they are when it
/// runs: the rules for sources and destinations while copies run are those of
/// `transfer_tensor_h2d_into` (`docs/semantics.md`, "Copies into existing tensors").
///
/// ```no_run
/// use pinlane::{transfer_tensor_h2d, H2dPairs, IntoOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let statics = transfer_tensor_h2d(&vec![Tensor::from_vec(vec![0i64; 256], [256])?])?;
/// // Page-locked sources: the kernel reads them where they are at each copy.
/// let inputs = vec![Tensor::from_vec(vec![1i64; 256], [256])?.to_pinned()?];
/// let pairs = H2dPairs::new(&inputs, &statics)?;
/// for _step in 0..3 {
///     pairs.copy(&IntoOptions::default())?.wait()?;
/// }
/// # Ok(()) }
/// ```
pub struct H2dPairs {
    /// Source and destination, in the batches' visit order (by their paths' hashes when
    /// they hold a `HashMap`), empty pairs left out.
    pairs: Vec<(Tensor, Tensor)>,
    /// The destinations' device (`None`: nothing to copy).
    device: Option<usize>,
}

impl H2dPairs {
    /// Pairs `src` with `dst` and checks them as
    /// [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) does.
    ///
    /// # Errors
    /// [`Error::IntoMismatch`](crate::Error::IntoMismatch) (structure, placement, dtype or
    /// size) and [`Error::OverlappingDestinations`](crate::Error::OverlappingDestinations).
    pub fn new<B: Batch>(src: &B, dst: &B) -> Result<H2dPairs> {
        let checked = h2d_into::pair_and_check(src, dst)?;
        Ok(H2dPairs {
            pairs: checked
                .pairs
                .iter()
                .map(|&(s, d)| (s.clone(), d.clone()))
                .collect(),
            device: checked.device,
        })
    }

    /// Copies every source, as it is now, into its destination: the copies of
    /// [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) for these pairs,
    /// ordered and completed the same way.
    ///
    /// # Errors
    /// Those of `transfer_tensor_h2d_into` that do not depend on the batches alone:
    /// [`Error::StreamDeviceMismatch`](crate::Error::StreamDeviceMismatch),
    /// [`Error::BytesInFlight`](crate::Error::BytesInFlight),
    /// [`Error::Deferred`](crate::Error::Deferred),
    /// [`Error::StreamCapturing`](crate::Error::StreamCapturing), the driver's, and
    /// [`Error::StagingExhausted`](crate::Error::StagingExhausted).
    pub fn copy(&self, opts: &IntoOptions) -> Result<Transfer<()>> {
        super::trace::start("h2d_into");
        let r = match self.device {
            Some(device) if !self.pairs.is_empty() => {
                let pairs: Vec<(&Tensor, &Tensor)> =
                    self.pairs.iter().map(|(s, d)| (s, d)).collect();
                h2d_into::run(&pairs, device, opts)
            }
            _ => Ok(Transfer::ready(())),
        };
        super::trace::end();
        r
    }

    /// The pairs with bytes to copy (empty tensors are left out).
    pub fn len(&self) -> usize {
        self.pairs.len()
    }

    /// Whether no pair has bytes to copy.
    pub fn is_empty(&self) -> bool {
        self.pairs.is_empty()
    }
}
