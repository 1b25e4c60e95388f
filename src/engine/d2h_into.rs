//! Device to host into existing tensors: [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into).
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

/// # Safety
/// As [`transfer_tensor_d2h_into`](crate::transfer_tensor_d2h_into): nothing reads or
/// writes the destinations' memory during the call.
pub(crate) unsafe fn transfer<B: Batch>(src: &B, dst: &B, opts: &IntoOptions) -> Result<()> {
    let checked = into::pair_up(src, dst, Way::D2h)?;
    let (Some(device), false) = (checked.device, checked.pairs.is_empty()) else {
        return Ok(());
    };
    let pairs = checked.pairs;
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
    let (outputs, _) = d2h::transfer(&sources, &d2h_opts, Mode::Blocking)?;
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
