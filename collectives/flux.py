"""Flux (REFERENCE.md section 2): communication fused into the GEMM's epilogue, on a
fully connected or switched topology (the ``direct`` algorithm), as configurations
of the same mechanism as T3's.

GEMM + reduce-scatter, rank r owning rows chunk r:
- ``flux-rs-w`` (Flux's usual path): each WG stores its tile into the owner's slot
  buffer X, viewed as [N, m/N, n], at block r (its own rows locally): an
  all-to-all of the partial output (``direct.slot_writes``); the owner's
  reduction kernel waits for the N - 1 peers' blocks (the flag barrier) and
  sums the N blocks into its chunk of C (memory-bound: reads N (m/N) n, writes
  (m/N) n elements).
- ``flux-rs-a``: each WG reduces its tile straight into the owner's pre-zeroed
  chunk of C with atomic updates (``red.global.add``); the owner's chunk is
  complete when all N ranks' WGs have landed; no reduction kernel. The update's
  cost is the device's ``nmc_update_cost`` (an atomic read-modify-write).
- Tile swizzle (Flux's A100 form): the tile order is rotated by rank, own chunk
  first, then r + 1, r + 2, ...: at any moment each destination has one writer.
  The ``-noswizzle`` variants walk the chunks 0, 1, ... on every rank, so all
  ranks write the same destination at once (contended at its port and memory).

AllGather + GEMM, fused in the GEMM's prologue (``consumer.ag_gemm``, direct):
rank r's input rows are resident and pushed by the copy engine (DMA) to every
peer in communication tiles, each transfer followed by its signal; each GEMM
WG waits on the signals covering its rows, then runs the unchanged GEMM.
- ``flux-ag``: communication tile m/N rows (one per chunk), WGs own rows
  first, then ring order after the local rank (Flux's NVSwitch order);
- ``flux-ag-tile2``, ``flux-ag-tile4``: communication tiles halved once and
  twice (Flux tunes it from m/N down to the GEMM tile height);
- ``flux-ag-noswizzle``: WGs walk the chunks 0, 1, ... on every rank.

The HBM is shared by plain FR-FCFS-like arbitration (``fr-fcfs``): the copy and
store traffic of a stock GPU has no T3-style memory-controller policy.
"""

from __future__ import annotations

import numpy as np

from collectives import consumer, direct
from collectives.common import Problem
from emulator.engine.addrmap import AddressMap
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation
from emulator.engine.steps import CuStep

ARBITRATION = "fr-fcfs"


def flux_order(p: Problem, space, swizzle: bool) -> list[int]:
    """WG tiles chunk by chunk: rotated by rank (own chunk first) with ``swizzle``, else
    chunk 0 first on every rank."""
    chunks = ([(p.rank + s) % p.world for s in range(p.world)] if swizzle
              else list(range(p.world)))
    return [t for c in chunks for t in space.tiles_in(p.chunk_region(c))]


def rs_atomic(p: Problem, op: Operation, algorithm: str, swizzle: bool = True) -> Plan:
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    job, amap = direct.rs_map(p, slots, lambda s: flux_order(p, s, swizzle))
    phases = [KernelPhase("gemm+rs-a", job, [amap], op.parts.stream, fused=True)]
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def rs_write(p: Problem, op: Operation, algorithm: str, swizzle: bool = True) -> Plan:
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    layout = layout + [("X", (p.world * p.max_chunk, p.n), p.dtype)]
    job, maps, arrived = direct.slot_writes(p, slots, lambda s: flux_order(p, s, swizzle))
    blocks = [("X", p.slot_region(s, p.rank)) for s in range(p.world)]
    reduce = CuStep("rs-w reduce", op.parts.stream, blocks, ("C", p.chunk_region(p.rank)),
                    p.rank)
    phases = [KernelPhase("gemm+rs-w", job, maps, op.parts.stream, fused=True),
              StepsPhase("reduce", [reduce], waits=tuple(arrived))]
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def rs_atomic_unswizzled(p: Problem, op: Operation, algorithm: str) -> Plan:
    return rs_atomic(p, op, algorithm, swizzle=False)


def rs_write_unswizzled(p: Problem, op: Operation, algorithm: str) -> Plan:
    return rs_write(p, op, algorithm, swizzle=False)


def ag_gemm(p: Problem, op: Operation, algorithm: str, halvings: int = 0,
            swizzle: bool = True) -> Plan:
    """Flux's AG + GEMM: communication tiles of ceil(m/N / 2^halvings) rows."""
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    rows = -(-p.max_chunk // (1 << halvings))
    kernel, maps, preload = consumer.ag_gemm(p, slots, algorithm, comm_rows=rows,
                                             own_first=swizzle)
    phases = [KernelPhase("ag+gemm", kernel, maps, op.parts.stream, fused=True,
                          preload=preload)]
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def ag_gemm_tile2(p: Problem, op: Operation, algorithm: str) -> Plan:
    return ag_gemm(p, op, algorithm, halvings=1)


def ag_gemm_tile4(p: Problem, op: Operation, algorithm: str) -> Plan:
    return ag_gemm(p, op, algorithm, halvings=2)


def ag_gemm_unswizzled(p: Problem, op: Operation, algorithm: str) -> Plan:
    return ag_gemm(p, op, algorithm, swizzle=False)


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
    cspace = p.space(slots, "C", p.chunks)
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
    cspace = p.space(slots, "C", p.chunks)
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
