//! Options of the two transfer calls, and how a device is chosen.

use crate::driver::{Event, Stream};
use crate::error::{Error, Result};

/// Options of [`transfer_tensor_h2d_with`](crate::transfer_tensor_h2d_with).
///
/// ```
/// let opts = pinlane::H2dOptions::default().num_caches(8);
/// assert_eq!(opts.num_caches, 8);
/// ```
#[derive(Clone, Debug)]
pub struct H2dOptions {
    /// How many of the calling thread's most recent returned batches keep their device
    /// memory referenced by the thread's transfer state (default 4; 0 keeps none).
    pub num_caches: usize,
    /// The stream on which returned device memory is freed when its last owner drops:
    /// the stream its consumer works on. `None`: the device's legacy default stream.
    /// Must be on the transfer's device.
    pub consumer_stream: Option<Stream>,
}

impl Default for H2dOptions {
    fn default() -> Self {
        H2dOptions {
            num_caches: 4,
            consumer_stream: None,
        }
    }
}

impl H2dOptions {
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
/// let opts = pinlane::D2hOptions::default().device("cuda:0");
/// assert_eq!(opts.device.as_deref(), Some("cuda:0"));
/// ```
#[derive(Clone, Debug, Default)]
pub struct D2hOptions {
    /// The CUDA device to copy from: `"cuda:N"`, or `"cuda"` / `None` for
    /// `cuda:{LOCAL_RANK}` (`cuda:0` when `LOCAL_RANK` is unset).
    pub device: Option<String>,
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
/// When the output pool's cap leaves no room for a batch, `Pinned` falls back to
/// `Pageable` for that batch.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostOutput {
    /// Page-locked outputs, views into one block of the output pool per batch.
    #[default]
    Pinned,
    /// Ordinary (pageable) outputs: the spec's "new CPU tensors", holding no pinned memory.
    Pageable,
}

impl D2hOptions {
    /// Sets [`D2hOptions::device`].
    pub fn device(mut self, d: impl Into<String>) -> Self {
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

/// A device request before the device count is known.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum DeviceRequest {
    /// `cuda:{LOCAL_RANK}`.
    LocalRank,
    Index(usize),
}

/// Parses a device string: `"cuda"` or `"cuda:N"`. Anything else (`"cpu"`, `"cuda:x"`,
/// `"gpu"`, `""`) is [`Error::InvalidDevice`].
pub(crate) fn parse_device(s: &str) -> Result<DeviceRequest> {
    let invalid = || Error::InvalidDevice {
        value: s.to_string(),
    };
    match s.strip_prefix("cuda") {
        Some("") => Ok(DeviceRequest::LocalRank),
        Some(rest) => {
            let digits = rest.strip_prefix(':').ok_or_else(invalid)?;
            if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
                return Err(invalid());
            }
            digits
                .parse()
                .map(DeviceRequest::Index)
                .map_err(|_| invalid())
        }
        None => Err(invalid()),
    }
}

/// The device `LOCAL_RANK` names, given `LOCAL_RANK`'s value and the device count.
pub(crate) fn local_rank_device(value: Option<&str>, device_count: usize) -> Result<usize> {
    let Some(v) = value else { return Ok(0) };
    match v.trim().parse::<usize>() {
        Ok(i) if i < device_count => Ok(i),
        _ => Err(Error::InvalidLocalRank {
            value: v.to_string(),
            device_count,
        }),
    }
}

/// Reads `LOCAL_RANK`: unset means 0; a value that is not Unicode is invalid.
pub(crate) fn env_local_rank(device_count: usize) -> Result<usize> {
    match std::env::var("LOCAL_RANK") {
        Ok(v) => local_rank_device(Some(&v), device_count),
        Err(std::env::VarError::NotPresent) => Ok(0),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidLocalRank {
            value: v.to_string_lossy().into_owned(),
            device_count,
        }),
    }
}

/// Resolves a request against the device count.
pub(crate) fn resolve(req: DeviceRequest, device_count: usize) -> Result<usize> {
    match req {
        DeviceRequest::LocalRank => env_local_rank(device_count),
        DeviceRequest::Index(i) if i < device_count => Ok(i),
        DeviceRequest::Index(i) => Err(Error::DeviceUnavailable {
            index: i,
            device_count,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        assert_eq!(parse_device("cuda:0"), Ok(DeviceRequest::Index(0)));
        assert_eq!(parse_device("cuda:17"), Ok(DeviceRequest::Index(17)));
        assert_eq!(parse_device("cuda"), Ok(DeviceRequest::LocalRank));
        for bad in [
            "cpu", "cuda:x", "cuda:", "gpu", "", "cuda:-1", "cuda:+1", "cuda0", "CUDA:0", "cuda:1 ",
        ] {
            assert_eq!(
                parse_device(bad),
                Err(Error::InvalidDevice { value: bad.into() }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn local_rank_values() {
        assert_eq!(local_rank_device(None, 1), Ok(0));
        assert_eq!(local_rank_device(Some("1"), 2), Ok(1));
        for bad in ["abc", "-1", "99", "2", ""] {
            assert_eq!(
                local_rank_device(Some(bad), 2),
                Err(Error::InvalidLocalRank {
                    value: bad.into(),
                    device_count: 2
                }),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn index_beyond_count_is_unavailable() {
        assert_eq!(
            resolve(DeviceRequest::Index(99), 1),
            Err(Error::DeviceUnavailable {
                index: 99,
                device_count: 1
            })
        );
        assert_eq!(resolve(DeviceRequest::Index(0), 1), Ok(0));
    }
}
