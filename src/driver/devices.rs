//! The devices the driver sees, as [`Device`]s: here, not in `device.rs`, because they ask
//! the driver (the identifier type itself knows nothing of it).

use crate::device::Device;
use crate::error::Result;

impl Device {
    /// `cuda:{LOCAL_RANK}`, `cuda:0` when `LOCAL_RANK` is unset: the spec's default device.
    ///
    /// # Errors
    /// [`Error::NoCuda`](crate::error::Error::NoCuda) without a usable driver (the rank cannot be checked);
    /// [`Error::InvalidLocalRank`](crate::error::Error::InvalidLocalRank) when `LOCAL_RANK` is not a number below the device
    /// count.
    ///
    /// ```
    /// match pinlane::Device::from_local_rank() {
    ///     Ok(d) => println!("this process works on {d}"),
    ///     Err(e) => println!("no device: {e}"),
    /// }
    /// ```
    pub fn from_local_rank() -> Result<Device> {
        let info = super::require("Device::from_local_rank")?;
        crate::device::env_local_rank(info.device_count).map(Device::cuda)
    }

    /// The device a `LOCAL_RANK` value names (`None`: unset, which names `cuda:0`), checked
    /// against the devices the driver sees. [`Device::from_local_rank`] reads the variable
    /// once per thread; this is for callers that read it themselves, on every call (the
    /// Python package does, as spdl does).
    ///
    /// # Errors
    /// As [`Device::from_local_rank`].
    ///
    /// ```
    /// if pinlane::driver::available().is_some() {
    ///     assert_eq!(pinlane::Device::from_local_rank_value(None)?, pinlane::Device::cuda(0));
    /// }
    /// assert!(pinlane::Device::from_local_rank_value(Some("x")).is_err());
    /// # Ok::<(), pinlane::Error>(())
    /// ```
    pub fn from_local_rank_value(value: Option<&str>) -> Result<Device> {
        let info = super::require("Device::from_local_rank_value")?;
        crate::device::local_rank_device(value, info.device_count).map(Device::cuda)
    }

    /// Every device the driver sees (none without a usable driver).
    ///
    /// ```
    /// for d in pinlane::Device::all() {
    ///     println!("{d}");
    /// }
    /// ```
    pub fn all() -> impl Iterator<Item = Device> {
        let n = super::available().map_or(0, |i| i.device_count);
        (0..n).map(Device::cuda)
    }
}
