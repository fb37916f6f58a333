"""The JSON Schemas of the files t3emu reads (``t3emu schema``), for editors.

One schema layer (``devices/schema.py``) checks GPU and system presets, scenarios and
model files; this module exports its rules as JSON Schema (draft 2020-12). An editor
with a TOML language server (Taplo, "Even Better TOML") validates and completes a file
against them: a ``#:schema PATH`` line at the top of the file, or a Taplo rule mapping
files to schemas (``docs/reference.md``). The rules a schema cannot state (a key
bounding another, the names only the registry knows: collectives, configurations,
parameters) are checked when the file is loaded.
"""

from __future__ import annotations

import json
from pathlib import Path

KINDS = ("device", "system", "scenario", "model")


def document(kind: str) -> dict:
    """The JSON Schema of one kind of file (a key of ``KINDS``)."""
    from devices.schema import json_schema

    if kind == "device":
        from devices.spec import DEVICE_TABLE

        return json_schema(DEVICE_TABLE, "t3emu GPU preset", DEVICE_TABLE.doc)
    if kind == "system":
        from devices.system import SYSTEM_TABLE

        return json_schema(SYSTEM_TABLE, "t3emu system preset", SYSTEM_TABLE.doc)
    if kind == "scenario":
        from emulator.app.scenario import CASES_TABLE, MODELS_TABLE

        return json_schema([MODELS_TABLE, CASES_TABLE], "t3emu scenario",
                           "A sweep's scenario: models by their global parameters, or cases")
    if kind == "model":
        from emulator.workload.spec import TABLES

        return json_schema(list(TABLES.values()), "t3emu model",
                           f"A whole model (t3emu model): kind = {' or '.join(TABLES)}")
    raise ValueError(f"unknown kind {kind!r}; allowed: {', '.join(KINDS)}")


def text(kind: str) -> str:
    return json.dumps(document(kind), indent=2) + "\n"


def write(directory: str | Path, kinds: tuple[str, ...] = KINDS) -> list[Path]:
    """Each kind's schema as ``DIRECTORY/KIND.schema.json``; the paths written."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind in kinds:
        path = out / f"{kind}.schema.json"
        path.write_text(text(kind))
        paths.append(path)
    return paths
