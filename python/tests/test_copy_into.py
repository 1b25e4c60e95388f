"""copy_into's pairing of two containers (pure Python, every machine): same structure,
dicts paired by key, the first difference named."""

import collections
import dataclasses

import pytest

from pinlane._tree import pair


class Leaf:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return self.name


def names(xs):
    return [x.name for x in xs]


def test_dicts_pair_by_key_whatever_their_order():
    dst = {"a": Leaf("da"), "b": [Leaf("db0"), Leaf("db1")], "n": 3}
    src = {"b": [Leaf("sb0"), Leaf("sb1")], "n": 4, "a": Leaf("sa")}
    d, s = pair(dst, src, Leaf)
    assert names(d) == ["da", "db0", "db1"]
    assert names(s) == ["sa", "sb0", "sb1"]


def test_flat_lists_and_nested_containers():
    d, s = pair([Leaf("d0"), Leaf("d1")], [Leaf("s0"), Leaf("s1")], Leaf)
    assert (names(d), names(s)) == (["d0", "d1"], ["s0", "s1"])
    P = collections.namedtuple("P", "x y")

    @dataclasses.dataclass
    class D:
        p: P
        rest: tuple

    d, s = pair(D(P(Leaf("dx"), 1), (Leaf("dr"),)), D(P(Leaf("sx"), 2), (Leaf("sr"),)), Leaf)
    assert (names(d), names(s)) == (["dx", "dr"], ["sx", "sr"])


@pytest.mark.parametrize(
    "dst, src, where",
    [
        ({"a": Leaf("x")}, {"b": Leaf("y")}, "the keys differ: 'a', 'b'"),
        ([Leaf("x")], [Leaf("x"), Leaf("y")], "1 destinations for 2"),
        ({"a": [Leaf("x"), 5]}, {"a": [Leaf("x"), Leaf("y")]}, "at ['a'][1]: a int destination"),
        ([Leaf("x")], {"a": Leaf("y")}, "1 destinations for dict"),
        ({"a": Leaf("x")}, [Leaf("y")], "a dict destination for a list source"),
        ({"a": None}, {"a": [Leaf("y")]}, "a NoneType destination for a list source holding tensors"),
    ],
)
def test_structures_that_differ_are_a_value_error_naming_the_place(dst, src, where):
    with pytest.raises(ValueError, match="copy_into") as e:
        pair(dst, src, Leaf)
    assert where in str(e.value)


def test_copy_into_without_torch_or_cuda_is_an_error(monkeypatch):
    import sys

    import pinlane

    if "torch" in sys.modules:
        pytest.skip("torch is loaded in this process")
    with pytest.raises(RuntimeError, match="torch with a CUDA device"):
        pinlane.copy_into([], [])
    with pytest.raises(RuntimeError, match="torch with a CUDA device"):
        pinlane.Pairs([], [])


class _Dst:
    """What ``_copied`` needs of a ``Buffers`` or ``Pairs``: the bump and what it bumps."""

    def __init__(self):
        self.bumped = []
        self._written = ["d0", "d1"]
        self._bump = self.bumped.append


@pytest.mark.parametrize(
    "exc, bumps",
    [
        (ValueError("refused"), False),
        (TypeError("refused"), False),
        (RuntimeError("failed part way"), True),
        (MemoryError(), True),
        (KeyboardInterrupt(), True),
        (OSError("anything else"), True),
    ],
)
def test_a_copy_that_may_have_written_bumps_the_versions_whatever_ends_it(exc, bumps):
    # A refusal writes nothing; anything else may end a call after pinlane's pairs were
    # written (a KeyboardInterrupt in torch's copies of the pairs left to it), and then
    # the destinations' version counters must move, as torch's copy_ moves them.
    from pinlane import _copied

    def copy():
        raise exc

    dst = _Dst()
    with pytest.raises(type(exc)):
        _copied(dst, copy)
    assert dst.bumped == ([["d0", "d1"]] if bumps else [])
    dst = _Dst()
    assert _copied(dst, lambda x: x + 1, 1) == 2
    assert dst.bumped == [["d0", "d1"]]
