"""The five T3 configurations of every collective, as plans of phases (T3, "Configurations
compared"):

- ``sequential``: the producer GEMM, then the collective as a CU-driven kernel of
  its own (for ``ag-gemm``: the AG kernel, then the GEMM).
- ``t3``: the producer fused with the collective through the map + tracker +
  DMA, round-robin HBM arbitration; an AR's AG then runs as a kernel.
- ``t3-mca``: the same with memory-controller arbitration.
- ``ideal-overlap``: max(GEMM alone, collective alone) (+ AG alone for AR): the
  sequential phases, each run isolated on a clock of its own.
- ``ideal-rs-nmc``: the same with the RS done by near-memory updates (RS, AR).
"""

from __future__ import annotations

from collectives import direct, ring
from collectives.common import Problem, plain_gemm
from collectives.consumer import ag_gemm
from emulator.plan import Credit, GemmPhase, Plan, Slots, StepsPhase


def _algo(algorithm: str):
    return ring if algorithm == "ring" else direct


def _ag_credit(p: Problem, slots: Slots, algorithm: str) -> Credit:
    """AR's AG overwrites peers' C chunks: wait until they finished their RS."""
    base = slots.alloc("ag credit", 1)
    if algorithm == "ring":
        notify, count = [p.right], 1
    else:
        notify, count = p.others, p.world - 1
    return Credit(notify, slots.region("ag credit", [base], [count],
                                       "ranks written into have finished their RS"))


def build_plan(p: Problem, collective: str, algorithm: str, mode: str) -> Plan:
    slots = Slots()
    dt = p.dtype
    mod = _algo(algorithm)
    m, n, k = p.m, p.n, p.k
    r0, r1 = p.chunk(p.rank)
    ideal = mode.startswith("ideal")
    fused = mode in ("t3", "t3-mca")
    layout = [("B", (k, n), dt), ("C", (m, n), dt)]
    inputs = {"B": ("B", 0)}
    phases: list = []

    def iso(name: str) -> dict:
        return {"clock": name} if ideal else {}

    if collective == "ag-gemm":
        layout.append(("AG", (m, k), dt))
        inputs["A"] = ("AG", r0)
        if fused:
            job, maps, preload = ag_gemm(p, slots, algorithm)
            phases.append(GemmPhase("ag+gemm", job, maps, "ag", fused=True, preload=preload))
        else:
            phases.append(StepsPhase("ag", mod.ag_steps(p, slots, "AG", k), **iso("ag")))
            job, amap = plain_gemm(p, slots, a="AG")
            phases.append(GemmPhase("gemm", job, [amap], "ag", **iso("gemm")))
        return Plan(layout, inputs, phases, slots, [("C", (0, m, 0, n))], ideal)

    own_rows = collective == "ag"
    layout.append(("A", (m, k), dt))
    inputs["A"] = ("A", r0 if own_rows else 0)
    stream = {"a2a": "a2a", "ag": "ag"}.get(collective, "rs")
    if collective in ("rs", "ar"):
        layout.append(("R", ((p.world * p.max_chunk) if algorithm == "direct" else m, n), dt))
    if collective == "a2a":
        layout.append(("X", (p.world * p.max_chunk, n), dt))

    if fused:
        if collective == "a2a":
            job, maps = direct.a2a_map(p, slots)
        else:
            job, amap = (mod.ag_map if collective == "ag" else mod.rs_map)(p, slots)
            maps = [amap]
        phases.append(GemmPhase(f"gemm+{'rs' if collective == 'ar' else collective}", job,
                                maps, stream, fused=True))
    else:
        job, amap = plain_gemm(p, slots, rows=[(r0, r1)] if own_rows else None)
        phases.append(GemmPhase("gemm", job, [amap], stream, **iso("gemm")))
        if collective == "a2a":
            steps = direct.a2a_steps(p, slots)
        elif collective == "ag":
            steps = mod.ag_steps(p, slots)
        else:
            steps = mod.rs_steps(p, slots, nmc=mode == "ideal-rs-nmc")
        phases.append(StepsPhase(stream, steps, **iso(stream)))
    if collective == "ar" and p.world > 1:
        after = tuple(ph.name for ph in phases) if ideal else ()
        phases.append(StepsPhase("ag", mod.ag_steps(p, slots), **iso("ag"), after=after,
                                 credit=_ag_credit(p, slots, algorithm)))
    if collective == "rs":
        result = [("C", (r0, r1, 0, n))]
    elif collective == "a2a":
        result = [("X", p.slot_region(s, p.rank)) for s in range(p.world)]
    else:
        result = [("C", (0, m, 0, n))]
    return Plan(layout, inputs, phases, slots, result, ideal)

