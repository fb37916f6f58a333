"""What-ifs without editing files: ``--set KEY=VALUE`` overrides one key of a GPU preset
or of a system file before the file is checked, so an override is refused exactly as the
same value written in the file would be.

Keys:

- ``gpu.KEY`` or ``gpu.SECTION.KEY``: a key of the GPU file (``gpu.cus``,
  ``gpu.memory.hbm_gb_per_s``); the short form when the key name is in one section only;
- ``nodes``, ``gpus_per_node``, ``intra.KEY``, ``network.KEY``: a key of the system file
  (``--system``). Without a system, ``intra.KEY`` is the GPU file's own
  ``[interconnect]`` key of that name (the run's intra-node links);
- ``model.NAME``: a parameter of the model's code (``t3emu params`` lists them).

Values are TOML values (``160``, ``0.9``, ``true``, ``"switch"``; a bare word is a
string).
"""

from __future__ import annotations

import copy
import json
import sys
from typing import Any

from devices.spec import DEVICE_TABLE, SpecError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

Override = tuple[str, Any]  # ("gpu.cus", 160)

_GPU_SECTIONS: dict[str, set[str]] = {
    name: set(table.keys) for name, table in DEVICE_TABLE.sections().items()}


def _system_keys() -> dict[str, set[str]]:
    from devices.system import SYSTEM_TABLE, TOP_KEYS

    return {"": set(TOP_KEYS), **{name: set(table.keys)
                                 for name, table in SYSTEM_TABLE.sections().items()}}


def parse_value(text: str) -> Any:
    """A TOML value; a bare word that is no TOML value is a string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def format_value(value: Any) -> str:
    """The TOML text of a value (``parse_value`` reads it back)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value) if isinstance(value, (str, list)) else repr(value)


def parse(item: str) -> Override:
    """``KEY=VALUE`` -> (key, value); raises SpecError on a malformed item."""
    key, sep, text = item.partition("=")
    if not sep or not key.strip() or not text.strip():
        raise SpecError("KEY=VALUE, e.g. gpu.cus=160 or intra.link_gb_per_s_per_direction=300")
    return key.strip(), parse_value(text.strip())


def _gpu_key(key: str) -> tuple[str, str]:
    """``gpu.KEY`` / ``gpu.SECTION.KEY`` -> (section, key) of the GPU file."""
    parts = key.split(".")[1:]
    if len(parts) == 2 and parts[1] in _GPU_SECTIONS.get(parts[0], ()):
        return parts[0], parts[1]
    if len(parts) == 1:
        found = [s for s, keys in _GPU_SECTIONS.items() if parts[0] in keys]
        if len(found) == 1:
            return found[0], parts[0]
        if found:
            raise SpecError(f"{key} is in sections {', '.join(found)} of the GPU file: give "
                            f"{' or '.join(f'gpu.{s}.{parts[0]}' for s in found)}")
    raise SpecError(f"unknown key {key}; GPU keys: " + ", ".join(gpu_keys()))


def gpu_keys() -> list[str]:
    """Every GPU key in its shortest form (``gpu.KEY``, or ``gpu.SECTION.KEY`` where the name
    is in several sections)."""
    count: dict[str, int] = {}
    for keys in _GPU_SECTIONS.values():
        for k in keys:
            count[k] = count.get(k, 0) + 1
    return sorted(f"gpu.{k}" if count[k] == 1 else f"gpu.{s}.{k}"
                  for s, keys in _GPU_SECTIONS.items() for k in keys)


def check(overrides: tuple[Override, ...], system: bool) -> None:
    """Refuse unknown keys, a key given twice (in any spelling: ``gpu.cus`` and
    ``gpu.compute.cus`` are one key) and system keys without a system (the values are
    checked when the files load)."""
    seen: dict[tuple[str, str, str], str] = {}
    for key, _ in overrides:
        where = split(key, system)
        if where in seen:
            raise SpecError(f"a key is given twice: {seen[where]} and {key}")
        seen[where] = key


def flatten(table: dict, prefix: str = "") -> dict[str, Any]:
    """A scenario's ``set`` table with its keys as ``--set`` writes them: TOML reads an
    unquoted dotted key (``gpu.cus = 160``) as nested tables, which become "gpu.cus"."""
    out: dict[str, Any] = {}
    for key, value in table.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            out.update(flatten(value, name + "."))
        else:
            out[name] = value
    return out


def split(key: str, system: bool) -> tuple[str, str, str]:
    """(file, section, key) an override key names: file "gpu" or "system", or "model" (a
    parameter of the model's code, ``emulator/model/params.py``; its name is checked
    where the run's parameters are activated)."""
    if key.startswith("model.") and key[len("model."):]:
        return ("model", "", key[len("model."):])
    if key.startswith("gpu."):
        where = _gpu_key(key)
        if where == ("interconnect", "topology"):  # always the run's own (--topology)
            raise SpecError(f"{key}: the topology is --topology's (or the system's "
                            f"intra.topology)")
        return ("gpu", *where)
    sections = _system_keys()
    head, _, rest = key.partition(".")
    if not rest and head in sections[""]:
        if head == "gpu":
            raise SpecError("the system's GPU is --system's choice; give another system file")
        if not system:
            raise SpecError(f"{key} is a system key: it needs --system")
        return "system", "", head
    if head in ("intra", "network") and rest in sections[head]:
        if system:
            return "system", head, rest
        if head == "intra" and rest in _GPU_SECTIONS["interconnect"] and rest != "topology":
            return "gpu", "interconnect", rest
        raise SpecError(f"{key} needs --system" + (" (without one, use --topology)"
                                                   if rest == "topology" else ""))
    allowed = sorted({"gpu.KEY", "model.NAME", *(k for k in sections[""] if k != "gpu"),
                      *(f"{s}.{k}" for s in ("intra", "network") for k in sections[s])})
    raise SpecError(f"unknown key {key}; allowed: {', '.join(allowed)}")


def apply(data: dict, overrides: tuple[Override, ...], file: str, system: bool) -> dict:
    """A parsed file with the overrides of ``file`` ("gpu" or "system") written in."""
    out = copy.deepcopy(data)
    for key, value in overrides:
        which, section, name = split(key, system)
        if which != file:
            continue
        table = out if not section else out.setdefault(section, {})
        if not isinstance(table, dict):
            raise SpecError(f"[{section}] must be a table")
        table[name] = value
    return out


def describe(overrides: tuple[Override, ...]) -> str:
    """``gpu.cus=160;intra.links=4``: the CSV's and the labels' form."""
    return ";".join(f"{k}={format_value(v)}" for k, v in overrides)
