//! Options of the two transfer calls.

use crate::device::DeviceSpec;
use crate::driver::{Event, Stream};

/// Options of [`transfer_tensor_h2d_with`](crate::transfer_tensor_h2d_with).
///
/// ```
/// use pinlane::{Device, DeviceSpec, H2dOptions};
/// let opts = H2dOptions::default().num_caches(8).device(Device::cuda(1));
/// assert_eq!(opts.num_caches, 8);
/// assert_eq!(opts.device, DeviceSpec::Ordinal(1));
/// ```
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct H2dOptions {
    /// The device to copy to (default `cuda:{LOCAL_RANK}`, as the spec says). One process
    /// can drive every device of the machine: a thread per device, or a device per call.
    pub device: DeviceSpec,
    /// How many of the calling thread's most recent returned batches keep their device
    /// memory referenced by the thread's transfer state (default 4; 0 keeps none; at most
    /// [`MAX_NUM_CACHES`]).
    pub num_caches: usize,
    /// The stream on which returned device memory is freed when its last owner drops:
    /// the stream its consumer works on. `None`: the device's legacy default stream.
    /// Must be on the transfer's device.
    pub consumer_stream: Option<Stream>,
}

impl Default for H2dOptions {
    fn default() -> Self {
        H2dOptions {
            device: DeviceSpec::LocalRank,
            num_caches: 4,
            consumer_stream: None,
        }
    }
}

/// Most batches a thread's cache ring may keep ([`H2dOptions::num_caches`]): the ring's
/// storage is allocated up front, so a larger value is refused rather than allocated.
pub const MAX_NUM_CACHES: usize = 1 << 16;

impl H2dOptions {
    /// Checks the values that need no driver.
    ///
    /// # Errors
    /// [`Error::InvalidOption`](crate::error::Error::InvalidOption) for `num_caches` above
    /// [`MAX_NUM_CACHES`].
    pub(crate) fn check(&self) -> crate::error::Result<()> {
        if self.num_caches > MAX_NUM_CACHES {
            return Err(crate::error::Error::InvalidOption {
                name: "num_caches",
                reason: format!("{} is above the most, {MAX_NUM_CACHES}", self.num_caches),
            });
        }
        Ok(())
    }

    /// Sets [`H2dOptions::device`]: a [`Device`](crate::device::Device), or `"cuda"` / `"cuda:N"`.
    pub fn device(mut self, d: impl Into<DeviceSpec>) -> Self {
        self.device = d.into();
        self
    }

    /// Sets [`H2dOptions::num_caches`].
    pub fn num_caches(mut self, n: usize) -> Self {
        self.num_caches = n;
        self
    }

    /// Sets [`H2dOptions::consumer_stream`].
    pub fn consumer_stream(mut self, s: Stream) -> Self {
        self.consumer_stream = Some(s);
        self
    }
}

/// Options of [`transfer_tensor_d2h`](crate::transfer_tensor_d2h).
///
/// ```
/// use pinlane::{D2hOptions, Device, DeviceSpec};
/// let opts = D2hOptions::default().device("cuda:0");
/// assert_eq!(opts.device, Some(DeviceSpec::Ordinal(0)));
/// assert_eq!(D2hOptions::default().device(Device::cuda(0)).device, opts.device);
/// ```
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct D2hOptions {
    /// The CUDA device to copy from: a [`Device`](crate::device::Device), `"cuda:N"`, or
    /// `"cuda"` / `None` for `cuda:{LOCAL_RANK}` (`cuda:0` when `LOCAL_RANK` is unset).
    pub device: Option<DeviceSpec>,
    /// A stream to copy on, used as given and not cached. Requires `device`, and must be
    /// on that device.
    pub stream: Option<Stream>,
    /// An event the copy must wait for besides the current stream (for tensors produced
    /// on another stream). Must be on the device.
    pub producer_event: Option<Event>,
    /// What memory the returned host tensors live in (default: page-locked).
    pub output: HostOutput,
}

/// The memory D2H outputs live in, and what each costs.
///
/// | mode | speed | pinned memory held |
/// | --- | --- | --- |
/// | `Pinned` (default) | the link's rate: one DMA per tensor straight into the output | the batch's size, from [`PinnedOutputPool`](crate::memory::PinnedOutputPool), for as long as the caller keeps any tensor of the batch |
/// | `Pageable` | bounded by host copies out of the staging slots (parallel) | only the staging arena's, during the call |
///
/// When the output pool's cap leaves no room for a batch, or the host cannot page-lock
/// its new block (`cuMemHostAlloc` out of memory), `Pinned` falls back to `Pageable` for
/// that batch ([`MemoryStats::pageable_fallbacks`](crate::MemoryStats::pageable_fallbacks)
/// counts it).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum HostOutput {
    /// Page-locked outputs, views into one block of the output pool per batch.
    #[default]
    Pinned,
    /// Ordinary (pageable) outputs: the spec's "new CPU tensors", holding no pinned memory.
    Pageable,
}

impl D2hOptions {
    /// Sets [`D2hOptions::device`]: a [`Device`](crate::device::Device), or `"cuda"` / `"cuda:N"`.
    pub fn device(mut self, d: impl Into<DeviceSpec>) -> Self {
        self.device = Some(d.into());
        self
    }

    /// Sets [`D2hOptions::stream`].
    pub fn stream(mut self, s: Stream) -> Self {
        self.stream = Some(s);
        self
    }

    /// Sets [`D2hOptions::producer_event`].
    pub fn producer_event(mut self, e: Event) -> Self {
        self.producer_event = Some(e);
        self
    }

    /// Sets [`D2hOptions::output`].
    pub fn output(mut self, o: HostOutput) -> Self {
        self.output = o;
        self
    }
}
