"""The registry of operations and configurations: the one place that knows them by name.

An **operation** is what is computed and communicated (``gemm+rs``: a GEMM whose
partial output is reduce-scattered; ``ag+gemm``: an all-gather feeding a GEMM;
...): its algorithms, the builders configurations compose (``parts``), its
independent reference and its lower bounds. A **configuration** is one design's
way to run an operation (T3's ``t3``, its baselines ``sequential``,
``ideal-overlap``, ...): a builder ``build(problem, operation, algorithm) ->
Plan``, the operations it applies to, the design it comes from and how reports
draw it. The CLI, the validation, the worker, the reference check, sweeps and
reports read this registry; nothing else branches on a name.

A researcher's own configuration is a Python file that imports the registry and
registers itself (``t3emu run --configs FILE``; see docs/reference.md).
"""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RegistryError(ValueError):
    """An unknown name, a duplicate registration or a plugin file that cannot load."""


@dataclass(frozen=True)
class Param:
    """A number an operation (a shape beyond M, N, K) or a configuration (a knob) takes
    from ``--param NAME=VALUE`` or a scenario's ``params``."""

    default: float
    help: str
    low: float  # allowed range, inclusive
    high: float
    integer: bool = False
    at_most: str = ""  # another parameter of the same run this one must not exceed (a
    # low/high or min/max pair: ``otb_low`` at most ``otb_high``)
    source: object = None  # where the default comes from (``devices/sources.py``: "KIND:
    # reference" or an assumption table; ``t3emu params`` lists it)

    def source_of(self):
        """The default's provenance (``devices.sources.Source``)."""
        from devices.sources import parse

        return parse(self.source, f"--param default {self.default!r}") if self.source \
            else None

    def check(self, name: str, value: float) -> str:
        """Why ``value`` is not allowed ("" : it is)."""
        if not math.isfinite(value):
            return f"{name} must be a finite number"
        if self.integer and value != int(value):
            return f"{name} must be an integer"
        if not self.low <= value <= self.high:
            return f"{name} must be from {self.low:g} to {self.high:g}"
        return ""


def param_conflict(specs: dict, given: dict) -> tuple[str, str]:
    """The parameters of one run (``specs``: name -> Param; ``given``: name -> value, the
    others at their defaults) that do not fit together: ("NAME=V,OTHER=W" as given, why),
    or ("", "") when they do. Every ``Param.at_most`` pair present in ``specs`` is checked,
    defaults included; each value alone is ``Param.check``'s."""
    value = {n: float(given.get(n, p.default)) for n, p in specs.items()}
    for name, p in specs.items():
        other = p.at_most
        if not other or other not in value or value[name] <= value[other]:
            continue
        shown = ",".join(f"{n}={value[n]:g}" for n in (name, other)
                         if n in given or not (name in given or other in given))

        def said(n: str) -> str:
            return ("" if n in given else "the default ") + f"{n} = {value[n]:g}"

        return shown, f"{name} must be at most {other}: {said(name)} is above {said(other)}"
    return "", ""


@dataclass(frozen=True)
class Operation:
    name: str  # e.g. "gemm+rs"
    help: str
    design: str  # where it is described (a paper's section)
    algorithms: tuple[str, ...]  # collective algorithms it has, the default first
    parts: Any  # the builders its configurations compose (collectives' OperationParts)
    reference: Callable  # (comm, a, b, dtype, values, chunks, split) -> (expected, tolerance)
    link_bytes: Callable[[int, int, int, int, int], float]  # (m, n, k, rows_min, e) -> bytes
    aliases: tuple[str, ...] = ()  # older names users type (``--collective rs``)
    reducing: bool = False  # reduces partial outputs (near-memory reduction applies)
    a_rows: str = "all"  # "own": each rank holds its chunk of A's rows; "all": every row
    compute_rows: str = "all"  # rows of C each rank's GEMM computes ("own" or "all")
    collective_bytes: Callable[[int, int, int, int], float] = (
        lambda m, n, k, e: m * n * e)  # (m, n, k, e) -> the collective's buffer (nccl-tests'
    # size: the whole reduced, gathered or exchanged array)
    bus_factors: dict = field(default_factory=dict)  # collective phase (or span) name ->
    # nccl-tests' busbw factor f(n) (busbw = algbw x f(n))
    spans: dict = field(default_factory=dict)  # name -> (first phase, last phase): a
    # collective timed from the first's start to the last's end (AR = RS then AG)
    passes: int = 1  # times the collective's buffer crosses the network (AR: RS then AG)
    exchange: bool = False  # an all-to-all: every rank's rows go to their GPU as they are
    # (nothing is gathered or reduced within a node before it leaves)
    params: dict = field(default_factory=dict)  # name -> Param: its shapes beyond M, N, K
    # Operations whose inputs are not a GEMM's A and B give their own (``cfg``: the run's
    # configuration, with ``param(name)``):
    inputs: Callable | None = None  # (cfg, rank, world) -> {input name: array}
    check_reference: Callable | None = None  # (comm, cfg, inputs) -> (expected, tolerance)
    bounds: Callable | None = None  # (cfg, spec, world) -> (compute-bound seconds, bytes a
    # rank sends to peers): its lower bounds' inputs (a GEMM's: its FLOPs, ``link_bytes``)
    split_k: bool = True  # its producer can split K over several WGs per tile (--split-k)
    k_blocks: bool = False  # a configuration may accumulate its GEMM over W column blocks
    # of K (W ranks; FiCCO's 2D schedules), each sum rounded: the numerics tolerance
    # allows W roundings on those blocks' partial products
    host_memory: Callable | None = None  # (cfg, spec) -> bytes one rank needs
    dims: str = "M=m N=n K=k"  # what --m, --n and --k mean (help and summaries)
    shape: tuple[int, int, int] = (8192, 3072, 768)  # not a parameter: a run's default size
    producer: str = "gemm"  # the producer kernel ("gemm", "gemv", "embedding"): Flux's ECT
    # and overlap efficiency compare with a GEMM alone, so only a GEMM's runs report them


@dataclass(frozen=True)
class Configuration:
    name: str  # e.g. "t3"
    help: str
    design: str  # "T3", "Flux", ... or "baseline"
    build: Callable  # (problem, operation, algorithm) -> Plan
    applies: Callable[[Operation], bool] = lambda op: True
    baseline: bool = False  # a baseline: runs report their speedup over it (the first one
    # registered is the one speedups and Flux's ECT are over by default)
    algorithms: tuple[str, ...] = ()  # the collective algorithms it runs (empty: all of the
    # operation's)
    search: bool = False  # its run is the best (modelled time, timing-only) of the other
    # configurations of its design that run the operation (a tuner); ``build`` gives the
    # plan of its default candidate
    picks: Callable | None = None  # a heuristic: (problem, operation, algorithm) ->
    # (the configuration whose plan ``build`` gives for that problem, the plan's ``choice``);
    # a timing-only job that ran that configuration already reuses its run
    atomics: bool = False  # reduces by atomic adds: refused for a dtype without native
    # atomics on the device (``DeviceSpec.atomic_dtypes``), as on the real hardware
    wide_atomics: Callable | None = None  # (spec, dtype, ranks) -> True where it adds a dtype
    # without native atomics by fp32 atomics into a wider buffer instead (Flux on sm80
    # across nodes), so ``atomics`` does not refuse it
    refuses: Callable | None = None  # (spec, ranks) -> why it cannot run a job of ``ranks``
    # GPUs on that device or system ("": it can), as the real software refuses it
    refuses_op: Callable | None = None  # (spec, ranks, operation name) -> the same, for a
    # configuration that runs some of its operations only on some systems
    color: str = "#8c564b"  # reports
    short: str = ""  # one-letter label in stacked traffic bars ("" = not drawn)
    params: dict = field(default_factory=dict)  # name -> Param: its knobs
    tile_bytes: int = 8192  # not a parameter: host memory per output tile (measured):
    # plans with an object per tile take about 6 KB; array-only plans far less
    tiles: float = 1.0  # its buffers' tiles per output tile (a gather area adds some)
    over: str = ""  # the baseline its gain is measured against, as its paper does ("":
    # the registry's first baseline; FiCCO's schedules: ``ficco-serial``)
    compared: bool = True  # False: a measurement run (isolated clocks, FiCCO's DIL/CIL runs)
    # whose time is not a schedule's: no speedup, no causes
    balanced: bool = False  # needs the same GEMM on every rank: refused with uneven expert
    # loads (``expert_skew``), left out of ``--mode all`` then


@dataclass(frozen=True)
class Design:
    """What a design runs in a whole model (``emulator/workload``): its configuration for
    each operation it fuses (``uses``: operation -> configuration); every other operation
    runs the baseline."""

    name: str
    help: str
    uses: dict[str, str]


@dataclass
class Registry:
    operations: dict[str, Operation] = field(default_factory=dict)
    configurations: dict[str, Configuration] = field(default_factory=dict)
    plugins: list[str] = field(default_factory=list)
    designs: dict[str, Design] = field(default_factory=dict)

    def add_design(self, design: Design) -> Design:
        if design.name in self.designs:
            raise RegistryError(f"design {design.name!r} is registered twice")
        for op, cfg in design.uses.items():
            if not self.configuration(cfg).applies(self.operation(op)):
                raise RegistryError(f"design {design.name!r}: {cfg} does not run {op}")
        self.designs[design.name] = design
        return design

    def design(self, name: str) -> Design:
        if name not in self.designs:
            raise RegistryError(f"unknown design {name!r}; allowed: {', '.join(self.designs)}")
        return self.designs[name]

    def design_configuration(self, design: str, op: str) -> str:
        """The configuration ``design`` runs ``op`` with (the baseline where it has none; the
        baseline itself, named as a design, runs everything)."""
        if design == self.baseline():
            return design
        return self.design(design).uses.get(self.operation(op).name, self.baseline())

    def add_operation(self, op: Operation) -> Operation:
        for name in (op.name, *op.aliases):
            if name in self.operations or self._alias(name):
                raise RegistryError(f"operation {name!r} is registered twice")
        self.operations[op.name] = op
        return op

    def add_configuration(self, cfg: Configuration) -> Configuration:
        if cfg.name in self.configurations:
            raise RegistryError(f"configuration {cfg.name!r} is registered twice")
        if cfg.name == "all" or "," in cfg.name:
            raise RegistryError(f"{cfg.name!r} cannot name a configuration")
        self.configurations[cfg.name] = cfg
        return cfg

    def _alias(self, name: str) -> Operation | None:
        return next((op for op in self.operations.values() if name in op.aliases), None)

    def operation(self, name: str) -> Operation:
        op = self.operations.get(name) or self._alias(name)
        if op is None:
            raise RegistryError(f"unknown operation {name!r}; allowed: {', '.join(self.names())}")
        return op

    def names(self) -> list[str]:
        """Every operation name users may type: aliases first (the older vocabulary)."""
        return [a for op in self.operations.values() for a in op.aliases] + list(self.operations)

    def configuration(self, name: str) -> Configuration:
        if name not in self.configurations:
            raise RegistryError(f"unknown configuration {name!r}; allowed: "
                                f"{', '.join(self.configurations)}")
        return self.configurations[name]

    def configurations_for(self, op: Operation, algorithm: str | None = None
                           ) -> tuple[str, ...]:
        """The configurations that run ``op`` (with ``algorithm``, if given)."""
        return tuple(n for n, c in self.configurations.items() if c.applies(op)
                     and (algorithm is None or not c.algorithms or algorithm in c.algorithms))

    def refusal(self, name: str, spec, dtype: str, ranks: int = 0, op: str | None = None
                ) -> str:
        """Why configuration ``name`` cannot run on device ``spec`` in ``dtype`` with
        ``ranks`` GPUs ("" : it can); ``op``: the operation's name, for the refusals that
        depend on it."""
        cfg = self.configuration(name)
        if cfg.refuses is not None and ranks and (why := cfg.refuses(spec, ranks)):
            return f"{name}: {why}"
        if (cfg.refuses_op is not None and ranks and op is not None
                and (why := cfg.refuses_op(spec, ranks, self.operation(op).name))):
            return f"{name}: {why}"
        if cfg.atomics and dtype not in spec.atomic_dtypes and not (
                cfg.wide_atomics is not None and ranks and cfg.wide_atomics(spec, dtype, ranks)):
            return (f"{name} reduces by atomic adds and device {spec.name} has no native "
                    f"{dtype} atomics (it has {', '.join(spec.atomic_dtypes) or 'none'})"
                    + ("; its fp32 path runs only across nodes on sm80"
                       if cfg.wide_atomics is not None else ""))
        return ""

    def candidates(self, name: str, op: Operation, algorithm: str) -> tuple[str, ...]:
        """What search configuration ``name`` tries: its design's other configurations that
        run ``op`` with ``algorithm``."""
        design = self.configuration(name).design
        return tuple(n for n in self.configurations_for(op, algorithm)
                     if n != name and self.configurations[n].design == design
                     and not self.configurations[n].search)

    def params_for(self, op: Operation, modes: tuple[str, ...]) -> dict:
        """name -> Param a run of ``op`` in ``modes`` takes: the operation's shapes and the
        configurations' knobs (a search configuration's: its candidates' too)."""
        out = dict(op.params)
        for m in modes:
            cfg = self.configurations.get(m)
            if cfg is None:
                continue
            out.update(cfg.params)
        return out

    def baseline(self) -> str | None:
        """The configuration speedups and Flux's ECT baseline are over (the first baseline)."""
        return next((n for n, c in self.configurations.items() if c.baseline), None)

    def baseline_of(self, name: str) -> str | None:
        """The configuration ``name``'s gain is measured against (its ``over``, else the
        first baseline); None for a baseline measured against nothing, or a measurement."""
        cfg = self.configuration(name)
        if not cfg.compared:
            return None
        base = cfg.over or self.baseline()
        return None if base == name else base

    def baselines(self) -> tuple[str, ...]:
        """Every baseline configuration (runs report their speedup over each)."""
        return tuple(n for n, c in self.configurations.items() if c.baseline)

    def snapshot(self) -> tuple:
        """What the registry holds now, for ``restore``."""
        return (dict(self.operations), dict(self.configurations), list(self.plugins),
                dict(self.designs))

    def restore(self, snap: tuple) -> None:
        """Back to a ``snapshot``: entries registered since (a plugin file's) are gone."""
        ops, confs, plugins, designs = snap
        self.operations, self.configurations = dict(ops), dict(confs)
        self.plugins, self.designs = list(plugins), dict(designs)

    def load(self, path: str) -> None:
        """Run a configuration file (it registers its entries); each file once."""
        p = Path(path).resolve()
        if str(p) in self.plugins:
            return
        if not p.is_file():
            raise RegistryError(f"configuration file {path!r} does not exist")
        spec = importlib.util.spec_from_file_location(f"t3emu_plugin_{len(self.plugins)}", p)
        module = importlib.util.module_from_spec(spec)
        self.plugins.append(str(p))
        sys.modules[spec.name] = module
        try:
            spec.loader.exec_module(module)
        except RegistryError:
            self.plugins.remove(str(p))
            raise
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # noqa: BLE001 - a user's file: say which and why
            self.plugins.remove(str(p))
            if isinstance(exc, SystemExit):  # sys.exit() at import: never a silent exit
                raise RegistryError(f"configuration file {path!r} called sys.exit("
                                    f"{exc.code!r}) while loading; a configuration file "
                                    f"only registers entries") from None
            raise RegistryError(f"configuration file {path!r} failed to load: "
                                f"{type(exc).__name__}: {exc}") from exc


REGISTRY = Registry()
