"""Consumer-side fusion: an all-gather feeding a GEMM (T3: "the tracker can instead count
arrivals of an input region and release the WGs that need it").

Rank i holds rows chunk i of the input A (M x K) and its own B (K x N); the
consumer GEMM computes C = A @ B once all of A has been gathered into the
buffer AG. Fused form, only through the map over AG (one tile = up to
``wg_tile_m`` rows x all K columns):
- the rank's own rows are resident at time 0 (signalled to the tracker) and
  ``dma_map``-ped to the next ranks (ring: to i-1, forwarded hop by hop;
  direct: to every peer at once), as stores;
- every arriving input tile is tracked (after = 1) and, on a ring, DMA'd on
  unless this is its last stop;
- the GEMM's WGs walk the chunks in arrival order (own, i+1, i+2, ...) and each
  WG is released by the tracker when the input tiles it reads are in (on WG slots
  as they free: ``KernelRunner._time_stage``).

Flux's AG + GEMM (``flux.py``) is the direct form with two knobs: the
communication tile (``comm_rows``: rows per transfer and signal, whole GEMM
tiles; 0 = one GEMM tile) and the chunk order of the GEMM's WGs (``own_first``:
own rows first then ring order after the local rank, Flux's swizzle; else
chunk 0 first on every rank).
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from emulator.engine.addrmap import AddressMap
from emulator.engine.plan import Slots
from emulator.engine.kernel import Kernel


def comm_tiles(p: Problem, c: int, comm_rows: int) -> list[tuple[int, int, int, int]]:
    """Chunk ``c`` of the input in communication tiles of ``comm_rows`` rows rounded up to
    whole GEMM tiles (0: one GEMM tile each)."""
    r0, r1 = p.chunk(c)
    tm = p.tile_m
    step = max(tm, -(-comm_rows // tm) * tm) if comm_rows else tm
    return [(a, min(a + step, r1), 0, p.k) for a in range(r0, r1, step)]


def ag_gemm(p: Problem, slots: Slots, algorithm: str, comm_rows: int = 0,
            own_first: bool = True) -> tuple[Kernel, list[AddressMap],
                                             list[tuple[list[int], list[int]]]]:
    """The gated consumer GEMM, its maps (C's, then AG's) and the resident-input signals."""
    n, i = p.world, p.rank
    aspace = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
    own = aspace.tiles_in(p.chunk_region(i, p.k))
    writes = np.zeros(len(aspace), np.int64)
    writes[own] = 1
    amap = AddressMap(aspace, i, n, "store", writes, incoming_op="store")
    signal = {}  # input tile region -> the signal of its arrival (or residence)

    def mark(region, sig) -> None:
        for t in aspace.tiles_in(region):
            signal[aspace.region(t)] = sig

    for region in comm_tiles(p, i, comm_rows):
        if n > 1:
            mark(region, amap.dma_map(region, p.left if algorithm == "ring" else p.others,
                                      op="store", after=1))
        else:  # one rank: its own rows are the whole input; tracked so the gates see them
            mark(region, amap.track(region, after=1))
    for c in p.others:
        for region in comm_tiles(p, c, comm_rows):
            if algorithm == "ring" and c != p.left:
                mark(region, amap.dma_map(region, p.left, op="store", after=1))
            else:
                mark(region, amap.track(region, after=1))
    arrival = ([p.ring_at(s) for s in range(n)] if algorithm == "ring"  # from the right
               else [i] + p.others if own_first else list(range(n)))
    kernel, cmap = gated_gemm(p, slots, signal, arrival)
    return kernel, [cmap, amap], resident(p, aspace, own)


def gated_gemm(p: Problem, slots: Slots, signal: dict, chunks: list[int],
               plain: bool = False) -> tuple[Kernel, AddressMap]:
    """The consumer GEMM over AG, its WGs chunk by chunk in ``chunks`` order, each WG gated
    on the signals (``signal``: input tile region -> signal, or a tuple of them) of the
    input tiles it reads (T3: "the tracker ... releases the WGs that need it"; Flux: each
    thread block's prologue waits for its own input tiles), so the WGs of a stage whose
    rows are in start while the others wait (``Kernel.groups``). ``plain``: the
    GEMM's own tiles (the unfused GEMM's, which may span chunks: Flux's kernel is the
    unchanged GEMM), ordered by the last chunk their rows need; else tiles aligned to the
    chunks (T3's)."""
    if plain:
        cspace = p.space(slots, "C", [(0, p.m)], tile_n=p.kernel.tile_n)
        rank_of = {c: i for i, c in enumerate(chunks)}
        need = lambda t: max(rank_of[c] for c in range(p.world)  # noqa: E731
                             if _overlap(p.chunk(c), cspace.region(t)[:2]))
        order = sorted(range(len(cspace)), key=need)
    else:
        cspace = p.space(slots, "C", p.chunks)
        order = [t for c in chunks for t in cspace.tiles_in(p.chunk_region(c))]
    kernel = p.gemm(cspace, order, a="AG")
    inputs = sorted(signal)  # input tile regions (rows, all K)

    def read(r0: int, r1: int) -> list:
        """The input tiles rows r0..r1 read: the one of the same rows (chunk-aligned
        tiles), else every one they overlap."""
        key = (r0, r1, 0, p.k)
        return [key] if key in signal else [k for k in inputs if _overlap(k[:2], (r0, r1))]

    of_rows: dict[tuple[int, int], tuple] = {}  # a WG's rows -> the signals it waits on
    gates = {}
    for w, (r0, r1) in enumerate(np.asarray(kernel.wgs[:, :2]).tolist()):
        g = of_rows.get((r0, r1))
        if g is None:
            sigs = [x for key in read(r0, r1) for x in _signals(signal[key])]
            g = of_rows[(r0, r1)] = tuple({id(x): x for x in sigs}.values())
        if g:
            gates[w] = g
    kernel = kernel.with_gates(gates)
    cmap = AddressMap(cspace, p.rank, p.world, p.producer_op(), kernel.local_writes(),
                      local_ok=True)
    return kernel, cmap


def _overlap(a, b) -> bool:
    """Row ranges ``a`` and ``b`` share a row."""
    return a[0] < b[1] and b[0] < a[1]


def _signals(sig) -> tuple:
    return sig if isinstance(sig, tuple) else (sig,)


def resident(p: Problem, aspace, own: list[int]) -> list[tuple[list[int], list[int]]]:
    """The preload signals of the rank's own input tiles, resident before the GEMM."""
    return [([aspace.slot(t) for t in own],
             [int((aspace.tiles[t, 1] - aspace.tiles[t, 0]) * p.k) for t in own])]
