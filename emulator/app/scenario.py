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

A scenario may instead list **cases** (``[[cases]]``, Flux's way of stating its
workloads): an operation at given global shapes on given systems. A case names
the operation, the systems (each a ``--system`` preset; TP = its GPU count),
the token counts ``m`` and the global ``n`` and ``k``; ``shard`` says which of
them tensor parallelism splits over the TP ranks (``"n"``: a column-parallel
GEMM after an all-gather, each rank computes m x n/TP over k; ``"k"``: a
row-parallel GEMM before a reduce-scatter, each rank computes an m x n partial
over k/TP), and ``modes`` the configurations to run (each point runs those
that apply to its system's algorithm). ``shard = "none"`` gives every rank the shapes
as written (an operation whose shapes are per GPU, or split by its own rules: the
embedding operator's global batch). ``params`` (optional) gives the runs' ``--param``
values; a list is swept. Every (case, system, m, params) is one point.
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
from devices.schema import OMIT, Key, SpecError, Table, check
from devices.spec import DTYPES

# sub-layer -> (direction, K factor over H / TP)
SUBLAYERS = {"OP": ("fwd", 1), "FC-2": ("fwd", 4), "FC-1": ("bwd", 4), "IP": ("bwd", 3)}

SHARDS = ("n", "k", "none")


def _strings(doc: str, choices: tuple = ()) -> Key:
    return Key(list, items=str, choices=choices, nonempty=True, doc=doc)


def _counts(doc: str) -> Key:
    return Key(list, items=int, minimum=1, nonempty=True, doc=doc)


_SHARED = {"name": Key(str), "description": Key(str, default=""),
           "dtype": Key(str, choices=DTYPES),
           "set": Key(dict, default=OMIT, doc="--set KEY=VALUE of every run; a list is swept")}
# A scenario file's schema (``devices/schema.py``): models by their global parameters ...
MODELS_TABLE = Table({
    **_SHARED,
    "device": Key(str, doc="a GPU preset or a path"),
    "collective": Key(str, doc="the operation every point runs (t3emu run --list)"),
    "topology": Key(str, choices=TOPOLOGIES),
    "modes": _strings("the configurations to run"),
    "models": Key(list, nonempty=True, items=Table({
        "name": Key(str), "hidden": Key(int, minimum=1), "layers": Key(int, minimum=1),
        "seq_len": Key(int, minimum=1), "batch": Key(int, minimum=1),
        "tp": _counts("TP degrees"),
        "sublayers": _strings("sub-layers", tuple(SUBLAYERS))})),
}, doc="A scenario of models (t3emu sweep)")
# ... or cases: an operation at global shapes on given systems
CASES_TABLE = Table({
    **_SHARED,
    "cases": Key(list, nonempty=True, items=Table({
        "name": Key(str), "sublayer": Key(str, doc="a label for the case's GEMM"),
        "operation": Key(str, doc="t3emu run --list"),
        "systems": _strings("system presets or paths (TP = the system's GPUs)"),
        "m": _counts("token counts"), "n": Key(int, minimum=1, doc="global N"),
        "k": Key(int, minimum=1, doc="global K"),
        "shard": Key(str, choices=SHARDS, doc="what tensor parallelism splits"),
        "modes": _strings("the configurations to run"),
        "params": Key(dict, default=OMIT, doc="--param NAME=VALUE; a list is swept")})),
}, doc="A scenario of cases (t3emu sweep)")


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
    collective: str = ""  # the operation this point runs
    topology: str = ""  # --topology ("" with a system: the system's own)
    system: str = ""  # a system preset: GPU, topology and nodes (cases only)
    modes: tuple[str, ...] = ()
    params: tuple[tuple[str, float], ...] = ()  # --param NAME=VALUE of its runs (cases)
    overrides: tuple[tuple[str, object], ...] = ()  # --set KEY=VALUE of its runs ([set])

    @property
    def device_name(self) -> str:
        """The GPU preset's name, or a GPU file's stem (a result names no path)."""
        return Path(self.device).stem if self.device.endswith(".toml") else self.device

    @property
    def system_name(self) -> str:
        """The system preset's name, or a system file's stem."""
        return Path(self.system).stem if self.system.endswith(".toml") else self.system

    @property
    def params_text(self) -> str:
        return ",".join(f"{n}={v:g}" for n, v in self.params)

    @property
    def set_text(self) -> str:
        from devices.overrides import describe

        return describe(self.overrides)

    @property
    def key(self) -> str:
        what = f"/{self.set_text}" if self.overrides else ""
        if self.system:
            return (f"{self.model}/{self.sublayer}/m{self.m}/tp{self.tp}/{self.system_name}"
                    + (f"/{self.params_text}" if self.params else "") + what)
        return f"{self.model}/{self.sublayer}/tp{self.tp}/{self.device_name}" + what

    def label(self) -> str:
        what = f" {self.set_text}" if self.overrides else ""
        if self.system:
            return (f"{self.model} {self.sublayer} m={self.m} TP{self.tp} {self.system_name}"
                    + (f" {self.params_text}" if self.params else "") + what)
        return f"{self.model} {self.sublayer} TP{self.tp}" + what


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


def _checked(path: Path, doc: dict, table: Table) -> dict:
    try:
        return check(doc, table, str(path))
    except SpecError as exc:
        raise ScenarioError(str(exc)) from None


def find_scenario(name_or_path: str) -> Path:
    """A scenario by name (a shipped ``run/NAME.toml``) or by path."""
    from emulator.app.packaged import scenario_dir

    path = Path(name_or_path)
    if path.suffix == ".toml" or path.exists():
        if not path.is_file():
            raise ScenarioError(f"scenario file {name_or_path} not found")
        return path
    path = scenario_dir() / f"{name_or_path}.toml"
    if not path.is_file():
        known = sorted(p.stem for p in scenario_dir().glob("*.toml"))
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
    if "cases" in doc:
        return _load_cases(path, doc, reg)
    top = _checked(path, doc, MODELS_TABLE)
    if top["collective"] not in reg.names():
        raise ScenarioError(f"{path}: collective = {top['collective']!r}; allowed: "
                            f"{', '.join(reg.names())}")
    modes = top["modes"]
    applies = reg.configurations_for(reg.operation(top["collective"]))
    bad = [m for m in modes if m not in applies]
    if bad:
        raise ScenarioError(f"{path}: modes {bad} (allowed for {top['collective']}: "
                            f"{', '.join(applies)}; a configuration of one's own needs "
                            f"--configs FILE)")
    models = [Model(md["name"], md["hidden"], md["layers"], md["seq_len"], md["batch"],
                    md["tp"], md["sublayers"]) for md in top["models"]]
    points = []
    sets = _set_grid(str(path), doc.get("set", {}), system=False)
    for md, overrides in [(md, o) for md in models for o in sets]:
        for tp in md.tp:
            for sl in md.sublayers:
                m, n, k = gemm_shape(md, sl, tp)
                if k < 1 or m < tp:
                    raise ScenarioError(f"{path}: {md.name} {sl} at TP {tp} gives M={m} K={k}; "
                                        f"needs K >= 1 and M >= TP")
                points.append(Point(md.name, sl, SUBLAYERS[sl][0], tp, m, n, k, doc["device"],
                                    md.layers, doc["collective"], doc["topology"], "", modes,
                                    overrides=overrides))
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise ScenarioError(f"{path}: the same point appears twice")
    return Scenario(top["name"], top["description"], top["device"], top["collective"],
                    top["topology"], top["dtype"], modes, tuple(models), str(path), tuple(points))


def _load_cases(path: Path, doc: dict, reg) -> Scenario:
    """A scenario of ``[[cases]]`` (see the module's docstring)."""
    from collectives import default_algorithm
    from devices.system import load_system, system_size

    top = _checked(path, doc, CASES_TABLE)
    points, all_modes, ops = [], [], []
    sets = _set_grid(str(path), doc.get("set", {}), system=True)
    for i, case in enumerate(top["cases"]):
        where = f"{path}: cases[{i}]"
        if case["operation"] not in reg.names():
            raise ScenarioError(f"{where}: operation = {case['operation']!r} (allowed: "
                                f"{', '.join(reg.names())})")
        op = reg.operation(case["operation"])
        for name, overrides in [(s, o) for s in case["systems"] for o in sets]:
            if name.endswith(".toml") and not Path(name).is_absolute():
                near = path.parent / name  # a system file next to the scenario
                name = str(near.resolve()) if near.is_file() else name
            try:
                spec = load_system(name, overrides)
            except SpecError as exc:
                raise ScenarioError(f"{where}: systems: {exc}") from None
            tp = system_size(spec)
            if not tp:
                raise ScenarioError(f"{where}: systems: {name} holds any number of GPUs; a "
                                    f"case runs on a system of fixed size (its TP degree), "
                                    f"e.g. mi210x4 or a100-sxm-x8")
            topo = spec.interconnect.topology
            algo = default_algorithm(op.algorithms, topo)
            applies = reg.configurations_for(op, algo)
            bad = [m for m in case["modes"] if m not in reg.configurations]
            if bad:
                raise ScenarioError(f"{where}: modes {bad} (allowed: "
                                    f"{', '.join(reg.configurations)}; a configuration of "
                                    f"one's own needs --configs FILE)")
            # the modes its algorithm runs that the system can run at its size in the
            # scenario's dtype (TransformerEngine refuses a job across nodes)
            modes = tuple(m for m in case["modes"] if m in applies
                          and not reg.refusal(m, spec, doc["dtype"], tp, op.name))
            if not modes:
                raise ScenarioError(f"{where}: none of the modes applies to {op.name} on "
                                    f"{name} (its algorithm {algo} runs {', '.join(applies)})")
            n, k = case["n"], case["k"]
            if case["shard"] != "none":
                split = n if case["shard"] == "n" else k
                if split % tp:
                    raise ScenarioError(f"{where}: {case['shard']} = {split} does not split "
                                        f"over the {tp} GPUs of {name}")
                if case["shard"] == "n":
                    n //= tp
                else:
                    k //= tp
            settings = _param_grid(where, case.get("params", {}),
                                   reg.params_for(op, modes))
            for m in case["m"]:
                if m < tp:
                    raise ScenarioError(f"{where}: m = {m} needs at least one row per rank "
                                        f"(>= {tp} on {name})")
                for params in settings:
                    points.append(Point(case["name"], case["sublayer"], "fwd", tp, m, n, k,
                                        spec.name, 1, op.name, topo, name, modes, params,
                                        overrides))
            all_modes += [m for m in modes if m not in all_modes]
        ops += [op.name] if op.name not in ops else []
    keys = [p.key for p in points]
    if len(set(keys)) != len(keys):
        raise ScenarioError(f"{path}: the same point appears twice")
    topologies = ",".join(dict.fromkeys(p.topology for p in points))
    devices = ",".join(dict.fromkeys(p.system_name for p in points))
    return Scenario(top["name"], top["description"], devices, ",".join(ops), topologies,
                    top["dtype"], tuple(all_modes), (), str(path), tuple(points))


def _set_grid(where: str, given: dict, system: bool) -> list[tuple[tuple[str, object], ...]]:
    """A scenario's ``[set]`` table as the runs' --set overrides: a list value is swept (one
    point per value; several lists: every combination; a list-valued key takes a list of
    lists). Keys are checked here, values when each point's device loads."""
    import itertools

    from devices.overrides import check, flatten

    given = flatten(given)
    names = sorted(given)
    try:
        check(tuple((n, None) for n in names), system)
    except SpecError as exc:
        raise ScenarioError(f"{where}: set: {exc}") from None
    values = []
    for name in names:
        vals = given[name] if isinstance(given[name], list) else [given[name]]
        if not vals:
            raise ScenarioError(f"{where}: set.{name} is an empty list")
        values.append(vals)
    return [tuple(zip(names, combo)) for combo in itertools.product(*values)] or [()]


def _param_grid(where: str, given: dict, specs: dict) -> list[tuple[tuple[str, float], ...]]:
    """A case's ``params`` table as the runs' --param settings: a list value is swept (one
    point per value; several lists: every combination)."""
    import itertools

    from emulator.engine.registry import param_conflict

    names = sorted(given)
    values = []
    for name in names:
        if name not in specs:
            raise ScenarioError(f"{where}: params.{name} is not a parameter of the case's "
                                f"operation or modes (allowed: {', '.join(specs) or 'none'})")
        vals = given[name] if isinstance(given[name], list) else [given[name]]
        for v in vals:
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise ScenarioError(f"{where}: params.{name} = {v!r} must be a number")
            why = specs[name].check(name, float(v))
            if why:
                raise ScenarioError(f"{where}: params.{name} = {v!r}: {why}")
        if not vals:
            raise ScenarioError(f"{where}: params.{name} is an empty list")
        values.append([float(v) for v in vals])
    settings = [tuple(zip(names, combo)) for combo in itertools.product(*values)] or [()]
    for setting in settings:  # with the defaults, as a run's --param are (RunConfig.validate)
        shown, why = param_conflict(specs, dict(setting))
        if why:
            raise ScenarioError(f"{where}: params {shown}: {why}")
    return settings


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")
