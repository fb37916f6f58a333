"""One schema layer for every TOML file t3emu reads: GPU and system presets, scenarios and
model files.

A schema is data: a `Table` of `Key`s, some of them tables of their own (a section,
``[memory]``) or lists of tables (``[[cases]]``). `check` validates a parsed document
against it and returns its values (numbers in SI units where a key has a unit scale), or
raises `SpecError` with one line naming the file, the section and the key:

    gpu.toml: [memory] hbm_gb_per_s = -1 is impossible hardware; it must be > 0
    scenario.toml: cases[2] colour: unknown key(s) ['colour']; allowed: [...]

`json_schema` exports the same rules as JSON Schema (draft 2020-12) for editors
(``t3emu schema KIND``; ``docs/schemas/``). The rules a schema cannot state (one key's
value bounding another's, names that only a registry knows) stay with the parser that
reads the file, after `check`, with messages in the same form.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any


class SpecError(ValueError):
    """A device file is malformed or describes impossible hardware."""


REQUIRED = object()  # a key the file must give
OMIT = object()  # an optional key without a default: absent from check()'s result

# Every number of a hardware file (GPU or system), in the key's own unit (GB/s, us, ns,
# MB, a count, a fraction), lies in this range unless it is 0: the presets' lie from 0.5
# to 27,500; six orders of magnitude either side admit any GPU while refusing a typo's
# 1e-300 (times of 300 digits) or 1e300 (overflows inside the ranks).
PLAUSIBLE = (1e-6, 1e9)

_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false",
          list: "a list", dict: "a table"}


@dataclass(frozen=True)
class Key:
    """One key: its type (``int``, ``float``, ``str``, ``bool``, ``list``, ``dict``: a table
    of any keys), where its value goes (``attr``, default the key) in what unit (``scale``:
    x the file's unit gives SI) and its bounds.

    ``items``: a list's element, a type or a `Table` (a list of tables); ``choices``: the
    allowed strings (of the value, or of a list's elements); ``zero``: a hardware number
    may be 0; ``minimum`` / ``maximum`` (``open_min``: > rather than >=) with ``why``, the
    reason shown when a bound is broken; ``nonempty``: a list needs an element;
    ``source``: where the default comes from (``devices/sources.py``: "KIND: reference"
    or an assumption table), for a hardware file's key with a default."""

    kind: type
    doc: str = ""
    attr: str = ""
    scale: float = 1.0
    default: Any = REQUIRED
    zero: bool = False
    choices: tuple = ()
    items: Any = None
    minimum: float | None = None
    maximum: float | None = None
    open_min: bool = False
    why: str = ""
    nonempty: bool = False
    unit: str = ""
    source: Any = None


@dataclass(frozen=True)
class Table:
    """A table's keys (`Key`) and sections (`Table`). ``hardware``: numbers are hardware
    (>= 0, and > 0 unless the key may be ``zero``, within `PLAUSIBLE`); ``required``: a
    section the file must have; ``empty``: an absent optional section reads as an empty
    one (its keys' defaults) rather than being left out."""

    keys: dict[str, Key | Table]
    doc: str = ""
    hardware: bool = False
    required: bool = True
    empty: bool = False
    title: str = ""

    def sections(self) -> dict[str, Table]:
        return {k: v for k, v in self.keys.items() if isinstance(v, Table)}


def _fail(where: str, text: str) -> SpecError:
    return SpecError(f"{where} {text}" if where else text)


def _number(where: str, key: Key, value: Any, hardware: bool) -> Any:
    typ = key.kind
    if isinstance(value, bool) or not isinstance(value, (int,) if typ is int else (int, float)):
        raise _fail(where, f"must be {_NAMES[typ]}, got {value!r}")
    if not math.isfinite(value):
        raise _fail(where, f"= {value!r} must be a finite number")
    if hardware:
        if value < 0 or (value == 0 and not key.zero):
            raise _fail(where, f"= {value!r} is impossible hardware; it must be "
                               f"{'>= 0' if key.zero else '> 0'}")
        if value and not PLAUSIBLE[0] <= value <= PLAUSIBLE[1]:
            raise _fail(where, f"= {value!r} is implausible hardware: a value other than 0 "
                               f"must lie from {PLAUSIBLE[0]:g} to {PLAUSIBLE[1]:g} in the "
                               f"key's unit")
    low, high = key.minimum, key.maximum
    below = low is not None and (value <= low if key.open_min else value < low)
    if below or (high is not None and value > high):
        if low is not None and high is not None:
            bounds = f"in {'(' if key.open_min else '['}{low:g}, {high:g}]"
        else:
            bounds = f"{'>' if key.open_min else '>='} {low:g}" if low is not None \
                else f"<= {high:g}"
        raise _fail(where, f"= {value!r} must be {bounds}" + (f" ({key.why})" if key.why else ""))
    return typ(value * key.scale) if typ is int else float(value) * key.scale


def _value(where: str, key: Key, value: Any, hardware: bool, at: str, source: str) -> Any:
    if key.kind in (int, float):
        return _number(where, key, value, hardware)
    if key.kind is str:
        if not isinstance(value, str):
            raise _fail(where, f"must be a string, got {value!r}")
        if key.choices and value not in key.choices:
            raise _fail(where, f"= {value!r}; allowed: {', '.join(key.choices)}"
                        + (f" ({key.why})" if key.why else ""))
        return value
    if key.kind is bool:
        if not isinstance(value, bool):
            raise _fail(where, f"must be true or false, got {value!r}")
        return value
    if key.kind is dict:
        if not isinstance(value, dict):
            raise _fail(where, f"must be a table, got {value!r}")
        return value
    # a list
    if not isinstance(value, list) or (key.nonempty and not value):
        raise _fail(where, f"must be a{' non-empty' if key.nonempty else ''} list of "
                           f"{_item_name(key)}, got {value!r}")
    if isinstance(key.items, Table):
        return tuple(check(v, key.items, source, f"{at}[{i}]", hardware)
                     for i, v in enumerate(value))
    item = Key(key.items, choices=key.choices, minimum=key.minimum, maximum=key.maximum,
               open_min=key.open_min, why=key.why)
    out = []
    for v in value:
        try:
            out.append(_value(where, item, v, hardware, at, source))
        except SpecError:
            raise _fail(where, f"= {value!r} must be a list of {_item_name(key)}") from None
    return tuple(out)


def _item_name(key: Key) -> str:
    if isinstance(key.items, Table):
        return "tables"
    if key.choices:
        return f"{', '.join(key.choices)}"
    name = {int: "integers", float: "numbers", str: "strings"}.get(key.items, "values")
    if key.minimum is not None:
        name += f" {'>' if key.open_min else '>='} {key.minimum:g}"
    return name


def check(data: Any, table: Table, source: str, at: str = "",
          hardware: bool = False) -> dict[str, Any]:
    """``data`` (a parsed TOML table) checked against ``table``: its values by attribute
    (sections as nested dicts), defaults filled in; the first fault raises `SpecError`.
    ``source`` names the file in messages; ``at`` is the table's place in it;
    ``hardware``: the table is part of a hardware file (its numbers are hardware)."""
    hardware = hardware or table.hardware
    where = f"{source}: {at}" if at else f"{source}:"
    if not isinstance(data, dict):
        raise _fail(where, "must be a table")
    extra = set(data) - set(table.keys)
    if extra:
        raise _fail(where, f"unknown key(s) {sorted(extra)}; allowed: {sorted(table.keys)}")
    out: dict[str, Any] = {}
    for name, spec in table.keys.items():
        if isinstance(spec, Table):
            sub_at = f"[{name}]" if not at else f"{at}.{name}" if at.startswith("[") \
                else f"{at} [{name}]"
            if name not in data:
                if spec.required:
                    raise _fail(where, f"missing section [{name}]")
                if spec.empty:
                    out[name] = check({}, spec, source, sub_at, hardware)
                continue
            if not isinstance(data[name], dict):
                raise _fail(f"{source}: {sub_at}", "must be a table")
            out[name] = check(data[name], spec, source, sub_at, hardware)
            continue
        if name not in data:
            if spec.default is REQUIRED:
                raise _fail(where, f"missing key '{name}'")
            if spec.default is not OMIT:
                out[spec.attr or name] = spec.default
            continue
        at_key = f"{at} {name}" if at else name
        out[spec.attr or name] = _value(f"{source}: {at_key}", spec, data[name], hardware,
                                        at_key, source)
    return out


def flat(values: dict[str, Any], table: Table) -> dict[str, Any]:
    """``check``'s nested result as one dict (every section's values by attribute)."""
    out = {k: v for k, v in values.items() if k not in table.sections()}
    for name, sub in table.sections().items():
        if name in values:
            out.update(flat(values[name], sub))
    return out


# --- JSON Schema, for editors -------------------------------------------------------

_JSON_TYPES = {int: "integer", float: "number", str: "string", bool: "boolean",
               list: "array", dict: "object"}


def _json_key(key: Key, hardware: bool) -> dict[str, Any]:
    if key.kind is list:
        items = (_json_table(key.items, hardware) if isinstance(key.items, Table)
                 else _json_key(Key(key.items, choices=key.choices, minimum=key.minimum,
                                    maximum=key.maximum, open_min=key.open_min), hardware))
        out: dict[str, Any] = {"type": "array", "items": items}
        if key.nonempty:
            out["minItems"] = 1
    else:
        out = {"type": _JSON_TYPES[key.kind]}
    if key.kind is not list and key.choices:
        out["enum"] = list(key.choices)
    if key.kind in (int, float):
        low, open_low = key.minimum, key.open_min
        if hardware and (low is None or low < 0 or (low == 0 and not open_low)):
            low, open_low = 0, not key.zero
        if low is not None:
            out["exclusiveMinimum" if open_low else "minimum"] = low
        high = key.maximum
        if hardware:
            high = PLAUSIBLE[1] if high is None else min(high, PLAUSIBLE[1])
        if high is not None:
            out["maximum"] = high
    text = key.doc + (f" ({key.unit})" if key.unit else "")
    if text:
        out["description"] = text
    if key.default not in (REQUIRED, OMIT) and key.default is not None \
            and not isinstance(key.default, tuple):
        out["default"] = key.default
    return out


def _json_table(table: Table, hardware: bool = False) -> dict[str, Any]:
    hardware = hardware or table.hardware
    props = {name: (_json_table(spec, hardware) if isinstance(spec, Table)
                    else _json_key(spec, hardware))
             for name, spec in table.keys.items()}
    required = [name for name, spec in table.keys.items()
                if (spec.required if isinstance(spec, Table) else spec.default is REQUIRED)]
    out: dict[str, Any] = {"type": "object", "properties": props,
                           "additionalProperties": False}
    if required:
        out["required"] = required
    if table.doc:
        out["description"] = table.doc
    return out


def json_schema(tables: Table | list[Table], title: str, doc: str = "") -> dict[str, Any]:
    """The JSON Schema of a file whose top level is ``tables`` (several: the file is one
    of them, e.g. a model of either kind)."""
    body = (_json_table(tables) if isinstance(tables, Table)
            else {"oneOf": [_json_table(t) for t in tables]})
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": title,
            **({"description": doc} if doc else {}), **body}

