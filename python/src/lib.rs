//! `pinlane._native`: the Rust half of the Python package.
//!
//! The Python half (`pinlane/__init__.py`, `pinlane/_tree.py`) walks the caller's
//! containers and hands this module a flat list of torch tensors; this module moves them
//! with pinlane and hands back torch tensors, zero-copy both ways through PyTorch's DLPack
//! C exchange API (`torch.Tensor.__dlpack_c_exchange_api__`).
//!
//! | module | holds |
//! | --- | --- |
//! | [`errors`] | pinlane's errors as the Python exceptions spdl raises |
//! | [`torch`] | torch tensor <-> pinlane tensor, through the exchange API |
//! | [`transfer`] | the two calls, with the GIL released while copies run |
//! | [`flat`] | flat batches walked and rebuilt in the call that moves them |
//! | [`split`] | the binding's own phases of a call, for the benches |
//! | [`weights`] | safetensors checkpoints onto the device (`pinlane::weights`) |

mod errors;
mod flat;
mod into;
mod pairs;
mod split;
mod torch;
mod transfer;
mod weights;

use pyo3::prelude::*;

/// How many CUDA devices pinlane can use (0 without a usable driver).
#[pyfunction]
fn device_count() -> usize {
    pinlane::driver::available().map_or(0, |i| i.device_count)
}

/// Why CUDA is not usable, or `None` when it is.
#[pyfunction]
fn unavailable_reason() -> Option<String> {
    match pinlane::driver::available() {
        Some(i) if i.device_count > 0 => None,
        Some(_) => Some("the CUDA driver reports no device".into()),
        None => Some(
            pinlane::driver::unavailable_reason()
                .unwrap_or("no CUDA driver")
                .to_string(),
        ),
    }
}

/// The device `"cuda"` / `None` names: `cuda:{LOCAL_RANK}`, `cuda:0` when it is unset.
/// Read on every call, as spdl reads it (the Rust core reads it once per thread).
pub(crate) fn local_rank_device() -> pinlane::Result<pinlane::Device> {
    let value = std::env::var_os("LOCAL_RANK");
    // Borrowed unless the value is not UTF-8: no second allocation per call.
    let value = value.as_deref().map(std::ffi::OsStr::to_string_lossy);
    pinlane::Device::from_local_rank_value(value.as_deref())
}

/// The ordinal `"cuda"` / `None` names (see [`local_rank_device`]).
#[pyfunction]
fn default_device() -> PyResult<usize> {
    local_rank_device()
        .map(pinlane::Device::ordinal)
        .map_err(errors::to_py)
}

/// Installs pinlane's configuration from keyword settings named as the `PINLANE_*`
/// variables, lower-case and without the prefix (`arena_bytes=...`, `h2d_small=...`),
/// parsed as those variables are: strictly. Must come before the first transfer of the
/// process.
#[pyfunction]
#[pyo3(signature = (**settings))]
fn configure(settings: Option<&Bound<'_, pyo3::types::PyDict>>) -> PyResult<()> {
    use pyo3::exceptions::{PyRuntimeError, PyValueError};
    let mut vars = std::collections::HashMap::new();
    if let Some(settings) = settings {
        for (k, v) in settings.iter() {
            let key: String = k.extract()?;
            let value = if v.is_instance_of::<pyo3::types::PyBool>() {
                // Only the one on/off setting takes a bool: `copy_threads=True` would read
                // as 1 thread, `arena_bytes=True` as 1 byte.
                if key != "nt_copy" {
                    return Err(PyValueError::new_err(format!(
                        "{key}={v}: a bool is no value of this setting (only nt_copy takes one)"
                    )));
                }
                if v.is_truthy()? { "1" } else { "0" }.to_string()
            } else {
                v.str()?.to_string()
            };
            vars.insert(format!("PINLANE_{}", key.to_uppercase()), (key, value));
        }
    }
    let asked = std::cell::RefCell::new(Vec::new());
    let config = pinlane::Config::from_vars(|name| {
        asked.borrow_mut().push(name.to_string());
        vars.get(name).map(|(_, v)| v.clone())
    })
    .map_err(errors::to_py)?;
    let asked = asked.into_inner();
    let mut unknown: Vec<&str> = vars
        .iter()
        .filter(|(name, _)| !asked.contains(name))
        .map(|(_, (key, _))| key.as_str())
        .collect();
    if !unknown.is_empty() {
        unknown.sort_unstable();
        let mut known: Vec<String> = asked
            .iter()
            .filter_map(|n| n.strip_prefix("PINLANE_"))
            .map(str::to_lowercase)
            .collect();
        known.sort_unstable();
        known.dedup();
        return Err(PyValueError::new_err(format!(
            "unknown setting(s) {unknown:?}; pinlane's are {known:?}"
        )));
    }
    config
        .install()
        .map(drop)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}

/// Arms pinlane's phase timer for the calling thread's next transfer (for the benches:
/// where one call's time goes), the engine's and the binding's own ([`last_split`]).
#[pyfunction]
fn trace_next_call() {
    pinlane::observe::trace_next_call();
    split::arm();
}

/// The phases of the calling thread's last traced call: `[(mark, microseconds from the
/// call's start)]`, or `None`.
#[pyfunction]
fn last_trace() -> Option<Vec<(&'static str, f64)>> {
    pinlane::observe::last_trace().map(|m| {
        m.into_iter()
            .map(|(n, d)| (n, d.as_secs_f64() * 1e6))
            .collect()
    })
}

/// The binding's phases of the calling thread's last traced call (its native entry to
/// its return, the engine's span inside): `[(mark, microseconds from the entry)]`, the
/// last `"end"`, or `None`.
#[pyfunction]
fn last_split() -> Option<Vec<(&'static str, f64)>> {
    split::last()
}

/// Gives cached memory back (see `pinlane::trim`).
#[pyfunction]
fn trim(py: Python<'_>) -> PyResult<()> {
    py.detach(pinlane::trim).map_err(errors::to_py)
}

/// Gives back everything pinlane holds and stops its threads, waiting up to `timeout`
/// seconds (see `pinlane::shutdown`); a later transfer starts afresh.
#[pyfunction]
#[pyo3(signature = (timeout=10.0))]
fn shutdown(py: Python<'_>, timeout: f64) -> PyResult<()> {
    let limit = seconds(timeout)?;
    // Before and after: a call that began before the shutdown, or during it, marks
    // nothing warm for the runtime that comes after.
    let bump = || transfer::EPOCH.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    bump();
    let done = py.detach(|| pinlane::shutdown(limit));
    bump();
    done.map_err(errors::to_py)
}

/// Waits up to `timeout` seconds for the pending non-blocking calls to complete and hands
/// back what they hold, freeing nothing (see `pinlane::settle`): for the interpreter's
/// exit.
#[pyfunction]
fn settle(py: Python<'_>, timeout: f64) -> PyResult<()> {
    let limit = seconds(timeout)?;
    py.detach(|| pinlane::settle(limit)).map_err(errors::to_py)
}

fn seconds(timeout: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(timeout).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "timeout must be a number of seconds >= 0, not {timeout}"
        ))
    })
}

/// Bytes held and in use, per pool (see `pinlane::memory_stats`), the process's counts
/// of fallbacks and waits, and per device used whether small D2H calls end on an end flag,
/// as a dict. It starts nothing (no driver, no runtime).
#[pyfunction]
fn memory_stats(py: Python<'_>) -> PyResult<Bound<'_, pyo3::types::PyDict>> {
    let s = pinlane::memory_stats();
    let d = pyo3::types::PyDict::new(py);
    for (name, p) in [
        ("staging", s.staging),
        ("pinned_outputs", s.pinned_outputs),
        ("pageable_outputs", s.pageable_outputs),
    ] {
        let e = pyo3::types::PyDict::new(py);
        e.set_item("held_bytes", p.held_bytes)?;
        e.set_item("in_use_bytes", p.in_use_bytes)?;
        e.set_item("peak_bytes", p.peak_bytes)?;
        d.set_item(name, e)?;
    }
    let devs = pyo3::types::PyDict::new(py);
    for dp in &s.devices {
        let e = pyo3::types::PyDict::new(py);
        e.set_item("reserved_bytes", dp.reserved_bytes)?;
        e.set_item("used_bytes", dp.used_bytes)?;
        // Not memory, but what explains a slow small D2H: without flags the calls wait in
        // the driver (and let go of the GIL there).
        e.set_item(
            "end_flags",
            pinlane::observe::end_flags_available(dp.device),
        )?;
        devs.set_item(dp.device.ordinal(), e)?;
    }
    d.set_item("devices", devs)?;
    d.set_item("background_errors", s.background_errors)?;
    d.set_item("pageable_fallbacks", s.pageable_fallbacks)?;
    d.set_item("slot_waits", s.slot_waits)?;
    d.set_item("retained_bytes", s.retained_bytes)?;
    d.set_item("kept_device_block_bytes", s.kept_device_block_bytes)?;
    Ok(d)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_function(wrap_pyfunction!(device_count, m)?)?;
    m.add_function(wrap_pyfunction!(unavailable_reason, m)?)?;
    m.add_function(wrap_pyfunction!(default_device, m)?)?;
    m.add_function(wrap_pyfunction!(errors::put_back_unreceived, m)?)?;
    m.add("UNRECEIVED", errors::UNRECEIVED)?;
    m.add_function(wrap_pyfunction!(trim, m)?)?;
    m.add_function(wrap_pyfunction!(trace_next_call, m)?)?;
    m.add_function(wrap_pyfunction!(last_trace, m)?)?;
    m.add_function(wrap_pyfunction!(last_split, m)?)?;
    m.add_function(wrap_pyfunction!(shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(settle, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(memory_stats, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::h2d, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::h2d_one, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::d2h_one, m)?)?;
    m.add_function(wrap_pyfunction!(flat::d2h_flat, m)?)?;
    m.add_function(wrap_pyfunction!(flat::h2d_flat, m)?)?;
    m.add_class::<into::Targets>()?;
    m.add_class::<pairs::Pairs>()?;
    m.add_function(wrap_pyfunction!(transfer::d2h, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::check_device, m)?)?;
    m.add_function(wrap_pyfunction!(transfer::torch_current_stream, m)?)?;
    m.add_function(wrap_pyfunction!(weights::load_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(weights::safetensors_names, m)?)?;
    Ok(())
}
