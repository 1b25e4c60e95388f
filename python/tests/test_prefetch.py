"""pinlane.prefetch on any machine: without torch or a GPU a batch comes back as is, so
the helper's order, errors, bounds and shutdown are tested here with plain objects (the
GPU machine runs it with torch tensors in test_integrations_gpu.py)."""

import threading
import time

import pytest

import pinlane


def test_batches_come_in_order_and_the_iteration_ends():
    batches = [{"x": i, "y": [i, i + 1]} for i in range(20)]
    got = list(pinlane.prefetch(batches, depth=3))
    assert got == batches


def test_an_error_from_the_source_comes_after_the_batches_before_it():
    class Boom(Exception):
        pass

    def source():
        yield 1
        yield 2
        raise Boom("the third batch")

    it = pinlane.prefetch(source())
    assert next(it) == 1 and next(it) == 2
    with pytest.raises(Boom, match="third"):
        next(it)
    with pytest.raises(StopIteration):  # and it stays ended
        next(it)


def _counting(taken):
    """A source of 100 batches that appends each to ``taken`` as it gives it."""
    for i in range(100):
        taken.append(i)
        yield i


def _settled(taken, n):
    """``len(taken)`` once it reached ``n`` (or 5 s passed) and stayed 0.3 s more."""
    deadline = time.monotonic() + 5
    while len(taken) < n and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.3)
    return len(taken)


def test_the_worker_stays_at_most_depth_batches_ahead():
    taken = []
    it = pinlane.prefetch(_counting(taken), depth=2)
    assert next(it) == 0
    # The one handed out, and `depth` moved ahead: no more (a worker blocked on a full
    # queue used to hold one more).
    assert _settled(taken, 3) == 1 + 2, taken
    assert next(it) == 1
    assert _settled(taken, 4) == 2 + 2, taken
    assert it.close()


def test_close_lets_go_of_the_batches_ahead_and_asks_the_source_for_no_more():
    taken = []
    for _ in range(20):
        taken.clear()
        it = pinlane.prefetch(_counting(taken), depth=1)
        assert next(it) == 0
        time.sleep(0.05)
        n = len(taken)
        assert it.close()
        # Before: a worker waiting to put its batch put it once close() emptied the
        # queue, so a batch stayed queued, and it asked the source for one more.
        assert it._queue.empty()
        assert len(taken) == n, (n, taken)


def test_a_transfer_that_raises_stopiteration_is_an_error_not_the_end(monkeypatch):
    real = pinlane.transfer_tensor_h2d

    def transfer(batch, **kw):
        if batch == 2:
            raise StopIteration("from inside a transfer")
        return real(batch, **kw)

    monkeypatch.setattr(pinlane, "transfer_tensor_h2d", transfer)
    it = pinlane.prefetch(range(5))
    assert next(it) == 0 and next(it) == 1
    with pytest.raises(RuntimeError, match="StopIteration"):
        next(it)  # was the silent end of the batches: list(...) gave [0, 1]


def test_close_is_bounded_when_the_source_is_stuck():
    release, inside = threading.Event(), threading.Event()

    def source():
        yield 0
        inside.set()
        release.wait(20)  # stuck in the user's iterator
        yield 1

    it = pinlane.prefetch(source())
    assert next(it) == 0
    assert inside.wait(5)  # the worker asks for batch 1 once batch 0 is taken
    t0 = time.monotonic()
    assert it.close(timeout=0.2) is False  # the worker is still inside the source
    assert time.monotonic() - t0 < 2
    release.set()
    with pytest.raises(StopIteration):
        next(it)


def test_with_block_stops_the_worker():
    with pinlane.prefetch(iter(range(1000)), depth=1) as it:
        assert next(it) == 0
    assert not it._thread.is_alive()


@pytest.mark.parametrize("kw", [dict(depth=0), dict(depth=1.5), dict(depth=True), dict(num_caches=-1)])
def test_bad_arguments_are_value_errors(kw):
    with pytest.raises(ValueError):
        pinlane.prefetch([], **kw)


def test_an_iterator_dropped_without_close_stops_its_worker():
    # Regression: the worker held the Prefetcher, so it was never collected and the
    # worker polled forever (holding its batches and the source).
    import gc

    it = pinlane.prefetch(iter(range(1000)), depth=1)
    assert next(it) == 0
    thread = it._thread
    del it
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_close_from_another_thread_ends_a_waiting_next():
    release = threading.Event()

    def source():
        yield 0
        release.wait(20)
        yield 1

    it = pinlane.prefetch(source())
    assert next(it) == 0
    threading.Timer(0.2, lambda: it.close(timeout=0.1)).start()
    with pytest.raises(StopIteration):
        next(it)  # was a RuntimeError once the worker had gone
    release.set()


def test_an_interrupt_as_a_batch_is_taken_loses_no_place():
    # A KeyboardInterrupt (a signal's handler) may land right after the queue gave the
    # consumer its batch: that batch is lost with the interrupt, but the caller may catch
    # it and go on. Before: the place it held was never given back, so at depth 1 the
    # worker moved nothing more and the next `next()` waited for ever.
    taken = []
    it = pinlane.prefetch(_counting(taken), depth=1)
    assert next(it) == 0
    real_get = it._queue.get
    interrupted = []

    def get_then_interrupt(*args, **kwargs):
        item = real_get(*args, **kwargs)
        if not interrupted:
            interrupted.append(item)
            raise KeyboardInterrupt
        return item

    it._queue.get = get_then_interrupt
    with pytest.raises(KeyboardInterrupt):
        next(it)
    assert interrupted == [1]
    got = []
    reader = threading.Thread(target=lambda: got.extend(next(it) for _ in range(3)), daemon=True)
    reader.start()
    reader.join(5)
    assert got == [2, 3, 4], "the iteration went on after the interrupt"
    assert it.close()


def _giving_back(monkeypatch):
    """The exceptions `prefetch` gives back for the device's next call, in order (the
    native half's `put_back_unreceived` replaced by a recorder)."""
    given = []
    monkeypatch.setattr(pinlane._native, "put_back_unreceived", given.append)
    return given


def _earlier_error():
    """What a pinlane call raises for an error recorded on the device by earlier work:
    an exception holding that error (here a stand-in for the native object)."""
    err = RuntimeError("a driver error recorded by earlier work")
    setattr(err, pinlane._native.UNRECEIVED, object())
    return err


@pytest.mark.parametrize("when", ["met while closing", "queued, never taken", "queued, dropped unclosed"])
def test_an_earlier_error_nobody_took_is_given_back(monkeypatch, when):
    # Somebody else's error, taken from the device's record by the worker's transfer: a
    # consumer that closes the prefetcher before taking it must not make it vanish (the
    # Rust Prefetcher keeps it the same way). Before: dropped with the queue.
    given = _giving_back(monkeypatch)
    err = _earlier_error()
    moving, made, its = threading.Event(), threading.Event(), []

    def transfer(batch, **kw):
        if batch == 1:
            if when == "met while closing":
                moving.set()
                assert made.wait(5)
                assert its[0]._stop.wait(5)  # the consumer closes while this one moves
            raise err
        return batch

    monkeypatch.setattr(pinlane, "transfer_tensor_h2d", transfer)
    it = pinlane.prefetch(range(5), depth=2)
    its.append(it)
    made.set()
    assert next(it) == 0
    if when == "met while closing":
        assert moving.wait(5)
    else:
        it._thread.join(5)  # the worker put the error in the queue and ended
        assert not it._thread.is_alive()
        assert given == []  # the consumer may still take it
    if when == "queued, dropped unclosed":
        # A `for` loop left with `break` does not close the iterator: its drop does.
        import gc

        its.clear()
        del it
        gc.collect()
    else:
        assert it.close()
    assert given == [err]


def test_an_error_the_consumer_took_is_not_given_back(monkeypatch):
    given = _giving_back(monkeypatch)
    err = _earlier_error()

    def transfer(batch, **kw):
        if batch == 1:
            raise err
        return batch

    monkeypatch.setattr(pinlane, "transfer_tensor_h2d", transfer)
    it = pinlane.prefetch(range(5))
    assert next(it) == 0
    with pytest.raises(RuntimeError, match="earlier work"):
        next(it)
    assert it.close()
    assert given == []


def test_an_earlier_error_the_source_raised_is_not_given_back(monkeypatch):
    # The source's own pinlane calls may have gone to any device: only the worker's
    # transfers' errors are given back (for the device it moves to).
    given = _giving_back(monkeypatch)

    def source():
        yield 0
        raise _earlier_error()

    it = pinlane.prefetch(source(), depth=2)
    assert next(it) == 0
    it._thread.join(5)
    assert it.close()
    assert given == []


def test_the_native_give_back_finds_nothing_in_other_exceptions():
    # An exception no pinlane call raised for an earlier error (the source's, a stand-in
    # whose holder is no native object) holds nothing to give back.
    assert pinlane._native.put_back_unreceived(RuntimeError("the source's")) is False
    assert pinlane._native.put_back_unreceived(_earlier_error()) is False
