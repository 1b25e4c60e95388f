//! # pinlane
//!
//! Moves nested batches of tensors between host memory and NVIDIA GPUs through the CUDA
//! driver API, loaded at run time: no CUDA toolkit to build, no libtorch, and a binary
//! that starts (and passes batches through unchanged) on a machine without a GPU.
//!
//! ```
//! use pinlane::{transfer_tensor_d2h, transfer_tensor_h2d, D2hOptions, Tensor};
//! use std::collections::BTreeMap;
//!
//! # fn main() -> pinlane::Result<()> {
//! let mut batch = BTreeMap::new();
//! batch.insert("pixels", Tensor::from_vec(vec![7u8; 3 * 4 * 4], [3, 4, 4])?);
//! batch.insert("scores", Tensor::from_vec(vec![0.5f32; 8], [8])?);
//!
//! let on_gpu = transfer_tensor_h2d(&batch)?; // cuda:{LOCAL_RANK}, or as is without CUDA
//! let back = transfer_tensor_d2h(&on_gpu, &D2hOptions::default())?;
//! assert_eq!(back, batch); // same keys, dtypes, shapes and bytes
//! # Ok(()) }
//! ```
//!
//! ## Layers
//!
//! | layer | module | holds |
//! | --- | --- | --- |
//! | driver | [`driver`] | the only CUDA calls: [`available`](driver::available), [`Stream`], [`Event`], checked memory and copy calls |
//! | memory | [`memory`] | raw buffers and their owners: pinned arena, device allocations, in-flight tracking, the retained registry |
//! | tensor | [`Tensor`], [`DType`], [`Shape`] | a cheap handle to immutable, contiguous bytes somewhere |
//! | traversal | [`batch`] | the [`Batch`] trait, `#[derive(Batch)]`, the dynamic [`Value`] |
//! | engine | [`transfer_tensor_h2d`], [`transfer_tensor_d2h`] | planning, per-thread streams, the cache ring; [`observe`]: what a call did |
//! | weights | [`weights`] | safetensors checkpoints onto a device, through the engine |
//!
//! The rules (stream ordering, buffer lifetimes, failure handling) are in
//! `docs/semantics.md`; the design in `docs/architecture.md`.

/// The DLPack crate pinlane's [`Tensor::to_dlpack`] and [`Tensor::from_dlpack`] speak,
/// re-exported so that users name the same version.
pub use dlpark;

// The derive emits `::pinlane::...` paths; this makes them resolve inside the crate too.
extern crate self as pinlane;

pub mod batch;
mod config;
mod device;
pub mod driver;
mod dtype;
mod engine;
mod error;
mod layout;
mod location;
pub mod memory;
mod runtime;
mod tensor;
pub mod verify;
#[cfg(feature = "weights")]
pub mod weights;

pub use batch::{Batch, Leaf, Value};
pub use config::{Config, CopyStores, SmallD2h, SmallH2d};
pub use device::{Device, DeviceSpec};
pub use driver::{Event, RawEvent, RawStream, Stream};
pub use dtype::{DType, Element};
pub use engine::{
    cached_batches, current_stream, set_current_stream, settle, shutdown, transfer_tensor_d2h,
    transfer_tensor_d2h_async, transfer_tensor_d2h_into, transfer_tensor_d2h_overlapping,
    transfer_tensor_d2h_overlapping_around, transfer_tensor_h2d, transfer_tensor_h2d_async,
    transfer_tensor_h2d_into, transfer_tensor_h2d_overlapping, transfer_tensor_h2d_with,
    CurrentStreamGuard, D2hOptions, H2dOptions, H2dPairs, HostOutput, IntoOptions, Prefetcher,
    Transfer, MAX_NUM_CACHES,
};
pub use error::{CheckpointFault, Error, Result};
pub use layout::Shape;
pub use location::Location;
pub use memory::DevicePtrGuard;
pub use runtime::{
    memory_stats, runtime, sync_wait, trim, wait_for_event, warm_up, DevicePoolStats, MemoryStats,
    PoolStats, Runtime,
};
pub use tensor::Tensor;

/// What a call did, for debugging and tuning: the calling thread's last transfer's
/// [`TransferStats`](observe::TransferStats) (tensors, bytes by route, copies, windows),
/// the timed phases of its next call ([`trace_next_call`](observe::trace_next_call),
/// [`last_trace`](observe::last_trace)), and whether small D2H calls end on an end flag
/// ([`end_flags_available`](observe::end_flags_available)). Spans and NVTX ranges are
/// features `tracing` and `nvtx`.
///
/// ```
/// use pinlane::observe::last_transfer_stats;
/// let b = vec![pinlane::Tensor::from_vec(vec![1.0f32; 8], [8])?];
/// let _ = pinlane::transfer_tensor_h2d(&b)?;
/// if let Some(s) = last_transfer_stats() {
///     assert_eq!((s.tensors, s.bytes), (1, 32));
/// }
/// # Ok::<(), pinlane::Error>(())
/// ```
pub mod observe {
    pub use crate::engine::{
        end_flags_available, last_trace, last_transfer_stats, trace_next_call, TransferStats,
    };
}

/// `#[derive(Batch)]`: see [`Batch`]. Fields are visited in declaration order;
/// `#[batch(skip)]` passes a field through unchanged (cloned). Any other `#[batch(..)]`
/// is a compile error, as is one on the type itself or an empty `#[batch()]`:
///
/// ```compile_fail
/// #[derive(pinlane::Batch)]
/// #[batch(skip)] // on the type: it would skip nothing
/// struct S {
///     x: pinlane::Tensor,
/// }
/// ```
///
/// ```compile_fail
/// #[derive(pinlane::Batch)]
/// struct S {
///     #[batch()] // says nothing: `#[batch(skip)]` was likely meant
///     label: String,
///     x: pinlane::Tensor,
/// }
/// ```
///
/// ```
/// #[derive(pinlane::Batch, Clone)]
/// struct S {
///     #[batch(skip)]
///     label: String,
///     x: pinlane::Tensor,
/// }
/// ```
#[cfg(feature = "derive")]
pub use pinlane_derive::Batch;

// The simulator and the test hooks (stream delays) its tests use.
#[cfg(all(test, feature = "test-util"))]
mod sim_tests;
