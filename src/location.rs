//! The identifier types, at the bottom of the crate: [`Device`] (a CUDA device) and
//! [`Location`] (where a tensor's bytes live). They import nothing of pinlane, so errors
//! and every layer can name them.

use std::fmt;

/// Where a tensor's bytes live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    /// Ordinary (pageable) host memory.
    Host,
    /// Page-locked host memory (copied to and from devices without staging).
    Pinned,
    /// Memory of a CUDA device.
    Cuda(Device),
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Host => f.write_str("host"),
            Location::Pinned => f.write_str("pinned host"),
            Location::Cuda(d) => write!(f, "{d}"),
        }
    }
}

/// A CUDA device: its ordinal, as the driver numbers the devices this process sees.
///
/// `Display` writes `cuda:N`. Making a `Device` does not touch the driver; calls check the
/// ordinal against the device count when they use it
/// ([`Error::DeviceUnavailable`](crate::Error::DeviceUnavailable)).
///
/// ```
/// use pinlane::Device;
/// # fn main() -> pinlane::Result<()> {
/// let d: Device = "cuda:1".parse()?;
/// assert_eq!(d, Device::cuda(1));
/// assert_eq!(d.ordinal(), 1);
/// assert_eq!(d.to_string(), "cuda:1");
/// assert!("cpu".parse::<Device>().is_err()); // a typed error: Error::InvalidDevice
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Device(usize);

impl Device {
    /// The device of ordinal `n`.
    pub const fn cuda(n: usize) -> Device {
        Device(n)
    }

    /// The ordinal (`N` of `cuda:N`).
    pub const fn ordinal(self) -> usize {
        self.0
    }

    // `from_local_rank` and `all` ask the driver: they are in `driver/devices.rs`.
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cuda:{}", self.0)
    }
}
