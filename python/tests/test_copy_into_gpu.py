"""pinlane.copy_into on the GPU machine: nested batches into slices of static buffers
(every byte and the bytes around them checked), a CUDA graph fed step after step and
checked against eager execution, D2H into CPU tensors, custom streams, torch's fallback
dtypes, and bad input refused with the destinations unchanged."""

import gc
import time

import pytest

import pinlane


def _inputs(torch, step, pinned=False):
    g = torch.Generator().manual_seed(step)
    t = {
        "tokens": torch.randint(0, 50_000, (64,), generator=g, dtype=torch.int64),
        "positions": torch.arange(64, dtype=torch.int32) + step,
        "slots": torch.randint(0, 1 << 20, (64,), generator=g, dtype=torch.int64),
        "blocks": torch.randint(0, 4096, (16, 32), generator=g, dtype=torch.int32),
        "lens": torch.randint(1, 512, (16,), generator=g, dtype=torch.int32),
        "scale": torch.rand(64, 256, generator=g, dtype=torch.float32),  # 64 KiB
        "bias": torch.rand(3, generator=g).to(torch.bfloat16),
    }
    if pinned:
        t = {k: v.pin_memory() for k, v in t.items()}
    return t


def _statics(torch, like, skew=0):
    """Each tensor of `like` as a view into one uint8 CUDA buffer (filled with 0xA5),
    `skew` bytes past a 256-byte boundary (when the dtype allows), a gap after each."""
    places, end = {}, 0
    for k, v in like.items():
        at = -(-end // 256) * 256 + skew * v.element_size()
        places[k] = (at, v.numel() * v.element_size())
        end = at + places[k][1] + 64
    buf = torch.full((end,), 0xA5, dtype=torch.uint8, device="cuda")
    views = {
        k: buf[at : at + n].view(like[k].dtype).view(like[k].shape) for k, (at, n) in places.items()
    }
    return buf, views, places


def _expected(torch, buf, src, places, fill=0xA5):
    want = torch.full_like(buf, fill).cpu()
    for k, (at, n) in places.items():
        want[at : at + n] = src[k].contiguous().view(-1).view(torch.uint8)
    return want


@pytest.mark.parametrize("pinned", [False, True])
@pytest.mark.parametrize("skew", [0, 1])
def test_copies_into_slices_of_a_static_buffer(torch, pinned, skew):
    src = _inputs(torch, 1, pinned)
    buf, dst, places = _statics(torch, src, skew)
    for step in range(5):
        src = _inputs(torch, step, pinned)
        pinlane.copy_into(dst, src)
        torch.cuda.current_stream().synchronize()
        assert torch.equal(buf.cpu(), _expected(torch, buf, src, places)), f"step {step}"


@pytest.mark.parametrize("way", ["Buffers", "Pairs"])
def test_feeds_a_captured_graph_step_after_step(torch, way):
    src = _inputs(torch, 0)
    buf, static, _ = _statics(torch, src)
    weights = torch.randn(50_000, 8, device="cuda")

    def model(x):
        e = weights[x["tokens"] % 50_000] * x["scale"][:, :8]
        pos = x["positions"].float().unsqueeze(1)
        tab = x["blocks"].float().sum(1).repeat(4).unsqueeze(1)
        return e + pos + tab + x["lens"].float().sum() + x["slots"].float().unsqueeze(1) % 7

    inputs = pinlane.Buffers(static)
    inputs.copy_from(src)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up before capture, as torch's docs do
        model(static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = model(static)
    host = _inputs(torch, 0, pinned=True)
    bound = pinlane.Pairs(inputs, host)
    for step in range(1, 60):
        src = _inputs(torch, step, pinned=step % 2 == 0)
        if way == "Buffers":
            inputs.copy_from(src)
        else:
            # The bound page-locked sources are written only after the last step's
            # comparison, which waited for the stream.
            for k, v in host.items():
                v.copy_(src[k])
            bound.copy()
        graph.replay()
        eager = model({k: v.cuda() for k, v in src.items()})
        torch.testing.assert_close(out, eager, rtol=0, atol=0, msg=f"step {step}")


@pytest.mark.parametrize(
    "way",
    ["copy_into pageable", "copy_into pinned", "Buffers pinned", "Pairs pinned", "d2h", "h2d"],
)
def test_calls_inside_a_graph_capture_are_refused(torch, way):
    """A call made while torch captures a CUDA graph is refused at the call, with nothing
    queued (before: the page-locked copies were captured, and the next pinlane call
    raised "an earlier release failed"; the others broke the capture), and calls made
    after the capture run as before."""
    n = 1 << 14  # 64 KiB of float32: read in place from page-locked memory
    src = torch.ones(n, pin_memory=way != "copy_into pageable")
    static = torch.zeros(n, device="cuda")
    inputs = pinlane.Buffers([static])
    pairs = pinlane.Pairs([static], [src])
    pinlane.copy_into([static], [src])  # warm: the thread's streams and pools set up
    torch.cuda.synchronize()
    calls = {
        "copy_into": lambda: pinlane.copy_into([static], [src]),
        "Buffers": lambda: inputs.copy_from([src]),
        "Pairs": pairs.copy,
        "d2h": lambda: pinlane.transfer_tensor_d2h(static),
        "h2d": lambda: pinlane.transfer_tensor_h2d(src),
    }
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(RuntimeError, match="CUDA graph capture is running"):
        with torch.cuda.graph(graph):
            calls[way.split()[0]]()
    torch.cuda.synchronize()
    src.fill_(3.0)
    pinlane.copy_into([static], [src])
    torch.cuda.synchronize()
    assert torch.equal(static.cpu(), src), way
    assert torch.equal(pinlane.transfer_tensor_d2h(static), src), way


def test_d2h_into_cpu_tensors(torch):
    src = {k: v.cuda() for k, v in _inputs(torch, 3).items()}
    dst = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=(k != "scale")) for k, v in src.items()}
    dst["big"] = torch.empty(1 << 22, dtype=torch.float16)
    src["big"] = torch.randn(1 << 22, device="cuda").half()
    pinlane.copy_into(dst, src)
    for k in src:
        assert torch.equal(dst[k], src[k].cpu()), k


def test_on_a_custom_stream_after_its_work(torch):
    s = torch.cuda.Stream()
    dst = torch.zeros(1 << 20, dtype=torch.int32, device="cuda")
    src = torch.arange(1 << 20, dtype=torch.int32)
    with torch.cuda.stream(s):
        dst.fill_(-1)
        torch.cuda._sleep(20_000_000)  # the copies must queue behind this
    pinlane.copy_into([dst], [src], stream=s)
    s.synchronize()
    assert torch.equal(dst.cpu(), src)
    with pytest.raises(TypeError):
        pinlane.copy_into([dst], [src], stream=5)


@pytest.mark.parametrize("producer", ["stream", "current"])
def test_d2h_on_a_stream_makes_strided_and_negated_sources_after_their_producer(torch, producer):
    """CUDA sources copied on ``stream``: the contiguous copies torch makes of a strided or
    negated source read it after the work queued before the call, on ``stream`` and on
    torch's current stream (where the copies wait too), as ``with torch.cuda.stream(s):
    dst.copy_(src)`` after ``s.wait_stream(current)`` does. Before session 63 they were
    made on the current stream at once, and read zeros written before ``stream``'s work
    (session 62 made them on ``stream`` alone, and read zeros before the current stream's
    work)."""
    new = torch.arange(256 * 256, dtype=torch.float32, device="cuda").reshape(256, 256)
    cases = [(lambda x: x.t(), new.t()), (lambda x: torch._neg_view(x), -new),
             (lambda x: x[:, ::2], new[:, ::2])]
    for view, want in cases:
        x = torch.zeros(256, 256, device="cuda")
        torch.cuda.synchronize()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s if producer == "stream" else torch.cuda.current_stream()):
            torch.cuda._sleep(20_000_000)  # the producer is still running at the call
            x.copy_(new)
        src = view(x)
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        pinlane.copy_into([dst], [src], stream=s)
        assert torch.equal(dst, want.cpu())
        torch.cuda.synchronize()


def test_d2h_on_a_stream_copies_torchs_pairs_after_the_current_streams_work(torch):
    """A pair torch copies (complex here) on ``stream`` waits for torch's current stream,
    where its source was made, as pinlane's own pairs do: before session 63 it waited
    for ``stream`` alone and read zeros written before the current stream's work."""
    new = torch.randn(1 << 16, dtype=torch.complex64, device="cuda")
    x = torch.zeros_like(new)
    torch.cuda.synchronize()
    s = torch.cuda.Stream()
    torch.cuda._sleep(20_000_000)  # on the current stream: the producer is still running
    x.copy_(new)
    # Torch's pair alone: a pinlane pair beside it would wait for the current stream in
    # the native call, before torch's copy starts.
    dst = {"c": torch.empty(x.shape, dtype=x.dtype, pin_memory=True)}
    pinlane.copy_into(dst, {"c": x}, stream=s)
    assert torch.equal(dst["c"], new.cpu())
    torch.cuda.synchronize()


def test_writes_are_seen_by_autograd_as_copy_s_are(torch):
    """Destinations pinlane writes have their version bumped, as torch's ``copy_`` does: a
    tensor saved for a backward pass and overwritten since is torch's error at backward,
    not a wrong gradient. Pairs and D2H destinations too; inference tensors (no version)
    are written as before."""
    w = torch.randn(8, 8, device="cuda", requires_grad=True)
    static = torch.zeros(8, device="cuda")
    out = (w @ static).sum()  # `static` is saved for w's gradient
    v = static._version
    pinlane.Buffers([static]).copy_from([torch.ones(8)])
    assert static._version > v
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.backward()
    pairs = pinlane.Pairs([static], [torch.full((8,), 2.0)])
    v = static._version
    pairs.copy()
    assert static._version > v
    host = torch.zeros(8)
    v = host._version
    pinlane.copy_into([host], [static])
    assert host._version > v and torch.equal(host, torch.full((8,), 2.0))
    with torch.inference_mode():
        inf = torch.zeros(8, device="cuda")
    pinlane.copy_into([inf], [torch.ones(8)])
    torch.cuda.synchronize()
    assert torch.equal(inf.cpu(), torch.ones(8))


def test_strided_sources_and_torch_dtypes(torch):
    src = {"t": torch.arange(100, dtype=torch.int64).view(10, 10).t(), "c": torch.randn(5, dtype=torch.complex64)}
    dst = {"t": torch.empty(10, 10, dtype=torch.int64, device="cuda"), "c": torch.empty(5, dtype=torch.complex64, device="cuda")}
    pinlane.copy_into(dst, src)
    torch.cuda.synchronize()
    assert torch.equal(dst["t"].cpu(), src["t"]) and torch.equal(dst["c"].cpu(), src["c"])
    # Back the other way: torch copies the complex pair, and the call returns with it there.
    back = {"t": torch.empty(10, 10, dtype=torch.int64), "c": torch.empty(5, dtype=torch.complex64, pin_memory=True)}
    torch.cuda._sleep(20_000_000)  # the sources' producer is still running
    pinlane.copy_into(back, dst)
    assert torch.equal(back["t"], src["t"]) and torch.equal(back["c"], src["c"])
    # A torch-copied pair is checked like the others, before anything is queued.
    with pytest.raises(ValueError, match="dtype or size"):
        pinlane.copy_into(dst, {"t": src["t"], "c": torch.randn(5, dtype=torch.complex128)})
    with pytest.raises(ValueError, match="dtypes differ"):
        pinlane.copy_into({"t": dst["t"]}, {"t": torch.zeros(10, 10, dtype=torch.complex64)})
    if torch.cuda.device_count() > 1:
        # A stream of another device is refused for torch's pairs alone too (session 63:
        # torch copied them unordered with it), nothing written.
        other = torch.cuda.Stream(device=(dst["c"].device.index + 1) % torch.cuda.device_count())
        before = dst["c"].clone()
        for way in ({"c": dst["c"]}, {"c": src["c"] * 2}), ({"c": back["c"]}, {"c": dst["c"]}):
            with pytest.raises(ValueError, match="stream"):
                pinlane.copy_into(*way, stream=other)
        assert torch.equal(dst["c"], before) and torch.equal(back["c"], src["c"])


def test_destinations_torch_copies_are_checked_as_pinlanes_are(torch):
    """A pair torch copies (complex here) has its destination checked as pinlane's own are
    (session 64: it was not, and an overlap was written in an order nobody promised):
    contiguous, and overlapping no other destination, both ways, refused before anything
    is written; adjacent destinations in one buffer are copied right."""
    for dev, other in (("cuda", "cpu"), ("cpu", "cuda")):
        buf = torch.zeros(4096, dtype=torch.uint8, device=dev)
        c = buf[:1024].view(torch.complex64)
        f = buf[512:1536].view(torch.float32)  # overlaps c
        c2 = buf[2048:3072].view(torch.complex64)
        c3 = buf[2560:3584].view(torch.complex64)  # overlaps c2
        cases = [
            ([c, f], "pair 1: the destination overlaps pair 0"),
            ([f, c], "pair 1: the destination overlaps pair 0"),
            ([c2, c3], "pair 1: the destination overlaps pair 0"),
            ([f, c2, c3[:8]], "pair 2: the destination overlaps pair 1"),
            ([c, c2[::2]], "pair 1: the destination is not contiguous"),
        ]
        for dst, msg in cases:
            src = [torch.ones_like(t, device=other) for t in dst]
            with pytest.raises(ValueError, match=msg):
                pinlane.copy_into(dst, src)
            with pytest.raises(ValueError, match=msg):
                pinlane.Buffers(dst)
        torch.cuda.synchronize()
        assert int(buf.count_nonzero()) == 0, dev
        # Side by side in one buffer: each written, nothing else.
        f2 = buf[1024:2048].view(torch.float32)
        src = [torch.randn(128, dtype=torch.complex64, device=other), torch.rand(256, device=other)]
        pinlane.copy_into([c, f2], src)
        torch.cuda.synchronize()
        assert torch.equal(c.cpu(), src[0].cpu()) and torch.equal(f2.cpu(), src[1].cpu()), dev
        assert int(buf[2048:].count_nonzero()) == 0, dev


def test_autograd_and_torch_pairs_as_copy_gives_them(torch):
    """Session 64 (a review's findings, each wrong before its fix): under grad mode a pair
    whose source requires grad is copied by torch, so the destination gets ``copy_``'s
    graph and gradients reach the source (before: written by pinlane, the graph lost); a
    destination that is a leaf requiring grad is refused, nothing written (before: written
    in place where ``copy_`` refuses); under ``no_grad`` pinlane copies them all. A pair
    torch copies (complex) has its source's side checked (before: a CUDA source of an H2D
    was copied device to device, unordered with ``stream``). A nested ``Buffers`` whose
    dict was reordered since is refused (before: each source went to the other's
    destination)."""
    dev = "cuda"
    w = torch.ones(4, requires_grad=True)
    wc = torch.ones(4, device=dev, requires_grad=True)
    for src, dst, leaf in ((w * 2, torch.zeros(4, device=dev), w), (wc * 2, torch.zeros(4), wc)):
        plain_dst = torch.zeros_like(dst)
        pinlane.copy_into([plain_dst, dst], [torch.full((4,), 5.0, device=src.device), src])
        torch.cuda.synchronize()
        assert dst.requires_grad and type(dst.grad_fn).__name__.startswith("Copy"), dst.grad_fn
        assert torch.equal(dst.detach().cpu(), torch.full((4,), 2.0))
        assert torch.equal(plain_dst.cpu(), torch.full((4,), 5.0)) and not plain_dst.requires_grad
        (dst * 3).sum().backward()
        assert torch.equal(leaf.grad.cpu(), torch.full((4,), 6.0))
        leaf.grad = None
        with torch.no_grad():
            again = torch.zeros_like(dst)
            pinlane.copy_into([again], [src])
        torch.cuda.synchronize()
        assert not again.requires_grad and torch.equal(again.cpu(), torch.full((4,), 2.0))
    # A D2H pair left to torch on a stream: it waits for the current stream too.
    s = torch.cuda.Stream()
    src = wc * 0
    torch.cuda._sleep(20_000_000)
    src.add_(3)  # queued after the sleep, on the current stream
    dst = torch.zeros(4)
    pinlane.copy_into([dst], [src], stream=s)
    assert torch.equal(dst.detach(), torch.full((4,), 3.0)) and dst.requires_grad
    # A Buffers destination that gained a graph at one step: the next step's copy replaces
    # it as copy_ does (pinlane wrote the bytes and left the old graph before the review's
    # mend, so a backward pass reached the first step's source).
    wb = torch.ones(4, requires_grad=True)
    held = torch.zeros(4, device=dev)
    bufs = pinlane.Buffers([held])
    bufs.copy_from([wb * 2])
    assert held.grad_fn is not None
    bufs.copy_from([torch.full((4,), 7.0)])
    torch.cuda.synchronize()
    assert torch.equal(held.detach().cpu(), torch.full((4,), 7.0))
    (held * 3).sum().backward()
    assert wb.grad is None or int(wb.grad.count_nonzero()) == 0, wb.grad
    # A source of another shape (the same elements) left to torch: reshaped, not broadcast.
    square = torch.zeros(2, 2, device=dev)
    pinlane.copy_into([square], [w * 2])
    torch.cuda.synchronize()
    assert square.requires_grad and torch.equal(square.detach().cpu(), torch.full((2, 2), 2.0))
    # An inference tensor has no graph: pinlane writes it, whatever the source.
    with torch.inference_mode():
        inf = torch.zeros(4, device=dev)
    pinlane.copy_into([inf], [w * 2])
    torch.cuda.synchronize()
    assert torch.equal(inf.cpu(), torch.full((4,), 2.0))
    # A leaf destination that requires grad: refused under grad mode, nothing written.
    lf = torch.zeros(4, device=dev, requires_grad=True)
    other = torch.zeros(4, device=dev)
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        pinlane.copy_into([other, lf], [torch.ones(4), torch.ones(4)])
    with pytest.raises(ValueError, match="requires grad"):
        pinlane.Pairs([lf], [torch.ones(4)]).copy()
    # A view of such a leaf, and a destination made to require grad after the Buffers
    # were: refused the same way (asked at each copy).
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        pinlane.copy_into([lf[:2]], [torch.ones(2)])
    later = torch.zeros(4, device=dev)
    late = pinlane.Buffers([later])
    later.requires_grad_()
    with pytest.raises(ValueError, match="leaf tensor that requires grad"):
        late.copy_from([torch.ones(4)])
    torch.cuda.synchronize()
    assert int(other.count_nonzero()) == 0 and int(lf.detach().count_nonzero()) == 0
    assert int(later.detach().count_nonzero()) == 0
    with torch.no_grad():
        pinlane.copy_into([lf], [torch.ones(4)])
        torch.cuda.synchronize()
        assert torch.equal(lf.detach().cpu(), torch.ones(4))
        pinlane.Pairs([lf], [torch.full((4,), 2.0)]).copy()
    torch.cuda.synchronize()
    assert torch.equal(lf.detach().cpu(), torch.full((4,), 2.0))
    # Pairs torch copies: each side where it must be, nothing written otherwise.
    c = torch.zeros(8, dtype=torch.complex64, device=dev)
    ch = torch.zeros(8, dtype=torch.complex64)
    with pytest.raises(ValueError, match="not a CPU tensor"):
        pinlane.copy_into([c], [torch.ones(8, dtype=torch.complex64, device=dev)], stream=s)
    with pytest.raises(ValueError, match="not a CUDA tensor"):
        pinlane.copy_into([ch], [torch.ones(8, dtype=torch.complex64)])
    # An inference tensor torch would write outside inference mode: refused before
    # pinlane's own pair beside it is written (torch's copy_ refused it after, before).
    with torch.inference_mode():
        ci = torch.zeros(8, dtype=torch.complex64, device=dev)
    beside = torch.zeros(4, device=dev)
    with pytest.raises(ValueError, match="inference"):
        pinlane.copy_into([beside, ci], [torch.ones(4), torch.ones(8, dtype=torch.complex64)])
    torch.cuda.synchronize()
    assert int(c.count_nonzero()) == 0 and int(ch.count_nonzero()) == 0
    assert int(beside.count_nonzero()) == 0
    # A nested Buffers whose destinations' dict was reordered: refused, nothing written.
    a, b = torch.zeros(4, device=dev), torch.zeros(4, device=dev)
    nested = {"x": {"a": a, "b": b}}
    bufs = pinlane.Buffers(nested)
    nested["x"] = {"b": b, "a": a}
    with pytest.raises(ValueError, match="changed since"):
        bufs.copy_from({"x": {"a": torch.ones(4), "b": torch.full((4,), 2.0)}})
    torch.cuda.synchronize()
    assert int(a.count_nonzero()) == 0 and int(b.count_nonzero()) == 0


def test_bad_input_is_refused_and_nothing_written(torch):
    buf = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    a = buf[:1024].view(torch.int32)
    b = buf[512:1536].view(torch.int32)  # overlaps a
    src = torch.ones(256, dtype=torch.int32)
    cases = [
        ([a, b], [src, src], "overlap"),
        ([a], [torch.ones(256, dtype=torch.float32)], "holds f32"),
        ([a], [torch.ones(255, dtype=torch.int32)], "bytes"),
        ([buf[:2048].view(torch.int32).view(256, 2)[:, 0]], [src], "not contiguous"),
        ([a], [a], "not a CPU tensor"),
        ({"x": a}, {"y": src}, "keys differ"),
    ]
    for dst, s, msg in cases:
        with pytest.raises(ValueError, match=msg):
            pinlane.copy_into(dst, s)
    torch.cuda.synchronize()
    assert int(buf.count_nonzero()) == 0


def test_a_pair_with_a_forward_ad_tangent_is_refused_and_nothing_written(torch):
    # pinlane copies values: the tangent would be dropped without a word (torch's copy_
    # makes the destination dual). Both ways, copy_into, Buffers and Pairs, a dual source
    # or destination; a level open with no tangent in any pair copies as ever.
    from torch.autograd import forward_ad as fwAD

    dst = [torch.zeros(8, device="cuda"), torch.zeros(4, device="cuda")]
    host = [torch.zeros(8), torch.zeros(4)]
    x, dx, y = torch.arange(8.0), torch.ones(8), torch.full((4,), 2.0)
    with fwAD.dual_level():
        dual = fwAD.make_dual(x, dx)
        with pytest.raises(ValueError, match="pair 0: the source carries a forward-mode AD tangent"):
            pinlane.copy_into(dst, [dual, y])
        with pytest.raises(ValueError, match="pair 1: the source carries"):
            pinlane.Buffers(host).copy_from([dst[0], fwAD.make_dual(y.cuda(), y.cuda())])
        # A dual destination: its tangent would be left stale (torch's copy_ replaces it).
        dual_dst = fwAD.make_dual(torch.zeros(4, device="cuda"), torch.ones(4, device="cuda"))
        with pytest.raises(ValueError, match="pair 1: the destination carries"):
            pinlane.copy_into([dst[0], dual_dst], [x, y])
        # Pairs: refused when made, and at a copy once a bound source was written in place
        # from a dual tensor (it carries a tangent from then on).
        with pytest.raises(ValueError, match="Pairs: pair 0: the source carries"):
            pinlane.Pairs(dst, [dual, y])
        src = [torch.zeros(8), y.clone()]
        step = pinlane.Pairs(dst, src)
        src[0][:] = dual
        with pytest.raises(ValueError, match="Pairs: pair 0: the source carries"):
            step.copy()
        torch.cuda.synchronize()
        assert all(int(t.count_nonzero()) == 0 for t in dst + host)
        pinlane.copy_into(dst, [x, y])
        torch.cuda.synchronize()
        assert torch.equal(dst[0].cpu(), x) and torch.equal(dst[1].cpu(), y)


def test_buffers_check_once_and_copy_every_step(torch):
    buf = torch.zeros(8192, dtype=torch.uint8, device="cuda")
    dst = {"a": buf[:4096].view(torch.float32), "b": buf[4096:].view(torch.int64)}
    bufs = pinlane.Buffers(dst)
    for step in range(10):
        src = {"b": torch.full((512,), step, dtype=torch.int64), "a": torch.rand(1024)}
        bufs.copy_from(src)
        torch.cuda.synchronize()
        assert torch.equal(dst["a"].cpu(), src["a"]) and torch.equal(dst["b"].cpu(), src["b"])
    # Keys in the destinations' order pair by position (a fast path): the same result.
    src = {"a": torch.rand(1024), "b": torch.full((512,), 42, dtype=torch.int64)}
    bufs.copy_from(src)
    torch.cuda.synchronize()
    assert torch.equal(dst["a"].cpu(), src["a"]) and torch.equal(dst["b"].cpu(), src["b"])
    with pytest.raises(ValueError, match="destination for a int source"):
        bufs.copy_from({"a": torch.rand(1024), "b": 3})
    with pytest.raises(ValueError, match="not contiguous"):
        pinlane.Buffers([buf.view(2, 4096)[:, 0]])
    # The keys as taken at construction: a dict re-ordered since is not followed, whichever
    # order the source's keys come in (same dtypes and sizes: a wrong pairing would
    # write the wrong bytes without an error).
    buf2 = torch.zeros(2048, dtype=torch.uint8, device="cuda")
    d2 = {"x": buf2[:1024].view(torch.int32), "y": buf2[1024:].view(torch.int32)}
    b2 = pinlane.Buffers(d2)
    d2["x"] = d2.pop("x")  # the same tensors, now in the order y, x
    for s2 in ({"x": torch.full((256,), 1, dtype=torch.int32), "y": torch.full((256,), 2, dtype=torch.int32)},
               {"y": torch.full((256,), 4, dtype=torch.int32), "x": torch.full((256,), 3, dtype=torch.int32)}):
        b2.copy_from(s2)
        torch.cuda.synchronize()
        assert torch.equal(d2["x"].cpu(), s2["x"]) and torch.equal(d2["y"].cpu(), s2["y"])
    with pytest.raises(ValueError, match="keys differ"):
        bufs.copy_from({"a": torch.rand(1024)})
    # A flat list: paired without a walk, with pair()'s errors.
    lb = pinlane.Buffers([dst["a"], dst["b"]])
    lb.copy_from((torch.ones(1024), torch.full((512,), 7, dtype=torch.int64)))
    torch.cuda.synchronize()
    assert int(dst["b"][0]) == 7 and float(dst["a"][0]) == 1.0
    with pytest.raises(ValueError, match="2 destinations for 1"):
        lb.copy_from([torch.rand(1024)])
    with pytest.raises(ValueError, match="destination for a int source"):
        lb.copy_from([torch.rand(1024), 3])
    # Not flat (a nested list and a non-tensor leaf): the walk pairs it.
    nb = pinlane.Buffers([[dst["a"], dst["b"]], None])
    with pytest.raises(ValueError, match="a list destination for a Tensor source"):
        nb.copy_from([torch.rand(1024), torch.zeros(512, dtype=torch.int64)])


@pytest.mark.parametrize("pinned,in_place", [(False, False), (True, False), (False, True), (True, True)])
def test_pairs_copy_their_sources_as_they_are_at_each_step(torch, pinned, in_place):
    # Bound once; each step writes the same host tensors in place, and the copy takes
    # what they hold then (a 64 KiB page-locked source, or with in_place every source,
    # is read by the device after copy() returns, so the step waits for the stream
    # before writing it again).
    host = _inputs(torch, 0, pinned)
    buf, dst, places = _statics(torch, host, skew=1)
    step = pinlane.Pairs(dst, host, in_place=in_place)
    assert len(step) == len(host)
    for n in range(6):
        new = _inputs(torch, n, pinned)
        for k, v in host.items():
            v.copy_(new[k])
        step.copy()
        torch.cuda.current_stream().synchronize()
        assert torch.equal(buf.cpu(), _expected(torch, buf, new, places)), f"step {n}"
    # On a custom stream, after its work; a Buffers' destinations bind too.
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        buf.fill_(0)
        torch.cuda._sleep(20_000_000)
    pinlane.Pairs(pinlane.Buffers(dst), host).copy(stream=s)
    s.synchronize()
    assert torch.equal(buf.cpu(), _expected(torch, buf, new, places, fill=0))


def test_pairs_in_place_read_their_sources_on_the_device(torch):
    # With in_place, every source is read where it is, by the device once the stream
    # reaches the copy: a write made after copy() returns, while the stream is still busy
    # before it, is what arrives. Without it, pageable and small page-locked sources are
    # staged at copy() and their bytes then arrive.
    host = {
        "ids": torch.zeros(256, dtype=torch.int64).pin_memory(),  # 2 KiB, page-locked
        "lens": torch.zeros(16, dtype=torch.int32),  # pageable, beside others in the heap
        "pos": torch.zeros(16, dtype=torch.int32),
        "mask": torch.zeros(70_000, dtype=torch.uint8),  # pageable, over several pages
    }
    buf, dst, places = _statics(torch, host)
    for in_place in (False, True):
        step = pinlane.Pairs(dst, host, in_place=in_place)
        for v in host.values():
            v.fill_(1)
        torch.cuda._sleep(50_000_000)  # ~25 ms on torch's current stream, where the copy goes
        step.copy()
        for v in host.values():
            v.fill_(2)  # the stream has not reached the copy yet
        torch.cuda.synchronize()
        for k, v in dst.items():
            assert v.cpu().unique().tolist() == [2 if in_place else 1], (in_place, k)
    # While `step` lives, torch sees its pageable sources as page-locked; a second Pairs
    # bound in place to them shares the registration, which outlives `step`: the second
    # still reads them in place, correctly, once `step` is gone.
    assert host["mask"].is_pinned()
    second = pinlane.Pairs(dst, host, in_place=True)
    del step
    gc.collect()
    for v in host.values():
        v.fill_(3)
    torch.cuda._sleep(50_000_000)
    second.copy()
    for v in host.values():
        v.fill_(4)
    torch.cuda.synchronize()
    assert all(v.cpu().unique().tolist() == [4] for v in dst.values())
    del second
    gc.collect()
    torch.cuda.synchronize()
    # The last step's owners go back once pinlane sees it done (at most 5 ms pending).
    pinlane._native.settle(5.0)
    deadline = time.monotonic() + 2.0
    while host["mask"].is_pinned() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not host["mask"].is_pinned(), "the registration ends with the last Pairs"


def test_pairs_d2h_into_cpu_tensors(torch):
    src = {k: v.cuda() for k, v in _inputs(torch, 3).items()}
    dst = {k: torch.empty(v.shape, dtype=v.dtype, pin_memory=(k != "scale")) for k, v in src.items()}
    step = pinlane.Pairs(dst, src)
    for n in range(3):
        for v in src.values():
            v.add_(1)  # on torch's current stream: the copy waits for it
        step.copy()
        for k in src:
            assert torch.equal(dst[k], src[k].cpu()), (n, k)
    # On a stream of the caller's, after the work queued there (and after torch's current
    # stream): the call returns with the bytes in place.
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(20_000_000)
        for v in src.values():
            v.mul_(3)
    step.copy(stream=s)
    s.synchronize()
    for k in src:
        assert torch.equal(dst[k], src[k].cpu()), k


def test_pairs_refuse_what_cannot_be_read_in_place(torch):
    buf = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    a = buf[:1024].view(torch.int32)
    src = torch.ones(256, dtype=torch.int32)
    cases = [
        ([a], [torch.ones(512, dtype=torch.int32)[::2]], "not contiguous"),
        ([a], [torch._neg_view(src)], "negation bit"),
        ([a], [torch.ones(256, dtype=torch.float32)], "differ in dtype or size"),
        ([a], [torch.ones(255, dtype=torch.int32)], "differ in dtype or size"),
        ([a], [a], "not a CPU tensor"),
        ([torch.zeros(4, dtype=torch.complex64, device="cuda")], [torch.zeros(4, dtype=torch.complex64)], "pinlane lacks"),
        ({"x": a}, {"y": src}, "keys differ"),
    ]
    for dst, s, msg in cases:
        with pytest.raises(ValueError, match=msg):
            pinlane.Pairs(dst, s)
    # in_place says how CPU sources are read: meaningless for CUDA sources.
    with pytest.raises(ValueError, match="in_place=True is for CPU sources"):
        pinlane.Pairs([torch.zeros(256, dtype=torch.int32)], [a], in_place=True)
    # Overlapping destinations: found when the pairs are made (H2D), nothing queued.
    with pytest.raises(ValueError, match="overlap"):
        pinlane.Pairs([a, buf[512:1536].view(torch.int32)], [src, src])
    torch.cuda.synchronize()
    assert int(buf.count_nonzero()) == 0


def test_a_copy_that_fails_part_way_still_bumps_its_destinations_versions(torch, new_process):
    """A copy that fails once it may have written (a ``RuntimeError``: here a D2H copy
    whose wait outlasts ``sync_wait``, behind ~1 s of sleep on the current stream) bumps
    its destinations' version counters as a finished one does: autograd must not take
    partly written memory for unchanged. A refusal, which writes nothing, bumps nothing.
    Its own process: the setting must come before the first transfer, and the device's
    first transfer (which loads pinlane's kernels, waiting for all work on the device)
    comes before the sleep."""
    code = (
        "import torch, pinlane\n"
        "pinlane.configure(sync_wait_ms=100)\n"
        "src = torch.arange(4096, dtype=torch.float32, device='cuda')\n"
        "host = torch.zeros(4096)\n"
        "pinlane.copy_into([host], [src])\n"
        "assert torch.equal(host, src.cpu())\n"
        "v = host._version\n"
        "try:\n"
        "    pinlane.copy_into([host], [torch.zeros(3, device='cuda')])\n"
        "except ValueError:\n"
        "    pass\n"
        "refused_unbumped = host._version == v\n"
        "torch.cuda.synchronize()\n"
        "torch.cuda._sleep(2_000_000_000)\n"
        "try:\n"
        "    pinlane.copy_into([host], [src])\n"
        "    outcome = 'returned'\n"
        "except RuntimeError as e:\n"
        "    outcome = 'timeout' if 'sync_wait' in str(e) else repr(e)\n"
        "busy = not torch.cuda.current_stream().query()\n"
        "bumped = host._version > v\n"
        "torch.cuda.synchronize()\n"
        "print(outcome, busy, bumped, refused_unbumped, flush=True)\n"
    )
    r = new_process(code)
    out = r.stdout + r.stderr
    assert r.stdout.split() == ["timeout", "True", "True", "True"], out


def test_exit_gives_held_torch_tensors_back_first(torch, new_process):
    # Steps whose handles are dropped (Buffers.copy_from) leave their owners, clones of
    # torch tensors (the destinations, the page-locked sources), with pinlane's
    # completion thread for a while; handing them back after torch began to tear down
    # aborted the process now and then. pinlane's atexit handler settles first: this
    # check, registered before pinlane is imported, runs after it (atexit is LIFO) and
    # finds that the handler succeeded and that no staging slot is in use any more.
    code = (
        "import atexit\n"
        "def check():\n"
        "    import pinlane\n"
        "    s = pinlane.memory_stats()['staging']\n"
        "    print('exit', pinlane._exit_outcome, 'in_use', s['in_use_bytes'], flush=True)\n"
        "atexit.register(check)\n"
        "import torch, pinlane\n"
        "src = {'a': torch.arange(64).pin_memory(), 'b': torch.rand(256, 256)}\n"
        "dst = {'a': torch.zeros(64, dtype=torch.int64, device='cuda'),\n"
        "       'b': torch.zeros(256, 256, device='cuda')}\n"
        "bufs = pinlane.Buffers(dst)\n"
        "for _ in range(20):\n"
        "    bufs.copy_from(src)\n"
        "torch.cuda.current_stream().synchronize()\n"
        "assert torch.equal(dst['b'].cpu(), src['b']), 'bytes'\n"
        "print('steps done', flush=True)\n"
    )
    r = new_process(code)
    out = r.stdout + r.stderr
    assert r.stdout.split() == ["steps", "done", "exit", "ok", "in_use", "0"], out


def test_a_pair_torch_refuses_is_torchs_error_after_pinlanes_pairs(torch):
    """A pair torch's ``copy_`` refuses (autograd's rules: an output of ``split`` that
    requires grad) fails the call with torch's ``RuntimeError`` (the class that says the
    destinations may be partly written) after pinlane's pairs are written: torch's pairs
    come after pinlane's, so that the engine's own refusals (a capturing stream, bytes
    in flight) come before torch writes anything. Session 79 ran them first for a while;
    a review showed the engine's refusals then came after torch's writes."""
    for h2d in (True, False):
        dev, src_dev = ("cuda", "cpu") if h2d else ("cpu", "cuda")
        other = torch.zeros(4, device=dev)
        parts = list((torch.ones(8, device=dev, requires_grad=True) * 1).split(4))
        with pytest.raises(RuntimeError, match="multiple views"):
            pinlane.copy_into([other, parts[0]], [torch.ones(4, device=src_dev)] * 2)
        torch.cuda.synchronize()
        assert torch.equal(other.cpu(), torch.ones(4)), (h2d, other)


def test_a_typeerror_in_torchs_pairs_after_pinlanes_still_bumps_the_versions(torch):
    """Session 87 (a helper's review): ``_copied`` takes a ``ValueError`` or ``TypeError``
    for a refusal with nothing written, and bumps no version counter; one raised in
    torch's copy of a pair left to it (here a subclass whose ``__torch_function__`` gives
    up on ``copy_``) comes after pinlane's pairs are written, so their destinations kept
    stale versions and autograd took them for unchanged. It is a ``RuntimeError`` now,
    and they are bumped."""

    class Refusing(torch.Tensor):
        @classmethod
        def __torch_function__(cls, func, types, args=(), kwargs=None):
            if func is torch.Tensor.copy_:
                raise TypeError("copy_ refused on purpose")
            return super().__torch_function__(func, types, args, kwargs or {})

    for h2d in (True, False):
        dev, src_dev = ("cuda", "cpu") if h2d else ("cpu", "cuda")
        other, dst = torch.zeros(4, device=dev), torch.zeros(4, device=dev)
        # Requires grad: under grad mode autograd records the pair, so torch copies it.
        src = (torch.ones(4, device=src_dev, requires_grad=True) * 2).as_subclass(Refusing)
        v = other._version
        with pytest.raises(RuntimeError, match="on purpose"):
            pinlane.copy_into([other, dst], [torch.ones(4, device=src_dev), src])
        torch.cuda.synchronize()
        assert torch.equal(other.cpu(), torch.ones(4)), (h2d, other)  # pinlane's pair
        assert other._version > v, (h2d, "pinlane's destination kept its version")


def test_a_second_threads_copy_is_refused_while_torch_copies_the_first(torch):
    """Session 79 (a helper's review): the one-writer lock of a ``Buffers`` was let go
    when the native half returned, before the pairs left to torch were copied, so a
    second thread's copy ran beside them and the destinations could mix both batches."""
    import threading

    src = torch.ones(1 << 16, dtype=torch.complex64, device="cuda")
    bufs = pinlane.Buffers([torch.zeros(1 << 16, dtype=torch.complex64)])
    bufs.copy_from([src])
    torch.cuda.synchronize()
    errors = []

    def first():
        try:
            bufs.copy_from([src])  # torch's D2H copy waits behind the sleep below
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)

    torch.cuda._sleep(1_000_000_000)
    t = threading.Thread(target=first)
    t.start()
    time.sleep(0.1)
    try:
        with pytest.raises(RuntimeError, match="another thread"):
            bufs.copy_from([src])
    finally:
        t.join(30)
    assert not t.is_alive() and not errors, errors
    assert torch.equal(bufs._leaves[0], src.cpu())


def test_a_call_that_leaves_every_tensor_to_torch_waits_with_the_bound(torch, new_process):
    """A D2H call whose tensors all go to torch (a dtype pinlane lacks; one that requires
    grad) waits for the work before it bounded by ``sync_wait`` as pinlane's own waits
    are: before the fix torch's synchronous copy waited for its stream without a bound
    (here ~1 s of sleep, against a 100 ms bound), and returned. ``copy_into`` on torch's
    current stream and on a stream given, and ``transfer_tensor_d2h``; each times out
    with the destination unwritten and the stream still busy. Also ``copy_into`` where
    pinlane's only pair is empty (the engine queues nothing for it, so it waits for
    nothing: before session 85's fix the call then skipped the bounded wait too, and
    torch's copy waited without a bound). Its own process: the setting comes before the
    first transfer."""
    code = (
        "import torch, pinlane\n"
        "pinlane.configure(sync_wait_ms=100)\n"
        "src = torch.ones(4096, dtype=torch.complex64, device='cuda')\n"
        "host = torch.zeros(4096, dtype=torch.complex64)\n"
        "pinlane.copy_into([torch.zeros(4)], [torch.ones(4, device='cuda')])  # loads the kernels\n"
        "pinlane.copy_into([host], [src])\n"
        "assert torch.equal(host, src.cpu())\n"
        "side = torch.cuda.Stream()\n"
        "grad = torch.ones(4096, device='cuda', requires_grad=True)\n"
        "cases = {\n"
        "    'current': (torch.cuda.current_stream(), lambda: pinlane.copy_into([host], [src])),\n"
        "    'given': (side, lambda: pinlane.copy_into([host], [src], stream=side)),\n"
        "    'd2h': (torch.cuda.current_stream(), lambda: pinlane.transfer_tensor_d2h([grad])),\n"
        "    'empty': (torch.cuda.current_stream(),\n"
        "              lambda: pinlane.copy_into([torch.zeros(0), host], [torch.zeros(0, device='cuda'), src])),\n"
        "}\n"
        "for name, (on, call) in cases.items():\n"
        "    host.zero_()\n"
        "    torch.cuda.synchronize()\n"
        "    with torch.cuda.stream(on):\n"
        "        torch.cuda._sleep(2_000_000_000)\n"
        "    try:\n"
        "        call()\n"
        "        outcome = 'returned'\n"
        "    except RuntimeError as e:\n"
        "        outcome = 'timeout' if 'sync_wait' in str(e) else repr(e)\n"
        "    busy = not on.query()\n"
        "    unwritten = int(host.count_nonzero()) == 0\n"
        "    torch.cuda.synchronize()\n"
        "    print(name, outcome, busy, unwritten, flush=True)\n"
    )
    r = new_process(code)
    out = r.stdout + r.stderr
    assert r.stdout.split() == [
        "current", "timeout", "True", "True",
        "given", "timeout", "True", "True",
        "d2h", "timeout", "True", "True",
        "empty", "timeout", "True", "True",
    ], out
