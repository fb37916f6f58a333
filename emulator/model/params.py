"""Every number the model's code reads that is not a GPU or system preset's key: a named
parameter with its provenance (``devices/sources.py``'s kinds: datasheet, measured,
library code, a paper, derived, or an ASSUMPTION with its reason and plausible range).

Three forms, all listed by ``t3emu params``:

- ``define(name, value, unit, doc, source)``: a parameter read at run time with
  ``value(name)``; ``--set model.NAME=VALUE`` (``activate``) changes it for a run, so
  ``t3emu validate --sensitivity`` can set each assumption to the ends of its range. Each
  rank records which it read (``reads``), so a result names the ones it depends on.
- ``table(name, obj, unit, doc, source)``: a structure of numbers taken whole from one
  source (NCCL's tuning tables), returned as given; not changed per run.
- ``Param`` knobs of operations and configurations (``--param``) are listed beside them
  with their own sources (``emulator/engine/registry.py``).

The rule the tests enforce on ``emulator/model/``, ``emulator/engine/`` and ``collectives/``
(``tests/test_params.py``): a numeric literal there is either one of these parameters'
(an argument of ``define``, ``table`` or ``Param``), or exempt as not deciding a time:
0, 1, 2, -1 and 0.5; a power of ten (a unit conversion or a tolerance); an integer used
as an index or slice, a shift or a power (``1 << 20``), or as an array shape
(``reshape``, ``empty``, ``zeros``, ...); or a line marked ``# not a parameter: REASON``
(a host-memory estimate, a numerics tolerance, a datatype's size, a configuration's
definition).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from devices.sources import Source, parse

# modules that register tables (imported for the listing)
TABLE_MODULES = ("emulator.model.library",)


@dataclass(frozen=True)
class ModelParam:
    """A parameter of the model's code: its default, unit, meaning and source."""

    name: str
    default: Any
    unit: str
    doc: str
    source: Source
    table: bool = False  # a structure taken whole from its source (``table``)

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.default if not self.table else "(table)",
                "unit": self.unit, "doc": self.doc, "source": self.source.to_dict(),
                "set": "" if self.table else f"model.{self.name}"}


REGISTRY: dict[str, ModelParam] = {}
_active: dict[str, float] = {}
_read: set[str] = set()


class ParamError(ValueError):
    """An unknown model parameter or a value it cannot take."""


def _register(name: str, default: Any, unit: str, doc: str, source: Any,
              table: bool = False) -> ModelParam:
    if name in REGISTRY:
        raise ParamError(f"model parameter {name!r} defined twice")
    src = parse(source, f"model parameter {name}")
    if src.kind == "assumption" and not table and not src.low <= default <= src.high:
        raise ParamError(f"model parameter {name}: range {src.low:g} to {src.high:g} does "
                         f"not hold its value {default!r}")
    p = ModelParam(name, default, unit, doc, src, table)
    REGISTRY[name] = p
    return p


def define(name: str, default: float, unit: str, doc: str, source: Any) -> ModelParam:
    """Register a parameter the code reads with ``value(name)``."""
    return _register(name, default, unit, doc, source)


def table(name: str, obj: Any, unit: str, doc: str, source: Any) -> Any:
    """Register a structure of numbers taken whole from ``source``; returns ``obj``."""
    _register(name, None, unit, doc, source, table=True)
    return obj


def value(name: str) -> float:
    """The run's value of model parameter ``name`` (its default unless ``--set
    model.NAME``); records the read."""
    p = REGISTRY[name]
    _read.add(name)
    return _active.get(name, p.default)


def activate(overrides) -> None:
    """Make the ``model.NAME`` items of ``overrides`` (``--set``) the values of this
    process's runs, every other parameter at its default, and forget earlier reads."""
    _active.clear()
    _read.clear()
    for key, v in overrides:
        if key.startswith("model."):
            _active[key[len("model."):]] = float(v)


def check(key: str, v: Any) -> None:
    """Refuse ``--set model.NAME=VALUE`` for an unknown parameter, a table, or a value that
    is not a finite number."""
    import math

    name = key[len("model."):]
    if name not in REGISTRY or REGISTRY[name].table:
        raise ParamError(f"unknown model parameter {name!r}; model parameters: "
                         f"{', '.join(sorted(n for n, p in REGISTRY.items() if not p.table))}")
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ParamError(f"{key} = {v!r} must be a finite number")


def reads() -> list[str]:
    """The parameters read since the last ``activate`` (this process)."""
    return sorted(_read)


def load_all() -> dict[str, ModelParam]:
    """Every registered parameter, the table modules imported."""
    import importlib

    for m in TABLE_MODULES:
        importlib.import_module(m)
    return dict(REGISTRY)


# ----------------------------------------------------------------- the parameters
_T3 = "Pati et al., T3 (ASPLOS 2024)"
_FUSED = "Punniyamurthy et al., fused computation-collective operators (SC 2024)"

define("shmem_occupancy_loss", 0.125, "fraction",
       "occupancy a fused embedding kernel loses to its ROC_SHMEM context (in whole WGs "
       "per CU)", f"paper: {_FUSED}, 'Costs': 12.5% lower occupancy, measured on the "
                  f"embedding kernel")
define("shmem_occupancy_loss_unmeasured", 0.0, "fraction",
       "occupancy the fused GEMV and GEMM kernels lose to the same context",
       {"assumption": "not measured; a GEMM at 1-2 WGs per CU is limited by its LDS and "
                      "tiles before its registers; at most the embedding's measured loss",
        "low": 0.0, "high": 0.125})
