"""The fused computation-collective operators' GEMV + all-reduce and GEMM + all-to-all
(Punniyamurthy et al., SC 2024), as persistent kernels; the embedding operator is in
``embedding.py``.

- GEMV + all-reduce (decode): y = sum over ranks of W_r x_r (``--m`` output rows,
  ``--n`` right-hand sides, ``--k`` this rank's slice of the input). A persistent GEMV
  whose physical WG i computes the same tiles on every GPU (tile t on WG t mod P).
  Two-phase direct all-reduce on a full mesh: each rank owns a row chunk of y; a WG
  first computes its tiles owned by peers (owners in staggered order) and stores them
  straight into the owner's slot buffer X (block = source), then its own tiles (into
  its own block). Then the same grid goes on (no new launch) to reduce its own tiles:
  it waits for one ready flag per (physical WG, peer) (the counterpart WG's tiles for
  this owner have all landed), sums the W blocks on the CUs and stores the reduced tile
  into every rank's output Y. The WGs poll the peers' reduced tiles at exit. The second
  task list starts when the whole grid has finished the first (a grid-wide barrier:
  the phase boundary).
- GEMM + all-to-all (MoE combine, one expert per GPU, top-2 routing with equal load):
  this rank's expert output rows go back to the GPUs that own their tokens, chunk c of
  the rows to rank c. A persistent GEMM whose WGs store each output tile straight into
  the owner's receive buffer X (peers' tiles first, interleaved over the peers), polling
  the peers' blocks at exit.
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from collectives.persistent import grid, remote_first, rounds, staggered
from devices.regions import shift_rows, tile_grid
from devices.signals import TrackedRegion
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.kernel import Kernel, make_wgs
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.producers import Elementwise, Gemv, Source, TiledGemm
from emulator.model import params



def across_nodes_refusal(spec, ranks: int, op: str) -> str:
    """Why the fused ``op`` (GEMV + AR, GEMM + A2A) cannot run a job of ``ranks`` GPUs ("" :
    it can): its WGs store their tiles straight into the peers' memory over the node's
    links (zero-copy), which no GPU can do to a GPU on another node; the design puts
    through the NIC only from its embedding kernel (the last WG of a slice)."""
    per_node = spec.interconnect.gpus_on_node(ranks)
    if ranks <= per_node:
        return ""
    return (f"the fused {op} operator's WGs store their tiles into peers' memory over the "
            f"node's links, which no GPU can issue to another node (only the fused "
            f"embedding puts through the NIC); {ranks} GPUs span "
            f"{-(-ranks // per_node)} nodes of {per_node}")


def gemv_tiles(p: Problem, blocks) -> np.ndarray:
    return tile_grid(list(blocks), p.n, int(params.value("gemv_rows")), p.n)


def plain_gemv(p: Problem, slots: Slots) -> tuple[Kernel, AddressMap]:
    """The baseline's GEMV: an ordinary kernel over C's row tiles, as many WGs at once as
    the CUs hold of a light kernel."""
    tiles = gemv_tiles(p, [(0, p.m)])
    space = TileSpace("C", tiles, slots.alloc("C tile", len(tiles)))
    wgs, wg_tile = make_wgs(space, range(len(space)), p.k, 1)
    kernel = Kernel(Gemv("A", "B"), space, wgs, wg_tile, np.arange(len(wgs)),
                    p.spec.max_resident_wgs)
    return kernel, AddressMap(space, p.rank, p.world, "store", kernel.local_writes(),
                              local_ok=True)


def _slot_space(p: Problem, base: int, owner: int) -> TileSpace:
    """Owner's slot buffer X: one block of its chunk's rows per source rank."""
    r0, r1 = p.chunk(owner)
    blocks = [(s * p.max_chunk, s * p.max_chunk + r1 - r0) for s in range(p.world)]
    return TileSpace("X", gemv_tiles(p, blocks), base)


def gemv_ar(p: Problem) -> Plan:
    slots, W, r = Slots(), p.world, p.rank
    tiles = gemv_tiles(p, p.chunks)
    yspace = TileSpace("C", tiles, slots.alloc("C tile", len(tiles)))
    xbase = slots.alloc("X tile", len(_slot_space(p, 0, 0)))  # chunk 0 is the largest
    P = grid(p)
    n_tiles = len(yspace)
    owner = p.owners(yspace.tiles[:, 0])
    # WG i: tiles t = i, i + P, ... (the same on every GPU), peers' tiles first
    lists = [sorted(range(i, n_tiles, P), key=lambda t: (staggered(p, owner[t]), t))
             for i in range(min(P, n_tiles))]
    order = rounds(lists)
    wgs, wg_tile = make_wgs(yspace, order, p.k, 1)
    gemv = Kernel(Gemv("A", "B"), yspace, wgs, wg_tile, np.arange(len(wgs)), P,
                  persistent=True, fair_share=True, store_queue=p.store_queue(W - 1))
    ymap = AddressMap(yspace, r, W, "store", np.ones(n_tiles, np.int64))
    for c in range(W):
        ymap.remote_map(p.chunk_region(c), c, op="store", to=_slot_space(p, xbase, c),
                        to_region=p.slot_region(r, c))
    # phase 2: the same grid reduces this rank's own tiles, each after the flags of the
    # WG that computed it (t mod P on every GPU)
    xmine = _slot_space(p, xbase, r)
    xmap = AddressMap(xmine, r, W, "store", np.zeros(len(xmine), np.int64),
                      incoming_op="store", local_ok=True)
    for s in p.others:  # the peers' blocks land here (their landing is modelled)
        xmap.track(p.slot_region(s, r))
    r0 = p.chunk(r)[0]
    zspace = TileSpace("Y", yspace.tiles, slots.alloc("Y tile", n_tiles))
    mine = [t for t in range(n_tiles) if owner[t] == r]
    flags = {}  # (WG, peer) -> the X tiles that WG's counterpart stores here
    for i in {t % P for t in mine}:
        ts = [t for t in mine if t % P == i]
        for s in p.others:
            xt = [xmine.tile_at(shift_rows(yspace.region(t), s * p.max_chunk - r0)) for t in ts]
            if xt:
                flags[(i, s)] = TrackedRegion(
                    f"X flag WG {i} from {s}", np.array([xmine.slot(x) for x in xt]),
                    np.array([xmine.elems(x) for x in xt]), f"WG {i}'s tiles from rank {s}",
                    {"after": 1})
    by_wg: dict[int, list[int]] = {}
    for t in mine:
        by_wg.setdefault(t % P, []).append(t)
    red_lists = sorted(by_wg.values(), key=len, reverse=True)
    red_order = rounds(red_lists)
    items = np.column_stack([zspace.tiles[red_order], np.zeros((len(red_order), 2), np.int64)])
    items[:, 5] = 1
    sources = tuple(Source("X", s * p.max_chunk - r0) for s in range(W))
    gates = {j: tuple(flags[(t % P, s)] for s in p.others if (t % P, s) in flags)
             for j, t in enumerate(red_order)}
    zmap = AddressMap(zspace, r, W, "store", np.bincount(np.array(red_order, np.int64),
                                                         minlength=n_tiles))
    if W > 1:
        zmap.remote_map(p.chunk_region(r), p.others, op="store", keep_local=True)
    else:
        zmap.local(p.chunk_region(r))
    done = tuple(zmap.track(p.chunk_region(c)) for c in p.others)
    reduce = Kernel(Elementwise((sources,)), zspace, items, np.array(red_order, np.int64),
                    np.arange(len(items)), P, gates={j: g for j, g in gates.items() if g},
                    persistent=True, exit_waits=done, fair_share=True)
    layout = [("B", (p.k, p.n), p.dtype), ("C", (p.m, p.n), p.dtype), ("A", (p.m, p.k), p.dtype),
              ("X", (W * p.max_chunk, p.n), p.dtype), ("Y", (p.m, p.n), p.dtype)]
    return Plan(layout, {"B": ("B", 0), "A": ("A", 0)},
                [KernelPhase("gemv", gemv, [ymap], "rs", fused=True),
                 KernelPhase("reduce+store", reduce, [zmap, xmap], "ag", fused=True,
                             launch=False)],
                slots, [("Y", (0, p.m, 0, p.n))])



def gemm_a2a(p: Problem) -> Plan:
    """MoE combine: a persistent GEMM storing every output tile straight into the owner's
    X block (peers' tiles first, interleaved over the peers), polling the peers' blocks at
    exit."""
    from collectives.direct import x_space
    from collectives.operations import ALL_TO_ALL

    slots, r = Slots(), p.rank
    space = p.space(slots, "C", p.chunks)
    xbase = slots.alloc("X tile", len(x_space(p, 0, 0)))  # chunk 0 is the largest
    mine = x_space(p, xbase, r)
    op = p.producer_op()
    xmap = AddressMap(mine, r, p.world, op, np.zeros(len(mine), np.int64), incoming_op=op,
                      local_ok=True)
    arrived = tuple(xmap.track(p.slot_region(s, r), after=p.split) for s in p.others)
    owner = p.owners(space.tiles[:, 0])
    first = np.searchsorted(owner, owner)  # each owner's first tile (tiles are by chunk)
    order = remote_first(p, owner, np.arange(len(space)) - first)
    wgs, wg_tile = make_wgs(space, order, p.k, p.split)
    # a persistent kernel's WGs each own their tiles: the chosen tile without split-K
    kernel = Kernel(TiledGemm("A", "B", False, p.kernel.data_parallel()), space, wgs, wg_tile,
                    np.arange(len(wgs)),
                    grid(p, per_cu=p.kernel.per_cu), persistent=True, exit_waits=arrived,
                    fair_share=True, store_queue=p.store_queue(p.world - 1))
    amap = AddressMap(space, r, p.world, op, kernel.local_writes())
    for c in range(p.world):
        amap.remote_map(p.chunk_region(c), c, op=op, to=x_space(p, xbase, c),
                        to_region=p.slot_region(r, c))
    layout, inputs, result = ALL_TO_ALL.layout(p, "direct")
    return Plan(layout, inputs, [KernelPhase("gemm+a2a", kernel, [amap, xmap], "a2a",
                                             fused=True)], slots, result)
