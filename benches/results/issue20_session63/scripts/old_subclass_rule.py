# Session 63: the premise of the subclass fix. Under the old rule (only __torch_function__
# compared) Rewrapped counted as plain and pinlane moved it, giving a torch.Tensor; torch's
# .to() gives Rewrapped.
import torch
import pinlane

class Rewrapped(torch.Tensor):
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        with torch._C._DisableTorchDispatch():
            out = func(*args, **(kwargs or {}))
        return torch.Tensor._make_subclass(cls, out) if type(out) is torch.Tensor else out

x = torch.Tensor._make_subclass(Rewrapped, torch.arange(9, dtype=torch.int16))
dev = f"cuda:{pinlane._native.default_device()}"
print("old rule says plain:", Rewrapped.__torch_function__ is torch._C._disabled_torch_function_impl)
print("dispatch disabled:", Rewrapped.__torch_dispatch__ is torch._C._disabled_torch_dispatch_impl)
print("torch .to() gives:", type(x.to(dev)).__name__)
print("pinlane now gives:", type(pinlane.transfer_tensor_h2d(x)).__name__,
      type(pinlane.transfer_tensor_h2d([x])[0]).__name__)
