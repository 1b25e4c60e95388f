"""pinlane: spdl.io's ``transfer_tensor_h2d`` / ``transfer_tensor_d2h``, moved by pinlane's
Rust engine, zero-copy with PyTorch.

Switch by changing one import::

    from pinlane import transfer_tensor_d2h, transfer_tensor_h2d   # was: from spdl.io

The signatures, defaults, containers, errors and stream semantics are spdl 0.8.0's (see
README.md for the differences). Importing pinlane needs neither torch nor a GPU: without
torch loaded there is no torch tensor to move, and without CUDA a batch comes back as is.
"""

from __future__ import annotations

import atexit
import contextlib
import operator
import os
import sys
from collections.abc import Callable, Iterable
from itertools import repeat
from typing import TYPE_CHECKING, Any, TypeVar, Union

from . import _native
from ._prefetch import Prefetcher, prefetch
from ._tree import flatten, pair, rebuild

__all__ = [
    "transfer_tensor_h2d",
    "transfer_tensor_d2h",
    "copy_into",
    "Buffers",
    "Pairs",
    "prefetch",
    "Prefetcher",
    "cuda_available",
    "trim",
    "shutdown",
    "memory_stats",
    "configure",
    "load_safetensors",
]
__version__ = _native.__version__

if TYPE_CHECKING:  # torch is optional: its types name arguments, nothing imports it here
    import torch

    _Device = Union[torch.device, str, int, None]

# A batch comes back with the structure it went in with (spdl's ``T``).
T = TypeVar("T")


def cuda_available() -> bool:
    """Whether pinlane can use a CUDA device (a driver and at least one device)."""
    return _native.device_count() > 0


def configure(**settings: object) -> None:
    """Sets pinlane's configuration for this process, before its first transfer. The
    keywords are the ``PINLANE_*`` environment variables of the README's configuration
    table, lower-case and without the prefix (mostly the Rust ``Config`` field names;
    ``d2h_small``, ``h2d_small``, ``nt_copy``, ``spin_us``, ``slot_wait_ms`` and
    ``drop_sync_wait_ms`` differ), e.g.
    ``pinlane.configure(arena_bytes=256 << 20, copy_threads=8, h2d_small="copy")``.
    Values are parsed strictly, as the variables are.

    Raises:
        ValueError: an unknown setting, or a value that does not parse or is out of range.
        RuntimeError: pinlane is already running with another configuration (a transfer
            ran first, or ``configure`` was called before with other values).
    """
    _native.configure(**settings)


def trim() -> None:
    """Gives back the memory pinlane caches (staging slots, free page-locked output
    blocks, small H2D outputs' kept device blocks, the device pools' free memory); what
    live tensors use stays."""
    _native.trim()


def shutdown(timeout: float = 10.0) -> None:
    """Gives back everything pinlane holds (staging slots, page-locked output blocks,
    cached pageable memory, the device pools' free memory) and stops its threads, waiting
    up to ``timeout`` seconds; the next transfer starts afresh, with the same
    configuration (or a new one from ``configure``). Memory under tensors still alive is
    freed when they go. Call it last, with your tensors dropped, and NVIDIA's
    compute-sanitizer reports no leak of pinlane's. (As the interpreter exits, pinlane
    waits at most 5 s for copies that did not wait, and hands back the torch tensors they
    hold, while torch is still whole; it frees nothing then.)

    Raises:
        ValueError: ``timeout`` is negative or not a number.
        RuntimeError: work was still running at the deadline (its memory stays held, and
            is freed when it finishes); at once in a child process forked after pinlane
            set up CUDA (nothing there is the child's to give back).
    """
    _native.shutdown(timeout)


# The process that imported pinlane (a forked child that exits through sys.exit runs the
# parent's atexit handlers too, with none of its threads).
_PID = os.getpid()

# How long the exit handler waits for copies still running (a hung device must not hold
# the process's exit longer than this).
_EXIT_TIMEOUT = 5.0

# What the exit handler found: None until it runs, then "ok" or the error it swallowed
# (for the tests: the process is exiting, there is no one else to tell).
_exit_outcome = None


def _settle_at_exit():
    """Runs as the interpreter exits, while torch is still whole: a copy that did not wait
    (``Buffers.copy_from``, ``copy_into``, the non-blocking calls) keeps the torch tensors
    it reads or writes until pinlane's completion thread sees it done, and that thread must
    not hand them back to torch after torch has begun to tear down (the process then
    aborted, now and then, with "terminate called without an active exception"). So it
    waits for those copies and hands everything back (``_native.settle``: no memory freed,
    no CUDA call that waits for the device, bounded by ``_EXIT_TIMEOUT`` even on a hung
    device)."""
    global _exit_outcome
    if os.getpid() != _PID:
        return
    try:
        _native.settle(_EXIT_TIMEOUT)
        _exit_outcome = "ok"
    except Exception as e:  # noqa: BLE001 - nothing to report to at exit
        _exit_outcome = f"{type(e).__name__}: {e}"


atexit.register(_settle_at_exit)


def memory_stats() -> dict[str, Any]:
    """Bytes pinlane holds and uses, per pool, as a dict; ``background_errors`` counts
    errors raised on pinlane's own threads (each is raised by the next call on its
    device). Also: ``pageable_fallbacks`` (D2H batches given ordinary memory because the
    page-locked output pool was full), ``slot_waits`` (calls that waited for a staging
    slot), ``retained_bytes`` (memory kept after failed synchronisations),
    ``kept_device_block_bytes`` (device blocks of small H2D outputs kept for the next ones,
    counted in the devices' used bytes; ``trim`` frees them), and per device
    pinlane has used (``devices``) its pool's bytes and ``end_flags``: whether small D2H
    calls see their copies end without waiting in the driver (false once the driver
    refused one; such calls are then slower, and let go of the GIL to wait). Asking starts
    nothing and fixes no configuration."""
    return _native.memory_stats()


def load_safetensors(
    path: str | os.PathLike[str],
    device: _Device = None,
    *,
    names: Iterable[str] | Callable[[str], bool] | None = None,
) -> dict[str, torch.Tensor]:
    """Loads a safetensors checkpoint onto a CUDA device and returns ``{name: tensor}``,
    in file order: a ``.safetensors`` file, a sharded checkpoint's index
    (``model.safetensors.index.json``, naming its shards), or a directory holding either.

    * ``device``: ``None`` or ``"cuda"`` (``cuda:{LOCAL_RANK}``), ``"cuda:N"``, an int,
      or a ``torch.device`` (``self.device`` in a ``LightningModule``).
    * ``names``: load only these tensors: an iterable of names (each in the checkpoint),
      or a predicate (any callable) called with each name in the checkpoint, in file
      order, e.g. ``names=lambda n: n.startswith("model.layers.0.")`` (only the headers
      are read to list them).
    * Every header of every shard is checked before anything is copied; the files are
      read in place (mapped) through pinlane's page-locked staging ring, so page-locked
      memory is bounded as for any transfer, and each tensor arrives zero-copy in torch.
    * The call returns once the bytes are on the device: the tensors are ready for work
      on any stream. Their memory is one device allocation, freed when torch lets go of
      the last of them (one tensor kept, a norm's weight say, keeps the whole
      checkpoint's memory), in order on torch's current stream of the device at the time
      of the call.
    * No CUDA (torch has none): CPU tensors (copies of the file's bytes), whatever
      ``device`` says, as the transfers return a batch as is there. A CUDA ``device``
      asked for where torch has CUDA and pinlane cannot use it (``cuda_available()``
      false) is a ``RuntimeError`` saying why, not CPU tensors.
    * A tensor of a dtype pinlane lacks (float8, complex, ...) is an error naming it:
      leave it out with ``names`` (and load it with ``safetensors`` if you need it).

    Raises:
        OSError: a file is missing or cannot be read.
        ValueError: a malformed file or index (truncated, bad header, offsets or shapes
            that do not match, a missing shard), a name the checkpoint does not hold, a
            dtype pinlane lacks, or a bad ``device``.
        RuntimeError: a copy failed (no tensor is returned), or pinlane cannot use the
            CUDA ``device`` asked for.
        MemoryError: device memory ran out (after torch's cache, where it held device
            memory unused, gave it back and the load was tried once more).
        Exception: whatever a ``names`` predicate raises (nothing is loaded).
    """
    import torch

    if isinstance(device, bool):
        raise ValueError(f"device must be None, 'cuda', 'cuda:N', an int or a torch.device, not {device!r}")
    device = _device_str(device)
    _native.check_device(device)
    if callable(names):
        pick = names
        names = [n for n in _native.safetensors_names(os.fspath(path)) if pick(n)]
    elif names is not None:
        if isinstance(names, str):
            raise ValueError("names must be an iterable of names or a predicate, not one string")
        names = [str(n) for n in names]
    index = None
    if _torch_with_cuda() is not None:
        index = _native.default_device() if device in (None, "cuda") else int(device[5:])
    elif device is not None and not cuda_available() and torch.cuda.is_available():
        # Asked for a GPU that torch sees and pinlane cannot use: CPU tensors would pass
        # for the load asked for. (`_torch_with_cuda` is None whenever pinlane sees no
        # device, so this cannot be asked inside its branch: session 79's check was.)
        raise RuntimeError(
            f"load_safetensors: pinlane cannot use CUDA here ({_native.unavailable_reason()}), "
            f"so it cannot load onto {device}"
        )

    def load():
        return _native.load_safetensors(os.fspath(path), probe=torch.empty(0), device=index, names=names)

    try:
        keys, tensors = load()
    except MemoryError as e:
        # As transfer_tensor_h2d: torch's unused cache given back, then once more (not
        # for an error recorded by earlier work: `_earlier`).
        if _earlier(e) or index is None or not _torch_cache_given_back(index):
            raise
        keys, tensors = load()
    return dict(zip(keys, tensors))


# Set once both torch and pinlane have seen a GPU: that does not change in a process, and
# asking torch again costs ~1-2 us a call.
_cuda_seen = False
# `torch.Tensor` once `_cuda_seen` is set (None before): what the calls' short ways
# compare a batch's type with.
_Tensor = None


class _NoForwardAD:
    """``_fwad`` before torch is seen: no forward-mode AD level is open."""

    _current_level = -1


# torch's `torch.autograd.forward_ad` once `_cuda_seen` is set: its `_current_level` (a
# module global, -1 with no `dual_level` open; torch opens one level at most) is read by
# every call, one attribute load, to send batches that may carry tangents through the
# walk, which asks each tensor (`_tangents`).
_fwad = _NoForwardAD


def _forget_cuda_in_child():
    """Runs in a child just forked: it cannot use the CUDA state, streams and copy threads
    it inherits (the driver's state does not survive a fork, and a lock a thread of the
    parent held stays held). Forgetting that CUDA was seen closes the short ways and sends
    the child's next call through ``_torch_with_cuda``, where ``torch.cuda.init()`` raises
    torch's own error for a forked subprocess (torch was initialised in the parent
    whenever the flag was set), as a torch call there would."""
    global _cuda_seen, _Tensor, _fwad
    _cuda_seen = False
    _Tensor = None
    _fwad = _NoForwardAD


if hasattr(os, "register_at_fork"):  # POSIX; the wheels are Linux's
    os.register_at_fork(after_in_child=_forget_cuda_in_child)


def _torch_with_cuda():
    """torch, if the caller loaded it and both torch and pinlane see a GPU; else None."""
    global _cuda_seen, _Tensor, _fwad
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    if not _cuda_seen:
        if _native.device_count() == 0 or not torch.cuda.is_available():
            return None
        # torch's own CUDA state, as its first CUDA call would make it: without it torch
        # says `is_pinned()` is False for page-locked memory (pinlane's D2H outputs), and
        # nothing else in these calls makes it (the current stream is asked in C).
        torch.cuda.init()
        from torch.autograd import forward_ad

        # A private global of torch's (since 1.11): were a torch without it ever loaded,
        # the calls would go on as before, without asking for tangents.
        if isinstance(getattr(forward_ad, "_current_level", None), int):
            _fwad = forward_ad
        _Tensor = torch.Tensor
        _cuda_seen = True
    return torch


def _num_caches(n):
    if isinstance(n, bool) or not isinstance(n, int):
        raise ValueError(f"num_caches must be an int, not {type(n).__name__}")
    if n < 0:
        raise ValueError(f"num_caches must be 0 or more, not {n}")
    return n


def transfer_tensor_h2d(batch: T, /, *, num_caches: int = 4) -> T:
    """Copies the CPU torch tensors of ``batch`` to ``cuda:{LOCAL_RANK}`` on the calling
    thread's own stream and returns the same structure with CUDA tensors in their place.

    * Containers (list, tuple, namedtuple, dict, defaultdict, dataclass, nested) are
      rebuilt with their own types; other leaves, and CUDA tensors, are returned as the
      same objects.
    * Each output holds the values torch gives its source (``tensor.to(device)`` would
      give the same bits), lazy bits resolved: a negated view (``is_neg()``, such as
      ``z.conj().imag``) arrives negated.
    * Sources are read in place: page-locked ones (``pin_memory()``) of 1 MiB and more
      are copied straight from their memory; pageable ones, and smaller page-locked ones,
      through pinlane's page-locked staging ring, where many small tensors share one
      copy. The driver says which large sources are page-locked. A non-contiguous or
      negated tensor is first made a plain contiguous tensor on the host, and its output
      is contiguous. While the call runs (it lets go of the GIL), no other thread may
      write, resize or re-point (``resize_``, ``set_``, ``.data =``) a tensor of
      ``batch``: as for torch's own copies, pinlane reads its memory in place.
    * The call returns once the copies are done; the outputs are ready for work on any
      stream. Their memory is freed, when torch lets them go, in order on torch's current
      stream of the device at the time of the call. If that stream is a
      ``torch.cuda.ExternalStream``, keep it alive until those outputs are freed (torch
      asks the same of an external stream for as long as its work uses memory).
      ``out.record_stream(s)`` does nothing to them (torch skips memory its allocator did
      not make): to use them on another stream ``s``, make it torch's current stream for
      the call, or keep them referenced until ``s`` is done with them.
    * The thread keeps its last ``num_caches`` batches' device memory referenced.
    * A tensor that requires grad or carries a forward-mode AD tangent (inside
      ``torch.autograd.forward_ad.dual_level()``), of a subclass whose class torch's ops
      keep (torchvision's ``tv_tensors``; not ``nn.Parameter``) or that has a ``.to`` of
      its own (a ``Parameter`` subclass that quantizes as it moves), whose dtype pinlane
      lacks (complex, float8, ...), or that torch does not export (sparse and other
      layouts; the wrappers a ``torch.func`` transform, ``jvp``, ``grad`` or ``vmap``,
      hands its function) is moved by torch (``tensor.to(device)``, keeping autograd, the
      tangent, the batch dimension, class and metadata, on torch's current stream),
      before pinlane copies anything: a move torch refuses (its out-of-memory error, a
      subclass's ``.to`` raising) fails the call with that error, none of the call's
      device memory left in the thread's ring. torch's move waits for that stream; with
      ``configure(sync_wait_ms=...)`` set, the call first waits for it with that bound
      (a ``RuntimeError`` naming ``sync_wait`` past it, nothing moved or queued).
      While a dual level is open, every call asks each tensor for a tangent (about 1 us
      a tensor).
    * No CUDA (or torch not loaded): the batch is returned as is.

    Raises:
        ValueError: ``num_caches`` is not an int >= 0, or ``LOCAL_RANK`` is not an
            integer.
        RuntimeError: ``LOCAL_RANK`` is an integer that names no device, a copy failed
            (nothing of the batch is changed), or, with ``sync_wait_ms`` set, the work on
            torch's current stream that a move by torch waits for outlasted it (the
            message names ``sync_wait``).
        MemoryError: device memory ran out: after pinlane's own cached memory, and torch's
            (``torch.cuda.empty_cache()``, where it held device memory unused), was given
            back and the batch tried once more, as torch's own ``.to()`` does; or an
            out-of-memory error recorded on the device by earlier work (an owner's drop),
            which the call raises before it touches the batch, untried.
    """
    if type(num_caches) is not int or num_caches < 0:  # the check's call only for a bad one
        num_caches = _num_caches(num_caches)
    # Device memory ran out: torch's cache gives back what it holds unused, as torch does
    # before its own out-of-memory error, and the batch is tried once more (the `try`
    # costs nothing until something is raised).
    try:
        # One plain tensor (a torch.Tensor, not a subclass, not negated), alone or in a
        # list or tuple of one (a server's request), once torch and pinlane have seen a
        # GPU (before, `_Tensor` is None, which no type is): handed to the native half in
        # one positional call, with no Python call before it (each costs ~0.1 us of a
        # ~10 us call). Not while a forward-mode AD level is open: the walk then asks
        # which tensors carry a tangent.
        t = type(batch)
        if _fwad._current_level < 0:
            if t is _Tensor:
                if not batch.is_neg():
                    return _native.h2d_one(batch, num_caches)
            elif (t is list or t is tuple) and len(batch) == 1:
                one = batch[0]
                if type(one) is _Tensor and not one.is_neg():
                    out = _native.h2d_one(one, num_caches)
                    return batch if out is one else ([out] if t is list else (out,))
            if (t is dict or t is list or t is tuple) and _Tensor is not None:
                # A flat dict, list or tuple of plain tensors (a training batch): walked,
                # checked and rebuilt in the native half, in one call; None for any other.
                out = _native.h2d_flat(batch, _Tensor, num_caches)
                if out is not None:
                    return out
        return _h2d_walked(batch, num_caches)
    except MemoryError as e:
        if _earlier(e) or not _torch_cache_given_back(None):
            raise
    return _h2d_walked(batch, num_caches)


def _earlier(e):
    """Whether ``e`` is an error recorded on the device by earlier work (an owner's drop
    somewhere) that the call met before it touched the batch: it is raised as it is, never
    retried, since a retry that succeeds would lose it (session 87: an earlier
    out-of-memory error was retried after ``empty_cache()`` and vanished)."""
    return getattr(e, _native.UNRECEIVED, None) is not None


def _torch_cache_given_back(device):
    """After pinlane found ``cuda:{device}`` (``None``: ``cuda:{LOCAL_RANK}``) out of
    memory: torch's caching allocator gives back to the driver the device memory it holds
    unused (``torch.cuda.empty_cache()``), as torch does before it raises its own
    out-of-memory error. Whether it held some there (then a retry may succeed); nothing is
    asked of torch when torch is not loaded or has not set CUDA up."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_initialized():
        return False
    if device is None:
        try:
            device = _native.default_device()
        except (RuntimeError, ValueError):
            return False
    if torch.cuda.memory_reserved(device) <= torch.cuda.memory_allocated(device):
        return False
    torch.cuda.empty_cache()
    return True


def _h2d_walked(batch, num_caches):
    """``transfer_tensor_h2d``'s way for any batch (the short ways give its results)."""
    torch = _torch_with_cuda()
    if torch is None:
        return batch
    one = _single(batch, torch.Tensor)
    if one is not None:
        out = _native.h2d(
            [one], num_caches=num_caches, maybe_neg=one.is_neg(), torch_moves=_tangents([one])
        )[0]
        return _rewrapped(batch, one, out)
    tensors = flatten(batch, torch.Tensor)
    if not tensors:
        return batch
    # The outputs' memory is freed in order on torch's current stream of the device, which
    # the native half asks torch for (through its DLPack exchange API: one C call).
    # Which tensors carry torch's negation bit is asked here, all at once (~0.1 us a
    # tensor; ~1 us each from the native half): when none does, none is asked again.
    outs = _native.h2d(
        tensors,
        num_caches=num_caches,
        maybe_neg=any(map(torch.Tensor.is_neg, tensors)),
        torch_moves=_tangents(tensors),
    )
    return rebuild(batch, torch.Tensor, outs)


def _tangents(tensors):
    """Which of ``tensors`` carry a forward-mode AD tangent, while a level is open
    (``torch.autograd.forward_ad.dual_level``): torch moves those (its ``.to()`` moves the
    tangent with the values, where pinlane's copy would drop it). ``None`` when no level
    is open or no tensor carries one (outside a level none does: torch clears the
    tangents as it closes one)."""
    if _fwad._current_level < 0:
        return None
    # Only a strided tensor of a floating or complex dtype can carry one (make_dual
    # refuses others): the rest (token ids, sparse layouts) are not asked.
    strided, unpack = sys.modules["torch"].strided, _fwad.unpack_dual
    flags = [
        t.layout == strided and (t.is_floating_point() or t.is_complex()) and unpack(t).tangent is not None
        for t in tensors
    ]
    return flags if any(flags) else None


def _refuse_tangents(what, sources, destinations):
    """``copy_into``'s (and ``Pairs``') refusal, inside an open forward-mode AD level, of
    a pair whose source or destination carries a tangent: pinlane copies values, so a
    source's tangent would be dropped and a destination's left stale, where torch's
    ``copy_`` carries the one over the other."""
    for side, tensors in (("source", sources), ("destination", destinations)):
        flags = _tangents(tensors)
        if flags is not None:
            raise ValueError(
                f"{what}: pair {flags.index(True)}: the {side} carries a forward-mode AD tangent, "
                "which pinlane does not copy; copy the pair with dst.copy_(src)"
            )


def _single(batch, T):
    """The tensor, where ``batch`` is one tensor or a list or tuple of one (a server's
    request, or a loss sent back): the calls then skip the walk and the rebuild, about 1
    us of a small call's Python half."""
    if isinstance(batch, T):
        return batch
    t = type(batch)
    if (t is list or t is tuple) and len(batch) == 1 and isinstance(batch[0], T):
        return batch[0]
    return None


def _rewrapped(batch, one, out):
    """``batch`` (``_single``'s) with ``one`` replaced by ``out``, as ``rebuild`` gives it:
    the same object where nothing changed."""
    if batch is one:
        return out
    if out is one:
        return batch
    return [out] if type(batch) is list else (out,)


def _device_str(device):
    if device is None or isinstance(device, str):
        return device
    if isinstance(device, int) and not isinstance(device, bool):
        return f"cuda:{device}"
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(device, torch.device):
        return str(device)
    raise ValueError(f"device must be a torch.device, a str or an int, not {type(device).__name__}")


def _stream_arg(torch, stream):
    if not isinstance(stream, torch.cuda.Stream):
        raise TypeError(f"stream must be a torch.cuda.Stream, not {type(stream).__name__}")
    return (stream.cuda_stream, stream.device.index)


def _event_arg(torch, event):
    if not isinstance(event, torch.cuda.Event):
        raise TypeError(f"producer_event must be a torch.cuda.Event, not {type(event).__name__}")
    if not event.cuda_event:  # never recorded: nothing to wait for
        return None
    return (event.cuda_event, event.device.index)


def transfer_tensor_d2h(
    batch: T,
    /,
    *,
    device: _Device = None,
    stream: torch.cuda.Stream | None = None,
    producer_event: torch.cuda.Event | None = None,
) -> T:
    """Copies the CUDA torch tensors of ``batch`` on ``device`` to CPU tensors in
    page-locked memory and returns the same structure with them in their place.

    * ``device``: ``torch.device``, ``"cuda:N"``, ``"cuda"``, an int, or ``None`` for
      ``cuda:{LOCAL_RANK}``. Tensors on other devices, CPU tensors and other leaves are
      returned as the same objects.
    * The copy waits for the work queued on torch's current stream of the device (and
      for ``producer_event``, a recorded ``torch.cuda.Event``, when given), so tensors
      still being produced there are copied once ready. It runs on the thread's own
      stream, or on ``stream`` (a ``torch.cuda.Stream`` on ``device``) when given; the
      call returns once the copies are done.
    * Each output holds the values torch gives its source (``tensor.cpu()`` would give
      the same bits), lazy bits resolved: a negated view (``is_neg()``) arrives negated.
    * Outputs are views into pinlane's recycled page-locked blocks (``is_pinned()`` is
      true; when the pool is full, a batch gets ordinary memory): the memory goes back to
      the pool when torch lets the tensors go.
    * The sources are read in place, on the device: while the call runs (it may let go
      of the GIL), no other thread may resize or re-point (``resize_``, ``set_``,
      ``.data =``) a tensor of ``batch``, and only work ordered before the copy (on
      torch's current stream, or before ``producer_event``) may write it.
    * A small call (up to three tensors under 1 MiB, after the thread's first on the
      device, no ``stream``) keeps the GIL but to wait on the device (copies not done
      within 50 us, a failed call's drain, the page-locked pool at its cap): under
      another busy Python thread it then waits for no switch interval.
    * A non-contiguous or negated tensor is first made a plain contiguous tensor on the
      device, on torch's current stream; a tensor that requires grad or carries a
      forward-mode AD tangent (inside ``torch.autograd.forward_ad.dual_level()``), of a
      subclass whose class torch's ops keep (not ``nn.Parameter``) or that has a ``.to``
      of its own, whose dtype pinlane lacks (complex, float8, ...), or that torch does not
      export (the wrappers a ``torch.func`` transform, ``jvp``, ``grad`` or ``vmap``,
      hands its function, among others) is moved by torch (``tensor.to("cpu")``, keeping
      autograd, the tangent, the batch dimension, class and metadata). With
      ``producer_event``, this torch-side work starts only once the event has completed
      (the call waits for it on the host first, for at most ``sync_wait_ms`` when
      ``configure`` set it: then a ``RuntimeError`` naming ``sync_wait``). With that
      setting, a call whose tensors all go to torch first waits, with that bound, for
      torch's current stream (torch's own wait in its copies has none).
    * No CUDA (or torch not loaded): the batch is returned as is.

    Raises:
        ValueError: ``device`` is not a CUDA device, ``stream`` is given without
            ``device`` or is on another device, ``producer_event`` is on another device,
            or ``LOCAL_RANK`` (for ``device=None``) is not an integer.
        TypeError: ``stream`` is not a ``torch.cuda.Stream``, or ``producer_event`` not a
            ``torch.cuda.Event``.
        RuntimeError: the device index is unavailable (``LOCAL_RANK`` naming no device
            included), or a copy failed.
        MemoryError: memory for the outputs ran out.
    """
    if (stream is None and producer_event is None and (device is None or type(device) is str)
            and _fwad._current_level < 0):
        # One plain tensor, alone or in a list or tuple of one: as in transfer_tensor_h2d.
        t = type(batch)
        if t is _Tensor:
            if not batch.is_neg():
                return _native.d2h_one(batch, device)
        elif (t is list or t is tuple) and len(batch) == 1:
            one = batch[0]
            if type(one) is _Tensor and not one.is_neg():
                out = _native.d2h_one(one, device)
                return batch if out is one else ([out] if t is list else (out,))
        if (t is dict or t is list or t is tuple) and _Tensor is not None:
            # A flat dict, list or tuple of plain tensors (a training batch): walked,
            # checked and rebuilt in the native half, in one call; None for any other.
            out = _native.d2h_flat(batch, _Tensor, device)
            if out is not None:
                return out
    dev = _device_str(device)
    if dev is not None:
        _native.check_device(dev)
    if stream is not None and device is None:
        raise ValueError("a custom stream needs the device argument (device=...)")
    torch = _torch_with_cuda()
    if torch is None:
        return batch
    s = None if stream is None else _stream_arg(torch, stream)
    e = None if producer_event is None else _event_arg(torch, producer_event)
    one = _single(batch, torch.Tensor)
    if one is not None:
        out = _native.d2h(
            [one], device=dev, stream=s, event=e, maybe_neg=one.is_neg(), torch_moves=_tangents([one])
        )[0]
        return _rewrapped(batch, one, out)
    tensors = flatten(batch, torch.Tensor)
    if not tensors:
        return batch
    outs = _native.d2h(
        tensors,
        device=dev,
        stream=s,
        event=e,
        maybe_neg=any(map(torch.Tensor.is_neg, tensors)),
        torch_moves=_tangents(tensors),
    )
    return rebuild(batch, torch.Tensor, outs)


def copy_into(dst: Any, src: Any, /, *, stream: torch.cuda.Stream | None = None) -> None:
    """Copies every tensor of ``src`` into the tensor at the same place in ``dst``, in
    place: CPU sources into CUDA destinations (buffers a server keeps: a captured CUDA
    graph's static inputs, slices of one preallocated buffer), or CUDA sources into CPU
    destinations. Many small tensors take one staging copy and one kernel launch, where
    ``d.copy_(s, non_blocking=True)`` per tensor pays a copy each. For destinations
    written step after step, ``Buffers(dst).copy_from(src)`` checks them once.

    * ``dst`` and ``src`` have the same structure (lists and tuples of the same lengths,
      dicts with the same keys, paired by key; dataclasses of the same type); each pair
      has the same dtype and number of bytes (shapes may differ). The CUDA side is on one
      device; destinations must not overlap.
    * Destinations are written in place: each must be contiguous (a non-contiguous one is
      a ``ValueError``, not a silent copy into a temporary). A strided or negated
      source is made contiguous first, where it lives: a CUDA one on the stream the
      copies run on, after the work queued there (and on torch's current stream).
      Autograd sees the destinations written, as after ``copy_``: their version counters
      are bumped, so a tensor saved for a backward pass and overwritten since is torch's
      error at backward. Under grad mode, a pair whose source or destination requires
      grad is copied by torch (``d.copy_(s)``), which records it for autograd, and a
      destination that is a leaf requiring grad, or a view of one, is a ``ValueError``
      (``copy_`` refuses to write one in place); under ``torch.no_grad()`` pinlane copies
      them all, and it writes inference tensors as they are. Inside a forward-mode AD
      ``dual_level``, a pair whose source or destination carries a tangent is a
      ``ValueError`` before anything is written, whichever way it would be copied
      (pinlane copies values: a source's tangent would be dropped, a destination's left
      stale): copy such a pair with ``d.copy_(s)``. ``Pairs`` asks at every ``copy``.
    * Order: the copies run on ``stream`` (a ``torch.cuda.Stream`` of the CUDA side's
      device) or, by default, on torch's current stream there: after the work queued on
      it before the call, and before the work queued after (a graph replay, a kernel
      reading the buffers), as ``copy_`` orders its copies.
    * CPU to CUDA returns once the copies are queued. Pageable sources, and page-locked
      ones under 64 KiB, have been copied into pinlane's staging memory by then and may
      change at once; larger page-locked ones are read by the device later, as with
      ``copy_(non_blocking=True)``: do not write them until the stream has passed the
      copies. The destinations must not be read or written by work on other streams
      until then either (order that work after the stream, with an event).
    * CUDA to CPU returns once the bytes are in the destinations (it waits for the
      stream); nothing else may touch the destinations during the call.
    * A pair whose dtype pinlane lacks (complex, float8, ...) is copied by torch
      (``d.copy_(s, non_blocking=True)`` on the same stream), after pinlane's pairs; it is
      checked as the others are, before anything is written (each side where it must be,
      the destination contiguous and overlapping no other). Its page-locked CPU source is
      read by the device after the call returns, as with ``copy_(non_blocking=True)``, and
      torch does not keep it for that: keep it (in particular one of pinlane's D2H
      outputs, whose memory pinlane reuses) until the stream has passed the copies.
      CUDA to CPU, torch's copies wait for the stream with no bound: when pinlane copies
      no bytes (every pair torch's, or pinlane's pairs all empty) and
      ``configure(sync_wait_ms=...)`` set a bound, the call first waits for torch's
      current stream and ``stream``, each with that bound (then a ``RuntimeError`` naming
      ``sync_wait``, with nothing written), as pinlane's own wait for its pairs is
      bounded. CPU to CUDA, torch's copy of a pageable source may wait for the stream
      (the driver may, to stage it) with no bound, and pinlane does not wait first.

    Raises:
        ValueError: the structures differ, a pair's dtypes or sizes differ, a tensor is
            on the wrong side (both on the CPU, say), a destination is not contiguous,
            overlaps another or (under grad mode) is a leaf that requires grad, a
            source or destination carries a forward-mode AD tangent (inside a
            ``dual_level``), or ``stream`` is on another device (nothing is written then).
        TypeError: ``stream`` is not a ``torch.cuda.Stream``.
        RuntimeError: a copy failed (destinations may be partly written) or there is no
            CUDA.
    """
    Buffers(dst).copy_from(src, stream=stream)


def _copied(dst, copy, *args, **kwargs):
    """``copy(*args, **kwargs)``, then the version counters of ``dst``'s destinations
    bumped (a ``Buffers`` or ``Pairs``: ``_bump`` and ``_written``), as torch's ``copy_``
    bumps them; also when the copy failed, since the destinations may be partly written
    then. Only a refusal, with nothing written, is a ``ValueError`` or ``TypeError``: any
    other exception (a ``RuntimeError``, a ``MemoryError``, a ``KeyboardInterrupt`` in
    torch's copies of the pairs left to it, after pinlane's were written) bumps them, so
    that autograd never takes written memory for unchanged."""
    try:
        out = copy(*args, **kwargs)
    except (ValueError, TypeError):
        raise
    except BaseException:
        if dst._bump is not None:
            dst._bump(dst._written)
        raise
    if dst._bump is not None:
        dst._bump(dst._written)
    return out


def _needs_a_copy(torch, srcs, maybe_neg):
    """Whether a CUDA source of ``srcs`` is one torch must make contiguous first."""
    return maybe_neg or not all(map(torch.Tensor.is_contiguous, srcs))


class Buffers:
    """Destinations that ``copy_from`` writes again and again: a server's static inputs,
    checked and imported once (contiguous, one device, each a dtype pinlane holds).

    ::

        static = {"tokens": buf[:256].view(torch.int64), "lens": lens_buf}
        inputs = pinlane.Buffers(static)            # once
        for batch in requests:
            inputs.copy_from(batch)                 # each step: as copy_into(static, batch)
            graph.replay()

    ``dst``'s structure and tensors are taken as they are now: a tensor re-pointed
    (``set_``, ``.data =``) is not followed (pinlane keeps writing the memory it imported,
    which it keeps alive), nor is a flat list, tuple or dict changed later (sources pair by
    the positions or keys taken now); a nested ``dst`` is walked at each call to pair the
    sources, and one whose tensors were moved or replaced since is a ``ValueError``. A destination must not be
    resized (``resize_``, ``untyped_storage().resize_``) while the ``Buffers`` exist:
    torch frees the old memory when it grows a storage, and pinlane would write freed
    memory (the rule CUDA graphs have for their static inputs). The rules are
    ``copy_into``'s.
    """

    def __init__(self, dst: Any, /) -> None:
        torch = _torch_with_cuda()
        if torch is None:
            raise RuntimeError("copy_into needs torch with a CUDA device")
        self._torch = torch
        self._dst = dst
        leaves = flatten(dst, torch.Tensor)
        self._leaves = leaves
        # A flat list, tuple or dict of tensors: each call pairs it without a walk.
        values = dst.values() if type(dst) is dict else dst
        self._flat = type(dst) in (list, tuple, dict) and all(
            map(isinstance, values, repeat(torch.Tensor))
        )
        # A dict's keys in order: a source dict whose keys come in the same order pairs
        # by its values alone (0.7 us less than a lookup per key, for 16).
        self._keys = list(dst) if self._flat and type(dst) is dict else None
        self._keyset = frozenset(self._keys) if self._keys is not None else None
        self._h2d = bool(leaves) and leaves[0].is_cuda
        self._native = _native.Targets(leaves, h2d=self._h2d)
        # The pairs torch copies (dtypes pinlane lacks), and those of them whose destination
        # is an inference tensor, which torch writes only under inference mode.
        self._torch_pairs = self._native.torch_pairs
        self._torch_inference = [k for k in self._torch_pairs if leaves[k].is_inference()]
        # What pinlane writes, autograd must see written, as after torch's copy_: a tensor
        # saved for a backward pass and overwritten since is then an error at backward,
        # not a wrong gradient. Inference tensors have no version to bump.
        self._written = [t for t in leaves if not t.is_inference()]
        self._bump = torch.autograd.graph.increment_version if self._written else None

    def _sources(self, src):
        """``src``'s tensors, paired with the destinations (``pair``'s rules)."""
        d, T = self._dst, self._torch.Tensor
        if self._flat and type(src) is type(d):
            if type(d) is dict:
                # The keys (and their order) as taken at construction, as the leaves
                # were: a dict changed since is not followed.
                if list(src) == self._keys:
                    s = list(src.values())
                else:
                    s = [src[k] for k in self._keys] if src.keys() == self._keyset else None
            else:
                s = list(src)
            if s is not None and len(s) == len(self._leaves) and all(map(isinstance, s, repeat(T))):
                return s
        dsts, srcs = pair(d, src, T)
        # Paired through the destinations' container as it is now: its tensors must still
        # be the ones taken at construction, in their order (a nested dict whose keys were
        # reordered since would otherwise pair each source with another's destination).
        if len(dsts) != len(self._leaves) or not all(map(operator.is_, dsts, self._leaves)):
            raise ValueError("copy_into: the destinations' container changed since Buffers was made")
        return srcs

    def copy_from(self, src: Any, /, *, stream: torch.cuda.Stream | None = None) -> None:
        """Copies ``src`` (the structure of the destinations) into them: see
        ``copy_into``."""
        torch = self._torch
        srcs = self._sources(src)
        if not srcs:
            return
        s = None if stream is None else _stream_arg(torch, stream)
        if self._torch_inference and not torch.is_inference_mode_enabled():
            # Refused before anything is written, as torch's copy_ would refuse it after
            # pinlane's pairs were.
            raise ValueError(
                f"copy_into: pair {self._torch_inference[0]}: the destination is an inference "
                "tensor of a dtype pinlane lacks, which torch's copy_ writes only under "
                "torch.inference_mode()"
            )
        if _fwad._current_level >= 0:  # refused before anything is written
            _refuse_tangents("copy_into", srcs, self._leaves)
        maybe_neg = any(map(torch.Tensor.is_neg, srcs))
        grad = torch.is_grad_enabled()
        ctx = contextlib.nullcontext()
        waited = False
        if s is not None and not self._h2d:
            # Work torch does on `stream` for a D2H (its pairs' copies; the contiguous
            # copies of strided or negated sources, which it would otherwise make on its
            # current stream at once, before `stream`'s work) must also come after the
            # current stream's, where the sources were made, as pinlane's copies do.
            copies = _needs_a_copy(torch, srcs, maybe_neg)
            if copies or self._torch_pairs:
                stream.wait_stream(torch.cuda.current_stream(stream.device))
                waited = True
            if copies:
                ctx = torch.cuda.stream(stream)
        def torch_copies(left, written):
            # The pairs left to torch, copied by the native half once pinlane's are queued,
            # under its one-writer lock, so that no other thread's copy runs beside them.
            # (After pinlane's: the engine's refusals, such as a stream being captured into
            # a graph, come before torch has written anything.)
            done = False  # whether torch wrote a pair
            try:
                if s is not None and not self._h2d and not waited:
                    # Pairs left to torch for autograd's sake: as above.
                    stream.wait_stream(torch.cuda.current_stream(stream.device))
                on = torch.cuda.stream(stream) if stream is not None else contextlib.nullcontext()
                # Under the caller's grad mode, as copy_ records them. D2H returns with the
                # bytes there: torch's copy waits too (non_blocking=False). The source is
                # reshaped to the destination's shape (the same elements, checked natively;
                # pinlane copies bytes in order where shapes differ, and copy_ would not
                # broadcast them).
                with on:
                    for i in left:
                        d = self._leaves[i]
                        d.copy_(srcs[i].reshape(d.shape), non_blocking=self._h2d)
                        done = True
            except (ValueError, TypeError) as e:
                if not (written or done):
                    raise  # nothing written: a refusal
                # Some pairs are written by now (pinlane's, or torch's before this one): not
                # a refusal, which `_copied` takes a ValueError or TypeError for (no version
                # bump). A tensor subclass whose `__torch_function__` gives up on `copy_`
                # raises TypeError here (session 87).
                raise RuntimeError(f"copy_into: a pair's copy by torch failed after others were written: {e}") from e

        with ctx:
            # The native half checks every pair (torch's too) before anything is written.
            _copied(
                self, self._native.copy_from, srcs, stream=s, maybe_neg=maybe_neg, grad=grad,
                torch_copies=torch_copies,
            )


class Pairs:
    """Sources bound to destinations, for a serving loop that refills the same host
    tensors every step (servers keep page-locked input buffers beside a CUDA graph's
    static inputs): both sides are checked and imported once, so each step is one call
    with nothing to pair, check or import.

    ::

        host = {"tokens": torch.zeros(256, dtype=torch.int64, pin_memory=True),
                "lens": torch.zeros(16, dtype=torch.int32)}
        step = pinlane.Pairs(static, host)      # once: copy_into(static, host)'s checks
        for batch in requests:
            host["tokens"][: len(batch)] = ...  # write the sources in place
            step.copy()                         # each step: as copy_into(static, host)
            graph.replay()

    ``dst`` is a structure of destinations (or a ``Buffers``), ``src`` the same structure
    of sources; the rules are ``copy_into``'s, and also:

    * each source is read in place at every ``copy``: it must be contiguous and without
      the negation bit, and of a dtype pinlane copies (else ``ValueError``; for complex,
      float8 ... use ``Buffers.copy_from``, which leaves those pairs to torch);
    * a pair whose source or destination requires grad is copied only under
      ``torch.no_grad()`` (else ``ValueError``, nothing written: ``copy_`` would record it
      for autograd, which ``Pairs`` cannot; ``Buffers.copy_from`` leaves it to torch);
    * destinations that overlap are a ``ValueError`` when the ``Pairs`` (or the
      ``Buffers`` it is made from) is made;
    * both sides are taken as they are now: a container changed later, or a tensor
      replaced or re-pointed (``set_``, ``.data =``), is not followed; writes into the
      tensors' memory are. No tensor of either side may be resized (``resize_``,
      ``untyped_storage().resize_``) while the ``Pairs`` exist: torch frees the old
      memory when it grows a storage, and pinlane would read or write freed memory;
    * a page-locked source of 64 KiB or more is read by the device after an H2D ``copy``
      returns: write it for the next step only once the stream has passed this step's
      copies (as with ``copy_(non_blocking=True)``); smaller and pageable sources are in
      pinlane's staging memory by the time ``copy`` returns.

    ``in_place=True`` (CPU to CUDA; a ``ValueError`` for CUDA sources) extends the last
    rule to every source: the device reads each where it is, with no host copy into
    pinlane's staging memory at each step (the step's one kernel launch reads most of
    those under 4 MiB; larger ones, and one to three of 64 KiB or more with nothing small
    beside them, take a copy of their own). Page-locked sources (``pin_memory()``)
    are read as they are; pageable ones are page-locked in place when the ``Pairs`` is
    made (``cuMemHostRegister``, sources that share a page of memory as one range: the
    rest of those pages is page-locked with them, and torch's ``is_pinned()`` says so of
    other tensors there too while the ``Pairs`` lives) until it is gone. A source under
    64 KiB that the kernel cannot read at full speed (its address or its destination's
    not a multiple of 16 bytes), or on a device that does not map host memory, is still
    staged at each ``copy``. So write a source for the
    next step only once the stream has passed the step's copies
    (``torch.cuda.current_stream().synchronize()``, or an event), as after
    ``copy_(non_blocking=True)``; a loop that synchronises every step, or double-buffers
    its inputs, already does. While the ``Pairs`` lives, torch sees those sources as
    page-locked (``is_pinned()``); a second ``Pairs`` (or a ``copy_into``) given them
    shares the registration, which lasts until every one of them is gone; torch's own
    ``copy_(non_blocking=True)`` of such a source does not hold it, so let those copies
    finish before the last ``Pairs`` goes. Memory
    another library page-locked in place can make the registration fail: a
    ``RuntimeError`` then. Binding in place costs about one copy of the pageable
    sources, once.
    """

    def __init__(self, dst: Any, src: Any, /, *, in_place: bool = False) -> None:
        bufs = dst if isinstance(dst, Buffers) else Buffers(dst)
        self._torch = bufs._torch
        srcs = bufs._sources(src)
        if _fwad._current_level >= 0:
            _refuse_tangents("Pairs", srcs, bufs._leaves)
        self._native = _native.Pairs(bufs._native, srcs, in_place=bool(in_place))
        self._written, self._bump = bufs._written, bufs._bump
        # Asked again at each copy inside a dual level: a source written in place from a
        # dual tensor carries a tangent from then on.
        self._sides = (srcs, bufs._leaves)

    def __len__(self) -> int:
        return len(self._native)

    def copy(self, *, stream: torch.cuda.Stream | None = None) -> None:
        """Copies every source, as it is now, into its destination, on ``stream`` (a
        ``torch.cuda.Stream`` of the CUDA side's device) or torch's current stream there:
        see ``copy_into``."""
        if _fwad._current_level >= 0:
            _refuse_tangents("Pairs", *self._sides)
        s = None if stream is None else _stream_arg(self._torch, stream)
        _copied(self, self._native.copy, stream=s, grad=self._torch.is_grad_enabled())
