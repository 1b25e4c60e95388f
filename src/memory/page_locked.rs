//! Whether host memory another library allocated is page-locked
//! ([`host_page_locked`]): what a binding asks of each large host source, to read a
//! page-locked one in place and stage a pageable one.

use crate::device::Device;
use crate::driver;
use crate::error::Result;

/// Whether the `len` bytes at `ptr` are page-locked host memory, all of one allocation or
/// registration (`cuMemHostAlloc`, `cudaHostAlloc` as torch's `pin_memory()` makes it,
/// `cuMemHostRegister`), as the driver knows it now: the question torch's
/// `Tensor.is_pinned()` asks, answered by the driver in `device`'s primary context (page-
/// locked memory is known to every context under unified addressing) with one
/// `cuPointerGetAttributes` call per end of the range, no runtime and no search for a
/// device. `false` for pageable memory (the driver does not know it), device or managed
/// memory, a range that runs past its allocation, and `len == 0`. The memory is not read.
///
/// The answer is about this moment: memory registered or unregistered afterwards (by
/// another thread, or another library) changes it. A caller that reads the memory in
/// place on the device later must hold what keeps it page-locked (for torch, the tensor's
/// storage), as for any DLPack `kDLCUDAHost` import.
///
/// # Errors
/// [`Error::NoCuda`](crate::Error::NoCuda), or the driver's error, when `device`'s context
/// cannot be made current.
///
/// ```
/// # fn main() -> pinlane::Result<()> {
/// # if pinlane::driver::available().is_none() { return Ok(()); }
/// let v = vec![0u8; 4096]; // an ordinary heap allocation: pageable
/// assert!(!pinlane::memory::host_page_locked(v.as_ptr(), v.len(), pinlane::Device::cuda(0))?);
/// # Ok(()) }
/// ```
pub fn host_page_locked(ptr: *const u8, len: usize, device: Device) -> Result<bool> {
    let ctx = driver::bind(device.ordinal())?;
    Ok(driver::host_page_locked(&ctx, ptr, len))
}
