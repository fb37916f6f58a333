"""Concurrent computation and communication (C3): a GEMM and a collective that do not
depend on each other, run alone and together, as the C3 study measures them on MI300X
(Agrawal, Aga, Pati, Islam, "Optimizing ML Concurrent Computation and Communication with
GPU DMA Engines", arXiv:2412.14335): an anchor of the contention model
(docs/validation/anchors.md), not one of the four designs.

The operation is FiCCO's (``ag+gemm``: rank r's GEMM reads the M x K rows the all-gather
of every rank's shard delivers; ``a2a+gemm``: the all-to-all dispatch), so the collective
is an all-gather or an all-to-all of M x K elements and the GEMM is rank r's M x N x K
(its N as the operation's ``shard`` gives it); here the GEMM reads rows already in place
and the collective moves the same bytes beside it, with no dependence (the study's C3).
The runs (phases on clocks of their own, as FiCCO's loss measurements):

- ``gemm``: the whole GEMM alone, one launch (the serial baseline's kernel);
- ``comm-cu``: the collective alone as the library's CU kernel (every shard whole to
  every peer at once, on ``cu_share`` of the CUs, at the library's share of each link);
- ``comm-dma``: the collective alone on the DMA engines (one per peer, as FiCCO's and the
  study's DMA collectives);
- ``c3-plain``, ``c3-prioritised``, ``c3-partitioned``: the GEMM and the CU collective
  together, the collective's blocks dispatched beside the running GEMM at the same
  priority, ahead of it, or on CUs masked for it (``devices.commands.DISPATCH``);
- ``c3-dma``: the GEMM and the DMA collective together.

The report takes, per pairing, the serial time (the GEMM alone plus the collective alone,
both from isolated runs), the ideal (the longer of the two) and the concurrent run, and
the fraction of the ideal speedup realised: (serial / concurrent - 1) / (serial / ideal -
1) (``emulator/app/report_c3.py``).
"""

from __future__ import annotations

from collectives.common import Problem
from collectives.ficco import ARBITRATION, _comm_phase, _launch_kernel, _untracked
from devices.commands import DISPATCH
from emulator.engine.addrmap import AddressMap
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.registry import Operation

ALONE = ("gemm", "comm-cu", "comm-dma")
TOGETHER = tuple(f"c3-{d}" for d in DISPATCH[::-1]) + ("c3-dma",)  # plain, prioritised,
# partitioned (the study's baseline first, then its two remedies), then DMA


def plan(p: Problem, op: Operation) -> Plan:
    """The C3 runs (module docstring), each phase isolated on a clock of its own."""
    slots = Slots()

    def gemm():
        space = _untracked(p, slots, "C", [(0, p.rows_here)])
        return _launch_kernel(p, space, [([(0, p.rows_here, 0, p.n)], 0, p.k)], "AG")[0]

    first = _comm_phase(p, op, slots, "comm-cu", True, "cu")
    phases = list(first.phases)
    phases += _comm_phase(p, op, slots, "comm-dma", True, "dma").phases
    kernel = gemm()
    cmap = AddressMap(kernel.space, p.rank, p.world, "store", kernel.local_writes(),
                      local_ok=True)
    phases.append(KernelPhase("gemm", kernel, [cmap], phases[0].stream, clock="gemm"))
    for d in DISPATCH[::-1]:
        phases += _comm_phase(p, op, slots, f"c3-{d}", True, "cu", gemm,
                              cu_dispatch=d).phases
    phases += _comm_phase(p, op, slots, "c3-dma", True, "dma", gemm).phases
    return Plan(first.layout, first.inputs, phases, slots, first.result, isolated=True,
                arbitration=ARBITRATION)
