"""Property tests of the container walk (no torch, no GPU): flatten and rebuild keep the
structure, the container types and the identity of every leaf they do not replace."""

import collections
import dataclasses

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from pinlane._tree import flatten, pair, rebuild


class Leaf:
    """Stands in for torch.Tensor: the leaves that get replaced."""

    def __init__(self, n):
        self.n = n

    def __repr__(self):
        return f"Leaf({self.n})"


Point = collections.namedtuple("Point", ["x", "y"])


@dataclasses.dataclass
class Pair:
    a: object
    b: object
    tag: str = "t"


@dataclasses.dataclass(frozen=True)
class Frozen:
    a: object


class TaggedDict(dict):
    pass


leaves = st.one_of(
    st.integers(0, 1000).map(Leaf),
    st.integers(),
    st.text(max_size=3),
    st.none(),
    st.floats(allow_nan=False),
    st.integers(0, 5).map(lambda n: np.arange(n, dtype=np.float32)),
)


def containers(children):
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.tuples(children, children).map(lambda t: Point(*t)),
        st.dictionaries(st.text(max_size=3), children, max_size=4),
        st.dictionaries(st.text(max_size=3), children, max_size=4).map(
            lambda d: collections.defaultdict(list, d)),
        st.dictionaries(st.integers(0, 9), children, max_size=4).map(collections.OrderedDict),
        st.dictionaries(st.text(max_size=3), children, max_size=3).map(TaggedDict),
        st.tuples(children, children).map(lambda t: Pair(*t)),
        children.map(Frozen),
    )


batches = st.recursive(leaves, containers, max_leaves=30)


def same_shape(a, b, replaced):
    """`b` is `a` with each Leaf mapped through `replaced`; same types all the way."""
    if isinstance(a, Leaf):
        return b is replaced[id(a)]
    assert type(a) is type(b), (a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same_shape(x, y, replaced) for x, y in zip(a, b))
    if isinstance(a, dict):
        if isinstance(a, collections.defaultdict):
            assert a.default_factory is b.default_factory
        return list(a.keys()) == list(b.keys()) and all(
            same_shape(a[k], b[k], replaced) for k in a)
    if dataclasses.is_dataclass(a):
        return all(same_shape(getattr(a, f.name), getattr(b, f.name), replaced)
                   for f in dataclasses.fields(a))
    return a is b  # every other leaf: the same object


@settings(max_examples=300, deadline=None)
@given(batches)
def test_rebuild_with_new_leaves_keeps_structure_and_types(batch):
    found = flatten(batch, Leaf)
    new = [Leaf(x.n + 1) for x in found]
    replaced = {id(a): b for a, b in zip(found, new)}
    out = rebuild(batch, Leaf, new)
    assert same_shape(batch, out, replaced)
    assert flatten(out, Leaf) == new  # the same order both ways
    if not found:
        assert out is batch


@settings(max_examples=200, deadline=None)
@given(batches)
def test_rebuild_with_the_same_leaves_returns_the_batch_itself(batch):
    assert rebuild(batch, Leaf, flatten(batch, Leaf)) is batch


def test_namedtuple_defaultdict_and_dataclass_come_back_as_themselves():
    a, b = Leaf(1), Leaf(2)
    dd = collections.defaultdict(int, {"k": a})
    batch = {"p": Point(a, 3), "d": dd, "c": Pair(b, [a], tag="keep"), "f": Frozen(b)}
    out = rebuild(batch, Leaf, ["A", "B", "C", "D", "E"])
    assert out["p"] == Point("A", 3) and type(out["p"]) is Point
    assert type(out["d"]) is collections.defaultdict and out["d"].default_factory is int
    assert out["d"]["k"] == "B" and out["d"]["missing"] == 0
    assert out["c"] == Pair("C", ["D"], tag="keep")
    assert out["f"] == Frozen("E")
    assert batch["p"] == Point(a, 3) and batch["c"].a is b  # the input is unchanged


class Tagged(tuple):
    """A tuple subclass whose instances carry attributes (a request id, say)."""


class NamedTagged(Point):
    """A namedtuple's subclass without __slots__: its instances carry attributes too."""


def test_tuple_subclasses_keep_their_instance_attributes():
    # Regression (session 81): a tuple subclass came back without its instance
    # attributes (made again from its items alone), where list and dict subclasses keep
    # theirs through copy.copy.
    a, b = Leaf(1), Leaf(2)
    t = Tagged([a, 2])
    t.request = {"id": 7}
    n = NamedTagged(b, 3)
    n.source = "cam0"
    out = rebuild([t, n], Leaf, ["A", "B"])
    assert type(out[0]) is Tagged and tuple(out[0]) == ("A", 2) and out[0].request == {"id": 7}
    assert type(out[1]) is NamedTagged and out[1] == ("B", 3) and out[1].source == "cam0"
    assert tuple(t) == (a, 2) and n.x is b  # the input is unchanged


def test_a_count_mismatch_is_an_error_not_a_wrong_batch():
    batch = [Leaf(1), Leaf(2)]
    with pytest.raises(ValueError, match="fewer"):
        rebuild(batch, Leaf, ["x"])
    with pytest.raises(ValueError, match="more"):
        rebuild(batch, Leaf, ["x", "y", "z"])


def test_flat_sequences_take_the_short_way_with_the_same_results():
    # flatten/rebuild skip the recursive walk for a plain list or tuple of leaves (issue
    # 20): the results must be those of the walk.
    a, b = Leaf(1), Leaf(2)
    for seq in ([a, b], (a, b), [a], ()):
        assert flatten(seq, Leaf) == list(seq)
        assert rebuild(seq, Leaf, list(seq)) is seq
        out = rebuild(seq, Leaf, ["x"] * len(seq))
        assert type(out) is type(seq) and list(out) == ["x"] * len(seq)
    # A non-leaf among them: the walk, which keeps it and descends into containers.
    mixed = [a, 3, [b]]
    assert flatten(mixed, Leaf) == [a, b]
    assert rebuild(mixed, Leaf, ["x", "y"]) == ["x", 3, ["y"]]
    # Same length as the replacements but not all leaves: still the walk's count check.
    with pytest.raises(ValueError, match="more"):
        rebuild([a, 3], Leaf, ["x", "y"])
    # A namedtuple is a tuple subclass, not a tuple: rebuilt as itself.
    assert rebuild(Point(a, b), Leaf, ["x", "y"]) == Point("x", "y")


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=3), st.one_of(st.integers(0, 9).map(Leaf), st.integers()),
                       max_size=6),
       st.integers(-1, 1))
def test_flat_dicts_take_the_short_way_with_the_same_results(batch, extra):
    """flatten/rebuild skip the recursive walk for a plain dict whose values are all
    leaves (issue 20: a training batch): the results, and the errors when the count of
    replacements differs, must be those of the walk (``_collect`` / ``_rebuild``)."""
    from pinlane._tree import _collect, _rebuild

    walked = []
    _collect(batch, Leaf, walked)
    found = flatten(batch, Leaf)
    assert found == walked
    # The same leaves back: the same object.
    assert rebuild(batch, Leaf, found) is batch
    new = [Leaf(x.n + 10) for x in found] + [Leaf(99)] * max(extra, 0)
    del new[len(new) + min(extra, 0):]
    if len(new) != len(found):
        with pytest.raises(ValueError, match="more" if len(new) > len(found) else "fewer"):
            rebuild(batch, Leaf, new)
        return
    got, want = rebuild(batch, Leaf, new), _rebuild(batch, Leaf, iter(new))
    assert type(got) is dict and list(got.items()) == list(want.items())
    assert (got is batch) == (not found)


@settings(max_examples=300, deadline=None)
@given(batches)
@example(Leaf(0))
@example([Leaf(0)])
@example((Leaf(0),))
@example([[Leaf(0)]])
@example([Leaf(0), Leaf(1)])
@example(Point(Leaf(0), 1))
@example({"a": Leaf(0)})
def test_the_calls_single_tensor_way_matches_the_walk(batch):
    """The transfer calls' short way for one tensor, or a list or tuple of one, gives what
    flatten and rebuild give, for a new leaf and for the same leaf; other batches take
    the walk (``_single`` is None for them)."""
    from pinlane import _rewrapped, _single

    leaves = flatten(batch, Leaf)
    one = _single(batch, Leaf)
    t = type(batch)
    is_single = isinstance(batch, Leaf) or (t in (list, tuple) and len(batch) == 1 and isinstance(batch[0], Leaf))
    assert (one is not None) == is_single
    if one is None:
        return
    assert leaves == [one]
    new = Leaf(-1)
    got, want = _rewrapped(batch, one, new), rebuild(batch, Leaf, [new])
    assert type(got) is type(want) and flatten(got, Leaf) == [new]
    assert _rewrapped(batch, one, one) is rebuild(batch, Leaf, [one]) is batch


class SignedLeaf(Leaf):
    """A leaf that knows whether it is negated, as a torch tensor answers ``is_neg()``."""

    def __init__(self, n, neg=False):
        super().__init__(n)
        self.neg = neg

    def is_neg(self):
        return self.neg


class _Declined(Exception):
    """What the stand-in native half raises where a call leaves its short way."""


class _ShortWay:
    """Stands in for ``pinlane._native``: records the tensors its one-tensor entries get
    and gives each back moved (or as it is, with ``same``); any other entry raises
    ``_Declined``."""

    def __init__(self, same=False):
        self.got, self.same = [], same

    def _one(self, t, _arg):
        self.got.append(t)
        return t if self.same else ("moved", t)

    h2d_one = d2h_one = _one

    def __getattr__(self, name):
        raise _Declined(name)


@settings(max_examples=300, deadline=None)
@given(batches, st.booleans())
@example([SignedLeaf(0)], False)
@example((SignedLeaf(0),), True)
@example((SignedLeaf(0, neg=True),), False)
@example(SignedLeaf(1), False)
def test_the_calls_plain_tensor_way_takes_exactly_the_plain_single_tensors(batch, same):
    """Both public calls hand the native half one tensor in one call (``h2d_one``,
    ``d2h_one``) exactly where ``_single`` takes the batch, that leaf is of exactly the
    tensor type and not negated, and torch and pinlane have seen a GPU (``_Tensor``
    set); the result is the batch's container with the output in its place, or the batch
    itself where the output is the input. Any other batch goes on to the other ways."""
    import pinlane

    def signed(b):
        # The strategy's leaves as SignedLeaf (every third one negated), and one of a
        # subclass, which the short way leaves to the general path.
        # (A SignedLeaf of an example keeps its own sign.)
        return rebuild(b, Leaf, [x if type(x) is SignedLeaf else SignedLeaf(x.n, neg=x.n % 3 == 0)
                                 for x in flatten(b, Leaf)])

    class Sub(SignedLeaf):
        pass

    def declined():
        raise _Declined("general")

    batch = signed(batch)
    one = pinlane._single(batch, SignedLeaf)
    want = one if one is not None and type(one) is SignedLeaf and not one.neg else None
    calls = (lambda b: pinlane.transfer_tensor_h2d(b, num_caches=2),
             lambda b: pinlane.transfer_tensor_d2h(b, device="cuda:0"))
    saved = pinlane._native, pinlane._Tensor, pinlane._torch_with_cuda
    try:
        pinlane._torch_with_cuda = declined
        for tensor_type in (None, SignedLeaf):
            for call in calls:
                for b in (batch, [Sub(1)]):
                    native = _ShortWay(same)
                    pinlane._native, pinlane._Tensor = native, tensor_type
                    taken = want if tensor_type is not None and b is batch else None
                    if taken is None:
                        with pytest.raises(_Declined):
                            call(b)
                        assert native.got == []
                        continue
                    out = call(b)
                    assert native.got == [taken]
                    if same:
                        assert out is b
                    elif b is taken:
                        assert out == ("moved", taken)
                    else:
                        assert type(out) is type(b) and list(out) == [("moved", taken)]
    finally:
        pinlane._native, pinlane._Tensor, pinlane._torch_with_cuda = saved


def test_namedtuples_with_other_fields_are_not_paired_by_position():
    # Regression (session 79): two namedtuples of the same length were paired by
    # position, so a source went into another field's destination with no error.
    class Leaf:
        pass

    P = collections.namedtuple("P", "x y")
    Q = collections.namedtuple("Q", "y x")
    R = collections.namedtuple("R", "x y")
    dx, dy, sx, sy = Leaf(), Leaf(), Leaf(), Leaf()
    with pytest.raises(ValueError, match=r"at \['b'\]: a P\('x', 'y'\) destination for a Q"):
        pair({"b": P(dx, dy)}, {"b": Q(y=sy, x=sx)}, Leaf)
    # The same fields in the same order pair, whatever the types' names; so do a
    # namedtuple and a plain sequence, by position.
    assert pair({"b": P(dx, dy)}, {"b": R(sx, sy)}, Leaf) == ([dx, dy], [sx, sy])
    assert pair([P(dx, dy)], [(sx, sy)], Leaf) == ([dx, dy], [sx, sy])
