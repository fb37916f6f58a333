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
    module: str = ""  # a table's module (where the code reads it)

    def to_dict(self) -> dict:
        return {"name": self.name, "value": self.default if not self.table else "(table)",
                "unit": self.unit, "doc": self.doc, "source": self.source.to_dict(),
                "set": "" if self.table or not isinstance(self.default, (int, float))
                else f"model.{self.name}"}


REGISTRY: dict[str, ModelParam] = {}
_active: dict[str, float] = {}
_read: set[str] = set()


class ParamError(ValueError):
    """An unknown model parameter or a value it cannot take."""


def _register(name: str, default: Any, unit: str, doc: str, source: Any,
              table: bool = False, module: str = "") -> ModelParam:
    if name in REGISTRY:
        raise ParamError(f"model parameter {name!r} defined twice")
    src = parse(source, f"model parameter {name}")
    if src.kind == "assumption" and not table and not src.low <= default <= src.high:
        raise ParamError(f"model parameter {name}: range {src.low:g} to {src.high:g} does "
                         f"not hold its value {default!r}")
    p = ModelParam(name, default, unit, doc, src, table, module)
    REGISTRY[name] = p
    return p


def define(name: str, default: float, unit: str, doc: str, source: Any) -> ModelParam:
    """Register a parameter the code reads with ``value(name)``."""
    return _register(name, default, unit, doc, source)


def table(name: str, obj: Any, unit: str, doc: str, source: Any) -> Any:
    """Register a structure of numbers taken whole from ``source``; returns ``obj``."""
    import sys

    _register(name, None, unit, doc, source, table=True,
              module=sys._getframe(1).f_globals.get("__name__", ""))
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
    if name not in REGISTRY or REGISTRY[name].table \
            or not isinstance(REGISTRY[name].default, (int, float)):
        settable = sorted(n for n, p in REGISTRY.items()
                          if not p.table and isinstance(p.default, (int, float)))
        raise ParamError(f"unknown model parameter {name!r}; model parameters: "
                         f"{', '.join(settable)}")
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
define("fixed_stages", 2, "K steps",
       "the fixed tile's software pipeline: K steps in flight, one computed while the "
       "next ones load (a device without a [gemm] section: T3's simulated GPU)",
       {"assumption": "one step prefetched while another computes, as Tensile's "
                      "PrefetchGlobalRead and CUTLASS's smallest multistage pipeline; the "
                      "libraries' tiles keep 2 to 4 (the [gemm] catalogues)",
        "low": 2, "high": 4})
define("k_step", 64, "elements",
       "a WG's K loop step; it prefetches one step ahead, so the L2 holds two steps of every "
       "panel (the fixed tile's L2 model)",
       {"assumption": "Tensile's DepthU 64 and CUTLASS's 32-64 K tiles; 32 to 128",
        "low": 32, "high": 128})
define("mca_thresholds", (5, 10, 30), "requests",
       "MCA's communication thresholds per channel (besides no limit)",
       f"paper: {_T3}, memory-controller arbitration (5, 10, 30 or no limit)")
define("mca_band_low", 0.25, "utilisation",
       "the first GEMM stage's DRAM utilisation from which MCA limits communication to 30 "
       "requests (then each further step: 10, then 5)",
       {"assumption": "T3 names the thresholds, not the occupancies that pick them: the "
                      "utilisation range split evenly (0.25, 0.5, 0.75); 0.15 to 0.35",
        "low": 0.15, "high": 0.35})
define("mca_band_step", 0.25, "utilisation",
       "the step between MCA's utilisation bands",
       {"assumption": "as mca_band_low: the range split evenly; 0.2 to 0.3 keeps the top "
                      "band below full utilisation", "low": 0.2, "high": 0.3})
define("flux_hopper_reduce_share", 0.25, "share of an SM",
       "the share of an SM's vector issue a Flux Hopper RS reduce warp gets",
       {"assumption": "one warp of four per SM sub-partition scheduler issues at most a "
                      "quarter of an SM's vector instructions; from an eighth (sharing its "
                      "scheduler with the GEMM's warps) to a half (two warps)",
        "low": 0.125, "high": 0.5})
define("flux_pcie_rs_ctas", 6, "thread blocks",
       "the thread blocks of Flux's PCIe reduce-scatter kernel (one per SM)",
       "library: bytedance/flux ths_op/gemm_reduce_scatter.cc (num_blocks = 6)")
define("gemv_rows", 8, "rows",
       "output rows one WG of a decode GEMV computes",
       {"assumption": "two rows per wavefront of a 256-thread WG, each streaming its weight "
                      "rows once, so the smallest decode shapes give hundreds of tiles; 4 "
                      "(one per wavefront) to 16", "low": 4, "high": 16})
define("te_splits", 4, "splits",
       "num_splits of TransformerEngine's pipelined GEMM + reduce-scatter overlap",
       "library: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py "
       "(num_splits of a 'pipeline' overlap)")
define("te_rs_sms", 16, "SMs",
       "num_sm of a pipelined overlap's reduce-scatter kernel (the GEMM's SM margin)",
       "library: NVIDIA/TransformerEngine transformer_engine/pytorch/module/base.py "
       "(num_sm of a 'pipeline' overlap, set_sm_margin)")
define("te_rs_last_sms", 32, "SMs",
       "SMs of the last split's reduce-scatter, with no GEMM beside it",
       "library: NVIDIA/TransformerEngine userbuffers (UB_MAX_SM)")
