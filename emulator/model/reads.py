"""Which of a device's fields a run reads: the causes split's counterfactual steps change a
few fields of the device (``ablation.ablate``); a run that read none of the fields a step
changes would run the same on the changed device (the clock is a deterministic function
of what it reads), so that step's run can be skipped and its times taken from the run
before it.

``watched(device, fields)`` is a copy of ``device`` (a frozen dataclass, with nested ones)
whose ``fields`` ((class name, field name) pairs, ``differences``) are read through a
property that notes the read while ``reading()`` is active; every other field is read as
before. A read goes through attribute access (methods of the spec read ``self.x``;
``dataclasses.replace``, ``==`` and ``hash`` read every field and so count as reads of all
of them); a watched device refuses to be pickled or copied, whose copies would read
unwatched."""

from __future__ import annotations

import contextlib
import dataclasses

Field = tuple[str, str]  # (the owning dataclass's name, the field's name)

_seen: set[Field] | None = None  # the fields read while ``reading`` is active
_classes: dict[tuple[type, frozenset], type] = {}


def differences(a, b) -> set[Field]:
    """The leaf fields in which dataclass instances ``a`` and ``b`` (of one class) differ,
    nested dataclasses compared field by field."""
    out: set[Field] = set()
    for f in dataclasses.fields(a):
        x, y = getattr(a, f.name), getattr(b, f.name)
        if (dataclasses.is_dataclass(x) and dataclasses.is_dataclass(y)
                and type(x) is type(y)):
            out |= differences(x, y)
        elif x != y:
            out.add((type(a).__name__, f.name))
    return out


def _watched_class(base: type, names: frozenset) -> type:
    got = _classes.get((base, names))
    if got is not None:
        return got

    def prop(name: str):
        key = (base.__name__, name)

        def get(self):  # (a run's hot path: the note inline)
            if _seen is not None:
                _seen.add(key)
            return self.__dict__[name]

        def put(self, value):  # (the dataclass's own __init__, as ``replace`` calls it)
            self.__dict__[name] = value
        return property(get, put)

    def eq(self, other):  # as the base class compares (a watched copy equals its original)
        if not isinstance(other, base):
            return NotImplemented
        return all(getattr(self, f.name) == getattr(other, f.name)
                   for f in dataclasses.fields(base) if f.compare)

    def refuse(self, protocol=None):
        raise TypeError(f"a watched {base.__name__} is not copied or pickled (its copy's "
                        f"reads would go unseen)")

    attrs = {n: prop(n) for n in names}
    attrs.update(__eq__=eq, __hash__=base.__hash__, __reduce_ex__=refuse,
                 __copy__=refuse, __deepcopy__=refuse, __module__=__name__,
                 __qualname__=f"watched.{base.__qualname__}")
    got = _classes[(base, names)] = type(f"Watched{base.__name__}", (base,), attrs)
    return got


def watched(obj, fields: set[Field]):
    """A copy of dataclass ``obj`` whose ``fields`` (here or in nested dataclasses) note
    their reads; ``obj`` itself where none of them is its own or a nested one's."""
    nested = {}
    for f in dataclasses.fields(obj):
        v = obj.__dict__[f.name]
        if dataclasses.is_dataclass(v) and not isinstance(v, type):
            w = watched(v, fields)
            if w is not v:
                nested[f.name] = w
    names = frozenset(n for c, n in fields if c == type(obj).__name__)
    if not names and not nested:
        return obj
    out = object.__new__(_watched_class(type(obj), names) if names else type(obj))
    out.__dict__.update(obj.__dict__)
    out.__dict__.update(nested)
    return out


@contextlib.contextmanager
def reading():
    """The set of watched fields read inside the block (one block at a time)."""
    global _seen
    if _seen is not None:
        raise RuntimeError("reads are already being watched")
    _seen = set()
    try:
        yield _seen
    finally:
        _seen = None
