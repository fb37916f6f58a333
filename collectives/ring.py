"""Ring algorithms: each rank sends to its left neighbour (T3's example: i -> i-1).

The output (M x Ncols) is cut into N chunks of rows; rank i owns chunk i after
a reduce-scatter. At RS step s (1..N) rank i handles the chunk of the rank s
places after it on the ring (``p.ring_at(s)``; (i + s) mod N on a ring in rank
order), so its own chunk comes last.

Fused RS (``rs_map``, T3 track & trigger), purely through the address-space map
(S = WGs per tile, 1 unless split-K):
    stage 1 (chunk i+1)      remote_map -> rank i-1, update
    stages 2..N-1            local update, dma_map -> rank i-1, update,
                             after = S + S (stage 2: the right neighbour's
                             stage-1 WGs) or S + 1 (later: one DMA)
    stage N (chunk i)        local update, track(after = S + 1, or 2S if N = 2)
Fused AG (``ag_map``): the producer's own chunk is stored locally and
remote-mapped to i-1; a chunk arriving from i+1 is DMA'd on to i-1 once it
has landed (after = S from the producer's WGs, 1 from a DMA), except chunk
i-1, whose last stop this is (track).
"""

from __future__ import annotations

from collectives.common import Problem
from emulator.engine.addrmap import AddressMap
from emulator.engine.steps import CuStep
from emulator.engine.plan import Slots
from emulator.engine.kernel import Kernel

# ------------------------------------------------------------------ fused


def rs_map(p: Problem, slots: Slots) -> tuple[Kernel, AddressMap]:
    """T3's fused GEMM-RS: the staggered producer and its map."""
    space = p.space(slots, "C", p.chunks)
    n, i, s_ = p.world, p.rank, p.split
    steps = [(s, p.ring_at(s)) for s in range(1, n + 1)]
    order = [t for _, c in steps for t in space.tiles_in(p.chunk_region(c))]
    job = p.gemm(space, order, store_queue=p.store_queue(1))  # stage 1 stores to one peer
    amap = AddressMap(space, i, n, "update", job.local_writes())
    for s, c in steps:
        incoming = s_ if s == 2 else 1
        for t in space.tiles_in(p.chunk_region(c)):
            region = space.region(t)
            if n == 1:
                amap.track(region, after=s_)
            elif s == n:
                amap.track(region, after=s_ + incoming)
            elif s == 1:
                amap.remote_map(region, p.left, op="update")
            else:
                amap.dma_map(region, p.left, op="update", after=s_ + incoming)
    return job, amap


def ag_map(p: Problem, slots: Slots) -> tuple[Kernel, AddressMap]:
    """Fused GEMM-AG on a ring: stores instead of updates."""
    space = p.space(slots, "C", p.chunks)
    n, i = p.world, p.rank
    job = p.gemm(space, space.tiles_in(p.chunk_region(i)))
    op = p.producer_op()
    amap = AddressMap(space, i, n, op, job.local_writes(), incoming_op=op)
    if n == 1:
        amap.local(p.chunk_region(i))
        return job, amap
    amap.remote_map(p.chunk_region(i), p.left, op=op, keep_local=True)
    for c in p.others:
        after = p.split if c == p.right else 1
        for t in space.tiles_in(p.chunk_region(c)):
            if c == p.left:
                amap.track(space.region(t), after=after)
            else:
                amap.dma_map(space.region(t), p.left, op=op, after=after)
    return job, amap


# ------------------------------------------------------------------ CU-driven kernels


def rs_steps(p: Problem, slots: Slots, nmc: bool = False) -> list[CuStep]:
    """Ring RS kernel. Baseline: each step reads the local and the received copy, adds,
    and writes the sum into the left neighbour's receive buffer R. With ``nmc`` (the
    isolated RS of Ideal-RS+NMC): each step reads one copy and sends it as an update
    into the neighbour's C, where near-memory compute adds it."""
    n, i = p.world, p.rank
    base = slots.alloc("rs recv chunk", n)
    steps = []
    for s in range(1, n + 1):
        c = p.ring_at(s)
        reg = p.chunk_region(c)
        el = p.chunk_elems(c)
        wait = None if s == 1 else slots.region(f"rs recv chunk {c}", [base + c], [el],
                                                "from the right")
        nbytes = el * p.dtype.itemsize if wait else 0
        wait_op = "update" if nmc else "store"
        if nmc:
            inputs, out = [("C", reg)], ("C", reg)
        else:
            inputs = [("C", reg)] if s == 1 else [("C", reg), ("R", reg)]
            out = ("R", reg)
        if s < n:
            steps.append(CuStep(f"rs step {s} (chunk {c})", "rs", inputs, out, p.left, wait,
                                nbytes, wait_op, [base + c], [el],
                                op="update" if nmc else "store"))
        elif n > 1:
            if nmc:
                steps.append(CuStep(f"rs final (chunk {c})", "rs", [], None, i, wait, nbytes,
                                    wait_op))
            else:
                steps.append(CuStep(f"rs final (chunk {c})", "rs", inputs, ("C", reg), i,
                                    wait, nbytes))
    return steps


def ag_steps(p: Problem, slots: Slots, buffer: str = "C", cols: int | None = None,
             stream: str = "ag") -> list[CuStep]:
    """Ring AG kernel: forward each chunk to the left neighbour's ``buffer``."""
    n, i = p.world, p.rank
    if n == 1:
        return []
    base = slots.alloc(f"{stream} recv chunk", n)
    cols = p.n if cols is None else cols
    steps = []

    def recv(c: int):
        r0, r1 = p.chunk(c)
        el = (r1 - r0) * cols
        return slots.region(f"{stream} recv chunk {c}", [base + c], [el], "from the right"), el

    for s in range(1, n):
        c = p.ring_at(s - 1)
        r0, r1 = p.chunk(c)
        el = (r1 - r0) * cols
        wait, nbytes = (None, 0) if s == 1 else (recv(c)[0], el * p.dtype.itemsize)
        reg = (r0, r1, 0, cols)
        steps.append(CuStep(f"{stream} step {s} (chunk {c})", stream, [(buffer, reg)],
                            (buffer, reg), p.left, wait, nbytes, "store", [base + c], [el]))
    c = p.left
    region, el = recv(c)
    steps.append(CuStep(f"{stream} final (chunk {c})", stream, [], None, i, region,
                        el * p.dtype.itemsize))
    return steps
