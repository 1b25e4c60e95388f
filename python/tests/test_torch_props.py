"""Property tests of the two calls against torch itself, on a GPU (the GPU machine runs
them with PINLANE_REQUIRE_GPU=1; elsewhere they skip).

Random nested batches (every container the calls accept, empty ones included) of random
tensors (every dtype torch can move to CUDA, found at start; 0-dim and zero-size shapes;
transposed, stepped, sliced, selected, expanded and overlapping views; negated and
conjugate views; tensors sharing storage and the same tensor twice; tensors that require
grad; page-locked and pageable sources; tensors already on the far side) go through
``transfer_tensor_h2d``, ``transfer_tensor_d2h`` and both in turn, and every output is
compared bit for bit with torch's own ``.to(device)`` / ``.cpu()`` of the same tensor;
structure, the identity of everything not moved, dtype, device, contiguity, ``is_pinned()``
and ``requires_grad`` are checked as documented, and the inputs must come out unchanged.
The same with the values written by a producer on another stream (``producer_event``),
with a custom ``stream=``, and from 8 threads at once while another thread keeps the GPU
busy.

Every case is made from its own seed, so one case can be run again alone; a failing run
lists each failing case (up to 10) with the batch leaf by leaf and the command to rerun it:

    PINLANE_PROP_SEED=<seed> PINLANE_PROP_CASES=1 python -m pytest python/tests/test_torch_props.py -k <test>

PINLANE_PROP_CASES sets the cases of each test (default 400; the threaded test runs it
split over its threads, the producer tests a quarter each).
"""

import collections
import dataclasses
import os
import random
import re
import threading
import traceback

import pytest

import pinlane
from pinlane import transfer_tensor_d2h, transfer_tensor_h2d
from pinlane._tree import flatten
# A CPU tensor of random bytes (NaN patterns included), bool as 0/1: the GPU tests' own.
from test_torch_gpu import pattern

CASES = int(os.environ.get("PINLANE_PROP_CASES", "400"))
SEED = int(os.environ.get("PINLANE_PROP_SEED", "20261201"))

# What pinlane moves itself (the rest goes to torch's .to()): README, "What the two calls do".
PINLANE_DTYPE_NAMES = {"bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "uint32",
                       "uint64", "float16", "bfloat16", "float32", "float64"}
CANDIDATE_DTYPE_NAMES = sorted(PINLANE_DTYPE_NAMES) + [
    "complex32", "complex64", "complex128", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz",
    "float8_e5m2fnuz", "float8_e8m0fnu", "float4_e2m1fn_x2", "bits8", "bits16", "bits1x8",
    "bits2x4", "bits4x2", "uint1", "uint2", "uint3", "uint4", "uint5", "uint6", "uint7", "int1",
    "int2", "int3", "int4", "int5", "int6", "int7", "quint8", "qint8", "qint32"]
GRAD_DTYPE_NAMES = {"float16", "bfloat16", "float32", "float64", "complex64", "complex128"}


# ---------------------------------------------------------------------------------------
# What torch can do on this machine, found once.

class Caps:
    """The dtypes torch moves to CUDA and back byte for byte, and which take a negated view."""

    def __init__(self, torch, dev):
        self.dtypes, self.neg_ok, self.conj_imag_ok, self.refused = [], set(), set(), []
        self.shells = []  # dtypes torch only copies as they are (no kernels: no views, no pinning)
        self.kernels = set()
        for name in CANDIDATE_DTYPE_NAMES:
            dt = getattr(torch, name, None)
            if dt is None:
                continue
            try:
                x = pattern(torch, dt, (6,), 1)
                if not torch.equal(bits(torch, x.to(dev).cpu()), bits(torch, x)):
                    raise AssertionError("torch's own round trip changed the bytes")
            except Exception as e:  # noqa: BLE001 - a dtype torch cannot move is left out
                self.refused.append(f"{name} ({type(e).__name__})")
                continue
            self.dtypes.append(dt)
            try:
                for side in ("cpu", dev):
                    x.to(side).reshape(2, 3).t().contiguous()
                x.pin_memory()
                self.kernels.add(dt)
            except Exception:  # noqa: BLE001
                self.shells.append(name)
            try:
                for side in ("cpu", dev):
                    v = torch._neg_view(x.to(side))
                    assert v.is_neg()
                    v.resolve_neg()
                self.neg_ok.add(dt)
            except Exception:  # noqa: BLE001
                pass
            try:
                for side in ("cpu", dev):
                    im = x.to(side).conj().imag
                    assert im.is_neg()
                    im.resolve_neg()
                self.conj_imag_ok.add(dt)
            except Exception:  # noqa: BLE001
                pass

    def describe(self):
        return (f"dtypes moved: {[str(d).replace('torch.', '') for d in self.dtypes]}; "
                f"of those only as they are (no views, no pinning): {self.shells}; "
                f"left out (torch cannot move them): {self.refused}")


def bits(torch, t):
    """The bytes of the values torch sees in `t` (lazy bits resolved), on the CPU."""
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    return flat_bytes(torch, t.cpu())


def flat_bytes(torch, t):
    """A contiguous tensor's bytes as a flat uint8 view (any dtype, any size-1 strides)."""
    if not t.is_contiguous():
        t = t.contiguous()
    return t.as_strided((t.numel(),), (1,)).view(torch.uint8)


# ---------------------------------------------------------------------------------------
# Random batches: a tree of specs, made into tensors on either side.

@dataclasses.dataclass
class Leaf:
    """One tensor: `dtype` bytes from `seed` in `shape`, then `ops` (views) applied.
    `far`: made on the side the call moves to (returned as is). `alias`: another view of
    leaf `alias`'s base (shared storage); `same`: the very tensor of leaf `same`."""
    dtype: object
    shape: tuple
    seed: int
    ops: list
    pinned: bool = False
    grad: bool = False
    far: bool = False
    alias: int = -1
    same: int = -1

    def describe(self):
        if self.same >= 0:
            return f"<the same tensor as leaf {self.same}>"
        d = str(self.dtype).replace("torch.", "")
        extra = [k for k in ("pinned", "grad", "far") if getattr(self, k)]
        base = f"view of leaf {self.alias}'s base" if self.alias >= 0 else f"{d}{list(self.shape)} seed={self.seed}"
        return f"<{base} ops={self.ops}{' ' + ','.join(extra) if extra else ''}>"


Pair = collections.namedtuple("Pair", ["a", "b"])


class Tagged(dict):
    """A dict subclass with an attribute (rebuilt through copy.copy)."""


@dataclasses.dataclass
class Rec:
    x: object
    y: object = None


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: object
    y: object = None


class Gen:
    """Random specs from one seed."""

    def __init__(self, caps, seed, big=True):
        self.caps, self.r, self.big, self.leaves = caps, random.Random(seed), big, []

    def shape(self):
        r = self.r
        if self.big and r.random() < 0.03:
            return (r.randint(300_000, 700_000),)  # 1 MiB and more for 4-byte dtypes
        rank = r.choice([0, 1, 1, 2, 2, 3, 4])
        return tuple(0 if r.random() < 0.06 else r.choice([1, 2, 3, 4, 5, 7, 16])
                     for _ in range(rank))

    def ops(self, dtype, shape):
        r, ops, rank, dims = self.r, [], len(shape), list(shape)
        if dtype not in self.caps.kernels:
            return ops
        n = 1
        for d in shape:
            n *= d
        if n >= 2 and r.random() < 0.12:
            w = r.randint(2, min(n, 4))
            ops.append(("overlap", n - w + 1, w))  # rows i..i+w-1 of the flat storage
            dims = [n - w + 1, w]
            rank = 2
        for _ in range(r.choice([0, 0, 1, 1, 2, 3])):
            kind = r.choice(["t", "step", "slice", "expand", "select", "permute"])
            if kind == "t" and rank >= 2:
                a, b = r.sample(range(rank), 2)
                ops.append(("transpose", a, b))
                dims[a], dims[b] = dims[b], dims[a]
            elif kind == "permute" and rank >= 2:
                p = list(range(rank))
                r.shuffle(p)
                ops.append(("permute", tuple(p)))
                dims = [dims[i] for i in p]
            elif kind == "step" and rank >= 1:
                d, k = r.randrange(rank), r.choice([2, 3])
                ops.append(("step", d, k))
                dims[d] = (dims[d] + k - 1) // k
            elif kind == "slice" and rank >= 1:
                d = r.randrange(rank)
                if dims[d] >= 2:
                    s = r.randint(1, dims[d] - 1)
                    ops.append(("slice", d, s, dims[d] - s))
                    dims[d] -= s
            elif kind == "expand" and rank <= 3:
                k = r.choice([1, 2, 3])
                ops.append(("expand", k))
                dims = [k] + dims
                rank += 1
            elif kind == "select" and rank >= 1:
                d = r.randrange(rank)
                if dims[d] >= 1:
                    ops.append(("select", d, r.randrange(dims[d])))
                    del dims[d]
                    rank -= 1
        if dtype.is_complex and r.random() < 0.3:
            if dtype in self.caps.conj_imag_ok and r.random() < 0.5:
                ops.append(("conj_imag",))  # a real view with the negation bit
            else:
                ops.append(("conj",))
        elif dtype in self.caps.neg_ok and r.random() < 0.25:
            ops.append(("neg",))
        return ops

    def leaf(self):
        r = self.r
        k = len(self.leaves)
        if self.leaves and r.random() < 0.08:
            spec = Leaf(None, (), 0, [], same=r.randrange(k))
        elif self.leaves and r.random() < 0.08:
            j = r.randrange(k)
            while self.leaves[j].same >= 0 or self.leaves[j].alias >= 0:
                j = self.leaves[j].same if self.leaves[j].same >= 0 else self.leaves[j].alias
            src = self.leaves[j]
            spec = Leaf(src.dtype, src.shape, src.seed, self.ops(src.dtype, src.shape),
                        pinned=src.pinned, far=src.far, alias=j)
        else:
            dtype = r.choice(self.caps.dtypes)
            shape = self.shape()
            name = str(dtype).replace("torch.", "")
            spec = Leaf(dtype, shape, r.randrange(2**31), self.ops(dtype, shape),
                        pinned=r.random() < 0.3 and dtype in self.caps.kernels,
                        far=r.random() < 0.1)
            spec.grad = name in GRAD_DTYPE_NAMES and r.random() < 0.1 and not any(
                o[0] in ("conj_imag",) for o in spec.ops)
        self.leaves.append(spec)
        return spec

    def tree(self, depth=0):
        r = self.r
        if depth >= 3 or r.random() < 0.35:
            x = r.random()
            if x < 0.7:
                return self.leaf()
            return r.choice([7, "text", None, 2.5, b"raw", object()])
        n = r.choice([0, 1, 2, 3, 4])
        kids = lambda: [self.tree(depth + 1) for _ in range(n)]  # noqa: E731
        kind = r.choice(["list", "tuple", "pair", "dict", "odict", "ddict", "tagged", "rec",
                         "frozen"])
        if kind == "list":
            return kids()
        if kind == "tuple":
            return tuple(kids())
        if kind == "pair":
            return Pair(self.tree(depth + 1), self.tree(depth + 1))
        if kind in ("dict", "odict", "ddict", "tagged"):
            items = [(f"k{i}", v) for i, v in enumerate(kids())]
            if kind == "dict":
                return dict(items)
            if kind == "odict":
                return collections.OrderedDict(items)
            if kind == "ddict":
                return collections.defaultdict(list, items)
            t = Tagged(items)
            t.note = "kept"
            return t
        if kind == "rec":
            return Rec(self.tree(depth + 1), self.tree(depth + 1))
        return Frozen(self.tree(depth + 1), self.tree(depth + 1))


def apply(torch, t, op):
    k = op[0]
    if k == "overlap":
        return t.reshape(-1).as_strided((op[1], op[2]), (1, 1))
    if k == "transpose":
        return t.transpose(op[1], op[2])
    if k == "permute":
        return t.permute(op[1])
    if k == "step":
        idx = [slice(None)] * t.dim()
        idx[op[1]] = slice(None, None, op[2])
        return t[tuple(idx)]
    if k == "slice":
        return t.narrow(op[1], op[2], op[3])
    if k == "expand":
        return t.unsqueeze(0).expand(op[1], *t.shape)
    if k == "select":
        return t.select(op[1], op[2])
    if k == "neg":
        return torch._neg_view(t)
    if k == "conj":
        return t.conj()
    if k == "conj_imag":
        return t.conj().imag
    raise ValueError(op)


class Made:
    """A spec tree made into tensors. `near`: the side the call moves from (`"cpu"` or the
    device). `zeros`: device bases on the near side start as zeros, and `fill()` (run on
    another stream by the producer tests) writes their values; `expected(t)` is then the
    same view of a tensor that holds those values from the start (else `t` itself)."""

    def __init__(self, torch, gen, tree, near, far, zeros=False):
        self.torch, self.near, self.far, self.zeros = torch, near, far, zeros
        self.bases, self.finals, self.tensors, self.expect, self.fills = [], [], [], [], []
        self.specs = gen.leaves
        self.batch = self._make(tree)
        self.by_id = {id(t): e for t, e in zip(self.tensors, self.expect)}

    def expected(self, t):
        return self.by_id[id(t)]

    def _tensor(self, spec):
        torch = self.torch
        if spec.same >= 0:
            for lst in (self.bases, self.finals, self.tensors, self.expect):
                lst.append(lst[spec.same])
            return self.tensors[-1]
        if spec.alias >= 0:
            base, final = self.bases[spec.alias], self.finals[spec.alias]
        else:
            base = pattern(torch, spec.dtype, spec.shape, spec.seed)
            side = self.far if spec.far else self.near
            if side == "cpu":
                if spec.pinned:
                    base = base.pin_memory()
                final = base
            else:
                final = base.to(side)
                if self.zeros and not spec.far:
                    # zeros through bytes: torch has no kernels for some dtypes
                    n = final.numel() * final.element_size()
                    raw = torch.zeros(n, dtype=torch.uint8, device=side)
                    base = raw.view(spec.dtype).reshape(spec.shape)
                    self.fills.append((raw, flat_bytes(torch, final)))
                else:
                    base = final
        t, e = base, final
        for op in spec.ops:
            t = apply(torch, t, op)
            e = t if final is base else apply(torch, e, op)
        if spec.grad:
            t = t.detach().requires_grad_(True)
            e = t if final is base else e.detach().requires_grad_(True)
        for lst, v in ((self.bases, base), (self.finals, final), (self.tensors, t), (self.expect, e)):
            lst.append(v)
        return t

    def _make(self, x):
        if isinstance(x, Leaf):
            return self._tensor(x)
        if isinstance(x, Pair):
            return Pair(self._make(x.a), self._make(x.b))
        if isinstance(x, (list, tuple)):
            return type(x)(self._make(v) for v in x)
        if isinstance(x, dict):
            new = x.copy() if isinstance(x, collections.defaultdict) else type(x)()
            for k, v in x.items():
                new[k] = self._make(v)
            if isinstance(x, Tagged):
                new.note = x.note
            return new
        if isinstance(x, (Rec, Frozen)):
            return type(x)(self._make(x.x), self._make(x.y))
        return x

    def fill(self):
        for raw, final in self.fills:
            raw.copy_(final)

    def describe(self):
        return "\n".join(f"    leaf {i}: {s.describe()}" for i, s in enumerate(self.specs))


# ---------------------------------------------------------------------------------------
# Checks.

class Check:
    """Compares one call's output with torch's own move of every tensor."""

    def __init__(self, torch, dev):
        self.torch, self.dev = torch, dev

    def snapshot(self, made):
        """Each input's metadata, and the bytes it holds (or will, once a producer has
        written them)."""
        torch = self.torch
        return [(meta(t), bits(torch, made.expected(t)).clone()) for t in made.tensors]

    def unchanged(self, made, before):
        torch = self.torch
        for i, (t, (m, b)) in enumerate(zip(made.tensors, before)):
            if meta(t) != m or not torch.equal(bits(torch, t), b):
                raise AssertionError(f"input leaf {i} changed: {m} -> {meta(t)}")

    def by_pinlane(self, t):
        return not t.requires_grad and str(t.dtype).replace("torch.", "") in PINLANE_DTYPE_NAMES

    def moves(self, t, direction):
        if direction == "h2d":
            return t.device.type == "cpu"
        return t.device == self.dev

    def tree(self, a, b, direction, path="batch", ref=None):
        """`b` is `a` moved in `direction`; `ref(t)` is torch's own move of a tensor."""
        torch = self.torch
        if isinstance(a, torch.Tensor):
            if not self.moves(a, direction):
                assert b is a, f"{path}: a tensor the call does not move came back as another object"
                return
            want = ref(a)
            assert isinstance(b, torch.Tensor), f"{path}: got {type(b).__name__}"
            assert b.device == want.device, f"{path}: on {b.device}, torch's on {want.device}"
            assert b.dtype == want.dtype, f"{path}: dtype {b.dtype}, torch's {want.dtype}"
            assert b.shape == want.shape, f"{path}: shape {list(b.shape)}, torch's {list(want.shape)}"
            assert b.requires_grad == want.requires_grad, f"{path}: requires_grad {b.requires_grad}"
            if not torch.equal(bits(torch, b), bits(torch, want)):
                got, exp = bits(torch, b), bits(torch, want)
                k = int((got != exp).nonzero()[0]) if got.numel() == exp.numel() else -1
                raise AssertionError(f"{path}: bytes differ from torch's at byte {k}: "
                                     f"{got[k:k + 8].tolist()} != {exp[k:k + 8].tolist()}")
            if self.by_pinlane(a):
                assert b.is_contiguous(), f"{path}: pinlane's output is not contiguous"
                if direction == "d2h" and b.numel() > 0:
                    assert b.is_pinned(), f"{path}: D2H output not page-locked"
            return
        assert type(b) is type(a), f"{path}: {type(a).__name__} came back as {type(b).__name__}"
        if not self.holds_moved(a, direction):
            assert b is a, f"{path}: a container with nothing to move was rebuilt"
        if isinstance(a, (list, tuple)):
            assert len(a) == len(b), f"{path}: length {len(a)} -> {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                self.tree(x, y, direction, f"{path}[{i}]", ref)
        elif isinstance(a, dict):
            assert list(a) == list(b), f"{path}: keys {list(a)} -> {list(b)}"
            if isinstance(a, collections.defaultdict):
                assert b.default_factory is a.default_factory, f"{path}: default_factory"
            if isinstance(a, Tagged):
                assert b.note == a.note, f"{path}: attribute lost"
            for k in a:
                self.tree(a[k], b[k], direction, f"{path}[{k!r}]", ref)
        elif dataclasses.is_dataclass(a):
            for f in dataclasses.fields(a):
                self.tree(getattr(a, f.name), getattr(b, f.name), direction, f"{path}.{f.name}", ref)
        else:
            assert b is a, f"{path}: a non-tensor leaf came back as another object"

    def holds_moved(self, a, direction):
        torch = self.torch
        if isinstance(a, torch.Tensor):
            return self.moves(a, direction)
        if isinstance(a, (list, tuple)):
            return any(self.holds_moved(x, direction) for x in a)
        if isinstance(a, dict):
            return any(self.holds_moved(x, direction) for x in a.values())
        if dataclasses.is_dataclass(a) and not isinstance(a, type):
            return any(self.holds_moved(getattr(a, f.name), direction)
                       for f in dataclasses.fields(a))
        return False


def meta(t):
    return (t.dtype, tuple(t.shape), t.stride(), t.storage_offset(), t.is_neg(), t.is_conj(),
            t.requires_grad, t.device)


class Failures:
    """Failing cases of one test, each with what reproduces it."""

    def __init__(self, test):
        self.test, self.items, self.cases, self.lock = test, [], 0, threading.Lock()

    def run(self, seed, case):
        made = []
        try:
            case(made)
        except Exception as e:  # noqa: BLE001 - reported with the case
            tb = traceback.format_exc(limit=3)
            desc = made[0].describe() if made else "    (failed while making the batch)"
            with self.lock:
                self.items.append(f"seed {seed}: {type(e).__name__}: {e}\n{desc}\n{tb}")
        with self.lock:
            self.cases += 1

    def check(self):
        print(f"\n{self.test}: {self.cases} random cases, {len(self.items)} failed")
        # One line a kind: the message without its seed, path and numbers.
        kinds = collections.Counter(
            re.sub(r"[0-9]+", "N", re.sub(r"^seed \d+: (\w+: )(batch\S*: )?", r"\1", i.split("\n")[0]))[:100]
            for i in self.items)
        for k, n in kinds.most_common():
            print(f"  {n:5d} x {k}")
        if self.items:
            head = "\n".join(self.items[:10])
            pytest.fail(f"{len(self.items)} of {self.cases} cases failed; rerun one with "
                        f"PINLANE_PROP_SEED=<seed> PINLANE_PROP_CASES=1 python -m pytest "
                        f"python/tests/test_torch_props.py -k {self.test}\n{head}", pytrace=False)


# ---------------------------------------------------------------------------------------
# The tests.

@pytest.fixture(scope="module")
def env(torch):
    dev = torch.device("cuda", pinlane._native.default_device())
    caps = Caps(torch, dev)
    print("\n" + caps.describe())
    return torch, dev, caps, Check(torch, dev)


def seeds(n):
    return [SEED + i for i in range(max(1, n))]


def h2d_case(env, seed, made_out, big=True):
    torch, dev, caps, check = env
    gen = Gen(caps, seed, big)
    made = Made(torch, gen, gen.tree(), "cpu", dev)
    made_out.append(made)
    before = check.snapshot(made)
    out = transfer_tensor_h2d(made.batch)
    check.tree(made.batch, out, "h2d", ref=lambda t: t.to(dev))
    back = transfer_tensor_d2h(out)
    round_trip(check, made.batch, out, back, dev)
    check.unchanged(made, before)


def round_trip(check, src, on_dev, back, dev):
    """d2h(h2d(src)): every host tensor of `src` back on the host with torch's bits of
    it, every device tensor of `src` (returned as is by h2d) moved to the host."""
    torch = check.torch
    check.tree(on_dev, back, "d2h", ref=lambda t: t.cpu())
    flat_src, flat_back = flatten(src, torch.Tensor), flatten(back, torch.Tensor)
    assert len(flat_src) == len(flat_back)
    for i, (a, b) in enumerate(zip(flat_src, flat_back)):
        if a.device.type != "cpu" and a.device != dev:
            assert b is a
            continue
        assert b.device.type == "cpu" and b.dtype == a.dtype and b.shape == a.shape, f"leaf {i}"
        assert torch.equal(bits(torch, b), bits(torch, a)), f"round trip changed leaf {i}'s bytes"


def d2h_case(env, seed, made_out, producer=False, custom_stream=False, big=True):
    torch, dev, caps, check = env
    gen = Gen(caps, seed, big)
    made = Made(torch, gen, gen.tree(), dev, "cpu", zeros=producer)
    made_out.append(made)
    before = check.snapshot(made)
    kwargs = {}
    if custom_stream:
        kwargs.update(device=dev, stream=torch.cuda.Stream(dev))
    ev = None
    if producer:
        # The values are written on another stream after ~10 ms of GPU time; only the
        # event orders them before anything reads them.
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            torch.cuda._sleep(20_000_000)
            made.fill()
            ev = torch.cuda.Event()
            ev.record(side)
        kwargs["producer_event"] = ev
    out = transfer_tensor_d2h(made.batch, **kwargs)
    if ev is not None:
        ev.synchronize()
    check.tree(made.batch, out, "d2h", ref=lambda t: made.expected(t).cpu())
    check.unchanged(made, before)


def test_h2d_and_round_trips_match_torch(env):
    fails = Failures("test_h2d_and_round_trips_match_torch")
    for s in seeds(CASES):
        fails.run(s, lambda m, s=s: h2d_case(env, s, m))
    fails.check()


def test_d2h_matches_torch(env):
    fails = Failures("test_d2h_matches_torch")
    for s in seeds(CASES):
        fails.run(s, lambda m, s=s: d2h_case(env, s, m, custom_stream=s % 3 == 0))
    fails.check()


def test_d2h_after_a_producer_on_another_stream_matches_torch(env):
    fails = Failures("test_d2h_after_a_producer_on_another_stream_matches_torch")
    for s in seeds(CASES // 4):
        fails.run(s, lambda m, s=s: d2h_case(env, s, m, producer=True, custom_stream=s % 2 == 0,
                                             big=False))
    fails.check()


def test_eight_threads_while_the_gpu_is_busy_match_torch(env):
    torch, dev, _, _ = env
    fails = Failures("test_eight_threads_while_the_gpu_is_busy_match_torch")
    stop = threading.Event()

    def busy():
        s = torch.cuda.Stream(dev)
        a = torch.randn(4096, 4096, device=dev)
        with torch.cuda.stream(s):
            while not stop.is_set():
                for _ in range(4):
                    a = (a @ a).clamp_(-1, 1)
                s.synchronize()

    def work(k, mine):
        own = torch.cuda.Stream(dev) if k % 2 else None  # half the threads on a stream of their own
        for s in mine:
            def case(m, s=s):
                if s % 3 == 0:
                    d2h_case(env, s, m, producer=s % 2 == 0, big=False)
                else:
                    h2d_case(env, s, m, big=False)
            if own is None:
                fails.run(s, case)
            else:
                with torch.cuda.stream(own):
                    fails.run(s, case)

    all_seeds = seeds(CASES)
    hog = threading.Thread(target=busy)
    hog.start()
    try:
        threads = [threading.Thread(target=work, args=(k, all_seeds[k::8])) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        stop.set()
        hog.join()
    fails.check()
