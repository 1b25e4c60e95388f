//! Devices as calls name them: [`Device`] parsed from `"cuda"` / `"cuda:N"` or taken from
//! `LOCAL_RANK`, and [`DeviceSpec`], a device before the driver is asked. (The `Device`
//! type itself is an identifier, in `location.rs`, at the bottom of the crate.)

use crate::error::{Error, Result};
pub use crate::location::Device;

/// Parses `"cuda:N"`, or `"cuda"` for [`Device::from_local_rank`]. Anything else
/// (`"cpu"`, `"cuda:x"`, `"gpu"`, `""`, `"CUDA:0"`, `"cuda:+1"`) is
/// [`Error::InvalidDevice`].
impl std::str::FromStr for Device {
    type Err = Error;

    fn from_str(s: &str) -> Result<Device> {
        match DeviceSpec::parse(s) {
            DeviceSpec::Ordinal(n) => Ok(Device::cuda(n)),
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
            DeviceSpec::LocalRank => env_local_rank(device_count).map(Device::cuda),
            DeviceSpec::Ordinal(i) if *i < device_count => Ok(Device::cuda(*i)),
            DeviceSpec::Ordinal(i) => Err(Error::DeviceUnavailable {
                device: Device::cuda(*i),
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
        DeviceSpec::Ordinal(d.ordinal())
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

thread_local! {
    /// `LOCAL_RANK` as this thread first read it (`None`: unset; `Err`: not Unicode): the
    /// environment is read once per thread, by its first call that resolves the default
    /// device, not on every call.
    static LOCAL_RANK: std::cell::OnceCell<RawRank> = const { std::cell::OnceCell::new() };
}

type RawRank = Option<std::result::Result<String, String>>;

fn read_local_rank() -> RawRank {
    match std::env::var("LOCAL_RANK") {
        Ok(v) => Some(Ok(v)),
        Err(std::env::VarError::NotPresent) => None,
        Err(std::env::VarError::NotUnicode(v)) => Some(Err(v.to_string_lossy().into_owned())),
    }
}

/// The device `LOCAL_RANK` (the one environment variable the spec defines) names, as this
/// thread read it first: unset means 0; a value that is not Unicode is invalid.
pub(crate) fn env_local_rank(device_count: usize) -> Result<usize> {
    let resolve = |raw: &RawRank| match raw {
        None => Ok(0),
        Some(Ok(v)) => local_rank_device(Some(v), device_count),
        Some(Err(v)) => Err(Error::InvalidLocalRank {
            value: v.clone(),
            device_count,
        }),
    };
    // While the thread is being torn down its cache is gone: read the environment.
    LOCAL_RANK
        .try_with(|c| resolve(c.get_or_init(read_local_rank)))
        .unwrap_or_else(|_| resolve(&read_local_rank()))
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
                device: Device::cuda(99),
                device_count: 1
            })
        );
        assert_eq!(DeviceSpec::Ordinal(1).resolve(2), Ok(Device::cuda(1)));
    }
}
