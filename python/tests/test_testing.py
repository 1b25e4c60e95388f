"""pinlane.testing: the strategies and assert_round_trip on the GPU machine (torch and a
GPU); that it finds what it should (a changed byte, a swapped pair, a missing GPU) with
the place named. Importing it needs neither torch nor hypothesis (checked anywhere)."""

import sys

import pytest
from hypothesis import HealthCheck, given, settings

import pinlane


def test_importing_needs_neither_torch_nor_hypothesis(new_process):
    code = "import sys, pinlane.testing; assert 'torch' not in sys.modules and 'hypothesis' not in sys.modules"
    new_process(code)


def test_random_batches_round_trip(torch):
    from pinlane.testing import assert_round_trip, batches, tensors

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
    @given(batches(leaves=tensors(pinned=None)))
    def check(batch):
        assert_round_trip(batch)

    check()


def test_a_changed_byte_is_named_with_its_place(torch):
    from pinlane.testing import first_difference

    sent = {"images": [torch.full((4,), float(i)) for i in range(4)], "label": torch.tensor(7)}
    back = {"images": [t.clone() for t in sent["images"]], "label": sent["label"]}
    back["images"][3][1] = 9.0
    assert first_difference(sent, back) == (
        "['images'][3]: byte 6 differs: element 1 (torch.float32) is 9.0 [00 00 10 41], "
        "sent as 3.0 [00 00 40 40]")
    assert first_difference(sent, {"images": sent["images"], "label": sent["label"]}) is None
    assert first_difference(sent, {"label": sent["label"], "images": sent["images"]}).startswith(
        "(the batch itself): keys ['label', 'images']")
    assert "shape [5], sent as [4]" in first_difference([sent["images"][0]], [torch.zeros(5)])


def test_a_broken_transfer_fails_the_assertion(torch, monkeypatch):
    from pinlane.testing import assert_round_trip

    real = pinlane.transfer_tensor_d2h

    def swapping(batch, **kw):  # a bug: the two tensors come back the other way round
        out = real(batch, **kw)
        return {"a": out["b"], "b": out["a"]}

    monkeypatch.setattr(pinlane, "transfer_tensor_d2h", swapping)
    batch = {"a": torch.arange(8, dtype=torch.int32), "b": torch.arange(8, 16, dtype=torch.int32)}
    with pytest.raises(AssertionError, match=r"after the round trip: \['a'\]: byte 0 differs"):
        assert_round_trip(batch)


def test_no_gpu_is_not_a_pass(torch, monkeypatch):
    from pinlane.testing import assert_round_trip

    monkeypatch.setattr(pinlane, "cuda_available", lambda: False)
    with pytest.raises(AssertionError, match="no GPU here"):
        assert_round_trip([torch.zeros(3)])
    assert_round_trip([torch.zeros(3)], allow_no_gpu=True)


def test_negated_and_conjugated_tensors_are_compared_by_value(torch):
    # Regression (session 79): `view(torch.uint8)` refused a tensor with torch's lazy
    # negation or conjugation bit, so the comparison raised instead of comparing.
    from pinlane.testing import first_difference

    z = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    assert first_difference({"z": z.conj()}, {"z": z.conj().resolve_conj()}) is None
    assert first_difference({"z": z.conj()}, {"z": z}).startswith("['z']: byte 7 differs")
    n = torch._neg_view(torch.tensor([1.0, -2.0]))
    assert first_difference([n], [torch.tensor([-1.0, 2.0])]) is None
    assert first_difference([n], [torch.tensor([-1.0, 3.0])]).startswith("[0]: byte 6 differs")


def test_a_batch_already_on_the_gpu_is_refused_not_compared_with_itself(torch):
    # Regression (session 79): transfer_tensor_h2d returns a CUDA tensor as it is, so the
    # H2D check compared each tensor with itself.
    from pinlane.testing import assert_round_trip

    with pytest.raises(ValueError, match=r"\['x'\]\[1\] is on cuda"):
        assert_round_trip({"x": [torch.ones(2), torch.ones(4, device="cuda")]})


def test_requires_grad_and_tangents_are_compared(torch):
    # A transfer that dropped autograd (requires_grad) or a forward-mode AD tangent gave
    # back the right bytes, and the comparison used to find no difference.
    from torch.autograd import forward_ad as fwAD

    from pinlane.testing import assert_round_trip, first_difference

    w = torch.ones(3, requires_grad=True)
    assert first_difference([w], [w.detach().clone()]) == "[0]: requires_grad False, sent as True"
    assert first_difference([w], [w.detach().clone().requires_grad_()]) is None
    x, dx = torch.arange(4.0), torch.full((4,), 0.5)
    with fwAD.dual_level():
        d = fwAD.make_dual(x, dx)
        assert first_difference({"d": d}, {"d": x.clone()}) == (
            "['d']: no forward-mode AD tangent came back, one was sent")
        assert first_difference({"d": x}, {"d": d}) == "['d']: a forward-mode AD tangent came back, none was sent"
        assert first_difference({"d": d}, {"d": fwAD.make_dual(x.clone(), dx * 2)}).startswith(
            "['d'] (its tangent): byte 2 differs")
        assert first_difference({"d": d}, {"d": fwAD.make_dual(x.clone(), dx.clone())}) is None
        # pinlane's transfers move the tangent (torch moves such a tensor).
        assert_round_trip({"d": d, "plain": torch.arange(5), "w": w})
