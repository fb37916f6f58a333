"""Where every number of a GPU or system preset comes from.

Each preset carries a ``[sources]`` table: one entry per key it gives, named
``"SECTION.KEY"`` (``"KEY"`` for a top-level key), either a string ``"KIND: reference"``
or, for an assumption, an inline table with its reason and a plausible range in the key's
own unit (argued from the hardware)::

    [sources]
    "compute.cus" = "paper: T3 Table 1"
    "dma.setup_ns" = { assumption = "pre-programmed commands leave a small issue cost", low = 10, high = 500 }

A key the file leaves out takes the schema's default, whose provenance is the schema
key's own (``Key.source``, same form). ``preset_params`` lists them all; the kinds:
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from devices.schema import OMIT, REQUIRED, Key, SpecError, Table

KINDS = {
    "datasheet": "a vendor's datasheet, whitepaper or specification",
    "measured": "a published measurement (cited)",
    "library": "a library's or simulator's own code (repository and file)",
    "paper": "stated by a paper (which, and where)",
    "derived": "computed from other parameters (which)",
    "assumption": "ASSUMPTION: a stated reason and a plausible range (low, high)",
    "off": "the mechanism is not modelled on this device (the value turns it off)",
}
__doc__ += "".join(f"\n- ``{k}``: {v}" for k, v in KINDS.items())

# keys that name or describe rather than set a value the clock reads: no source needed
DESCRIPTIVE = ("name", "description", "arch", "gpu", "launch_source", "sustained_source",
               "source", "store_source", "copy_source", "put_source", "library_source")


@dataclass(frozen=True)
class Source:
    """Where one value comes from: ``kind`` (a key of ``KINDS``), ``ref`` (the citation,
    file, paper, the parameters it is derived from, or the assumption's reason) and, for
    an assumption, its plausible range in the key's unit."""

    kind: str
    ref: str
    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        if self.kind == "assumption":
            return f"ASSUMPTION ({self.low:g} to {self.high:g}): {self.ref}"
        return f"{self.kind}: {self.ref}"

    def to_dict(self) -> dict:
        out = {"kind": self.kind, "ref": self.ref}
        if self.kind == "assumption":
            out.update(low=self.low, high=self.high)
        return out


def parse(entry: Any, where: str) -> Source:
    """A ``[sources]`` entry (or a ``Key.source``): ``"KIND: reference"`` or ``{assumption =
    "reason", low = X, high = Y}``; raises SpecError naming ``where``."""
    if isinstance(entry, str):
        kind, sep, ref = entry.partition(":")
        kind, ref = kind.strip(), ref.strip()
        if not sep or kind not in KINDS or kind == "assumption" or not ref:
            raise SpecError(f"{where}: {entry!r} must be 'KIND: reference' with KIND one of "
                            f"{', '.join(k for k in KINDS if k != 'assumption')} (an "
                            f"assumption: {{assumption = \"reason\", low = X, high = Y}})")
        return Source(kind, ref)
    if isinstance(entry, dict):
        if set(entry) != {"assumption", "low", "high"}:
            raise SpecError(f"{where}: an assumption is {{assumption = \"reason\", low = X, "
                            f"high = Y}}, got keys {sorted(entry)}")
        why, low, high = entry["assumption"], entry["low"], entry["high"]
        if not isinstance(why, str) or not why.strip():
            raise SpecError(f"{where}: the assumption's reason must be a non-empty string")
        for name, x in (("low", low), ("high", high)):
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise SpecError(f"{where}: {name} = {x!r} must be a number")
        if not low < high:
            raise SpecError(f"{where}: the range must have low < high, got {low!r} to {high!r}")
        return Source("assumption", why.strip(), float(low), float(high))
    raise SpecError(f"{where}: must be 'KIND: reference' or an assumption table, got {entry!r}")


@dataclass(frozen=True)
class PresetParam:
    """One key of a preset file as the clock reads it: ``key`` ("SECTION.KEY"), its value in
    the file's unit (the default when the file leaves it out), where it comes from, and
    the ``--set`` key that changes it."""

    key: str
    value: Any
    unit: str
    doc: str
    source: Source
    given: bool  # in the file (else the schema's default)
    set_key: str  # the --set form (gpu.SECTION.KEY, intra.KEY, nodes, ...)
    file: str  # the preset's name

    def to_dict(self) -> dict:
        return {"key": self.key, "value": self.value, "unit": self.unit, "doc": self.doc,
                "source": self.source.to_dict(), "given": self.given, "set": self.set_key,
                "file": self.file}


def _keys(table: Table, prefix: str = ""):
    """(dotted name, Key) of every key of ``table`` and its sections, file order."""
    for name, spec in table.keys.items():
        if isinstance(spec, Table):
            yield from _keys(spec, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", spec


def needs_source(name: str, key: Key) -> bool:
    """Whether a key sets a value the clock reads (every key but names, descriptions and
    the free-text ``*_source`` keys; ``sources`` itself)."""
    last = name.rsplit(".", 1)[-1]
    return name != "sources" and last not in DESCRIPTIVE


def _get(data: dict, name: str) -> tuple[bool, Any]:
    node: Any = data
    for part in name.split("."):
        if not isinstance(node, dict) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


MISSING = Source("missing", "no source given")


def preset_params(data: dict, table: Table, file: str, set_key,
                  strict: bool = True) -> list[PresetParam]:
    """Every key of the parsed preset ``data`` (schema ``table``) that the clock reads, with
    its provenance; ``set_key(dotted name) -> str``: its ``--set`` form. Raises SpecError
    for a given key without a ``[sources]`` entry, an entry for no key of the file, a
    left-out key whose default has no source, or an assumption whose range does not hold
    the value (``strict`` False: a missing source reads as ``MISSING``, a faulty one still
    raises)."""
    sources = data.get("sources", {})
    if not isinstance(sources, dict):
        raise SpecError(f"{file}: [sources] must be a table")
    out, named = [], set()
    for name, key in _keys(table):
        if not needs_source(name, key):
            continue
        given, value = _get(data, name)
        section = name.rsplit(".", 1)[0] if "." in name else ""
        if not given and section and isinstance(table.keys.get(section), Table) \
                and not _get(data, section)[0] and not table.keys[section].empty:
            continue  # an optional section the file leaves out: none of its keys is read
        if given:
            if name not in sources and not strict:
                src = MISSING
            elif name not in sources:
                raise SpecError(f"{file}: [sources] gives no source for {name} (add "
                                f"\"{name}\" = \"KIND: reference\" or an assumption table)")
            else:
                src = parse(sources[name], f"{file}: [sources] {name}")
                named.add(name)
        else:
            if key.default in (REQUIRED, OMIT):
                continue
            value = key.default if key.scale == 1 or not _number(key.default) \
                else key.default / key.scale
            if key.source is None and not strict:
                src = MISSING
            elif key.source is None:
                raise SpecError(f"{file}: {name} is left out and its default ({value!r}) "
                                f"has no source (devices: the schema Key's source)")
            else:
                src = parse(key.source, f"schema default of {name}")
        if src.kind == "assumption" and _number(value) and not src.low <= value <= src.high:
            raise SpecError(f"{file}: [sources] {name}: the range {src.low:g} to {src.high:g} "
                            f"does not hold the value {value!r}")
        out.append(PresetParam(name, value, key.unit, key.doc, src, given, set_key(name),
                               file))
    extra = set(sources) - named
    if extra:
        raise SpecError(f"{file}: [sources] names key(s) the file does not give: "
                        f"{sorted(extra)}")
    return out
