"""Scenarios: paper workloads as data (``run/*.toml``), turned into sweep points.

A scenario names a device, a collective, a topology, a dtype, the configurations
(modes) to run, and models given by their global parameters. Each (model,
sub-layer, TP degree) becomes one point: one MPI job of TP ranks running every
mode. Global parameters become per-device GEMM shapes by these rules (T3,
Section 2 and Table 2; Megatron-style tensor parallelism):

- tokens T = seq_len x batch; every sub-layer's per-device output is T x H, so
  M = T and N = H;
- the sub-layer's GEMM is K-sliced across the TP devices, K = factor x H / TP:
  OP (attention output projection, forward) 1; FC-2 (second MLP GEMM, forward)
  4; FC-1 (first MLP GEMM, backward input gradient) 4; IP (input QKV
  projection, backward input gradient) 3;
- forward GEMMs read a transposed weight, backward ones do not (T3 evaluates
  both); the emulator's cost model does not depend on that layout, so the
  direction is recorded but does not change the shape.
"""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass, field
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from collectives import TOPOLOGIES
from devices.spec import DTYPES

# sub-layer -> (direction, K factor over H / TP)
SUBLAYERS = {"OP": ("fwd", 1), "FC-2": ("fwd", 4), "FC-1": ("bwd", 4), "IP": ("bwd", 3)}
SCENARIO_DIR = Path(__file__).resolve().parents[2] / "run"

_TOP = {"name": str, "description": str, "device": str, "collective": str, "topology": str,
        "dtype": str, "modes": list, "models": list}
_MODEL = {"name": str, "hidden": int, "layers": int, "seq_len": int, "batch": int, "tp": list,
          "sublayers": list}


class ScenarioError(ValueError):
    """A scenario file that cannot be run; the message names the file and the key."""


@dataclass(frozen=True)
class Model:
    name: str
    hidden: int
    layers: int
    seq_len: int
    batch: int
    tp: tuple[int, ...]
    sublayers: tuple[str, ...]

    @property
    def tokens(self) -> int:
        return self.seq_len * self.batch


@dataclass(frozen=True)
class Point:
    """One sweep point: a sub-layer of a model at a TP degree, on the scenario's device."""

    model: str
    sublayer: str
    direction: str
    tp: int
    m: int
    n: int
    k: int
    device: str
    layers: int

    @property
    def key(self) -> str:
        return f"{self.model}/{self.sublayer}/tp{self.tp}/{self.device}"

    def label(self) -> str:
        return f"{self.model} {self.sublayer} TP{self.tp}"


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    device: str
    collective: str
    topology: str
    dtype: str
    modes: tuple[str, ...]
    models: tuple[Model, ...]
    path: str = ""
    points: tuple[Point, ...] = field(default=())


def gemm_shape(model: Model, sublayer: str, tp: int) -> tuple[int, int, int]:
    """(M, N, K) of one device's GEMM for ``sublayer`` at TP degree ``tp`` (rules above)."""
    _, factor = SUBLAYERS[sublayer]
    return model.tokens, model.hidden, factor * model.hidden // tp


def _typed(where: str, doc: dict, schema: dict) -> None:
    unknown = sorted(set(doc) - set(schema))
    if unknown:
        raise ScenarioError(f"{where}: unknown key(s) {', '.join(unknown)} "
                            f"(allowed: {', '.join(schema)})")
    for key, typ in schema.items():
        if key in doc and not (isinstance(doc[key], typ) and not isinstance(doc[key], bool)):
            raise ScenarioError(f"{where}: {key} must be a {typ.__name__}, "
                                f"got {doc[key]!r}")
    missing = [k for k in schema if k not in doc and k != "description"]
    if missing:
        raise ScenarioError(f"{where}: missing key(s) {', '.join(missing)}")


def find_scenario(name_or_path: str) -> Path:
    """A scenario by name (``run/NAME.toml``) or by path."""
    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ScenarioError(f"scenario file {name_or_path} not found")
        return path
    path = SCENARIO_DIR / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in SCENARIO_DIR.glob("*.toml"))
        raise ScenarioError(f"unknown scenario {name_or_path!r} (known: {', '.join(known)}; "
                            f"or give a .toml path)")
    return path


def load_scenario(name_or_path: str, configs: tuple[str, ...] = ()) -> Scenario:
    """Parse and check a scenario; every error names the file and the key. ``configs``:
    configuration files whose configurations the scenario's modes may name."""
    from emulator.app.catalog import registry
    from emulator.engine.registry import RegistryError

    try:
        reg = registry(configs)
    except RegistryError as exc:
        raise ScenarioError(f"--configs: {exc}") from None
    path = find_scenario(name_or_path)
    try:
        doc = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise ScenarioError(f"{path}: malformed TOML: {exc}") from None
    _typed(str(path), doc, _TOP)
    for key, allowed in (("collective", tuple(reg.names())), ("topology", TOPOLOGIES),
                         ("dtype", DTYPES)):
        if doc[key] not in allowed:
            raise ScenarioError(f"{path}: {key} = {doc[key]!r} (allowed: {', '.join(allowed)})")
    modes = tuple(doc["modes"])
    applies = reg.configurations_for(reg.operation(doc["collective"]))
    bad = [m for m in modes if m not in applies]
    if bad or not modes:
        raise ScenarioError(f"{path}: modes {bad or '[]'} (allowed for {doc['collective']}: "
                            f"{', '.join(applies)}; a configuration of one's own needs "
                            f"--configs FILE)")
    models = []
    for i, md in enumerate(doc["models"]):
        where = f"{path}: models[{i}]"
        if not isinstance(md, dict):
            raise ScenarioError(f"{where}: must be a table ([[models]])")
        _typed(where, md, _MODEL)
        for key in ("hidden", "layers", "seq_len", "batch"):
            if md[key] < 1:
                raise ScenarioError(f"{where}: {key} = {md[key]} must be >= 1")
        if not md["tp"] or not all(isinstance(t, int) and t >= 1 for t in md["tp"]):
            raise ScenarioError(f"{where}: tp = {md['tp']!r} must be a list of integers >= 1")
        badsl = [s for s in md["sublayers"] if s not in SUBLAYERS]
        if badsl or not md["sublayers"]:
            raise ScenarioError(f"{where}: sublayers {badsl or '[]'} (allowed: "
                                f"{', '.join(SUBLAYERS)})")
        models.append(Model(md["name"], md["hidden"], md["layers"], md["seq_len"], md["batch"],
                            tuple(md["tp"]), tuple(md["sublayers"])))
    points = []
    for md in models:
        for tp in md.tp:
            for sl in md.sublayers:
                m, n, k = gemm_shape(md, sl, tp)
                if k < 1 or m < tp:
                    raise ScenarioError(f"{path}: {md.name} {sl} at TP {tp} gives M={m} K={k}; "
                                        f"needs K >= 1 and M >= TP")
                points.append(Point(md.name, sl, SUBLAYERS[sl][0], tp, m, n, k, doc["device"],
                                    md.layers))
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise ScenarioError(f"{path}: the same point appears twice")
    return Scenario(doc["name"], doc.get("description", ""), doc["device"], doc["collective"],
                    doc["topology"], doc["dtype"], modes, tuple(models), str(path), tuple(points))


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
