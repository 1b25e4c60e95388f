"""Check (session 51): does `test_rows_of_a_run_are_independent_tensors_to_autograd`
(python/tests/test_torch_gpu.py) fail without the split guard? The test skips where torch
lacks `_AutoDispatchBelowADInplaceOrView`, so this runs its body twice in one process:
with the name in `torch._C` (the package's way) and with it removed (runs split into views
of one base, as before session 51), and says for each side whether backward raised.

    bash .gpu/with-python python3 benches/probes/rows_autograd_without_guard.py   # GPU
"""

import torch

import pinlane

NAME = "_AutoDispatchBelowADInplaceOrView"


def body():
    xs = [torch.arange(8, dtype=torch.float32) + 10 * i for i in range(32)]
    on = pinlane.transfer_tensor_h2d(xs, num_caches=0)
    back = pinlane.transfer_tensor_d2h(on)
    out = {}
    for side, outs in (("H2D", on), ("D2H", back)):
        w = torch.ones(8, device=outs[2].device, requires_grad=True)
        loss = (outs[2] * w).sum()
        outs[3].add_(1)
        try:
            loss.backward()
            out[side] = "backward ran" if torch.equal(w.grad.cpu(), outs[2].cpu()) else "wrong grad"
        except RuntimeError as e:
            out[side] = f"backward raised: {str(e).splitlines()[0][:90]}"
        out[side] += f" (outputs are views: {outs[0]._is_view()})"
    return out


def main():
    guard = getattr(torch._C, NAME)
    print("guard present:", body(), flush=True)
    delattr(torch._C, NAME)
    try:
        print("guard removed:", body(), flush=True)
    finally:
        setattr(torch._C, NAME, guard)


if __name__ == "__main__":
    main()
