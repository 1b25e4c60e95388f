//! DLPack, through the `dlpark` crate: export pinlane tensors (host, page-locked, device)
//! as versioned `DLManagedTensorVersioned`, and import versioned and legacy
//! `DLManagedTensor` ones, zero-copy, with the producer's deleter run exactly once.
//!
//! The memory layer, because a capsule is an owner of raw memory: an import turns the
//! descriptor's data pointer into a [`Storage`] whose owner is the producer's deleter; an
//! export points a descriptor at a storage's bytes and keeps them alive until the
//! consumer's deleter runs. It reads dtypes and shapes (plain data of the tensor layer)
//! and gives `Tensor` its parts.

use super::{
    pinned, DeviceAlloc, DevicePtrGuard, DeviceView, HostBuf, PinnedBlock, PinnedBuf, Storage,
};
use crate::driver::Stream;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::layout::Shape;
use dlpark::ffi::{DLDataType, DLDevice, DLDeviceType};
use dlpark::metadata::Dynamic;
use dlpark::{DlpackFlags, Managed, ManagedTensorBase};

fn bad(reason: impl Into<String>) -> Error {
    Error::DLPack {
        reason: reason.into(),
    }
}

/// The pinlane dtype of a DLPack dtype, if there is one.
fn from_dl_dtype(t: DLDataType) -> Result<DType> {
    DType::from_dlpack(t).ok_or_else(|| {
        bad(format!(
            "unsupported dtype (code {}, {} bits, {} lanes)",
            t.code.0, t.bits, t.lanes
        ))
    })
}

/// What the exported capsule keeps alive: the tensor's memory (`keep`), and for a device
/// tensor lent for a stream, the guard whose drop (when the consumer calls the deleter)
/// records the use.
struct Exported {
    _keep: Box<dyn Send + Sync>,
    _lent: Option<DevicePtrGuard>,
}

/// A versioned, read-only capsule over `storage`'s bytes (`dtype`, `dims`), alive while
/// `keep` (which must keep those bytes alive and unchanged) is; with `stream`, a device
/// storage's use is recorded on it when the deleter runs. `in_flight`: a page-locked
/// storage that a D2H call may still be writing is exported too (the caller's
/// obligation: see [`Tensor::to_dlpack_in_flight`](crate::Tensor::to_dlpack_in_flight));
/// otherwise it is refused.
pub(crate) fn export(
    storage: &Storage,
    dtype: DType,
    dims: &[usize],
    keep: Box<dyn Send + Sync>,
    stream: Option<&Stream>,
    in_flight: bool,
) -> Result<dlpark::versioned::Dlpack> {
    let (device, data, lent) = match storage {
        Storage::Host(b) => (DLDevice::CPU, b.as_ptr(), None),
        Storage::Pinned(b) => {
            // Another framework reads the bytes: not while a copy may still write them,
            // unless the caller has promised not to read them before the copy is done.
            if !in_flight {
                b.readable("to_dlpack")?;
            }
            let host = DLDevice {
                device_type: DLDeviceType::CUDAHOST,
                device_id: 0,
            };
            (host, b.as_ptr(), None)
        }
        Storage::Device(v) => {
            // Likewise for an H2D call's output whose copies may still run; a consumer on
            // `stream` waits for a non-blocking call's copies once it has returned.
            match (in_flight, stream) {
                (true, _) => {}
                (false, Some(s)) => v.usable_on(s, "to_dlpack")?,
                (false, None) => v.usable("to_dlpack")?,
            }
            let lent = stream.map(|s| v.lend(s));
            let id = i32::try_from(v.device()).map_err(|_| bad("device ordinal too large"))?;
            // An address as DLPack stores it: a pointer-sized value (null for no bytes).
            let addr = v.addr(0).unwrap_or(0) as usize as *const u8;
            (DLDevice::cuda(id), addr, lent)
        }
    };
    let dims = dims
        .iter()
        .map(|&d| i64::try_from(d).map_err(|_| bad("a dimension does not fit i64")))
        .collect::<Result<Vec<i64>>>()?;
    let ctx = Box::new(Exported {
        _keep: keep,
        _lent: lent,
    });
    let mut init = Dynamic::compact(dims)
        .initialize(ctx)
        .map_err(|e| bad(e.to_string()))?;
    init.set_data(data.cast_mut().cast())
        .set_device(device)
        .set_dtype(dtype.to_dlpack())
        .set_byte_offset(0)
        .set_flags(DlpackFlags::READ_ONLY)
        .map_err(|e| bad(e.to_string()))?;
    // SAFETY: the descriptor is complete: data points to the storage's bytes (or is null
    // for no bytes), which `keep` in the context keeps alive until the deleter runs, and
    // unchanged once the copies writing them are done (checked above, or, `in_flight`,
    // the caller's obligation before anyone reads them); shape and compact strides live
    // in the same allocation; READ_ONLY because pinlane tensors are immutable.
    Ok(unsafe { init.finish() })
}

/// Whether `strides` (in elements) describe the compact row-major layout of `shape`;
/// dimensions of size 1 may have any stride, and a tensor of no elements is compact.
fn is_compact(shape: &[i64], strides: &[i64]) -> bool {
    if shape.contains(&0) {
        return true;
    }
    let mut expected: i64 = 1;
    for (&n, &s) in shape.iter().zip(strides).rev() {
        if n != 1 && s != expected {
            return false;
        }
        expected = expected.saturating_mul(n);
    }
    true
}

/// The parts of a tensor over a capsule's memory: dtype, shape, byte size, storage. The
/// deleter runs when the storage's last view drops, or here on error.
pub(crate) fn import<M: ManagedTensorBase>(
    dl: Managed<M>,
    writes: Writes,
) -> Result<(DType, Shape, usize, Storage)> {
    if writes == Writes::Refused
        && !dl
            .flags()
            .intersects(DlpackFlags::READ_ONLY | DlpackFlags::IS_COPIED)
    {
        return Err(bad(
            "the producer may still write this memory (it is flagged neither READ_ONLY nor \
             IS_COPIED), and a pinlane tensor's bytes never change: import it with the \
             unsafe Tensor::from_dlpack_writable, whose contract is that nothing writes it \
             while pinlane's tensor lives",
        ));
    }
    let (dtype, shape, nbytes, device, addr) = {
        let t = dl.validate().map_err(|e| bad(e.to_string()))?;
        let dtype = from_dl_dtype(t.dtype())?;
        let dims = t
            .shape()
            .iter()
            .map(|&d| usize::try_from(d).map_err(|_| bad(format!("negative dimension {d}"))))
            .collect::<Result<Vec<usize>>>()?;
        if let Some(strides) = t.strides() {
            if !is_compact(t.shape(), strides) {
                return Err(bad(format!(
                    "non-contiguous strides {strides:?} for shape {:?} (pinlane tensors are \
                     contiguous and row-major)",
                    t.shape()
                )));
            }
        }
        let shape = Shape::from(dims);
        let nbytes = shape.try_nbytes(dtype)?;
        let base = t.data_ptr() as usize as u64;
        let addr = base
            .checked_add(t.byte_offset())
            .ok_or_else(|| bad("data pointer plus byte_offset overflows"))?;
        if nbytes > 0 && (base == 0 || !addr.is_multiple_of(dtype.size() as u64)) {
            return Err(bad(format!(
                "data {base:#x} + byte_offset {} is null or not aligned to {dtype}'s {} bytes",
                t.byte_offset(),
                dtype.size()
            )));
        }
        (dtype, shape, nbytes, t.device(), addr)
    };
    // Whether copies into existing tensors (`transfer_tensor_d2h_into` on the host,
    // `transfer_tensor_h2d_into` and `H2dPairs` on the device) may write this memory: only
    // when the importer took it as writable (the unsafe imports) and the producer did not
    // flag it read-only.
    let writable = writes == Writes::Promised && !dl.flags().intersects(DlpackFlags::READ_ONLY);
    let owner: Box<dyn Send + Sync> = Box::new(dl.into_deleter());
    let storage = match device.device_type {
        DLDeviceType::CPU => {
            // SAFETY: a valid DLPack CPU tensor's `nbytes` at `addr` are readable until its
            // deleter runs, which dropping `owner` does.
            Storage::Host(unsafe {
                HostBuf::from_raw_parts(addr as usize as *const u8, nbytes, owner, writable)
            })
        }
        DLDeviceType::CUDAHOST => {
            let ptr = addr as usize as *mut u8;
            match pinned::registered(ptr as usize, nbytes) {
                // Memory pinlane is page-locking or unlocking right now, or only partly
                // holds: it may stop being page-locked while the import lives, so it is
                // taken as pageable (staged, never read by the device after the call).
                pinned::Registered::Passing => Storage::Host(
                    // SAFETY: as for a CPU tensor above.
                    unsafe { HostBuf::from_raw_parts(ptr, nbytes, owner, writable) },
                ),
                clear_or_inside => {
                    // SAFETY: as above; the producer says the memory is page-locked (for
                    // as long as the capsule holds it: the DLPack contract of
                    // `kDLCUDAHost`); memory inside a registration of pinlane's is kept
                    // page-locked by the block, which holds that registration (all of the
                    // range, as `registered` found).
                    let block = unsafe {
                        PinnedBlock::foreign_in(
                            ptr,
                            nbytes,
                            owner,
                            writable,
                            clear_or_inside.inside(),
                        )
                    };
                    Storage::Pinned(PinnedBuf::view(&block, 0, nbytes)?)
                }
            }
        }
        DLDeviceType::CUDA => {
            let ordinal = usize::try_from(device.device_id)
                .map_err(|_| bad(format!("negative CUDA device id {}", device.device_id)))?;
            crate::driver::require("Tensor::from_dlpack")?;
            crate::driver::check_device(ordinal)?;
            if nbytes == 0 {
                Storage::Device(DeviceView::empty(ordinal))
            } else {
                // SAFETY: a valid DLPack CUDA tensor's `nbytes` at `addr` are device memory
                // of `ordinal` (usable from its primary context, as every CUDA runtime
                // allocation is) until its deleter runs, which dropping `owner` does.
                let alloc = unsafe { DeviceAlloc::foreign(addr, nbytes, ordinal, owner, writable) };
                Storage::Device(DeviceView::whole(&alloc))
            }
        }
        other => {
            return Err(bad(format!(
                "unsupported device type {} (pinlane takes kDLCPU, kDLCUDAHost and kDLCUDA)",
                other.0
            )))
        }
    };
    Ok((dtype, shape, nbytes, storage))
}

/// Whether an [`import`] takes memory its producer may still write.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Writes {
    /// Only memory flagged `READ_ONLY` or `IS_COPIED` (nobody else writes it).
    Refused,
    /// Any memory: the caller promised that nothing writes it while the tensor lives.
    Promised,
}

/// [`import`] from a raw pointer to a managed tensor (versioned or legacy), taking
/// ownership of it: its deleter runs exactly once, also on error (dlpark releases a
/// capsule of an incompatible version before returning).
///
/// # Safety
/// `ptr` is null (an error) or a valid managed tensor whose ownership the caller gives
/// up: its descriptor is readable and unchanged until its deleter runs, and the deleter
/// may be called once, from any thread.
pub(crate) unsafe fn import_raw<M: ManagedTensorBase>(
    ptr: *mut M,
    writes: Writes,
) -> Result<(DType, Shape, usize, Storage)> {
    // SAFETY: the caller's contract is dlpark's `from_raw` contract.
    let dl = unsafe { Managed::from_raw(ptr) }.map_err(|e| bad(e.to_string()))?;
    import(dl, writes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dlpark::ffi::DLDataTypeCode;

    /// Exports `b` as `n` bytes, as torch gets it from the Python package (writable), and
    /// writes `byte` into all of them through the export's data pointer, as torch would.
    fn write_through_export(b: &HostBuf, n: usize, byte: u8) {
        let dl = export(
            &Storage::Host(b.clone()),
            DType::U8,
            &[n],
            Box::new(b.clone()),
            None,
            false,
        )
        .unwrap();
        // SAFETY: the consumer's write into a tensor it was handed writable: the callers'
        // `n` bytes from the view's start lie inside its region or copy, which the
        // capsule keeps alive, and nothing reads them meanwhile.
        unsafe {
            let data = (*dl.as_ptr()).dl_tensor.data.cast::<u8>();
            data.write_bytes(byte, n);
        }
    }

    /// The Python package hands pinlane's D2H outputs to torch writable (torch has no
    /// read-only tensors): the export of a view of an output region must carry the right
    /// to write the region's bytes, not a pointer derived from a shared `&[u8]`. Miri
    /// checks that (`cargo +nightly miri test --lib exported_`; `.ci/miri` runs it).
    #[test]
    fn exported_output_regions_may_be_written_through_their_data_pointer() {
        use super::super::{HostPool, HostRegion};
        let pool = std::sync::Arc::new(HostPool::new(1 << 20));
        let mut r = HostRegion::take(&pool, 512);
        r.bytes_mut().fill(1);
        let frozen = r.freeze();
        let mut views = HostBuf::views(&frozen, [(0, 256), (256, 256)].into_iter()).unwrap();
        let (a, b) = (views.next().unwrap(), views.next().unwrap());
        drop(views);
        drop(frozen);
        write_through_export(&b, 256, 7);
        assert_eq!(b.bytes(), &[7u8; 256][..], "the write landed");
        assert_eq!(a.bytes(), &[1u8; 256][..], "the other view is untouched");
        // A run of same-shape outputs goes to torch as one tensor over its first view's
        // pointer, spanning the views after it: that pointer may write them all.
        write_through_export(&a, 512, 9);
        assert_eq!(a.bytes(), &[9u8; 256][..]);
        assert_eq!(b.bytes(), &[9u8; 256][..]);
    }

    /// The same for a copy pinlane made (`Tensor::from_bytes`, which the Python package's
    /// checkpoint loader hands to torch when there is no GPU).
    #[test]
    fn exported_copies_may_be_written_through_their_data_pointer() {
        let b = HostBuf::copy_of(&[1u8; 100]);
        write_through_export(&b, 100, 3);
        assert_eq!(b.bytes(), &[3u8; 100][..]);
    }

    #[test]
    fn dtypes_map_both_ways() {
        for d in DType::ALL {
            assert_eq!(from_dl_dtype(d.to_dlpack()), Ok(d));
        }
        let f32x4 = DLDataType {
            lanes: 4,
            ..DType::F32.to_dlpack()
        };
        assert!(from_dl_dtype(f32x4).is_err());
        let complex = DLDataType {
            code: DLDataTypeCode::COMPLEX,
            bits: 64,
            lanes: 1,
        };
        assert!(from_dl_dtype(complex).is_err());
    }

    #[test]
    fn compact_strides() {
        assert!(is_compact(&[2, 3], &[3, 1]));
        assert!(
            is_compact(&[2, 1, 3], &[3, 99, 1]),
            "size-1 dims take any stride"
        );
        assert!(is_compact(&[0, 3], &[7, 7]), "no elements");
        assert!(is_compact(&[], &[]));
        assert!(!is_compact(&[2, 3], &[1, 2]), "column-major");
        assert!(!is_compact(&[2, 3], &[6, 1]), "padded rows");
    }
}
