"""The baselines T3 compares against (T3, "Configurations compared"), for every
operation:

- ``sequential``: the producer GEMM, then the collective as a CU-driven kernel of
  its own (for an AG feeding a GEMM: the AG kernel, then the GEMM); an AR's AG
  then runs as a kernel; an operation may give its own phases (``parts.phases``:
  the embedding operator's kernel per table, then the library all-to-all);
- ``ideal-overlap``: max(GEMM alone, collective alone) (+ AG alone for AR): the
  sequential phases, each run isolated on a clock of its own;
- ``ideal-rs-nmc``: the same with the RS done by near-memory updates (reductions).
"""

from __future__ import annotations

from collectives.common import Problem
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation


def _phases(p: Problem, op: Operation, algorithm: str, isolated: bool, nmc: bool) -> Plan:
    parts, slots = op.parts, Slots()

    def iso(name: str) -> dict:
        return {"clock": name} if isolated else {}

    if getattr(parts, "phases", None) is not None:  # an operation with phases of its own
        layout, inputs, result, phases = parts.phases(p, slots, algorithm, iso)
        return Plan(layout, inputs, phases, slots, result, isolated)
    layout, inputs, result = parts.layout(p, algorithm, recv_buffer=not nmc)

    stream = parts.stream
    if parts.consumer:  # the collective gathers the GEMM's input first
        phases = [StepsPhase(stream, parts.steps(p, slots, algorithm, nmc), **iso(stream))]
        kernel, amap = parts.producer(p, slots)
        phases.append(KernelPhase("gemm", kernel, [amap], stream, **iso("gemm")))
    else:
        kernel, amap = parts.producer(p, slots)
        phases = [KernelPhase("gemm", kernel, [amap], stream, **iso("gemm")),
                  StepsPhase(stream, parts.steps(p, slots, algorithm, nmc), **iso(stream))]
    if parts.then_ag and p.world > 1:
        steps, credit = parts.ag_after(p, slots, algorithm)
        after = tuple(ph.name for ph in phases) if isolated else ()
        phases.append(StepsPhase("ag", steps, **iso("ag"), after=after, credit=credit))
    return Plan(layout, inputs, phases, slots, result, isolated)


def sequential(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=False, nmc=False)


def ideal_overlap(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=True, nmc=False)


def ideal_rs_nmc(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=True, nmc=True)
