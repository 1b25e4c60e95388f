//! NVTX ranges (feature `nvtx`): pinlane's calls and their phases as nested ranges on the
//! calling thread's row in Nsight Systems.
//!
//! `libnvToolsExt.so.1` (or `libnvToolsExt.so`) is looked up once, at the first range,
//! through the dynamic loader's search path (`LD_LIBRARY_PATH` included); without it
//! every range is a no-op, so the library is never a hard dependency. Nsight Systems
//! injects its collector into that library when it traces the process.

use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

type Push = unsafe extern "C" fn(*const c_char) -> c_int;
type Pop = unsafe extern "C" fn() -> c_int;

struct Nvtx {
    push: Push,
    pop: Pop,
    /// Keeps the library loaded (the function pointers point into it).
    _lib: libloading::Library,
}

static NVTX: OnceLock<Option<Nvtx>> = OnceLock::new();

fn load() -> Option<Nvtx> {
    for name in ["libnvToolsExt.so.1", "libnvToolsExt.so"] {
        // SAFETY: loading the NVTX library runs no initialisation with preconditions
        // (NVTX initialises lazily at the first call).
        let Ok(lib) = (unsafe { libloading::Library::new(name) }) else {
            continue;
        };
        // SAFETY: the symbols have these C signatures in every NVTX version.
        let syms = unsafe {
            (
                lib.get::<Push>(b"nvtxRangePushA\0").map(|s| *s),
                lib.get::<Pop>(b"nvtxRangePop\0").map(|s| *s),
            )
        };
        if let (Ok(push), Ok(pop)) = syms {
            return Some(Nvtx {
                push,
                pop,
                _lib: lib,
            });
        }
    }
    None
}

fn nvtx() -> Option<&'static Nvtx> {
    NVTX.get_or_init(load).as_ref()
}

/// Whether NVTX ranges are emitted: the library was found (looked up at the first call).
pub fn nvtx_loaded() -> bool {
    nvtx().is_some()
}

thread_local! {
    /// Range names made into C strings once per thread: `(prefix, label)` -> `prefix label`.
    static NAMES: std::cell::RefCell<std::collections::HashMap<(&'static str, &'static str), CString>> =
        std::cell::RefCell::new(std::collections::HashMap::new());
}

/// Opens a range named `{prefix}{label}` on the calling thread; returns the nesting depth
/// NVTX reports (negative on error), or `None` without the library. Each name is made
/// once per thread, so a range costs a map lookup and the NVTX call.
pub(crate) fn push(prefix: &'static str, label: &'static str) -> Option<i32> {
    let n = nvtx()?;
    NAMES
        .try_with(|names| {
            let mut names = names.borrow_mut();
            let name = names
                .entry((prefix, label))
                .or_insert_with(|| CString::new(format!("{prefix}{label}")).unwrap_or_default());
            // SAFETY: a NUL-terminated string alive for the call; NVTX copies it.
            unsafe { (n.push)(name.as_ptr()) }
        })
        .ok()
}

/// Closes the calling thread's innermost range.
pub(crate) fn pop() {
    if let Some(n) = nvtx() {
        // SAFETY: no arguments; popping with no open range is an NVTX error code, not UB.
        unsafe { (n.pop)() };
    }
}
