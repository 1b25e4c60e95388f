"""``pinlane.prefetch``: the next batches moved to the GPU on a background thread while
the caller uses the current one."""

from __future__ import annotations

import queue
import sys
import threading
from collections.abc import Iterable
from typing import Generic, TypeVar

T = TypeVar("T")

__all__ = ["prefetch", "Prefetcher"]

_DONE = object()


class _Failure:
    """An exception raised on the worker thread, handed to the consumer; `moving`:
    raised by the worker's own transfer (not the source's)."""

    def __init__(self, exc, moving=False):
        self.exc = exc
        self.moving = moving


def prefetch(batches: Iterable[T], *, depth: int = 1, num_caches: int = 4) -> Prefetcher[T]:
    """Iterates over ``batches`` (any iterable of host batches: a ``DataLoader``, a
    generator, a list) with each batch already moved by ``transfer_tensor_h2d``: a
    background thread moves up to ``depth`` batches ahead of the one the caller is using,
    so the copy of batch *n + 1* overlaps the work on batch *n*.

    * Each batch is what ``transfer_tensor_h2d(batch, num_caches=num_caches)`` gives,
      same structure and semantics, in the source's order.
    * The outputs' memory is freed in order on the stream that was torch's current stream
      of the device when ``prefetch`` was called (the worker makes it its own current
      stream), so use the batches there, as with the blocking call. The worker also runs
      under the grad and inference modes the caller had then (a tensor that requires grad
      is moved by torch's ``.to()``, which records autograd only where grad is on, as on
      the caller's thread).
    * An exception from the source or from a transfer is raised by the ``next()`` that
      would have returned that batch; the batches before it come first.
    * At most ``depth`` moved batches are ahead of the caller (waiting, or being moved),
      plus the ``num_caches`` most recent ones the worker thread keeps referenced (see
      ``transfer_tensor_h2d``): the worker asks the source for a batch only when fewer
      than ``depth`` are ahead.
    * ``close()`` (or leaving a ``with`` block, or the end of the iteration) stops the
      worker and lets go of the batches it moved ahead: it waits up to ``timeout`` seconds
      (10 by default) for the worker to leave the source; a worker still inside the
      source's ``next()`` then is left to finish on its own (it is a daemon thread, lets
      go of that batch and asks the source for no other). An error that nobody took then
      is dropped, but for one recorded by earlier work on the device (an error a pinlane
      call met before it touched the batch, raised in the batch's place): that one goes
      back to be raised by the device's next pinlane call on any thread.

    Example::

        loader = torch.utils.data.DataLoader(dataset, batch_size=64, num_workers=4)
        with pinlane.prefetch(loader) as batches:
            for batch in batches:          # already on cuda:{LOCAL_RANK}
                loss = model(batch["image"]).sum()

    Raises:
        ValueError: ``depth`` is not an int >= 1, or ``num_caches`` not an int >= 0.
    """
    return Prefetcher(batches, depth=depth, num_caches=num_caches)


def _int_at_least(name, value, least):
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{name} must be an int >= {least}, not {value!r}")
    return value


def _take_place(q, depth, taken, stop):
    """Waits until fewer than `depth` moved batches wait in `q` (so that the one the
    worker moves next makes at most `depth` ahead of the consumer), unless `stop` is set
    first; says whether the worker may go on. `taken` is notified by the consumer as it
    takes a batch; the wait also looks again every 50 ms, so a notification lost (an
    interrupt between the consumer's `get` and its notify) only delays the worker."""
    with taken:
        while not stop.is_set():
            if q.qsize() < depth:
                return True
            taken.wait(0.05)
    return False


def _unreceived(item):
    """Lets go of `item`, which nobody will take (the prefetcher is closed): an error
    recorded by earlier work that a transfer raised (somebody else's error, which the
    transfer took from the device's record) is given back for the device's next call on
    any thread, as the Rust ``Prefetcher`` does (session 87: before, it was lost)."""
    if isinstance(item, _Failure) and item.moving:
        # Only the worker's own transfer's, on the device the worker moves to (the
        # source's own pinlane calls may have gone to any device).
        from . import _native

        _native.put_back_unreceived(item.exc)


def _drain(q):
    """Lets go of every batch waiting in `q`, and of an error nobody took (`_unreceived`)."""
    while True:
        try:
            _unreceived(q.get_nowait())
        except queue.Empty:
            return


def _work(source, stream, modes, q, depth, taken, stop, num_caches):
    """The worker. It holds the queue, its condition and the stop flag, not the
    `Prefetcher`, so an iterator the caller drops without `close()` is collected, and its
    `__del__` stops it. `modes`: the caller's (grad enabled, inference mode), or None
    without torch.

    It asks the source for a batch only while fewer than `depth` moved batches wait in
    the queue: with the one it moves, at most `depth` are ahead of the consumer, and a
    stopped worker asks the source for nothing more. The bound is the queue's own length,
    so nothing the consumer must give back can be lost (session 79's semaphore lost a
    place to an interrupt between the consumer's `get` and its release)."""
    import contextlib

    from . import transfer_tensor_h2d

    end = _DONE
    moving = False
    try:
        torch = sys.modules.get("torch")
        with contextlib.ExitStack() as ctx:
            if stream is not None:
                ctx.enter_context(torch.cuda.stream(stream))
            if modes is not None:
                ctx.enter_context(torch.inference_mode(modes[1]))
                ctx.enter_context(torch.set_grad_enabled(modes[0]))
            while _take_place(q, depth, taken, stop):
                batch = next(source, _DONE)
                if batch is _DONE or stop.is_set():
                    break
                moving = True
                moved = transfer_tensor_h2d(batch, num_caches=num_caches)
                moving = False
                q.put(moved)
                batch = moved = None
    except BaseException as e:  # noqa: BLE001 - handed to the consumer, raised there
        end = _Failure(e, moving)
        # The exception's traceback holds this frame: let go of the source and the batch
        # (a DataLoader's workers) for as long as the caller keeps the exception.
        source = batch = moved = None  # noqa: F841
    if stop.is_set():
        # Closed: nothing moved stays behind in the queue, and an error of the worker's
        # own nobody will take is let go of as one in the queue is.
        _unreceived(end)
        _drain(q)
    else:
        q.put(end)
        if stop.is_set():
            # Stopped as it was put: a `__del__` may have drained the queue before it.
            _drain(q)


class Prefetcher(Generic[T]):
    """The iterator ``prefetch`` returns; see there."""

    def __init__(self, batches: Iterable[T], *, depth: int = 1, num_caches: int = 4) -> None:
        from . import _native, _torch_with_cuda

        depth = _int_at_least("depth", depth, 1)
        num_caches = _int_at_least("num_caches", num_caches, 0)
        source = iter(batches)
        torch = _torch_with_cuda()
        # The consumer's current stream, made the worker's: the outputs are freed in order
        # there, as a blocking call on this thread would free them.
        stream = torch.cuda.current_stream(_native.default_device()) if torch else None
        modes = (torch.is_grad_enabled(), torch.is_inference_mode_enabled()) if torch else None
        # Unbounded: the worker bounds the batches in it (`_take_place`; the end or an
        # error is put past the bound).
        self._queue = queue.Queue()
        self._taken = threading.Condition()
        self._stop = threading.Event()
        self._finished = False
        self._thread = threading.Thread(
            target=_work,
            args=(source, stream, modes, self._queue, depth, self._taken, self._stop, num_caches),
            name="pinlane-prefetch-py", daemon=True,
        )
        self._thread.start()

    def __iter__(self) -> Prefetcher[T]:
        return self

    def __next__(self) -> T:
        if self._finished:
            raise StopIteration
        while True:  # at the source's pace, for as long as the worker lives
            try:
                item = self._queue.get(timeout=0.1)
                break
            except queue.Empty:
                if self._finished:  # closed meanwhile, from another thread
                    raise StopIteration from None
                if not self._thread.is_alive() and self._queue.empty():
                    self._finished = True
                    raise RuntimeError("pinlane.prefetch: the worker thread ended without a batch or an error") from None
        if item is _DONE:
            self.close()
            raise StopIteration
        if isinstance(item, _Failure):
            self.close()
            if isinstance(item.exc, StopIteration):
                # Raised here it would read as the end of the batches (PEP 479's case).
                raise RuntimeError("pinlane.prefetch: moving a batch raised StopIteration") from item.exc
            raise item.exc
        with self._taken:  # the worker may move one more
            self._taken.notify()
        return item

    def close(self, timeout: float = 10.0) -> bool:
        """Stops the worker and drops the batches it moved ahead; waits up to `timeout`
        seconds for it to exit and says whether it did."""
        self._finished = True
        self._stop.set()
        _drain(self._queue)
        self._thread.join(timeout)
        # A batch the worker put after the first drain (it lets go of its own once it
        # sees the stop, which it may not before `timeout`).
        _drain(self._queue)
        return not self._thread.is_alive()

    def __enter__(self) -> Prefetcher[T]:
        return self

    def __exit__(self, *exc: object) -> bool:
        self.close()
        return False

    def __del__(self) -> None:
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()
            # Dropped without `close()` (a `for` loop left with `break`): what the worker
            # left in the queue is let go of as `close()` would (session 87: an error
            # recorded by earlier work waiting there was lost). Not at the interpreter's
            # exit, when no call is left to report it to.
            # Nor on the worker's own thread (a collection it set off): it may hold the
            # queue's lock there, and drains once it sees the stop anyway.
            if not sys.is_finalizing() and threading.current_thread() is not self._thread:
                _drain(self._queue)
