"""The Python API: what ``t3emu run`` and ``t3emu sweep`` do, as functions that return
typed results (docs/api.md).

    from emulator import api

    res = api.run("gemm+rs", system="a100-sxm-x8", modes=["sequential", "flux-rs-w"],
                  m=4096, n=4096, k=1024, timing_only=True, set={"gpu.cus": 216})
    res["flux-rs-w"].modelled_time_s, res["flux-rs-w"].speedup

    sw = api.sweep("example", out="results/example", timing_only=True)
    [(p.label, p["t3"].speedup) for p in sw.points if "t3" in p]

Both launch MPI exactly as the command line does (``mpiexec`` from the mpich wheel, the
same checks before the launch, the same result document); the command line is a thin
layer over ``config``, ``execute`` and ``sweep``. Bad input raises ``ConfigError`` (the
CLI's exit 2), a failed job ``RunError`` (exit 1) with the job's output.
"""

from __future__ import annotations

import contextlib

import io
import sys
import json
import tempfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from emulator.app.config import ConfigError, RunConfig, set_text

__all__ = ["ConfigError", "RunError", "ModeResult", "RunResult", "PointResult",
           "SweepResult", "config", "execute", "run", "sweep", "load_sweep", "pooled"]


class RunError(RuntimeError):
    """A job that failed (an exception on a rank, a numerics check, a killed rank); the
    message ends with the job's output."""

    def __init__(self, message: str, output: str = ""):
        super().__init__(f"{message}\n{output[-4000:]}" if output else message)
        self.output = output


@dataclass(frozen=True)
class ModeResult:
    """One configuration's result (a ``runs`` entry of the JSON; ``raw`` holds every
    field)."""

    mode: str
    modelled_time_s: float
    speedup: float | None  # over ``baseline`` (the registry's baseline of the mode)
    baseline: str | None
    phases: dict[str, float]
    dram_bytes: dict[str, int]
    numerics: str  # "pass", "fail" or "timing-only"
    causes: dict | None  # --causes: the gain split into causes (seconds)
    raw: dict

    @classmethod
    def of(cls, run: dict) -> ModeResult:
        return cls(run["mode"], run["modelled_time_s"], run.get("speedup"),
                   run.get("baseline"), dict(run["phases"]), dict(run["dram_bytes"]),
                   run["numerics"], run.get("causes"), run)


@dataclass(frozen=True)
class RunResult:
    """A run's result document (what ``--json`` writes) with its configurations by name."""

    doc: dict
    output: str = ""  # what the job printed (the summary table, progress lines)

    @property
    def runs(self) -> dict[str, ModeResult]:
        return {r["mode"]: ModeResult.of(r) for r in self.doc["runs"]}

    @property
    def modes(self) -> list[str]:
        return [r["mode"] for r in self.doc["runs"]]

    @property
    def config(self) -> dict:
        return self.doc["config"]

    @property
    def header(self) -> str:
        return self.doc.get("header", "")

    def __getitem__(self, mode: str) -> ModeResult:
        return self.runs[mode]

    def __contains__(self, mode: str) -> bool:
        return mode in self.modes

    def summary(self) -> str:
        """The table ``t3emu run`` prints."""
        from emulator.app.worker import summary_table

        return summary_table(self.doc)


@dataclass(frozen=True)
class PointResult:
    """One point of a sweep (an entry of ``results.json``'s ``points``)."""

    doc: dict

    @property
    def key(self) -> str:
        return self.doc["key"]

    @property
    def label(self) -> str:
        """As the sweep's progress lines name the point (its params and --set values too)."""
        from devices.overrides import describe

        d = self.doc
        params = ",".join(f"{n}={v:g}" for n, v in (d.get("params") or {}).items())
        return " ".join(str(x) for x in (d["model"], d["sublayer"], f"m={d['m']}",
                                         f"TP{d['tp']}", d.get("system") or d["device"],
                                         params, describe(tuple((d.get("set") or {}).items())))
                        if x)

    @property
    def runs(self) -> dict[str, ModeResult]:
        return {r["mode"]: ModeResult.of(r) for r in self.doc["runs"]}

    def __getitem__(self, mode: str) -> ModeResult:
        return self.runs[mode]

    def __contains__(self, mode: str) -> bool:
        return mode in self.runs


@dataclass(frozen=True)
class SweepResult:
    """A sweep's ``results.json`` (every finished point) and where it is."""

    doc: dict
    out: Path
    exit_code: int = 0  # 0: every point finished and passed

    @property
    def points(self) -> list[PointResult]:
        return [PointResult(p) for p in self.doc["points"]]

    @property
    def csv(self) -> Path:
        return self.out / "results.csv"


def _names(value, option: str) -> tuple[str, ...]:
    """A list option: a list of strings, or one comma-separated string."""
    if value is None:
        return ()
    if isinstance(value, str):
        return tuple(x.strip() for x in value.split(",") if x.strip())
    if isinstance(value, Iterable) and all(isinstance(x, str) for x in value):
        return tuple(value)
    raise ConfigError(option, value, "a list of strings or one comma-separated string")


def _typed(value, option: str, typ: type, what: str, optional: bool = False):
    """``value`` if it is a ``typ`` (bool is no number here), else ConfigError."""
    if value is None and optional:
        return None
    ok = isinstance(value, typ) and not (isinstance(value, bool) and typ is not bool)
    if typ is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok:
        raise ConfigError(option, value, what)
    return value


def _settings(value) -> tuple:
    """``set=``: a dict, pairs, or ``"KEY=VALUE"`` strings -> (key, value) pairs."""
    from devices.overrides import parse
    from devices.spec import SpecError

    if not value:
        return ()
    if isinstance(value, Mapping):
        return tuple(value.items())
    out = []
    for item in ([value] if isinstance(value, str) else value):
        try:
            out.append(parse(item) if isinstance(item, str) else tuple(item))
        except (SpecError, TypeError) as exc:
            raise ConfigError("--set", item, str(exc)) from None
        if len(out[-1]) != 2:
            raise ConfigError("--set", item, "KEY=VALUE or a (key, value) pair")
    return tuple(out)


def _params(value) -> tuple[tuple[str, float], ...]:
    """``params=``: a dict or pairs of a name and a number."""
    if not value:
        return ()
    items = value.items() if isinstance(value, Mapping) else value
    out = []
    for item in items:
        try:
            name, number = item
        except (TypeError, ValueError):
            raise ConfigError("--param", item, "NAME=VALUE pairs: a dict or (name, number) "
                              "pairs") from None
        if isinstance(number, bool) or not isinstance(number, (int, float)):
            raise ConfigError("--param", f"{name}={number!r}", "a number")
        out.append((str(name), float(number)))
    return tuple(out)


def config(operation: str = "ar", *, ranks: int | None = None, system: str | None = None,
           device: str | None = None, topology: str | None = None,
           algorithm: str | None = None, modes: str | Iterable[str] = "all",
           m: int | None = None, n: int | None = None, k: int | None = None,
           dtype: str = "fp16", params: Mapping[str, float] | None = None,
           set: Mapping[str, Any] | None = None, timing_only: bool = False,  # noqa: A002
           seed: int = 0, values: str = "int", split_k: int = 1, causes: bool = False,
           ablate: Iterable[str] | str = (), configs: Iterable[str] | str = (),
           watchdog_s: float = 60.0, json_path: str | None = None, trace: str | None = None,
           hosts: Iterable[str] | str = (), same_machine: bool = False,
           ranks_here: int | None = None, **hidden) -> RunConfig:
    """A checked run configuration (the options of ``t3emu run``; ``set`` is ``--set``,
    ``params`` ``--param``). Raises ConfigError naming the option, as the CLI's exit 2.
    ``ranks_here``: the ranks this host holds (default: as the launcher places them; 0
    under an outside mpiexec, whose ranks check their node themselves). ``hidden``: the
    CLI's test hooks (``record_wall``, ``inject_fault``)."""
    from devices.overrides import check
    from devices.spec import SpecError
    from devices.system import load_system, system_size
    from emulator.app.launcher import preflight, ranks_on_this_host

    unknown = sorted(h for h in hidden if h not in ("record_wall", "inject_fault"))
    if unknown:  # (``set`` is an argument here: no builtin set in this function)
        raise TypeError(f"config() got unexpected keyword arguments {unknown}")
    for opt, val in (("--device", device), ("--topology", topology)):
        if system and val:
            raise ConfigError(opt, val, "--system gives the GPU and the topology; drop one")
    for opt, val in (("-n/--ranks", ranks), ("--m", m), ("--n", n), ("--k", k)):
        _typed(val, opt, int, "an integer", optional=True)
    for opt, val in (("--seed", seed), ("--split-k", split_k)):
        _typed(val, opt, int, "an integer")
    for opt, val in (("--timing-only", timing_only), ("--causes", causes),
                     ("--same-machine", same_machine)):
        _typed(val, opt, bool, "True or False")
    _typed(watchdog_s, "--watchdog-s", float, "seconds (a number)")
    for opt, val in (("--collective", operation), ("--dtype", dtype), ("--values", values)):
        _typed(val, opt, str, "a string")
    overrides = _settings(set)
    try:
        check(overrides, bool(system))
    except SpecError as exc:
        raise ConfigError("--set", set_text(overrides), str(exc)) from None
    if system and ranks is None:
        try:
            ranks = system_size(load_system(system, overrides)) or None
        except SpecError as exc:
            raise ConfigError("--system", system, str(exc)) from None
    cfg = RunConfig(ranks=RunConfig.ranks if ranks is None else ranks, collective=operation,
                    topology=topology or "", algorithm=algorithm,
                    mode=",".join(_names(modes, "--mode")) or "all", m=m, n=n, k=k,
                    dtype=dtype, device=device or RunConfig.device, seed=seed, values=values,
                    split_k=split_k, watchdog_s=float(watchdog_s), json=json_path,
                    timing_only=timing_only, trace=trace,
                    configs=_names(configs, "--configs"), hosts=_names(hosts, "--hosts"),
                    same_machine=same_machine, system=system, params=_params(params),
                    ablate=_names(ablate, "--ablate"), causes=causes, overrides=overrides,
                    **hidden)
    return preflight(cfg, ranks_on_this_host(cfg) if ranks_here is None else ranks_here)


def execute(cfg: RunConfig, stdout=None, stderr=None) -> int:
    """Launch a checked configuration as an MPI job (what ``t3emu run`` does); the job's
    output goes to ``stdout``/``stderr`` (default this process's); returns its exit code."""
    from emulator.app.launcher import launch

    return launch(cfg, stdout=stdout, stderr=stderr)


def run(operation: str = "ar", *, echo: bool = False, **options) -> RunResult:
    """Run ``operation`` (keyword options as ``config``) and return its result document.
    ``echo``: also print the job's output as it comes. Raises ConfigError for bad input,
    RunError when the job fails (numerics included)."""
    with tempfile.TemporaryDirectory(prefix="t3emu-api-") as tmp:
        path = options.pop("json_path", None) or str(Path(tmp) / "run.json")
        cfg = config(operation, json_path=path, **options)
        log = _Tee(echo)
        rc = execute(cfg, stdout=log, stderr=log)
        output = log.getvalue()
        if rc != 0 or not Path(path).exists():
            raise RunError(f"t3emu run failed (exit {rc})", output)
        return RunResult(json.loads(Path(path).read_text()), output)


def sweep(scenario: str, out: str | Path, *, timing_only: bool = False,
          set: Mapping[str, Any] | None = None, causes: bool = False,  # noqa: A002
          ablate: Iterable[str] = (), configs: Iterable[str] = (),
          watchdog_s: float = 60.0, mixed: bool = False) -> SweepResult:
    """Run (or resume) a scenario (a shipped name or a .toml path) into ``out`` as
    ``t3emu sweep`` does; returns every finished point. Raises ScenarioError for a bad
    scenario or option, and for points in ``out`` made by other code or files unless
    ``mixed`` (``--mixed``: kept, each marked with what made it)."""
    from emulator.app.config import MAX_WATCHDOG_S
    from emulator.app.files import check_output_dir
    from emulator.app.scenario import ScenarioError, load_scenario
    from emulator.app.sweep import load_results, run_sweep
    from emulator.model.ablation import AblationError, check

    _typed(watchdog_s, "--watchdog-s", float, "seconds (a number)")
    _typed(timing_only, "--timing-only", bool, "True or False")
    _typed(causes, "--causes", bool, "True or False")
    _typed(mixed, "--mixed", bool, "True or False")
    if not 0 < watchdog_s <= MAX_WATCHDOG_S:
        raise ConfigError("--watchdog-s", watchdog_s,
                          f"seconds, more than 0 and at most {MAX_WATCHDOG_S:g}")
    ablate = _names(ablate, "--ablate")
    try:
        check(ablate)
    except AblationError as exc:
        raise ConfigError("--ablate", ",".join(ablate), str(exc).split(": ", 1)[1]) from None
    if causes and ablate:
        raise ConfigError("--causes", "set", "--causes runs its own counterfactuals; drop "
                          "--ablate")
    out = Path(out)
    configs = _names(configs, "--configs")
    sc = load_scenario(scenario, configs)
    made = not out.exists()
    check_output_dir(out, "--out", len(sc.points) * (2 << 20))
    try:
        rc = run_sweep(sc, out, timing_only, watchdog_s, configs, ablate, causes,
                       _settings(set), mixed)
    except (ConfigError, ScenarioError):
        if made:  # a refusal leaves no directory behind
            with contextlib.suppress(OSError):
                out.rmdir()  # (only if empty)
        raise
    return SweepResult(load_results(out), out, rc)


def pooled(keep: int = 1, timeout_s: float | None = None):
    """A context manager: within it every ``run``/``execute`` goes to a pooled MPI job of
    its size, started once (``emulator.app.pool``); ``keep`` jobs of different sizes stay
    up at once; a run longer than ``timeout_s`` stops its job (exit 124)."""
    from emulator.app.pool import pooled as _pooled

    return _pooled(keep, timeout_s)


def load_sweep(out: str | Path) -> SweepResult:
    """The results of an earlier sweep (its ``results.json``)."""
    from emulator.app.scenario import ScenarioError
    from emulator.app.sweep import load_results

    doc = load_results(Path(out))
    if doc is None:
        raise ScenarioError(f"{out} holds no results.json")
    return SweepResult(doc, Path(out))


class _Tee(io.StringIO):
    """Keeps what the job prints; with ``echo`` also prints it."""

    def __init__(self, echo: bool):
        super().__init__()
        self.echo = echo

    def write(self, text: str) -> int:
        if self.echo:
            sys.stdout.write(text)
        return super().write(text)

    def flush(self) -> None:
        if self.echo:
            sys.stdout.flush()
