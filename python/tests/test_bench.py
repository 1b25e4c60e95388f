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
    # The large batches' ways, and the limit's copy, are timed in rounds (no torch needed).
    from pinlane import bench

    log = []

    def way(name):
        return lambda r: log.append((name, r))

    out = bench.rounds([("limit", way("limit"), 3), ("a", way("a"), 3), ("slow", way("slow"), 1)])
    w = bench.WARMUPS
    # Warm-up rounds are run but not timed; then each way is timed `count` times.
    assert {name: len(v) for name, (v, _) in out.items()} == {"limit": 3, "a": 3, "slow": 1}
    assert [n for n, _ in log].count("slow") == w + 1
    assert [n for n, _ in log].count("a") == w + 3
    # Within a round every way runs once, starting one further along each round.
    first = [next(n for n, r in log if r == k) for k in range(w + 3)]
    assert first[:3] == ["limit", "a", "slow"]
    assert all(cpu >= 0 for _, cpu in out.values())
    assert all(t >= 0 for v, _ in out.values() for t in v)
