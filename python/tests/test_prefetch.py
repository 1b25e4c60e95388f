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


def test_the_worker_stays_at_most_depth_batches_ahead():
    taken = []

    def source():
        for i in range(100):
            taken.append(i)
            yield i

    it = pinlane.prefetch(source(), depth=2)
    assert next(it) == 0
    time.sleep(0.3)
    # One being handed out, `depth` in the queue, one the worker holds waiting to put.
    assert len(taken) <= 1 + 2 + 1, taken
    assert it.close()


def test_close_is_bounded_when_the_source_is_stuck():
    release = threading.Event()

    def source():
        yield 0
        release.wait(20)  # stuck in the user's iterator
        yield 1

    it = pinlane.prefetch(source())
    assert next(it) == 0
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
