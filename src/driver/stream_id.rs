//! `cuStreamGetId`: the driver's id of a stream, unique for the life of the process,
//! unlike its handle (an address the driver may give to a new stream once the old one is
//! destroyed). The kept device blocks use it to tell a borrowed consumer stream's work
//! from another's (`memory::device_blocks`).
//!
//! The call is not in the CUDA 11.4 header set pinlane binds; CUDA 12.0 and later have it,
//! looked up by hand when first needed. Without it, [`unique_id`] is `None`. The simulated
//! device answers it too.

use super::Stream;
use cudarc::driver::sys;
use std::sync::OnceLock;

type GetId = unsafe extern "C" fn(sys::CUstream, *mut u64) -> sys::CUresult;

fn entry() -> Option<GetId> {
    static E: OnceLock<Option<GetId>> = OnceLock::new();
    *E.get_or_init(|| {
        super::available()?;
        #[cfg(feature = "sim")]
        if super::simulated() {
            return Some(simulated as GetId);
        }
        // SAFETY: the library is loaded (available() checked it); `get` only resolves an
        // address, and the type matches the CUDA 12.0+ prototype of `cuStreamGetId`.
        unsafe { sys::culib().get::<GetId>(b"cuStreamGetId").ok().map(|f| *f) }
    })
}

/// The simulated device's `cuStreamGetId`.
#[cfg(feature = "sim")]
unsafe extern "C" fn simulated(s: sys::CUstream, id: *mut u64) -> sys::CUresult {
    match super::sim::active() {
        // SAFETY: the caller's contract is the driver call's; the simulator keeps it.
        Some(sim) => unsafe { sim.cuStreamGetId(s, id) },
        None => sys::CUresult::CUDA_ERROR_NOT_INITIALIZED,
    }
}

/// `stream`'s id, unique among every stream of the process for its whole life; `None`
/// when the driver lacks the call (before CUDA 12.0) or refuses it (a stream capturing a
/// CUDA graph, say). No context needs to be current.
pub(crate) fn unique_id(stream: &Stream) -> Option<u64> {
    let get = entry()?;
    let mut id = 0u64;
    // SAFETY: the stream is alive (we hold it; a borrowed one under `from_raw`'s
    // contract) and `id` is a live out-pointer.
    let res = unsafe { get(stream.raw(), &mut id) };
    (res == sys::CUresult::CUDA_SUCCESS).then_some(id)
}
