//! [`DriverError`]: a failed `CUresult`, typed.

use cudarc::driver::sys::CUresult;

/// A `CUresult` other than success: its number and its name (`CUDA_ERROR_*`), with
/// helpers for the cases callers act on.
///
/// ```
/// use pinlane::driver::DriverError;
/// let e = DriverError::from_code(2);
/// assert!(e.is_out_of_memory());
/// assert_eq!(e.name(), "CUDA_ERROR_OUT_OF_MEMORY");
/// assert_eq!(e.to_string(), "CUDA_ERROR_OUT_OF_MEMORY (2)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DriverError {
    code: u32,
    name: &'static str,
}

impl DriverError {
    /// The error of `CUresult` number `code`, named from pinlane's own table (the
    /// driver's own name is used where pinlane has a driver to ask).
    pub fn from_code(code: u32) -> DriverError {
        DriverError {
            code,
            name: known_name(code).unwrap_or("CUDA_ERROR_UNRECOGNIZED"),
        }
    }

    #[cfg(feature = "test-util")]
    pub(crate) fn with_name(code: u32, name: &'static str) -> DriverError {
        DriverError { code, name }
    }

    pub(crate) fn from_result(res: CUresult, name: Option<&'static str>) -> DriverError {
        let code = res as u32;
        match name {
            Some(name) => DriverError { code, name },
            None => DriverError::from_code(code),
        }
    }

    /// The raw `CUresult` number.
    pub fn code(&self) -> u32 {
        self.code
    }

    /// The `CUresult` name, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
    pub fn name(&self) -> &'static str {
        self.name
    }

    /// `CUDA_ERROR_OUT_OF_MEMORY`: an allocation the device (or host) could not satisfy.
    pub fn is_out_of_memory(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_OUT_OF_MEMORY as u32
    }

    /// `CUDA_ERROR_NOT_READY`: an asynchronous operation has not finished yet.
    pub fn is_not_ready(&self) -> bool {
        self.code == CUresult::CUDA_ERROR_NOT_READY as u32
    }

    /// An error after which the context is unusable for the rest of the process (an
    /// illegal address, a launch failure, an assertion in a kernel, ...): every later
    /// call on that device fails too.
    pub fn is_sticky(&self) -> bool {
        use CUresult::*;
        [
            CUDA_ERROR_ILLEGAL_ADDRESS,
            CUDA_ERROR_LAUNCH_FAILED,
            CUDA_ERROR_ASSERT,
            CUDA_ERROR_HARDWARE_STACK_ERROR,
            CUDA_ERROR_ILLEGAL_INSTRUCTION,
            CUDA_ERROR_MISALIGNED_ADDRESS,
            CUDA_ERROR_INVALID_ADDRESS_SPACE,
            CUDA_ERROR_INVALID_PC,
            CUDA_ERROR_ECC_UNCORRECTABLE,
        ]
        .iter()
        .any(|&r| r as u32 == self.code)
    }
}

impl std::fmt::Display for DriverError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name, self.code)
    }
}

impl std::error::Error for DriverError {}

fn known_name(code: u32) -> Option<&'static str> {
    use CUresult::*;
    let table = [
        (CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE"),
        (CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY"),
        (CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED"),
        (CUDA_ERROR_DEINITIALIZED, "CUDA_ERROR_DEINITIALIZED"),
        (CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE"),
        (CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE"),
        (CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT"),
        (CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE"),
        (CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY"),
        (CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS"),
        (CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED"),
        (CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED"),
        (CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN"),
    ];
    table
        .iter()
        .find(|(r, _)| *r as u32 == code)
        .map(|(_, n)| *n)
}
