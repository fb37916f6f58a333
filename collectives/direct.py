"""Direct algorithms (fully connected or switched topologies): every rank talks to every
owner at once.

Fused RS (``rs_map``): each stage's output is sliced by owner and every slice
is remote-mapped to its owner as updates, reduced at the destination by
near-memory compute; the owner tracks its chunk until all N ranks' WGs have
landed (after = N x S). The collective makes no memory reads of its own.
Fused AG (``ag_map``): the producer's chunk is stored locally and
remote-mapped (stores) to every peer, which tracks it (after = S).
Fused all-to-all (``a2a_map``): chunk j of the producer's output is
remote-mapped into rank j's receive buffer X (block i); nothing is written
locally except through the map; receivers track every peer's block.
WG order is swizzled: the tiles of the N chunks are dealt round-robin (rank i
starting with chunk i+1, its own last), so every GEMM stage sends about 1/N of
its tiles to each peer and all N-1 links (or the switch port) stream at once;
a stage's remote stores leave through a bounded store queue
(``Problem.store_queue``) instead of holding the stage's WGs until the last
byte has left. (With each stage's tiles all bound for one peer, one link of
N-1 was busy while the stage waited for it: fused direct RS and A2A on a full
mesh of 8 were slower than the sequential baseline.)
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from emulator.engine.addrmap import AddressMap, TileSpace, tile_grid
from emulator.engine.steps import CuStep
from emulator.engine.plan import Slots
from emulator.engine.kernel import Kernel


def _swizzled(p: Problem, space: TileSpace) -> list[int]:
    """Tiles dealt round-robin over the destinations (rank+1, rank+2, ..., the own chunk
    last): every stage sends about the same bytes to every peer, so all the links work
    at once instead of one link per stage."""
    lists = [space.tiles_in(p.chunk_region(c)) for c in p.others + [p.rank]]
    longest = max(len(x) for x in lists)
    return [x[j] for j in range(longest) for x in lists if j < len(x)]


def rs_map(p: Problem, slots: Slots, order=None) -> tuple[Kernel, AddressMap]:
    """Fused direct RS; the GEMM's WGs in ``order(space)`` (default: dealt round-robin
    over the owners)."""
    space = p.space(slots, "C", p.chunks)
    job = p.gemm(space, (order or (lambda s: _swizzled(p, s)))(space),
                 store_queue=p.store_queue(p.world - 1))
    amap = AddressMap(space, p.rank, p.world, "update", job.local_writes())
    for c in p.others:
        amap.remote_map(p.chunk_region(c), c, op="update")
    amap.track(p.chunk_region(p.rank), after=p.split * p.world)
    return job, amap


def ag_map(p: Problem, slots: Slots) -> tuple[Kernel, AddressMap]:
    space = p.space(slots, "C", p.chunks)
    job = p.gemm(space, space.tiles_in(p.chunk_region(p.rank)), store_queue=p.store_queue(p.world - 1))
    op = p.producer_op()
    amap = AddressMap(space, p.rank, p.world, op, job.local_writes(), incoming_op=op)
    if p.world > 1:
        amap.remote_map(p.chunk_region(p.rank), p.others, op=op, keep_local=True)
    else:
        amap.local(p.chunk_region(p.rank))
    for c in p.others:
        amap.track(p.chunk_region(c), after=p.split)
    return job, amap


def x_space(p: Problem, base: int, owner: int, blocks: int | None = None) -> TileSpace:
    """Rank ``owner``'s receive buffer X: one block of its chunk's rows per sender (or per
    one of ``blocks`` senders)."""
    rows = [p.slot_region(s, owner)[:2] for s in range(p.world if blocks is None else blocks)]
    return TileSpace("X", tile_grid(rows, p.n, p.tile_m, p.tile_n,
                                    p.spec.wg_raster_group), base)


def a2a_map(p: Problem, slots: Slots) -> tuple[Kernel, list[AddressMap]]:
    job, maps, _ = slot_writes(p, slots, lambda space: _swizzled(p, space))
    return job, maps


def slot_writes(p: Problem, slots: Slots, order) -> tuple[Kernel, list[AddressMap], list]:
    """The GEMM (WGs in ``order(space)``) stores chunk j of its output into rank j's
    receive buffer X, block i (its own block locally): an all-to-all of the output, or
    Flux's RS-W before the owner's reduction. Returns the kernel, its maps and the
    signals of the peers' blocks arriving here."""
    space = p.space(slots, "C", p.chunks)
    xbase = slots.alloc("X tile", len(x_space(p, 0, 0)))  # chunk 0 is the largest
    job = p.gemm(space, order(space), store_queue=p.store_queue(p.world - 1))
    op = p.producer_op()
    amap = AddressMap(space, p.rank, p.world, op, job.local_writes())
    for c in p.others + [p.rank]:
        amap.remote_map(p.chunk_region(c), c, op=op, to=x_space(p, xbase, c),
                        to_region=p.slot_region(p.rank, c))
    mine = x_space(p, xbase, p.rank)
    xmap = AddressMap(mine, p.rank, p.world, op, np.zeros(len(mine), np.int64), incoming_op=op)
    arrived = [xmap.track(p.slot_region(s, p.rank), after=p.split) for s in p.others]
    xmap.local(p.slot_region(p.rank, p.rank))  # its own block: written by its own GEMM
    return job, [amap, xmap], arrived


# ------------------------------------------------------------------ CU-driven kernels


def _gather_wait(p: Problem, slots: Slots, base: int, name: str, elems_of) -> tuple:
    senders = p.others
    el = [elems_of(s) for s in senders]
    region = slots.region(name, [base + s for s in senders], el, "from every peer")
    return region, sum(el) * p.dtype.itemsize


def rs_steps(p: Problem, slots: Slots, nmc: bool = False) -> list[CuStep]:
    """Direct RS kernel. Baseline: send chunk c to its owner's receive buffer R (block i);
    the owner reads all N copies, adds, writes. With ``nmc``: send chunk c as an update
    into the owner's C; near-memory compute reduces it there."""
    if p.world == 1:
        return []
    i = p.rank
    base = slots.alloc("rs recv from", p.world)
    steps = []
    for j, c in enumerate(p.others):
        el = p.chunk_elems(c)
        out = ("C", p.chunk_region(c)) if nmc else ("R", p.slot_region(i, c))
        steps.append(CuStep(f"rs send chunk {c}", "rs", [("C", p.chunk_region(c))], out, c,
                            signal_slots=[base + i], signal_elems=[el],
                            op="update" if nmc else "store", concurrent=j > 0))
    wait, nbytes = _gather_wait(p, slots, base, f"rs chunk {i} copies",
                                lambda s: p.chunk_elems(i))
    if nmc:
        steps.append(CuStep("rs final", "rs", [], None, i, wait, nbytes, "update",
                            writers=len(p.others)))
    else:
        inputs = [("C", p.chunk_region(i))] + [("R", p.slot_region(s, i)) for s in p.others]
        steps.append(CuStep("rs final", "rs", inputs, ("C", p.chunk_region(i)), i, wait,
                            nbytes, writers=len(p.others)))
    return steps


def ag_steps(p: Problem, slots: Slots, buffer: str = "C", cols: int | None = None,
             stream: str = "ag") -> list[CuStep]:
    """Direct AG kernel: send the own chunk to every peer at once; wait for theirs."""
    if p.world == 1:
        return []
    i = p.rank
    cols = p.n if cols is None else cols
    r0, r1 = p.chunk(i)
    reg = (r0, r1, 0, cols)
    base = slots.alloc(f"{stream} recv from", p.world)
    steps = [CuStep(f"{stream} send to {c}", stream, [(buffer, reg)], (buffer, reg), c,
                    signal_slots=[base + i], signal_elems=[(r1 - r0) * cols],
                    concurrent=j > 0) for j, c in enumerate(p.others)]

    def elems(s: int) -> int:
        a, b = p.chunk(s)
        return (b - a) * cols

    wait, nbytes = _gather_wait(p, slots, base, f"{stream} chunks", elems)
    steps.append(CuStep(f"{stream} final", stream, [], None, i, wait, nbytes,
                         writers=len(p.others)))
    return steps


def a2a_steps(p: Problem, slots: Slots) -> list[CuStep]:
    """All-to-all kernel: chunk c of C goes to rank c's X (block i); own chunk copied."""
    i = p.rank
    base = slots.alloc("a2a recv from", p.world)
    steps = []
    for j, c in enumerate(p.others + [i]):
        steps.append(CuStep(f"a2a send chunk {c}", "a2a", [("C", p.chunk_region(c))],
                            ("X", p.slot_region(i, c)), c,
                            signal_slots=[base + i] if c != i else [],
                            signal_elems=[p.chunk_elems(c)] if c != i else [],
                            concurrent=j > 0))
    if p.world > 1:
        wait, nbytes = _gather_wait(p, slots, base, "a2a blocks", lambda s: p.chunk_elems(i))
        steps.append(CuStep("a2a final", "a2a", [], None, i, wait, nbytes,
                            writers=len(p.others)))
    return steps
