"""``t3emu params``: every parameter the clock reads, with where it comes from and where it
is read: a GPU preset's keys (``--device``), a system's and its GPU's (``--system``), and
the model's code (``emulator/model/params.py``) with the configurations' knobs; without an
option, every preset and the model's code.

``assumptions(device, system)`` gives the ASSUMPTION parameters a run on that device (or
system) reads, each with its ``--set`` key and range: what ``t3emu validate
--sensitivity`` varies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from devices.sources import MISSING, PresetParam, Source, preset_params

ROOT = Path(__file__).resolve().parents[2]
CODE_DIRS = ("emulator", "collectives", "devices")


@dataclass(frozen=True)
class Row:
    """One parameter as the listing shows it."""

    scope: str  # the preset's name, "model" or "knob"
    key: str
    value: object
    unit: str
    source: Source
    set_key: str  # "" : not settable per run
    where: str  # where the clock reads it

    def to_dict(self) -> dict:
        return {"scope": self.scope, "key": self.key, "value": self.value, "unit": self.unit,
                "source": self.source.to_dict(), "set": self.set_key, "read_in": self.where}


def _gpu_set(name: str) -> str:
    return f"gpu.{name}"


def _system_set(name: str) -> str:
    head, _, rest = name.partition(".")
    return name if not rest else f"{head}.{rest}"


def _attr(table, name: str) -> str:
    node = table
    for part in name.split("."):
        node = node.keys[part]
    return node.attr or name.rsplit(".", 1)[-1]


def device_params(device: str, strict: bool = False) -> list[PresetParam]:
    """The parameters of GPU preset (or file) ``device`` (``strict``: a missing source
    raises SpecError; else it is listed as missing)."""
    from devices.spec import DEVICE_TABLE, PRESET_DIR, list_presets, read_toml

    data, path = read_toml(device, PRESET_DIR, "device", list_presets())
    return preset_params(data, DEVICE_TABLE, path.stem, _gpu_set, strict)


def system_params(system: str, strict: bool = False
                  ) -> tuple[list[PresetParam], list[PresetParam]]:
    """(the system file's parameters, its GPU's less the [interconnect] keys the system's
    [intra] replaces)."""
    from devices.system import SYSTEM_DIR, SYSTEM_TABLE, list_systems
    from devices.spec import read_toml

    data, path = read_toml(system, SYSTEM_DIR, "system", list_systems())
    own = preset_params(data, SYSTEM_TABLE, path.stem, _system_set, strict)
    gpu = Path(data["gpu"])
    if gpu.suffix == ".toml" and not gpu.is_absolute():
        gpu = path.parent / gpu
    replaced = {f"interconnect.{p.key.split('.', 1)[1]}" for p in own
                if p.key.startswith("intra.") and p.given}
    return own, [p for p in device_params(str(gpu), strict) if p.key not in replaced]


def _read_sites() -> dict[str, list[str]]:
    """Model parameter -> the files and lines that name it (a quoted ``"NAME"`` in the
    code that imports ``emulator.model.params``, the registry itself left out)."""
    from emulator.model.params import REGISTRY

    out: dict[str, list[str]] = {}
    pat = re.compile(r"""["']([a-z0-9_]+)["']""")
    for d in CODE_DIRS:
        for f in sorted((ROOT / d).rglob("*.py")):
            text = f.read_text()
            if f.name == "params.py" or "model import params" not in text:
                continue
            for i, line in enumerate(text.splitlines(), 1):
                for name in pat.findall(line):
                    if name in REGISTRY:
                        out.setdefault(name, []).append(f"{f.relative_to(ROOT)}:{i}")
    return out


def knobs() -> list[tuple[str, object]]:
    """(NAME, Param) of every operation's and configuration's ``--param`` knob."""
    from emulator.app.catalog import registry

    reg = registry(())
    seen: dict[str, object] = {}
    for holder in [*reg.operations.values(), *reg.configurations.values()]:
        for name, p in holder.params.items():
            seen.setdefault(name, p)
    return sorted(seen.items())


def model_rows() -> list[Row]:
    """The model's code parameters, then the configurations' knobs."""
    from emulator.model.params import load_all

    sites = _read_sites()
    rows = []
    for name, p in sorted(load_all().items()):
        where = ", ".join(sites.get(name, [])) if not p.table else \
            p.module.replace(".", "/") + ".py"
        rows.append(Row("model", name, "(table)" if p.table else p.default,
                        "" if p.table else p.unit, p.source,
                        "" if p.table or not isinstance(p.default, (int, float))
                        else f"model.{name}", where or "(not read)"))
    for name, k in knobs():
        rows.append(Row("knob", name, k.default, "", k.source_of() or MISSING, f"--param {name}",
                        "the configurations that take it (t3emu configs)"))
    return rows


def _preset_rows(params: list[PresetParam], where_table) -> list[Row]:
    return [Row(p.file, p.key, p.value, p.unit, p.source, p.set_key,
                f"DeviceSpec.{_attr(where_table, p.key)}") for p in params]


def rows_for(device: str | None = None, system: str | None = None) -> list[Row]:
    """The listing of ``t3emu params``: one preset (``device`` or ``system``: the system's
    keys, then its GPU's), or every preset and the model's code."""
    from devices.spec import DEVICE_TABLE, list_presets
    from devices.system import SYSTEM_TABLE, list_systems

    if system:
        own, gpu = system_params(system)
        return _preset_rows(own, SYSTEM_TABLE) + _preset_rows(gpu, DEVICE_TABLE)
    if device:
        return _preset_rows(device_params(device), DEVICE_TABLE)
    out = []
    for d in list_presets():
        out += _preset_rows(device_params(d), DEVICE_TABLE)
    for s in list_systems():
        out += _preset_rows(system_params(s)[0], SYSTEM_TABLE)
    return out + model_rows()


def assumptions(device: str | None, system: str | None) -> list[Row]:
    """The ASSUMPTION parameters of a run on ``device`` (or ``system``) with a range: the
    preset's and the model code's (every model assumption: which a run reads is recorded
    by the run)."""
    rows = rows_for(device, system) + model_rows()
    return [r for r in rows if r.source.kind == "assumption" and r.set_key
            and not r.set_key.startswith("--param")]
