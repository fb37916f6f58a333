"""What made a result: recorded in every run JSON, sweep ``results.json`` and CSV row, and
model estimate, so a result can be cited and reproduced, and a resumed sweep can refuse
points made by other code or files.

- ``t3emu``: the installed version (``pyproject.toml``);
- ``commit`` and ``clean``: the git commit of the checkout the code runs from and whether
  its tracked files were unmodified (None for an installed copy, which has no checkout);
- ``code``: a hash of every source and data file that decides a result (the Python files
  and the shipped presets, systems, scenarios and models of ``emulator``, ``devices``,
  ``collectives`` and ``run``): what ties a result to code when there is no checkout;
- ``model``: the same hash less the code that only presents results (pages, reports,
  tables, the CLI): what a sensitivity variant is compared on;
- ``files``: each file the result read that the user named (a GPU or system file, a
  scenario, a model, a configuration plugin), with its hash; a shipped preset is named
  by its path in the package, a user file by the name it was given (never an absolute
  path of this machine: only the file's own name when it was given as one).

``mismatch`` compares two records on what decides a result (``code`` and ``files``), not
on the commit: a commit that changes only documentation keeps the same numbers.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout (or site-packages) holding the code
CODE_DIRS = ("emulator", "devices", "collectives", "run")
CODE_SUFFIXES = (".py", ".toml")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def version() -> str:
    try:
        from importlib.metadata import version as v

        return v("t3emu")
    except Exception:  # noqa: BLE001 - a checkout that is not installed
        return "unknown"


# the code that presents results rather than making them (left out of ``model_hash``), and
# the parameters' provenance (``devices/sources.py``; the presets' ``[sources]`` tables are
# cut from their text there)
PRESENTATION = ("emulator/app/validation/", "emulator/app/report", "emulator/app/tables.py",
                "emulator/app/cli.py", "emulator/app/params.py", "emulator/app/schemas.py",
                "devices/sources.py")


def _without_sources(data: bytes) -> bytes:
    """A preset's text less its ``[sources]`` table (provenance, which no number reads)."""
    return re.sub(rb"(?ms)^\[sources\][^\n]*\n.*?(?=^\[|\Z)", b"", data)


def _hash(keep=lambda rel: True, text=lambda rel, data: data) -> str:
    h = hashlib.sha256()
    for top in CODE_DIRS:
        base = ROOT / top
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            rel = p.relative_to(ROOT).as_posix()
            if p.suffix in CODE_SUFFIXES and "__pycache__" not in p.parts and p.is_file() \
                    and keep(rel):
                h.update(rel.encode())
                h.update(text(rel, p.read_bytes()))
    return h.hexdigest()[:16]


@functools.lru_cache(maxsize=1)
def code_hash() -> str:
    """The hash of the code and shipped data files (module docstring)."""
    return _hash()


@functools.lru_cache(maxsize=1)
def model_hash() -> str:
    """The hash of the code and data that make the numbers: ``code_hash`` less the code
    that only presents them (``PRESENTATION``: the validation pages, reports, tables, the
    CLI, the parameter listing) and the parameters' provenance (the presets' ``[sources]``
    tables), so a sensitivity variant stays comparable with its sweep across a change of how
    pages are written or a parameter's source."""
    return _hash(lambda rel: not rel.startswith(PRESENTATION),
                 lambda rel, data: _without_sources(data) if rel.endswith(".toml") else data)


@functools.lru_cache(maxsize=1)
def git() -> tuple[str | None, bool | None]:
    """(commit, clean) of the checkout the code runs from; (None, None) outside one."""
    if not (ROOT / ".git").exists():
        return None, None

    def out(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30, check=True).stdout.strip()

    try:
        commit = out("rev-parse", "HEAD")
        clean = out("status", "--porcelain", "--untracked-files=no") == ""
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit or None, clean


def display_name(path: str | Path) -> str:
    """A file's name for a result: its path in the package for a shipped file, the path it
    was given when relative, else its own name (no absolute path of this machine)."""
    p = Path(path)
    try:
        return p.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        pass
    if not p.is_absolute():
        return p.as_posix()
    try:
        return p.resolve().relative_to(Path(os.getcwd()).resolve()).as_posix()
    except (ValueError, OSError):
        return p.name


def file_entry(role: str, path: str | Path) -> dict:
    """One file a result read: its role, display name and hash (None if unreadable)."""
    try:
        digest = _sha(Path(path).read_bytes())
    except OSError:
        digest = None
    return {"role": role, "name": display_name(path), "sha256": digest}


def record(files: list[tuple[str, str | Path]] = ()) -> dict:
    """The provenance of a result that read ``files`` ((role, path) pairs)."""
    commit, clean = git()
    seen, entries = set(), []
    for role, path in files:
        if path is None or (role, str(path)) in seen:
            continue
        seen.add((role, str(path)))
        entries.append(file_entry(role, path))
    return {"t3emu": version(), "commit": commit, "clean": clean, "code": code_hash(),
            "model": model_hash(), "files": entries}


def spec_path(source: str) -> str | None:
    """The file of a spec's ``source`` (``PATH`` or ``PATH with --set ...``)."""
    path = source.split(" with --set ")[0] if source else ""
    return path if path and Path(path).is_file() else None


def preset_file(name_or_path: str | None, kind: str) -> str | None:
    """The file of a GPU (``kind`` "device") or system preset name or path."""
    if not name_or_path:
        return None
    from devices.spec import PRESET_DIR, preset_path
    from devices.system import SYSTEM_DIR

    path = preset_path(name_or_path, PRESET_DIR if kind == "device" else SYSTEM_DIR)
    return str(path) if path is not None and path.is_file() else None


def mismatch(a: dict | None, b: dict | None) -> str:
    """What differs between two records in what decides a result ("" when nothing does;
    a record missing on one side is a difference)."""
    if not a or not b:
        return "no provenance recorded" if (a or b) else ""
    if a.get("code") != b.get("code"):
        return f"code {a.get('code')} (t3emu {a.get('t3emu')}, commit " \
               f"{_short(a.get('commit'))}) against {b.get('code')} (t3emu {b.get('t3emu')}, " \
               f"commit {_short(b.get('commit'))})"
    fa = {(f["role"], f["name"]): f["sha256"] for f in a.get("files", [])}
    fb = {(f["role"], f["name"]): f["sha256"] for f in b.get("files", [])}
    for key in sorted(set(fa) | set(fb)):
        if fa.get(key) != fb.get(key):
            return f"{key[0]} file {key[1]} differs ({fa.get(key)} against {fb.get(key)})"
    return ""


def _short(commit: str | None) -> str:
    return commit[:10] if commit else "none"


def of_run(cfg, spec) -> dict:
    """The provenance of a ``t3emu run``: its GPU and system files and plugins."""
    files = [("device", spec_path(getattr(spec, "source", "")))]
    if cfg.system:
        files.append(("system", preset_file(cfg.system, "system")))
    files += [("configs", c) for c in cfg.configs]
    return record(files)


PATH_KEYS = ("json", "trace", "device", "system")  # a run's options that may name files


def shown(value: str) -> str:
    """An option's value as a result shows it: a preset's name as it is, a file's path as
    ``display_name`` gives it."""
    return display_name(value) if value != "-" and (
        "/" in value or value.endswith((".toml", ".json"))) else value


def relative_paths(doc: dict) -> None:
    """A run document's paths in the form ``display_name`` gives (no absolute paths of
    this machine): its JSON output, plugins, trace, and its GPU file."""
    cfg = doc.get("config") or {}
    for key in PATH_KEYS:
        if isinstance(cfg.get(key), str):
            cfg[key] = shown(cfg[key])
    if cfg.get("configs"):
        cfg["configs"] = [display_name(c) for c in cfg["configs"]]
    dev = doc.get("device") or {}
    src = dev.get("source")
    if isinstance(src, str) and src:
        path, sep, rest = src.partition(" with --set ")
        dev["source"] = display_name(path) + sep + rest
