"""GPU tests skip without torch or a GPU, with a message; with PINLANE_REQUIRE_GPU=1 (as
on the GPU machine) they fail instead, so a broken setup cannot pass as skipped."""

import os
import subprocess
import sys

import pytest


@pytest.fixture(scope="session")
def torch():
    """torch with a CUDA device that pinlane can use too."""
    required = os.environ.get("PINLANE_REQUIRE_GPU") == "1"
    try:
        import torch as t
    except ImportError as e:
        if required:
            pytest.fail(f"PINLANE_REQUIRE_GPU=1 but torch cannot be imported: {e}")
        pytest.skip("torch is not installed")
    import pinlane

    if not (t.cuda.is_available() and pinlane.cuda_available()):
        why = f"torch sees CUDA: {t.cuda.is_available()}; pinlane: {pinlane._native.unavailable_reason()}"
        if required:
            pytest.fail(f"PINLANE_REQUIRE_GPU=1 but no usable GPU ({why})")
        pytest.skip(f"no GPU ({why})")
    return t


@pytest.fixture(scope="session")
def new_process():
    """Runs Python ``code`` with this interpreter in a process of its own (for what must
    come before a process's first transfer, or at its exit) and returns the finished
    process (``stdout``, ``stderr``); fails the test, with both, when it exits nonzero."""

    def run(code, timeout=120):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
        assert r.returncode == 0, r.stdout + r.stderr
        return r

    return run
