"""The baselines T3 compares against (T3, "Configurations compared"), for every
operation:

- ``sequential``: the producer GEMM, then the collective as a CU-driven kernel of
  its own (for an AG feeding a GEMM: the AG kernel, then the GEMM); an AR's AG
  then runs as a kernel; an operation may give its own phases (``parts.phases``:
  the embedding operator's kernel per table, then the library all-to-all);
- ``ideal-overlap``: max(GEMM alone, collective alone) (+ AG alone for AR): the
  sequential phases, each run isolated on a clock of its own;
- ``ideal-rs-nmc``: the same with the RS done by near-memory updates (reductions).

On a system whose preset names a collective library (NCCL, RCCL), its collective
kernels are the library's (``emulator/model/library.py``): its schedule (a ring,
whatever the run's ``--algorithm``, which the fused configurations follow; on a
full mesh the library's rings, one per link, run as direct sends), its protocol
and channels, and an all-reduce as one kernel (the AG half has no launch of its
own). Near-memory reductions (``ideal-rs-nmc``) are T3's, not a library's: they
keep the run's algorithm.
"""

from __future__ import annotations

from collectives.common import Problem
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation
from emulator.model import library


def library_schedule(p: Problem, op: Operation, algorithm: str) -> str:
    """The schedule a library runs an operation's collective with: its ring where the
    operation has one, except on a single full-mesh node (rings over every link: direct
    sends on the same links)."""
    if not p.spec.interconnect.library or "ring" not in op.algorithms:
        return algorithm
    topo = p.topology
    if p.spec.interconnect.topology == "full-mesh" and topo.nodes == 1:
        return "direct"
    return "ring"


def library_choice(p: Problem, kind: str, cols: int, schedule: str):
    """The library's choice for a collective of the whole m x ``cols`` buffer."""
    return library.for_problem(p.spec, p.topology, kind, p.m * cols * p.dtype.itemsize,
                               schedule)


def _phases(p: Problem, op: Operation, algorithm: str, isolated: bool, nmc: bool) -> Plan:
    parts, slots = op.parts, Slots()

    def iso(name: str) -> dict:
        return {"clock": name} if isolated else {}

    if getattr(parts, "phases", None) is not None:  # an operation with phases of its own
        layout, inputs, result, phases = parts.phases(p, slots, algorithm, iso)
        return Plan(layout, inputs, phases, slots, result, isolated)
    if not nmc:
        algorithm = library_schedule(p, op, algorithm)
    kind = "ar" if parts.then_ag else parts.stream
    lib = None if nmc else library_choice(p, kind, p.k if parts.consumer else p.n,
                                          algorithm)
    layout, inputs, result = parts.layout(p, algorithm, recv_buffer=not nmc)

    stream = parts.stream
    collective = StepsPhase(stream, parts.steps(p, slots, algorithm, nmc), **iso(stream),
                            library=lib)
    if parts.consumer:  # the collective gathers the GEMM's input first
        kernel, amap = parts.producer(p, slots)
        phases = [collective, KernelPhase("gemm", kernel, [amap], stream, **iso("gemm"))]
    else:
        kernel, amap = parts.producer(p, slots)
        phases = [KernelPhase("gemm", kernel, [amap], stream, **iso("gemm")), collective]
    if parts.then_ag and p.world > 1:
        steps, credit = parts.ag_after(p, slots, algorithm)
        after = tuple(ph.name for ph in phases) if isolated else ()
        one_kernel = lib is not None  # the library's AR: one kernel (isolated too: its AG
        # half alone is the kernel's tail, without a second launch and fixed latency)
        phases.append(StepsPhase("ag", steps, **iso("ag"), after=after, credit=credit,
                                 library=lib, launch=not one_kernel))
    plan = Plan(layout, inputs, phases, slots, result, isolated)
    if lib is not None:
        plan.pattern = algorithm  # the shares of ports its ring (or direct sends) cross
    return plan


def sequential(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=False, nmc=False)


def ideal_overlap(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=True, nmc=False)


def ideal_rs_nmc(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _phases(p, op, algorithm, isolated=True, nmc=True)
