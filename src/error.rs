//! The one error type of pinlane.
//!
//! Every failure, bad input and driver failure alike, is a variant here with the values
//! that explain it. Nothing in pinlane panics on bad input, and nothing panics in `Drop`:
//! a driver error raised while freeing is recorded (see [`crate::driver::deferred`]) and
//! returned by the next transfer call as [`Error::Deferred`].

use crate::driver::error::DriverError;
use crate::dtype::DType;
use crate::location::{Device, Location};

/// Result alias used throughout pinlane.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in pinlane.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A constructor was given a number of elements that does not match the shape.
    #[error("shape {shape:?} holds {expected} elements, but {got} were given")]
    ShapeMismatch {
        /// The shape, as given.
        shape: Vec<usize>,
        /// Elements the shape holds.
        expected: usize,
        /// Elements given.
        got: usize,
    },

    /// A shape whose element count or byte size overflows `usize`.
    #[error("shape {shape:?} is too large: its size overflows")]
    ShapeOverflow {
        /// The shape, as given.
        shape: Vec<usize>,
    },

    /// A typed view or copy asked for another element type than the tensor holds.
    #[error("{op}: tensor holds {got}, but {expected} was asked for")]
    DTypeMismatch {
        /// The operation that asked.
        op: &'static str,
        /// The dtype asked for.
        expected: DType,
        /// The dtype the tensor holds.
        got: DType,
    },

    /// Raw bytes that are not valid values of the dtype (a bool byte other than 0 or 1),
    /// or whose length is not a whole number of elements.
    #[error("invalid {dtype} bytes: {reason}")]
    InvalidBytes {
        /// The dtype the bytes were meant to hold.
        dtype: DType,
        /// What is wrong with them.
        reason: String,
    },

    /// An event that belongs to another device than the transfer's.
    #[error("the producer event is on {event_device}, but the transfer is on {device}")]
    EventDeviceMismatch {
        /// The event's device.
        event_device: Device,
        /// The transfer's device.
        device: Device,
    },

    /// The calling thread's transfer state is gone (the thread is exiting).
    #[error("the calling thread's transfer state is no longer available (thread exiting)")]
    ThreadExiting,

    /// A host-only operation was asked of a tensor that lives elsewhere.
    #[error("{op}: tensor is on {location}, but this needs host memory")]
    NotOnHost {
        /// The operation that asked.
        op: &'static str,
        /// Where the tensor's bytes are.
        location: Location,
    },

    /// A device-only operation was asked of a tensor that lives elsewhere.
    #[error("{op}: tensor is on {location}, but this needs a CUDA device tensor")]
    NotOnDevice {
        /// The operation that asked.
        op: &'static str,
        /// Where the tensor's bytes are.
        location: Location,
    },

    /// A tensor's bytes were asked for (read, exported, lent, or taken by a call as a
    /// source or destination) while the copies that write them may still be running: a
    /// page-locked tensor a D2H call handed to [`Batch::rebuild`](crate::Batch::rebuild),
    /// asked inside the rebuild or kept from it and asked before the call returned (or
    /// before its handle's wait); a device tensor an H2D call handed to its rebuild or to
    /// the `while_copying` of
    /// [`transfer_tensor_h2d_overlapping`](crate::transfer_tensor_h2d_overlapping), used
    /// before the call returned (a non-blocking call's: before it returned its handle; after
    /// that, only `to_dlpack`, which has no stream to order after the copies, until they
    /// are done). Also for ever after, if those copies failed or were not all queued (the
    /// bytes may be partly written). Nothing was read or queued.
    #[error(
        "{op}: the tensor's bytes are still being written by the transfer call that made \
         it (use them once that call has returned; a non-blocking call's: once its wait has, \
         or on a stream, as to_dlpack_on does), or that call failed"
    )]
    BytesInFlight {
        /// The operation that asked.
        op: &'static str,
    },

    /// `LOCAL_RANK` is set but is not a device index this machine has.
    #[error("LOCAL_RANK={value:?} is not a device index below the device count {device_count}")]
    InvalidLocalRank {
        /// `LOCAL_RANK`'s value.
        value: String,
        /// Devices this machine has.
        device_count: usize,
    },

    /// A device string that does not name a CUDA device (`"cpu"`, `"cuda:x"`, `""`).
    #[error("{value:?} is not a CUDA device (expected \"cuda\" or \"cuda:N\")")]
    InvalidDevice {
        /// The string given.
        value: String,
    },

    /// A CUDA device index this machine does not have.
    #[error("{device} is unavailable: this machine has {device_count} CUDA device(s)")]
    DeviceUnavailable {
        /// The device asked for.
        device: Device,
        /// Devices this machine has.
        device_count: usize,
    },

    /// A custom stream was given without naming the device it belongs to.
    #[error("a custom stream requires the device to be given too")]
    StreamWithoutDevice,

    /// A custom stream that belongs to another device than the one requested.
    #[error("the stream is on {stream_device}, but {device} was requested")]
    StreamDeviceMismatch {
        /// The stream's device.
        stream_device: Device,
        /// The device requested.
        device: Device,
    },

    /// A raw stream handed to pinlane that belongs to another context than the primary
    /// context of the device it was given with.
    #[error("the raw stream does not belong to {device}'s primary context")]
    ForeignStream {
        /// The device the stream was given with.
        device: Device,
    },

    /// An event used on a stream of another device (events and streams must share a
    /// device).
    #[error("{op}: the event is on {event_device}, the stream on {stream_device}")]
    EventStreamMismatch {
        /// The operation that found it.
        op: &'static str,
        /// The event's device.
        event_device: Device,
        /// The stream's device.
        stream_device: Device,
    },

    /// [`Event::record`](crate::Event::record) of a transfer's own event
    /// ([`Transfer::ready_event`](crate::Transfer::ready_event), or a clone of it): it marks
    /// the end of that transfer's copies, which pinlane waits for before it lets go of
    /// their buffers and orders the transfer's outputs after, so only pinlane records it.
    /// Wait on it (`Event::wait_on`), or record an event of your own.
    #[error("{op}: the event marks a transfer's copies (Transfer::ready_event) and only pinlane records it; record an event of your own")]
    SealedEvent {
        /// The operation refused.
        op: &'static str,
    },

    /// Memory handed to pinlane by another owner (a host owner, a device pointer, a
    /// DLPack tensor) that pinlane cannot use as a tensor, and why.
    #[error("external memory: {reason}")]
    External {
        /// Why the memory cannot be used.
        reason: String,
    },

    /// A DLPack tensor pinlane cannot import, or a tensor it cannot export, and why.
    #[error("DLPack: {reason}")]
    DLPack {
        /// Why the tensor cannot be imported or exported.
        reason: String,
    },

    /// An operation needs the CUDA driver, and none is usable on this machine.
    #[error("{op}: no usable CUDA driver or device ({reason})")]
    NoCuda {
        /// The operation that needed the driver.
        op: &'static str,
        /// Why no driver or device is usable.
        reason: String,
    },

    /// A call that would use CUDA in a child process forked after pinlane set CUDA up in
    /// its parent. The driver's state and pinlane's threads do not survive `fork`, so the
    /// child cannot use them (as torch says "Cannot re-initialize CUDA in forked
    /// subprocess"): start worker processes with the `spawn` method, or set CUDA up only
    /// after the fork. Refused before any driver call or lock (the copies into existing
    /// tensors once their pairs are matched, which takes no lock).
    #[error(
        "{op}: this process was forked after CUDA was set up in its parent, whose CUDA state a \
         forked child cannot use (start workers with the 'spawn' method, or use CUDA only \
         after the fork)"
    )]
    ForkedChild {
        /// The call that was refused.
        op: &'static str,
    },

    /// A thread pinlane runs work on could not start (a [`Prefetcher`](crate::engine::Prefetcher)'s
    /// worker, the non-blocking calls' completion thread), or a prefetcher's source
    /// iterator panicked.
    #[error("worker thread: {reason}")]
    Worker {
        /// What happened to the thread.
        reason: String,
    },

    /// [`Transfer::wait`](crate::Transfer::wait) or `wait_timeout` was called, for a call
    /// whose copies are not known done, on pinlane's completion thread (from a waker, or a
    /// `Drop` or DLPack deleter that thread runs as it releases a finished call). That
    /// thread is the one that ends such waits, so the wait would never end (or always
    /// time out). Refused at once; the handle's call still completes: `wait` drops the
    /// handle (what its copies use is released once they are done), `wait_timeout` keeps
    /// it. Poll the handle as a `Future` there instead, or wait on another thread.
    #[error(
        "{op} on pinlane's completion thread (from a waker or a drop it runs), the thread \
         that ends the wait: refused instead of waiting for ever"
    )]
    WaitOnCompletionThread {
        /// The wait.
        op: &'static str,
    },

    /// A [`Batch`](crate::batch::Batch) implementation whose `rebuild` does not hand over the
    /// tensors its `visit` gave, one by one and in the same order (a hand-written
    /// implementation that skips, adds or reorders a tensor). No batch is returned: its
    /// tensors would be in the wrong places.
    #[error(
        "Batch contract broken: visit gave {visited} tensors, rebuild handed over \
         {rebuilt}{}",
        first_mismatch.map(|k| format!("; tensor {k} of the rebuild is not tensor {k} of the visit")).unwrap_or_default()
    )]
    BatchMismatch {
        /// Tensors `visit` gave.
        visited: usize,
        /// Tensors `rebuild` handed to its function.
        rebuilt: usize,
        /// The first position where the two disagree.
        first_mismatch: Option<usize>,
    },

    /// User code that pinlane ran on one of its own threads (an owner's `Drop` or a
    /// DLPack deleter run when a non-blocking call's copies completed, a waker) panicked.
    /// The thread caught the panic and went on; the error is kept for the next call on
    /// the device (see [`crate::driver::deferred`]). On the prefetcher's worker (a
    /// batch's `Batch` code or drop), it is that batch's item instead. Also an owner's
    /// drop that pinlane ran for another call while it released what failed calls had
    /// retained ([`crate::memory::retained`]), on whichever thread released it: the
    /// call that released it goes on.
    #[error("user code panicked on {} ({what}): {message}", shown_thread(thread))]
    Panicked {
        /// The thread: `"completion"`, `"prefetch"`, `"free"` (pinlane's free thread,
        /// which also ends registrations), `"caller"` (the calling thread: then the error
        /// is kept for that thread's next call on the device).
        thread: &'static str,
        /// What pinlane was running: `"releasing a completed transfer's owners"`.
        what: &'static str,
        /// The panic's message.
        message: String,
    },

    /// The page-locked pool ([`Config::pinned_output_bytes`](crate::config::Config::pinned_output_bytes))
    /// has no room for a [`PinnedBufferMut`](crate::memory::PinnedBufferMut) of this size.
    #[error("the page-locked pool has no room for {requested} bytes (cap {cap} bytes)")]
    PinnedPoolFull {
        /// Bytes asked for.
        requested: usize,
        /// The pool's cap, in bytes.
        cap: usize,
    },

    /// An option outside its allowed range.
    #[error("invalid option {name}: {reason}")]
    InvalidOption {
        /// The option.
        name: &'static str,
        /// What its value must be.
        reason: String,
    },

    /// A configuration value that does not parse or is out of range
    /// ([`Config::from_env`](crate::config::Config::from_env)).
    #[error("{variable}={value:?} is not valid: {reason}")]
    InvalidConfig {
        /// The `PINLANE_*` variable.
        variable: String,
        /// Its value.
        value: String,
        /// What is wrong with it.
        reason: String,
    },

    /// [`Config::install`](crate::config::Config::install) after the runtime started with another
    /// configuration.
    #[error("the pinlane runtime is already running with another configuration: {reason}")]
    AlreadyRunning {
        /// The running runtime's configuration.
        reason: String,
    },

    /// Every staging slot stayed leased for [`Config::slot_wait`](crate::config::Config::slot_wait)
    /// (slots held by retained owners whose copies could not be proven complete, or a
    /// hung device); nothing was queued and the input is unchanged.
    #[error(
        "no staging slot became free in {waited_ms} ms ({retained_bytes} bytes retained \
         after failed synchronisations)"
    )]
    StagingExhausted {
        /// Milliseconds the call waited.
        waited_ms: u64,
        /// Bytes held by retained owners at that point.
        retained_bytes: usize,
    },

    /// An internal call made with one device's context current for another device's
    /// memory or stream.
    #[error("{op}: {current}'s context is current, but the call is for {device}")]
    ContextMismatch {
        /// The call.
        op: &'static str,
        /// The device whose context is current.
        current: Device,
        /// The device the call is for.
        device: Device,
    },

    /// A call was given a stream, or ran with a current stream, on which a CUDA graph
    /// capture is running (or was, and failed). pinlane's calls cannot be captured: their
    /// copies would be recorded into the graph instead of run, read their sources when the
    /// graph is replayed rather than when the call is made, and pinlane's own bookkeeping
    /// would wait on events that a capture never records. Found before anything is queued:
    /// nothing was copied or written. Make the call before the capture begins or after it
    /// ends (a graph's static inputs are filled outside it, before each replay).
    #[error(
        "{call}: a CUDA graph capture is running on the stream of {device}; pinlane's calls \
         cannot be captured: call it outside the capture"
    )]
    StreamCapturing {
        /// The call.
        call: &'static str,
        /// The stream's device.
        device: Device,
    },

    /// A copy path that cannot run on the legacy default stream was given it.
    #[error("{op}: the legacy default stream cannot be used here")]
    LegacyStream {
        /// The copy path.
        op: &'static str,
    },

    /// Two parallel arrays that must have one entry per copy have different lengths (an
    /// internal inconsistency, reported instead of queueing nothing).
    #[error("{op}: {what} have different lengths")]
    LengthMismatch {
        /// The call.
        op: &'static str,
        /// The arrays that differ.
        what: &'static str,
    },

    /// An invariant of pinlane itself does not hold (a copy range outside its buffer, a
    /// gather that does not fit the slot it was planned for): a bug in pinlane, reported
    /// instead of queueing a copy that could touch memory it should not. Please report it
    /// with the message.
    #[error("internal error in {op}: {reason} (a pinlane bug)")]
    Internal {
        /// Where it was found.
        op: &'static str,
        /// What did not hold.
        reason: String,
    },

    /// A CUDA driver call failed.
    #[error("{op} failed: {}", .error)]
    Driver {
        /// The driver call, e.g. `cuMemcpyHtoDAsync`.
        op: &'static str,
        /// The `CUresult`, with helpers such as
        /// [`DriverError::is_out_of_memory`](crate::driver::DriverError::is_out_of_memory).
        error: DriverError,
    },

    /// An error raised earlier inside a `Drop` (where it could not be returned),
    /// surfaced on the next call.
    #[error("an earlier release failed: {0}")]
    Deferred(Box<Error>),

    /// A blocking call's copies did not finish within
    /// [`Config::sync_wait`](crate::config::Config::sync_wait): what they use is held in
    /// the retained registry until they do (never freed early); the call's input is
    /// unchanged. The Python package also returns it, with nothing queued, where it
    /// waits with the same bound before torch's own synchronous copies: for D2H's
    /// `producer_event` before torch-side work, for torch's current stream before the
    /// copies of a D2H call that leaves every tensor to torch, and before an H2D call's
    /// moves by torch.
    #[error(
        "the device did not finish the work the call waits for within {waited_ms} ms (sync_wait)"
    )]
    SyncTimeout {
        /// Milliseconds the call waited.
        waited_ms: u64,
    },

    /// [`Runtime::shutdown`](crate::runtime::Runtime::shutdown) (or [`settle`](crate::settle))
    /// reached its deadline with work still running; what that work uses stays held (and
    /// counted) until it finishes.
    #[error("shutdown incomplete after {waited_ms} ms: {reason}")]
    ShutdownIncomplete {
        /// Milliseconds shutdown waited.
        waited_ms: u64,
        /// What was still running.
        reason: String,
    },
    /// A copy into existing tensors (`transfer_tensor_h2d_into`, `transfer_tensor_d2h_into`)
    /// was given a source and a destination that do not pair up: different numbers of
    /// tensors, a source or destination in the wrong place, or a pair whose dtypes or byte
    /// sizes differ. Found before anything is queued: no destination was written.
    #[error("copy into: {at}: {reason}")]
    IntoMismatch {
        /// Where: the pair's path in the destination batch (as [`crate::batch::Path`]
        /// writes it; for a tensor the source has where the destination has none, the
        /// source's path), or `batch` for the whole batch.
        at: String,
        /// What does not match.
        reason: String,
    },

    /// A copy into existing tensors was given two destinations whose bytes overlap (both
    /// would be written, in no defined order). Found before anything is queued.
    #[error("copy into: the destinations at {first} and {second} overlap")]
    OverlappingDestinations {
        /// The path of one destination.
        first: String,
        /// The path of the other.
        second: String,
    },

    /// A checkpoint ([`crate::weights`]) cannot be loaded: a file is missing, unreadable,
    /// truncated or malformed, or names a tensor pinlane cannot hold. Found before any of
    /// the checkpoint's tensors is copied (every header of every shard is checked first).
    #[error("checkpoint {path}: {}{reason}", tensor.as_ref().map(|t| format!("tensor {t:?}: ")).unwrap_or_default())]
    Checkpoint {
        /// The file at fault (a shard, or the index of a sharded checkpoint).
        path: String,
        /// The tensor at fault, when one is.
        tensor: Option<String>,
        /// What kind of fault, for code that handles some kinds itself.
        fault: CheckpointFault,
        /// What is wrong, in words.
        reason: String,
    },
}

/// What is wrong with a checkpoint ([`Error::Checkpoint`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointFault {
    /// The file cannot be opened or mapped (missing, unreadable).
    Io,
    /// The header: shorter than 8 bytes, a length past the end of the file, not UTF-8,
    /// or not the JSON safetensors writes (an unknown dtype is this too).
    Header,
    /// Data offsets out of range, overlapping, out of order, or not covering the file.
    Offsets,
    /// A shape that does not match its byte range (or overflows).
    Shape,
    /// Bytes that are not values of the tensor's dtype (a bool byte other than 0 or 1).
    Values,
    /// A dtype pinlane has no type for (float8, float4, complex): the tensor is named.
    UnsupportedDtype,
    /// The index of a sharded checkpoint: malformed, or naming a shard that is missing.
    Index,
    /// A tensor asked for (or listed in the index) that the checkpoint does not hold, or
    /// a name held by two shards.
    Tensor,
}

impl Error {
    /// Whether this is (or wraps) a driver out-of-memory error.
    ///
    /// ```
    /// assert!(!pinlane::Error::StreamWithoutDevice.is_out_of_memory());
    /// ```
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            Error::Driver { error, .. } => error.is_out_of_memory(),
            Error::Deferred(e) => e.is_out_of_memory(),
            _ => false,
        }
    }

    /// The driver error, if this is one.
    pub fn driver_error(&self) -> Option<DriverError> {
        match self {
            Error::Driver { error, .. } => Some(*error),
            _ => None,
        }
    }
}

/// How [`Error::Panicked`] names its thread.
fn shown_thread(thread: &str) -> String {
    match thread {
        "caller" => "the calling thread".into(),
        t => format!("pinlane's {t} thread"),
    }
}

/// A caught panic's message (`panic!` with a literal or a formatted string), for errors
/// that report user code that panicked on pinlane's threads. Takes the payload and drops
/// it: a payload is user code too (`panic_any` of a value whose drop panics,
/// rust-lang/rust#86027), so a panic in its drop is caught and that second payload
/// forgotten, not let unwind out of the catch that caught the first (session 86).
pub(crate) fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into());
    if let Err(again) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| drop(payload))) {
        std::mem::forget(again);
    }
    message
}
