"""`python -m pinlane.bench` where it cannot measure (CI: no torch, no GPU): it says why
and exits 0. The GPU machine runs it for real in test_integrations_gpu.py."""

import subprocess
import sys

import pytest


def test_bench_without_a_gpu_says_so_and_exits_0():
    try:
        import torch

        if torch.cuda.is_available():
            pytest.skip("a GPU is here: test_integrations_gpu.py runs the bench")
    except ImportError:
        pass
    out = subprocess.run([sys.executable, "-m", "pinlane.bench", "--quick"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "nothing to" in out.stdout, out.stdout


def test_bench_rejects_a_bad_batch_spec():
    try:
        import torch  # noqa: F401
    except ImportError:
        pytest.skip("the spec is parsed once torch is there")
    from pinlane import bench

    with pytest.raises(SystemExit, match="COUNT x SHAPE"):
        bench.parse_batch(__import__("torch"), "64x3x:uint8")
    with pytest.raises(SystemExit, match="COUNT x SHAPE"):
        bench.parse_batch(__import__("torch"), "4x4:notadtype")
    for empty in ("0x4:float32", "4x0:float32"):  # no bytes: nothing to time (was a ZeroDivisionError)
        with pytest.raises(SystemExit, match="1 or more"):
            bench.parse_batch(__import__("torch"), empty)
    name, sources, _ = bench.parse_batch(__import__("torch"), "2 x 3 : uint8")  # spaces, as the help writes it
    assert name == "2 x 3 uint8" and sources[0][0].shape == (3,)


def test_rounds_take_turns_and_time_each_call_its_count():
    # The large batches' D2H ways, the limit's copy and the floor are timed in rounds (no
    # torch needed).
    import time

    from pinlane import bench

    w = bench.WARMUPS
    log = []

    def way(name):
        def call(r):
            log.append((name, r))
            if r >= w:
                time.sleep(0.002)  # only the timed rounds: timing a warm-up call shows

        return call

    names = ["limit", "a", "b", "c", "d", "half", "slow"]
    counts = {"limit": 6, "a": 6, "b": 6, "c": 6, "d": 6, "half": 3, "slow": 2}
    out = bench.rounds([(n, way(n), counts[n]) for n in names])
    assert {n: len(v) for n, (v, _) in out.items()} == counts
    assert all(t >= 0.002 for v, _ in out.values() for t in v), "a warm-up call was timed"
    assert all(cpu >= 0 for _, cpu in out.values())
    by_round = {}
    for n, r in log:
        by_round.setdefault(r, []).append(n)
    assert sorted(by_round) == list(range(w + 6))
    for r, called in by_round.items():
        assert len(called) == len(set(called)), f"round {r} called a way twice"
        if r < w:
            assert sorted(called) == sorted(names), "every way warms up in every warm-up round"
    # Fewer calls are spread over the rounds, not bunched at their start.
    assert [r - w for r, called in sorted(by_round.items()) if r >= w and "half" in called] == [0, 2, 4]
    assert [r - w for r, called in sorted(by_round.items()) if r >= w and "slow" in called] == [0, 3]
    # The order changes from round to round: a way does not always follow the same one.
    before = {n: set() for n in names}
    for called in by_round.values():
        for prev, n in zip([None] + called, called):
            before[n].add(prev)
    assert all(len(b) >= 2 for n, b in before.items() if n not in ("half", "slow"))


def test_rounds_in_blocks_call_each_way_its_block_in_a_row():
    # The small batches are timed in rounds of blocks: each way `block` calls in a row per
    # round, each call timed, the ways' order shuffled per round.
    from pinlane import bench

    w = bench.WARMUPS
    log = []

    def way(name):
        return lambda r: log.append((name, r))

    names = ["a", "b", "c", "few"]
    counts = {"a": 4, "b": 4, "c": 4, "few": 2}
    out = bench.rounds([(n, way(n), counts[n]) for n in names], seed=3, block=5)
    assert {n: len(v) for n, (v, _) in out.items()} == {n: 5 * c for n, c in counts.items()}
    # Calls come in runs of exactly `block` of one way, one run per way and round.
    runs = []
    for name, r in log:
        if runs and runs[-1][0] == (name, r):
            runs[-1][1] += 1
        else:
            runs.append([(name, r), 1])
    assert all(k == 5 for _, k in runs), runs
    assert len(runs) == len({key for key, _ in runs}), "a way was called twice in one round"
    orders = {}
    for (name, r), _ in runs:
        orders.setdefault(r, []).append(name)
    assert len({tuple(o) for r, o in orders.items() if r < w}) >= 2, "the order never changed"
