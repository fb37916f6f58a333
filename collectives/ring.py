"""Ring reduce-scatter and all-gather: T3's fused map and the CU-driven baselines.

Conventions (T3's example): N ranks in a ring, rank i sends to its left
neighbour i-1. The output (M x Ncols, row-major) is cut into N ring chunks of
rows (sizes differ by at most one row); rank i owns chunk i after the RS.
At RS step s (1..N) rank i handles chunk (i + s) mod N, so chunk i comes last.

Fused T3 RS (``t3_rs_map``), purely through the address-space map:
    stage 1 (chunk i+1)      remote_map -> rank i-1, update
    stages 2..N-1            local update, dma_map -> rank i-1, update, after=2
    stage N (chunk i)        local update, track(after=2): the reduced chunk
and the WG order walks the chunks in that staggered order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.tracker import TrackedRegion
from emulator.addrmap import AddressMap, tile_grid
from emulator.custeps import CuStep


def ring_chunks(rows: int, world: int) -> list[tuple[int, int]]:
    """Row ranges of the N ring chunks (the first rows % N chunks get one row more)."""
    base, extra = divmod(rows, world)
    bounds = [0]
    for c in range(world):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return [(bounds[c], bounds[c + 1]) for c in range(world)]


@dataclass(frozen=True)
class RingContext:
    rank: int
    world: int
    rows: int
    cols: int
    out: str = "C"  # the producer's output / RS buffer
    recv: str = "R"  # the baseline RS receive buffer

    @property
    def left(self) -> int:
        return (self.rank - 1) % self.world

    @property
    def right(self) -> int:
        return (self.rank + 1) % self.world

    def chunk(self, c: int) -> tuple[int, int]:
        return ring_chunks(self.rows, self.world)[c % self.world]

    def chunk_region(self, c: int) -> tuple[int, int, int, int]:
        r0, r1 = self.chunk(c)
        return (r0, r1, 0, self.cols)

    def chunk_elems(self, c: int) -> int:
        r0, r1 = self.chunk(c)
        return (r1 - r0) * self.cols


class ChunkSlots:
    """Tracker slots after the output tiles: RS receive, AG receive, AG credit."""

    def __init__(self, ntiles: int, world: int):
        self.ntiles, self.world = ntiles, world

    def rs(self, c: int) -> int:
        return self.ntiles + c

    def ag(self, c: int) -> int:
        return self.ntiles + self.world + c

    @property
    def ag_credit(self) -> int:
        return self.ntiles + 2 * self.world

    @property
    def total(self) -> int:
        return self.ntiles + 2 * self.world + 1

    def name(self, s: int) -> str:
        if s < self.ntiles:
            return f"tile {s}"
        s -= self.ntiles
        if s < self.world:
            return f"rs chunk {s}"
        s -= self.world
        return f"ag chunk {s}" if s < self.world else "ag credit"


def _region(name: str, slot: int, elems: int, label: str) -> TrackedRegion:
    return TrackedRegion(name, np.array([slot], np.int64), np.array([elems], np.int64), label)


# ------------------------------------------------------------------ fused (T3)

def t3_rs_map(ctx: RingContext, tile_m: int, tile_n: int) -> tuple[AddressMap, np.ndarray]:
    """T3's fused GEMM-RS: the map and the staggered WG order (tile ids)."""
    chunks = ring_chunks(ctx.rows, ctx.world)
    tiles = tile_grid(chunks, ctx.cols, tile_m, tile_n)
    amap = AddressMap(ctx.out, tiles, ctx.rank, ctx.world, producer_op="update")
    n, i = ctx.world, ctx.rank
    order = []
    for s in range(1, n + 1):
        c = (i + s) % n
        for t in amap.tiles_in(ctx.chunk_region(c)):
            region = tuple(int(x) for x in tiles[t])
            if s == n:
                amap.track(region, after=2 if n > 1 else 1)
            elif s == 1:
                amap.remote_map(region, ctx.left, op="update")
            else:
                amap.dma_map(region, ctx.left, op="update", after=2)
            order.append(t)
    return amap, np.array(order, np.int64)


# ------------------------------------------------------------------ CU-driven baselines

def sequential_rs_steps(ctx: RingContext, slots: ChunkSlots, elem_bytes: int) -> list[CuStep]:
    """Baseline ring RS kernel: each step reads the local and the received copy,
    adds, and writes the sum to the left neighbour's receive buffer."""
    n, i = ctx.world, ctx.rank
    steps = []
    for s in range(1, n + 1):
        c = (i + s) % n
        reg = ctx.chunk_region(c)
        e = ctx.chunk_elems(c)
        wait = None if s == 1 else _region(f"rs recv chunk {c}", slots.rs(c), e, "from the right")
        inputs = [(ctx.out, reg)] if s == 1 else [(ctx.out, reg), (ctx.recv, reg)]
        if s < n:
            steps.append(CuStep(f"rs step {s} (chunk {c})", "rs", inputs, (ctx.recv, reg), ctx.left,
                                wait, e * elem_bytes if wait else 0, [slots.rs(c)], [e]))
        elif n > 1:
            steps.append(CuStep(f"rs final (chunk {c})", "rs", inputs, (ctx.out, reg), i,
                                wait, e * elem_bytes))
    return steps


def ag_steps(ctx: RingContext, slots: ChunkSlots, elem_bytes: int) -> list[CuStep]:
    """Ring all-gather kernel: forward each chunk to the left neighbour's output.

    Step 1 first waits for the left neighbour's credit (it has finished its RS,
    so its output may be overwritten), as a ring kernel's ready flag would."""
    n, i = ctx.world, ctx.rank
    steps = []
    if n == 1:
        return steps
    credit = _region("ag credit", slots.ag_credit, 1, "left neighbour finished its RS")
    for s in range(1, n):
        c = (i + s - 1) % n
        e = ctx.chunk_elems(c)
        wait = credit if s == 1 else _region(f"ag recv chunk {c}", slots.ag(c), e, "from the right")
        steps.append(CuStep(f"ag step {s} (chunk {c})", "ag", [(ctx.out, ctx.chunk_region(c))],
                            (ctx.out, ctx.chunk_region(c)), ctx.left, wait,
                            0 if s == 1 else e * elem_bytes, [slots.ag(c)], [e]))
    c = (i - 1) % n
    e = ctx.chunk_elems(c)
    steps.append(CuStep(f"ag final (chunk {c})", "ag", [], None, i,
                        _region(f"ag recv chunk {c}", slots.ag(c), e, "from the right"),
                        e * elem_bytes))
    return steps
