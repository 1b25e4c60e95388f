"""GPU tests skip without torch or a GPU, with a message; with PINLANE_REQUIRE_GPU=1 (as
on the GPU machine) they fail instead, so a broken setup cannot pass as skipped."""

import os

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
