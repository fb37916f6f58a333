"""T3's fused configurations (T3, "Fused GEMM-RS" and "Memory-controller arbitration"):
the producer fused with its collective through the address-space map, the tracker
and the DMA engine, with near-memory updates; an AR's AG then runs as a kernel.

- ``t3``: round-robin HBM arbitration between compute and communication;
- ``t3-mca``: memory-controller arbitration.
"""

from __future__ import annotations

from collectives.baselines import library_choice
from collectives.common import Problem
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation


def _fused(p: Problem, op: Operation, algorithm: str, arbitration: str) -> Plan:
    parts, slots = op.parts, Slots()
    layout, inputs, result = parts.layout(p, algorithm)
    kernel, maps, preload = parts.fused(p, slots, algorithm)
    phases: list = [KernelPhase(parts.fused_name, kernel, maps, parts.stream, fused=True,
                                preload=preload)]
    if parts.then_ag and p.world > 1:
        steps, credit = parts.ag_after(p, slots, algorithm)
        phases.append(StepsPhase("ag", steps, credit=credit,  # the library's AG
                                 library=library_choice(p, "ag", p.n, algorithm)))
    return Plan(layout, inputs, phases, slots, result, arbitration=arbitration)


def t3(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _fused(p, op, algorithm, "round-robin")


def t3_mca(p: Problem, op: Operation, algorithm: str) -> Plan:
    return _fused(p, op, algorithm, "mca")
