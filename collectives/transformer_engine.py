"""The medium-grained overlap Flux compares against (TransformerEngine with userbuffers):
the operator split into N chunk GEMMs, each its own kernel launch, pipelined with P2P
chunk transfers on a ring (Flux, "Baselines")."""

from __future__ import annotations

import numpy as np

from collectives import consumer
from collectives.common import Problem
from collectives.flux_rs import ARBITRATION
from emulator.engine.addrmap import AddressMap
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation
from emulator.engine.steps import CuStep


def te_ag_gemm(p: Problem, op: Operation, algorithm: str) -> Plan:
    """Flux's medium-grained baseline for AG + GEMM (TransformerEngine with userbuffers):
    N chunk GEMMs, each its own kernel launch, pipelined with P2P chunk transfers on a
    ring. Step s computes the chunk ``ring_at(s)`` (its own rows first) while the copy
    engine forwards that chunk to the left neighbour; step s waits for its chunk's
    arrival from the right, and a step ends when both its GEMM and its transfer have."""
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    n, i = p.world, p.rank
    aspace = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
    cspace = p.space(slots, "C", p.chunks, tile_n=p.spec.wg_tile_n)  # chunk GEMMs: own tiles
    own = aspace.tiles_in(p.chunk_region(i, p.k))
    phases = []
    for s in range(n):
        c = p.ring_at(s)
        region = p.chunk_region(c, p.k)
        writes = np.zeros(len(aspace), np.int64)
        if s == 0:
            writes[own] = 1  # resident: written before the operation
        amap = AddressMap(aspace, i, n, "store", writes, incoming_op="store", local_ok=True)
        arrived = (amap.dma_map(region, p.left, op="store", after=1) if s < n - 1
                   else amap.track(region, after=1))
        kernel = p.gemm(cspace, cspace.tiles_in(p.chunk_region(c)), a="AG")
        cmap = AddressMap(cspace, i, n, p.producer_op(), kernel.local_writes(), local_ok=True)
        preload = consumer.resident(p, aspace, own) if s == 0 else []
        phases.append(KernelPhase(f"step {s}", kernel, [cmap, amap], op.parts.stream,
                                  fused=True, preload=preload,
                                  waits=(arrived,) if s > 0 else ()))
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def te_gemm_rs(p: Problem, op: Operation, algorithm: str) -> Plan:
    """Flux's medium-grained baseline for GEMM + RS (TransformerEngine): N chunk GEMMs on
    a ring, each its own kernel launch; step s computes the partial of chunk
    ``ring_at(s + 1)``, adds the partial of the same chunk received from the right and
    sends the sum to the left (the last step keeps its own chunk): each step's add
    needs the previous step's send, so the steps serialise."""
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm, recv_buffer=True)
    n, i = p.world, p.rank
    cspace = p.space(slots, "C", p.chunks, tile_n=p.spec.wg_tile_n)  # chunk GEMMs: own tiles
    base = slots.alloc("te rs partial", n)  # one slot per chunk: its partial from the right
    phases: list = []
    for s in range(n):
        c = p.ring_at(s + 1)
        region = p.chunk_region(c)
        kernel = p.gemm(cspace, cspace.tiles_in(region))
        cmap = AddressMap(cspace, i, n, p.producer_op(), kernel.local_writes(), local_ok=True)
        phases.append(KernelPhase(f"gemm {s}", kernel, [cmap], op.parts.stream))
        parts = [("C", region)]
        wait, nbytes = None, 0
        if s > 0:  # the right neighbour's partial of this chunk
            parts.append(("R", region))
            wait = slots.region(f"te rs chunk {c} partial", [base + c], [p.chunk_elems(c)],
                                "from the right neighbour")
            nbytes = p.chunk_elems(c) * p.dtype.itemsize
        last = s == n - 1
        if last and s == 0:  # one rank: its GEMM's chunk is the result
            break
        step = CuStep(f"{'keep' if last else 'send'} chunk {c}", op.parts.stream, parts,
                      ("C", region) if last else ("R", region), i if last else p.left,
                      wait, nbytes, signal_slots=[] if last else [base + c],
                      signal_elems=[] if last else [p.chunk_elems(c)])
        phases.append(StepsPhase(f"rs {s}", [step]))
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)
