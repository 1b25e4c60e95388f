"""The containers spdl accepts, walked and rebuilt.

A batch is a leaf or a container of batches. Containers: ``list``, ``tuple`` (and
``namedtuple``, and other ``tuple``/``list`` subclasses), ``dict`` (and ``OrderedDict``,
``defaultdict``, other ``dict`` subclasses), and dataclass instances. Every other object
is a leaf. ``flatten`` lists the leaves that are instances of a class (torch.Tensor) in a
fixed order; ``rebuild`` puts replacements back in that same order, making each container
again with its own type:

* a namedtuple comes back as the same namedtuple class, a defaultdict with the same
  ``default_factory``, a dict or list subclass or dataclass with its other attributes
  (it is copied with ``copy.copy``, then its items or fields are set), a tuple subclass
  made again from its items with its instance attributes (``__dict__``) copied over;
* a container in which no leaf was replaced comes back as the same object, so a batch
  with nothing to move is returned as is.

Both walks visit a dict's items in their order, a dataclass's fields in declaration order,
and sequences front to back, so the two always agree.
"""

import copy
import dataclasses
import operator
from itertools import repeat

__all__ = ["flatten", "rebuild", "pair"]


def _is_dataclass_instance(obj):
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)


def flatten(batch, leaf_type):
    """The leaves of ``batch`` that are instances of ``leaf_type``, in walk order."""
    t = type(batch)
    if t is list or t is tuple:
        # The common cases first, without the recursive walk: a flat list of leaves,
        out = []
        for x in batch:
            if not isinstance(x, leaf_type):
                break
            out.append(x)
        else:
            return out
    elif t is dict:
        # or a flat dict of them (a training batch).
        out = list(batch.values())
        if all(map(isinstance, out, repeat(leaf_type))):
            return out
    out = []
    _collect(batch, leaf_type, out)
    return out


def _collect(obj, leaf_type, out):
    if isinstance(obj, leaf_type):
        out.append(obj)
    elif isinstance(obj, (list, tuple)):
        for x in obj:
            _collect(x, leaf_type, out)
    elif isinstance(obj, dict):
        for x in obj.values():
            _collect(x, leaf_type, out)
    elif _is_dataclass_instance(obj):
        for f in dataclasses.fields(obj):
            _collect(getattr(obj, f.name), leaf_type, out)


def rebuild(batch, leaf_type, replacements):
    """``batch`` with its ``leaf_type`` leaves replaced, in walk order, by
    ``replacements`` (a sequence as long as ``flatten(batch, leaf_type)``)."""
    t = type(batch)
    if (t is list or t is tuple) and len(batch) == len(replacements):
        # A flat list of leaves, without the recursive walk (same result).
        changed = False
        for x, r in zip(batch, replacements):
            if not isinstance(x, leaf_type):
                break
            changed = changed or x is not r
        else:
            if not changed:
                return batch
            return list(replacements) if t is list else tuple(replacements)
    if t is dict and len(batch) == len(replacements):
        # A flat dict of leaves (a training batch), without the recursive walk (same
        # result: the keys in their order, the same object where nothing changed).
        vals = batch.values()
        if all(map(isinstance, vals, repeat(leaf_type))):
            if all(map(operator.is_, vals, replacements)):
                return batch
            return dict(zip(batch, replacements))
    it = iter(replacements)
    out = _rebuild(batch, leaf_type, it)
    if next(it, _END) is not _END:
        raise ValueError("more replacements than leaves: the batch changed while moving")
    return out


_END = object()


def _next(it):
    x = next(it, _END)
    if x is _END:
        raise ValueError("fewer replacements than leaves: the batch changed while moving")
    return x


def _rebuild(obj, leaf_type, it):
    if isinstance(obj, leaf_type):
        return _next(it)
    t = type(obj)
    if t is list or t is tuple:
        items = [_rebuild(x, leaf_type, it) for x in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        return items if t is list else tuple(items)
    if isinstance(obj, (list, tuple)):
        items = [_rebuild(x, leaf_type, it) for x in obj]
        if all(a is b for a, b in zip(items, obj)):
            return obj
        if isinstance(obj, tuple):
            new = t(*items) if hasattr(t, "_fields") else t(items)  # a namedtuple: by field
            # A subclass's own attributes, as a list or dict subclass keeps them (through
            # copy.copy, which a tuple cannot take: its items are fixed at creation).
            state = getattr(obj, "__dict__", None)
            if state:
                new.__dict__.update(state)
            return new
        new = copy.copy(obj)  # a list subclass, with its attributes
        new[:] = items
        return new
    if isinstance(obj, dict):
        items = [(k, _rebuild(v, leaf_type, it)) for k, v in obj.items()]
        if all(v is obj[k] for k, v in items):
            return obj
        if t is dict:
            return dict(items)
        new = copy.copy(obj)  # keeps the type, default_factory, other attributes
        for k, v in items:
            new[k] = v
        return new
    if _is_dataclass_instance(obj):
        values = [(f.name, _rebuild(getattr(obj, f.name), leaf_type, it))
                  for f in dataclasses.fields(obj)]
        if all(v is getattr(obj, n) for n, v in values):
            return obj
        new = copy.copy(obj)
        for n, v in values:
            object.__setattr__(new, n, v)  # also for frozen dataclasses
        return new
    return obj


def pair(dst, src, leaf_type):
    """The ``leaf_type`` leaves of ``dst`` and ``src`` at the same places, as two lists in
    ``dst``'s walk order. The two must have the same structure: sequences of the same
    lengths (namedtuples with the same fields, in the same order), dicts with the same
    keys (paired by key, whatever their order), dataclasses of the same type; a
    ``leaf_type`` leaf in one must meet one in the other. Other leaves are not compared.
    Raises ``ValueError`` naming the first place that differs."""
    t = type(dst)
    # The common cases first, without the recursive walk: two flat lists, or two flat
    # dicts with the same keys, of leaves.
    if (t is list or t is tuple) and type(src) is t and len(dst) == len(src):
        if all(map(isinstance, dst, repeat(leaf_type))) and all(
            map(isinstance, src, repeat(leaf_type))
        ):
            return list(dst), list(src)
    if t is dict and type(src) is dict and dst.keys() == src.keys():
        d = list(dst.values())
        s = [src[k] for k in dst]
        if all(map(isinstance, d, repeat(leaf_type))) and all(map(isinstance, s, repeat(leaf_type))):
            return d, s
    dsts, srcs = [], []
    _pair(dst, src, leaf_type, [], dsts, srcs)
    return dsts, srcs


def _pair(d, s, leaf_type, path, dsts, srcs):
    def differ(why):
        at = "".join(path)
        return ValueError(f"copy_into: at {at or 'the top'}: {why}")

    if isinstance(d, leaf_type) or isinstance(s, leaf_type):
        if not (isinstance(d, leaf_type) and isinstance(s, leaf_type)):
            raise differ(
                f"a {type(d).__name__} destination for a {type(s).__name__} source"
            )
        dsts.append(d)
        srcs.append(s)
    elif isinstance(d, (list, tuple)):
        if not isinstance(s, (list, tuple)) or len(s) != len(d):
            n = len(s) if isinstance(s, (list, tuple)) else type(s).__name__
            raise differ(f"{len(d)} destinations for {n}")
        # Two namedtuples pair by field name, as the Rust batches' fields do: with other
        # fields, or the same in another order, pairing by position would copy a source
        # into another field's destination. (One side's positions against a plain
        # sequence's are what the plain sequence means.)
        fd, fs = getattr(type(d), "_fields", None), getattr(type(s), "_fields", None)
        if isinstance(fd, tuple) and isinstance(fs, tuple) and fd != fs:
            raise differ(
                f"a {type(d).__name__}{fd} destination for a {type(s).__name__}{fs} source"
            )
        for i, (x, y) in enumerate(zip(d, s)):
            path.append(f"[{i}]")
            _pair(x, y, leaf_type, path, dsts, srcs)
            path.pop()
    elif isinstance(d, dict):
        if not isinstance(s, dict) or s.keys() != d.keys():
            keys = sorted(map(repr, d.keys() ^ s.keys())) if isinstance(s, dict) else None
            raise differ(
                f"the keys differ: {', '.join(keys)}" if keys is not None
                else f"a dict destination for a {type(s).__name__} source"
            )
        for k, x in d.items():
            path.append(f"[{k!r}]")
            _pair(x, s[k], leaf_type, path, dsts, srcs)
            path.pop()
    elif _is_dataclass_instance(d):
        if type(s) is not type(d):
            raise differ(f"a {type(d).__name__} destination for a {type(s).__name__} source")
        for f in dataclasses.fields(d):
            path.append(f".{f.name}")
            _pair(getattr(d, f.name), getattr(s, f.name), leaf_type, path, dsts, srcs)
            path.pop()
    elif flatten(s, leaf_type):
        raise differ(f"a {type(d).__name__} destination for a {type(s).__name__} source holding tensors")
