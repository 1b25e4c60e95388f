//! Device to host into existing tensors: [`transfer_tensor_d2h_into`], the call and its
//! work.
//!
//! 1. Pair and check (`into.rs`), including that pinlane may write every destination
//!    and that no two overlap.
//! 2. Move the sources as [`transfer_tensor_d2h`](crate::transfer_tensor_d2h) does, into
//!    page-locked outputs (ordered after the caller's current stream; small tensors
//!    gathered by the kernel and moved by one copy), waiting for the copies.
//! 3. Copy each output into its destination on the host (by the copy threads when large).
//!
//! Step 3 is a host copy a direct DMA into page-locked destinations would save; it keeps
//! this path the transfer's own, with its gather and its bounded memory.

use super::into::{self, IntoOptions, Way};
use super::{d2h, D2hOptions, HostOutput, Mode};
use crate::batch::Batch;
use crate::error::{Error, Result};
use crate::memory::scatter::{self, HostDst};
use crate::tensor::Tensor;

/// Copies every device tensor of `src` into the host tensor at the same place in `dst`,
/// overwriting its memory, and returns once the bytes are there.
///
/// * Pairs as for [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into): same
///   structure, each pair the same dtype and byte size; sources are device tensors of one
///   device, destinations host tensors that pinlane may write: page-locked memory, or
///   memory imported from another framework (DLPack; a torch CPU tensor, say). Host
///   tensors over memory a Rust value owns (`Tensor::from_vec`, `from_owner`) are
///   immutable and refused.
/// * Order: the copies run after the work queued before the call on the thread's
///   [`current_stream`](crate::current_stream) of the sources' device, on
///   [`IntoOptions::stream`] if given (else the thread's own copy stream).
/// * How: as [`transfer_tensor_d2h`](crate::transfer_tensor_d2h) into page-locked memory
///   (small tensors gathered by a kernel and moved by one copy), then one host copy into
///   each destination (by the copy threads for large ones).
///
/// ```no_run
/// use pinlane::{transfer_tensor_d2h_into, transfer_tensor_h2d, IntoOptions, Tensor};
/// # fn main() -> pinlane::Result<()> {
/// let on_gpu = transfer_tensor_h2d(&vec![Tensor::from_vec(vec![1.5f32; 64], [64])?])?;
/// let mut out = pinlane::memory::PinnedBufferMut::<f32>::new(64, pinlane::Device::cuda(0))?;
/// out.copy_from_slice(&[0.0; 64])?;
/// let host = vec![out.freeze([64])?];
/// // SAFETY: nothing else reads or writes `host`'s memory during the call.
/// unsafe { transfer_tensor_d2h_into(&on_gpu, &host, &IntoOptions::default()) }?;
/// assert_eq!(host[0].as_slice::<f32>()?, &[1.5; 64]);
/// # Ok(()) }
/// ```
///
/// # Safety
/// Nothing reads or writes the destinations' host memory during the call: no borrow of
/// it (from [`Tensor::as_bytes`] or [`Tensor::as_slice`] on any clone, on any thread, the
/// calling one included) is alive across the call, and no earlier pinlane copy still
/// reads it (an unfinished `transfer_tensor_h2d_async` or `transfer_tensor_h2d_into`
/// with it as a source). pinlane tensors are otherwise immutable, and this call writes
/// them.
///
/// # Errors
/// As [`transfer_tensor_h2d_into`](crate::transfer_tensor_h2d_into) before any copy (a
/// destination pinlane may not write is an [`Error::IntoMismatch`]); then as
/// [`transfer_tensor_d2h`](crate::transfer_tensor_d2h).
pub unsafe fn transfer_tensor_d2h_into<B: Batch>(
    src: &B,
    dst: &B,
    opts: &IntoOptions,
) -> Result<()> {
    super::trace::start("d2h_into");
    // SAFETY: the caller's contract, passed on.
    let r = unsafe { transfer(src, dst, opts) };
    super::trace::end();
    r
}

/// # Safety
/// As [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into): nothing reads or
/// writes the destinations' memory during the call.
pub(crate) unsafe fn transfer<B: Batch>(src: &B, dst: &B, opts: &IntoOptions) -> Result<()> {
    let checked = into::pair_up(src, dst, Way::D2h)?;
    let (Some(device), false) = (checked.device, checked.pairs.is_empty()) else {
        return Ok(());
    };
    // Before the checks below take locks a parent's thread may have held at the fork.
    crate::driver::fork::check("transfer_tensor_d2h_into")?;
    let pairs = checked.pairs;
    // Destinations a D2H call may still be writing, and sources an H2D call's copies may
    // still be writing unordered (its outputs, in its rebuild or `while_copying`), are
    // refused. A non-blocking H2D call's outputs, once it returned, are read after its
    // copies: the D2H below orders its stream after them (its own check).
    let ordered_by_the_d2h = crate::memory::check_usable(
        pairs.iter().flat_map(|p| [p.0.storage(), p.1.storage()]),
        "transfer_tensor_d2h_into",
    )?;
    drop(ordered_by_the_d2h);
    let mut targets = Vec::with_capacity(pairs.len());
    for (_, d) in &pairs {
        targets.push(HostDst::of(d).ok_or_else(|| Error::Internal {
            op: "copy into",
            reason: "a checked destination is not writable".into(),
        })?);
    }
    let ranges: Vec<(u64, usize)> = targets.iter().map(HostDst::range).collect();
    into::check_overlap(dst, &pairs, &ranges)?;
    let sources: Vec<Tensor> = pairs.iter().map(|p| p.0.clone()).collect();
    let mut d2h_opts = D2hOptions::default()
        .device(crate::device::Device::cuda(device))
        .output(HostOutput::Pinned);
    if let Some(s) = &opts.stream {
        d2h_opts = d2h_opts.stream(s.clone());
    }
    // Its only `BytesInFlight` is a source's (the outputs are its own), refused since the
    // check above (a non-blocking call whose completion failed): named as this call.
    let (outputs, _) = d2h::transfer(&sources, &d2h_opts, Mode::Blocking, d2h::Overlap::none())
        .map_err(|e| match e {
            Error::BytesInFlight { .. } => Error::BytesInFlight {
                op: "transfer_tensor_d2h_into",
            },
            e => e,
        })?;
    super::trace::mark("copied");
    let mut writes = Vec::with_capacity(outputs.len());
    for (out, target) in outputs.iter().zip(targets) {
        writes.push((out.as_bytes()?, target));
    }
    let rt = crate::runtime::runtime();
    // SAFETY: every destination is memory pinlane may write (host_write_ptr: page-locked,
    // or handed over as a raw pointer), of its tensor's length; the destinations do not
    // overlap (checked above) and cannot overlap the outputs, which are new; the caller
    // promises that nothing else reads or writes them during the call.
    unsafe { scatter::write_host(&rt.copy, &writes) }?;
    super::trace::mark("written");
    Ok(())
}
