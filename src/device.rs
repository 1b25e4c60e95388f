//! [`Device`]: a CUDA device, as a type. Parsed once from `"cuda"` / `"cuda:N"` or taken
//! from `LOCAL_RANK`; every call that works with a device takes one.

use crate::error::{Error, Result};
use std::fmt;

/// A CUDA device: its ordinal, as the driver numbers the devices this process sees.
///
/// `Display` writes `cuda:N`. Making a `Device` does not touch the driver; calls check the
/// ordinal against the device count when they use it ([`Error::DeviceUnavailable`]).
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

/// Parses `"cuda:N"`, or `"cuda"` for [`Device::from_local_rank`]. Anything else
/// (`"cpu"`, `"cuda:x"`, `"gpu"`, `""`, `"CUDA:0"`, `"cuda:+1"`) is
/// [`Error::InvalidDevice`].
impl std::str::FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Device> {
        match DeviceSpec::parse(s) {
            DeviceSpec::Ordinal(n) => Ok(Device(n)),
            DeviceSpec::LocalRank => Device::from_local_rank(),
            DeviceSpec::Invalid(value) => Err(Error::InvalidDevice { value }),
        }
    }
}

/// A device as an option names it, before the driver is asked: a [`Device`], a string
/// (`"cuda"`, `"cuda:N"`), or `cuda:{LOCAL_RANK}`. A string that names no CUDA device is
/// kept and reported by the call that uses it, as [`Error::InvalidDevice`] (on every
/// machine, with or without CUDA).
///
/// ```
/// use pinlane::{D2hOptions, Device, H2dOptions};
/// let a = H2dOptions::default().device(Device::cuda(1));
/// let b = D2hOptions::default().device("cuda:1");
/// assert_eq!(Some(a.device), b.device);
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DeviceSpec {
    /// `cuda:{LOCAL_RANK}` (`cuda:0` when unset).
    #[default]
    LocalRank,
    /// One device.
    Ordinal(usize),
    /// A string that names no CUDA device.
    Invalid(String),
}

impl DeviceSpec {
    fn parse(s: &str) -> DeviceSpec {
        match s.strip_prefix("cuda") {
            Some("") => DeviceSpec::LocalRank,
            Some(rest) => match rest.strip_prefix(':') {
                Some(d) if !d.is_empty() && d.bytes().all(|b| b.is_ascii_digit()) => d
                    .parse()
                    .map_or_else(|_| DeviceSpec::Invalid(s.into()), DeviceSpec::Ordinal),
                _ => DeviceSpec::Invalid(s.into()),
            },
            None => DeviceSpec::Invalid(s.into()),
        }
    }

    /// Checks the spec without the driver: only a string that names no device fails.
    pub(crate) fn check(&self) -> Result<()> {
        match self {
            DeviceSpec::Invalid(value) => Err(Error::InvalidDevice {
                value: value.clone(),
            }),
            _ => Ok(()),
        }
    }

    /// The device this names, given the device count.
    pub(crate) fn resolve(&self, device_count: usize) -> Result<Device> {
        match self {
            DeviceSpec::LocalRank => env_local_rank(device_count).map(Device),
            DeviceSpec::Ordinal(i) if *i < device_count => Ok(Device(*i)),
            DeviceSpec::Ordinal(i) => Err(Error::DeviceUnavailable {
                index: *i,
                device_count,
            }),
            DeviceSpec::Invalid(value) => Err(Error::InvalidDevice {
                value: value.clone(),
            }),
        }
    }
}

impl From<Device> for DeviceSpec {
    fn from(d: Device) -> DeviceSpec {
        DeviceSpec::Ordinal(d.0)
    }
}

impl From<&str> for DeviceSpec {
    fn from(s: &str) -> DeviceSpec {
        DeviceSpec::parse(s)
    }
}

impl From<String> for DeviceSpec {
    fn from(s: String) -> DeviceSpec {
        DeviceSpec::parse(&s)
    }
}

/// The device `LOCAL_RANK`'s value names, given the device count: unset means 0.
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

/// Reads `LOCAL_RANK` (the one environment variable the spec defines): unset means 0; a
/// value that is not Unicode is invalid.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_strings() {
        assert_eq!(DeviceSpec::from("cuda:0"), DeviceSpec::Ordinal(0));
        assert_eq!(DeviceSpec::from("cuda:17"), DeviceSpec::Ordinal(17));
        assert_eq!(DeviceSpec::from("cuda"), DeviceSpec::LocalRank);
        assert_eq!("cuda:3".parse::<Device>(), Ok(Device::cuda(3)));
        for bad in [
            "cpu",
            "cuda:x",
            "cuda:",
            "gpu",
            "",
            "cuda:-1",
            "cuda:+1",
            "cuda0",
            "CUDA:0",
            "cuda:1 ",
            "cuda:99999999999999999999999",
        ] {
            let spec = DeviceSpec::from(bad);
            assert_eq!(spec, DeviceSpec::Invalid(bad.into()), "{bad:?}");
            let invalid = Error::InvalidDevice { value: bad.into() };
            assert_eq!(spec.check(), Err(invalid.clone()));
            assert_eq!(spec.resolve(4), Err(invalid.clone()));
            assert_eq!(bad.parse::<Device>(), Err(invalid));
        }
    }

    #[test]
    fn display_round_trips() {
        for n in [0, 1, 7, 4096] {
            let d = Device::cuda(n);
            assert_eq!(d.to_string().parse::<Device>(), Ok(d));
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
    fn ordinals_beyond_the_count_are_unavailable() {
        assert_eq!(
            DeviceSpec::Ordinal(99).resolve(1),
            Err(Error::DeviceUnavailable {
                index: 99,
                device_count: 1
            })
        );
        assert_eq!(DeviceSpec::Ordinal(1).resolve(2), Ok(Device::cuda(1)));
    }
}
