"""The contention model's anchors: three published measurements of how concurrent
computation and communication slow each other (none of them one of the four papers'
results), beside the emulator's values from the ``anchors`` sweep (``run/anchors.toml``:
the ``c3`` configuration, ``collectives/c3.py``). They check the mechanisms (CU dispatch and
slots, the L2 and the HBM shared with communication); no parameter is fitted to them.

Per C3 pairing (the GEMM with the collective on one executor): serial = the GEMM alone +
the collective alone, ideal = the longer of the two, both from isolated runs; the fraction
of the ideal speedup realised = (serial / concurrent - 1) / (serial / ideal - 1), the C3
study's definition (its abstract: "serial computation and communication versus maximum of
computation or communication; all times from isolated executions").
"""

from __future__ import annotations

from emulator.app.validation.common import (
    Claim, Measured, NotComputed, Paper, Published, Sweeps, mean, runs)

PAPER = Paper(
    "anchors", "independent measurements of contention (anchors)",
    "three studies, none of them one of the four papers: (1) Anirudha Agrawal, Shaizeen Aga, "
    "Suchita Pati, Mahzabeen Islam, \"Optimizing ML Concurrent Computation and "
    "Communication with GPU DMA Engines\" (ConCCL), arXiv:2412.14335 (ISPASS 2025); (2) "
    "Seonho Lee, Jihwan Oh, Junkyum Kim, Seokjin Go, Jongse Park, Divya Mahajan, "
    "\"Characterizing Compute-Communication Overlap in GPU-Accelerated Distributed Deep "
    "Learning: Performance and Power Implications\", arXiv:2507.03114; (3) Suchita Pati, "
    "Mahzabeen Islam, Shaizeen Aga et al., \"DMA Collectives for Efficient ML Communication "
    "Offloads\", arXiv:2511.06605 v1 (v2: \"DMA-Latte\"). Figures from their abstracts.",
    ("anchors",), "the three abstracts")
SWEEP = "anchors"
MODE = "c3"  # the configuration every point runs (collectives/c3.py)
C3_WHERE = "C3 study, abstract (8 x MI300X)"
SLOW_WHERE = "overlap characterisation, abstract (A100, H100, MI210, MI250)"
DMA_WHERE = "DMA collectives study, abstract (8 x MI300X)"
DISPATCHES = ("plain", "prioritised", "partitioned")
# the points the sensitivity pass varies: one C3 pairing of each collective, one slowdown
# GEMM on each GPU, the smallest and largest DMA collectives (the others keep their values)
SENSITIVITY_SUBSET = {SWEEP: (lambda pt: pt["key"].split("/")[0] in (
    "c3-ag-256m-n2048", "c3-a2a-256m-n2048", "slowdown-h5120", "dma-ag-1k", "dma-a2a-1k",
    "dma-ag-1g"), "6 of the 39 points: c3-ag/a2a-256m-n2048, slowdown-h5120 (3 GPUs), "
    "dma-ag-1k, dma-a2a-1k, dma-ag-1g")}


def _phases(pt: dict) -> dict[str, float]:
    return runs(pt)[MODE]["phases"]


def points(sw: Sweeps, prefix: str) -> list[dict]:
    """The sweep's points of one experiment (its cases' names start with ``prefix``)."""
    return [p for p in sw[SWEEP]["points"] if p["key"].startswith(prefix)
            and MODE in runs(p)]


def fraction(ph: dict[str, float], together: str, alone: str) -> float:
    """The fraction of the ideal speedup the concurrent run ``together`` realises, the
    collective alone being ``alone`` (module docstring)."""
    g, c = ph["gemm"], ph[alone]
    serial, ideal = g + c, max(g, c)
    return (serial / ph[together] - 1.0) / (serial / ideal - 1.0)


def speedup(ph: dict[str, float], together: str, alone: str) -> float:
    return (ph["gemm"] + ph[alone]) / ph[together]


def _mean_fraction(together: str, alone: str):
    def compute(sw: Sweeps) -> Measured | NotComputed:
        xs = [fraction(_phases(p), together, alone) for p in points(sw, "c3-")]
        if not xs:
            return NotComputed("no C3 point")
        return Measured(mean(xs), text=f"{mean(xs) * 100:.0f}% (mean of {len(xs)}; "
                                       f"{min(xs) * 100:.0f}% to {max(xs) * 100:.0f}%)")
    return compute


def _dma_best(sw: Sweeps) -> Measured:
    x, p = max((speedup(_phases(p), "c3-dma", "comm-dma"), p) for p in points(sw, "c3-"))
    return Measured(x, text=f"{x:.2f}x ({p['key'].split('/')[0]})")


def slowdowns(sw: Sweeps) -> list[tuple[float, dict]]:
    """The GEMM's time beside the collective (launched ahead of it: prioritised) over its
    time alone, per slowdown point."""
    return [(_phases(p)["c3-prioritised.kernel"] / _phases(p)["gemm"], p)
            for p in points(sw, "slowdown-")]


def _slow_mean(sw: Sweeps) -> Measured:
    xs = [x for x, _ in slowdowns(sw)]
    return Measured(mean(xs), text=f"{mean(xs):.3f} (mean of {len(xs)}: "
                                   f"{(mean(xs) - 1) * 100:.1f}% slower)")


def _slow_max(sw: Sweeps) -> Measured:
    x, p = max(slowdowns(sw), key=lambda t: t[0])
    return Measured(x, text=f"{x:.3f} ({p['key'].split('/')[0]} on {p['system']})")


SMALL, LARGE_FROM = "1k", 64 << 20  # the smallest size; "tens of MB to GB": 64 MB and up


def _size(pt: dict) -> int:
    return pt["m"] * pt["k"] * 2  # fp16


def dma_ratios(sw: Sweeps) -> list[tuple[float, dict]]:
    """The DMA collective's time over the library's, per DMA point."""
    return [(_phases(p)["comm-dma"] / _phases(p)["comm-cu"], p) for p in points(sw, "dma-")]


def _dma_large(sw: Sweeps) -> Measured:
    xs = [1.0 / x for x, p in dma_ratios(sw) if _size(p) >= LARGE_FROM]
    return Measured(mean(xs), text=f"{mean(xs):.3f} (library over DMA, mean of {len(xs)}: "
                                   f"64 MB to 1 GB, both collectives)")


def _dma_small(op: str):
    def compute(sw: Sweeps) -> Measured | NotComputed:
        xs = [(x, p) for x, p in dma_ratios(sw) if p["key"].startswith(f"dma-{op}-{SMALL}/")]
        if not xs:
            return NotComputed(f"no dma-{op}-{SMALL} point")
        x, p = xs[0]
        return Measured(x, text=f"{x:.2f} (DMA over library, {_size(p)} B)")
    return compute


CLAIMS = [
    Claim("C3 with the library's CU collectives realises about 21% of the ideal speedup",
          C3_WHERE, Published.value(0.21, "share", "21%"), (SWEEP,),
          _mean_fraction("c3-plain", "comm-cu")),
    Claim("schedule prioritisation (and CU partitioning) raise it to about 42%: "
          "prioritised", C3_WHERE, Published.value(0.42, "share", "42%"), (SWEEP,),
          _mean_fraction("c3-prioritised", "comm-cu")),
    Claim("schedule prioritisation and CU partitioning raise it to about 42%: partitioned",
          C3_WHERE, Published.value(0.42, "share", "42%"), (SWEEP,),
          _mean_fraction("c3-partitioned", "comm-cu")),
    Claim("DMA collectives (ConCCL) realise about 72% of the ideal speedup", C3_WHERE,
          Published.value(0.72, "share", "72%"), (SWEEP,),
          _mean_fraction("c3-dma", "comm-dma")),
    Claim("ConCCL's speedup over serial reaches 1.67x", C3_WHERE,
          Published.value(1.67, "speedup", "up to 1.67x"), (SWEEP,), _dma_best),
    Claim("computation overlapped with communication runs 18.9% slower on average",
          SLOW_WHERE, Published.value(1.189, "ratio", "18.9% slower (time ratio 1.189)"),
          (SWEEP,), _slow_mean),
    Claim("... and 40% slower at most", SLOW_WHERE,
          Published.value(1.40, "ratio", "40.0% slower (time ratio 1.40)"), (SWEEP,),
          _slow_max),
    Claim("DMA collectives are about 16% better than RCCL's at tens of MB to GB", DMA_WHERE,
          Published.value(1.16, "ratio", "16% better (library over DMA 1.16)"), (SWEEP,),
          _dma_large),
    Claim("DMA all-gather 4.5x slower than RCCL's at small sizes", DMA_WHERE,
          Published.value(4.5, "ratio", "4.5x slower"), (SWEEP,), _dma_small("ag")),
    Claim("DMA all-to-all 2.5x slower than RCCL's at small sizes", DMA_WHERE,
          Published.value(2.5, "ratio", "2.5x slower"), (SWEEP,), _dma_small("a2a")),
]


def _us(x: float) -> str:
    return f"{x * 1e6:.1f}"


def _c3_table(sw: Sweeps) -> list[str]:
    lines = ["## C3 on 8 x MI300X", "",
             "Each GPU's GEMM (M x N x K, fp16) beside a collective of M x K (all-gather: every "
             "rank's M/8 rows to every peer; all-to-all: the dispatch of M/8 rows per pair), "
             "times in us from isolated runs; fraction of the ideal speedup realised per "
             "pairing (the library's CU collective dispatched plain, prioritised, "
             "partitioned; the DMA collective).", "",
             "| case | GEMM | collective (CU) | collective (DMA) | plain | prioritised | "
             "partitioned | DMA | GEMM beside CU (prioritised) / alone |",
             "|---|---|---|---|---|---|---|---|---|"]
    for p in points(sw, "c3-"):
        ph = _phases(p)
        fr = [fraction(ph, f"c3-{d}", "comm-cu") for d in DISPATCHES]
        fr.append(fraction(ph, "c3-dma", "comm-dma"))
        lines.append(f"| {p['key'].split('/')[0]} (N = {p['n']}) | {_us(ph['gemm'])} | "
                     f"{_us(ph['comm-cu'])} | {_us(ph['comm-dma'])} | "
                     + " | ".join(f"{x * 100:.0f}%" for x in fr)
                     + f" | {ph['c3-prioritised.kernel'] / ph['gemm']:.3f} |")
    return lines + [""]


def _slow_table(sw: Sweeps) -> list[str]:
    lines = ["## The overlapped GEMM's slowdown", "",
             "Each GPU's GEMM (16384 tokens x 1024 x H, fp16) beside an all-gather of its "
             "16384 x H input on 4 GPUs; the GEMM's time beside the collective (its blocks "
             "dispatched first: prioritised; plain and partitioned for reference) over alone.",
             "", "| GPU | H | GEMM alone (us) | collective (us) | prioritised | plain | "
             "partitioned | beside DMA |", "|---|---|---|---|---|---|---|---|"]
    for p in points(sw, "slowdown-"):
        ph = _phases(p)
        ratio = [ph[f"c3-{d}.kernel"] / ph["gemm"] for d in ("prioritised", "plain",
                                                             "partitioned", "dma")]
        lines.append(f"| {p['system']} | {p['k']} | {_us(ph['gemm'])} | {_us(ph['comm-cu'])} "
                     "| " + " | ".join(f"{x:.3f}" for x in ratio) + " |")
    return lines + [""]


def _dma_table(sw: Sweeps) -> list[str]:
    lines = ["## DMA against the library's collectives on 8 x MI300X", "",
             "Each collective alone: its size in all (M x K fp16), the library's CU kernel "
             "and the DMA engines (one per peer, each command set up on the host), times in "
             "us.", "", "| collective | size | library | DMA | DMA / library |",
             "|---|---|---|---|---|"]
    for x, p in dma_ratios(sw):
        ph = _phases(p)
        op = "all-to-all" if p["key"].startswith("dma-a2a-") else "all-gather"
        lines.append(f"| {op} | {_size(p):,} B | {_us(ph['comm-cu'])} | {_us(ph['comm-dma'])} "
                     f"| {x:.2f} |")
    return lines + [""]


def details(sw: Sweeps) -> list[str]:
    if SWEEP not in sw:
        return []
    return _c3_table(sw) + _slow_table(sw) + _dma_table(sw)
