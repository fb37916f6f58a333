"""Embedding pooling + all-to-all (DLRM; Punniyamurthy et al., SC 2024): model-parallel
embedding tables feeding a data-parallel MLP.

Shapes: global batch B = ``--m`` (rank c's samples: ring chunk c of B), embedding
dimension D = ``--n``, indices per lookup L = ``--k``, ``tables`` T per GPU, ``rows``
per table. Bag lengths as the public DLRM code's random data generator draws them
(``dlrm_data_pytorch.py``): each lookup pools round(max(1, r min(rows, L))) rows, r
uniform in [0, 1) (``fixed_lookups`` = 1: exactly L, its ``--num-indices-per-lookup-
fixed``); drawn per (sample, table) from the run's seed and the rank, so numeric and
timing-only runs pool the same rows. The generator also drops duplicate ids within a
bag; here they are kept (with rows >> L they are rare). Rank r pools every sample's bags of its own T tables
into P (B x T D: row = sample, table t at columns t D ..), and each rank's output O
holds {its samples, all W T tables x D} (source s's tables at columns s T D ..).

- ``sequential`` (the baseline): one embedding-bag launch per table (as the public DLRM
  code does), then the library all-to-all (a CU kernel sending P's row chunk c to rank
  c at the library's share of the links).
- ``fused`` / ``fused-oblivious``: one persistent kernel of P physical WGs (the
  occupancy knob), each logical WG pooling one bag. Output tiles are slices (``slice``
  S consecutive samples of one table); a slice's tile counts its bags' writes, so the
  WG that writes its last bag is the one that sends it. Scale-out (a peer on another
  node): the slice is stored locally, then put through the NIC, fenced, and its flag
  put (the issuing WG pays the NIC's issue cost for both). Scale-up (a peer on the
  node): zero-copy, each bag stored by its WG straight into the peer's O. Own samples
  are stored straight into the own O. After their last task the WGs poll the
  receivers' flags (one per arriving slice; per source on a node). Task order:
  communication-aware (remote slices first, slice by slice, the peers' slices
  interleaved so each round's stores spread over every link; own samples last) or
  oblivious (index order: sample by sample, each sample's tables in order).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from collectives.common import Problem
from collectives.persistent import grid, staggered
from devices.commands import Executor
from devices.regions import tile_grid
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.kernel import Kernel
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.producers import EmbeddingBag
from emulator.engine.registry import Param
from emulator.engine.steps import CuStep

FUSED_PAPER = "paper: the fused operators' study (Punniyamurthy et al., SC 2024)"
TABLES = Param(8, "embedding tables per GPU", 1, 65536, integer=True,
               source="off: a small default for runs that give none (the study's 256 per "
                      "GPU is its scenarios' value)")
ROWS = Param(1024, "rows per embedding table (sizes the numeric check's tables; the cost "
             "model takes every looked-up row from DRAM, as production tables far exceed "
             "the L2)", 1, 1 << 24, integer=True,
             source="off: sizes the numeric check only (every looked-up row is read from DRAM)")
SLICE = Param(32, "samples per slice: the unit a fused kernel's last WG sends across nodes "
              "(the study's S)", 1, 1 << 20, integer=True,
              source=f"{FUSED_PAPER}, evaluation: S = 32")
FIXED = Param(0, "1: every bag pools exactly --k rows (DLRM's --num-indices-per-lookup-fixed); "
              "0: a random count in 1..k per bag, as DLRM's random data generator draws by "
              "default", 0, 1, integer=True,
              source="library: facebookresearch/dlrm, dlrm_data_pytorch.py random lengths "
                     "(--num-indices-per-lookup-fixed off by default)")
INDEX_BYTES = 8  # not a parameter: int64 row ids (DLRM's indices)


def bag_lengths(seed: int, rank: int, samples: int, tables: int, rows: int, L: int,
                fixed: bool) -> np.ndarray:
    """Rows pooled per (sample, table) of rank ``rank``'s tables: DLRM's generator's
    round(max(1, r min(rows, L))), r uniform in [0, 1); ``fixed``: L (int64)."""
    if fixed:
        return np.full((samples, tables), L, np.int64)
    r = np.random.default_rng([seed, rank, 19]).random((samples, tables))
    return np.rint(np.maximum(1.0, r * min(rows, L))).astype(np.int64)


@dataclass(frozen=True)
class Bags:
    """One rank's view of the embedding operation."""

    p: Problem

    @property
    def tables(self) -> int:
        return int(self.p.param("tables", TABLES.default))

    @property
    def rows(self) -> int:
        return int(self.p.param("rows", ROWS.default))

    @property
    def width(self) -> int:  # T x D: this rank's pooled columns
        return self.tables * self.p.n

    @property
    def out_width(self) -> int:  # W x T x D: the output's columns
        return self.p.world * self.width

    @property
    def lengths(self) -> np.ndarray:
        """(samples, tables): the rows each bag of this rank's tables pools."""
        p = self.p
        return bag_lengths(p.seed, p.rank, p.m, self.tables, self.rows, p.k,
                           bool(p.param("fixed_lookups", FIXED.default)))

    def producer(self) -> EmbeddingBag:
        return EmbeddingBag("E", "I", self.rows, self.p.n, INDEX_BYTES)

    def layout(self) -> tuple[list, dict, list]:
        p, dt = self.p, self.p.dtype
        arrays = [("E", (self.tables * self.rows, p.n), dt),
                  ("I", (p.m, self.tables * p.k), np.int64),
                  ("P", (p.m, self.width), dt),
                  ("O", (p.max_chunk, self.out_width), dt)]
        r0, r1 = p.chunk(p.rank)
        return arrays, {"E": ("E", 0), "I": ("I", 0)}, [("O", (0, r1 - r0, 0, self.out_width))]

    def pooled_space(self, slots: Slots, rows: int, tables=None) -> TileSpace:
        """P's tiles: slices of ``rows`` samples of one table, cut at the owners' chunks
        (of ``tables`` only, if given)."""
        tiles = tile_grid(self.p.chunks, self.width, rows, self.p.n)
        if tables is not None:
            tiles = tiles[np.isin(tiles[:, 2] // self.p.n, list(tables))]
        return TileSpace("P", tiles, slots.alloc("P slice", len(tiles)))

    def out_tiles(self, owner: int, rows: int) -> np.ndarray:
        r0, r1 = self.p.chunk(owner)
        return tile_grid([(0, r1 - r0)], self.out_width, rows, self.p.n)

    def items(self, space: TileSpace) -> tuple[np.ndarray, np.ndarray]:
        """One work item per bag of every tile: (s, s + 1, table's columns, its ids'
        columns), and each item's tile."""
        t = space.tiles
        h = t[:, 1] - t[:, 0]
        tile_of = np.repeat(np.arange(len(t)), h)
        first = np.repeat(np.cumsum(h) - h, h)
        s = t[tile_of, 0] + np.arange(len(tile_of)) - first
        table = t[tile_of, 2] // self.p.n
        L = self.p.k
        pooled = self.lengths[s, table]
        items = np.stack([s, s + 1, t[tile_of, 2], t[tile_of, 3], table * L,
                          table * L + pooled], axis=1).astype(np.int64)
        return items, tile_of.astype(np.int64)

    def index_key(self, items: np.ndarray) -> np.ndarray:
        """The logical WG index: sample by sample, each sample's tables in order."""
        return items[:, 0] * self.tables + items[:, 2] // self.p.n


# ------------------------------------------------------------------ the baseline

def _a2a_steps(b: Bags, slots: Slots) -> list[CuStep]:
    """The library all-to-all: P's row chunk c to rank c's O (this rank's table columns),
    every peer at once, its own chunk copied; then wait for every peer's block."""
    p = b.p
    base = slots.alloc("a2a recv from", p.world)
    col = p.rank * b.width
    steps = []
    for j, c in enumerate(p.others + [p.rank]):
        r0, r1 = p.chunk(c)
        steps.append(CuStep(f"a2a send chunk {c}", "a2a", [("P", (r0, r1, 0, b.width))],
                            ("O", (0, r1 - r0, col, col + b.width)), c,
                            signal_slots=[base + p.rank] if c != p.rank else [],
                            signal_elems=[(r1 - r0) * b.width] if c != p.rank else [],
                            concurrent=j > 0))
    if p.world > 1:
        own = p.chunk(p.rank)[1] - p.chunk(p.rank)[0]
        el = [own * b.width] * (p.world - 1)
        wait = slots.region("a2a blocks", [base + s for s in p.others], el, "from every peer")
        steps.append(CuStep("a2a final", "a2a", [], None, p.rank, wait,
                            sum(el) * p.dtype.itemsize, writers=len(p.others)))
    return steps


def phases(p: Problem, slots: Slots, algorithm: str, iso) -> tuple:
    """The baseline's phases (``iso(name)``: the clock of an isolated run, or {}): one
    embedding-bag kernel per table, then the library all-to-all."""
    b = Bags(p)
    layout, inputs, result = b.layout()
    out = []
    for t in range(b.tables):
        space = b.pooled_space(slots, p.spec.wg_tile_m, [t])
        items, wg_tile = b.items(space)
        kernel = Kernel(b.producer(), space, items, wg_tile, np.argsort(items[:, 0],
                                                                          kind="stable"),
                        p.spec.max_resident_wgs)
        amap = AddressMap(space, p.rank, p.world, "store", np.ones(len(space), np.int64),
                          local_ok=True)
        out.append(KernelPhase("embedding", kernel, [amap], "a2a", **iso("compute")))
    out.append(StepsPhase("a2a", _a2a_steps(b, slots), **iso("a2a")))
    return layout, inputs, result, out


# ------------------------------------------------------------------ the fused kernel

def fused(p: Problem, aware: bool) -> Plan:
    b, slots = Bags(p), Slots()
    S = int(p.param("slice", SLICE.default))
    layout, inputs, result = b.layout()
    space = b.pooled_space(slots, S)
    items, wg_tile = b.items(space)
    owner = p.owners(items[:, 0])
    key = b.index_key(items)
    # communication-aware: slice by slice (a slice's bags together, so slices complete and
    # leave one after another), the peers' slices interleaved, this rank's own last
    first_tile = np.searchsorted(p.owners(space.tiles[:, 0]), np.arange(p.world))
    position = wg_tile - first_tile[owner]  # the slice's place in its owner's part
    bag = items[:, 0] - space.tiles[wg_tile, 0]
    order = (np.lexsort((bag, staggered(p, owner), position, owner == p.rank)) if aware
             else np.argsort(key, kind="stable"))
    obase = slots.alloc("O slice", len(b.out_tiles(0, S)))  # chunk 0 is the largest
    spaces: dict[int, TileSpace] = {}

    def out_space(c: int) -> TileSpace:  # rank c's O (its slots: the same on every rank)
        if c not in spaces:
            spaces[c] = TileSpace("O", b.out_tiles(c, S), obase)
        return spaces[c]

    topo, col = p.topology, p.rank * b.width
    pmap = AddressMap(space, p.rank, p.world, "store", np.ones(len(space), np.int64))
    nic = Executor("nic", 0)
    for c in range(p.world):
        r0, r1 = p.chunk(c)
        if topo.node(c) != topo.node(p.rank):  # scale-out: slices put through the NIC
            for t in space.tiles_in((r0, r1, 0, b.width)):
                a0, a1, c0, c1 = space.region(t)
                pmap.dma_map((a0, a1, c0, c1), c, op="store", after=1, to=out_space(c),
                             to_region=(a0 - r0, a1 - r0, col + c0, col + c1), executor=nic)
        else:  # scale-up and its own samples: zero-copy stores by the WGs
            pmap.remote_map((r0, r1, 0, b.width), c, op="store", to=out_space(c),
                            to_region=(0, r1 - r0, col, col + b.width))
    mine = out_space(p.rank)
    omap = AddressMap(mine, p.rank, p.world, "store", np.zeros(len(mine), np.int64),
                      incoming_op="store", local_ok=True)
    own = p.chunk(p.rank)[1] - p.chunk(p.rank)[0]
    flags = []
    for s in p.others:
        block = (0, own, s * b.width, (s + 1) * b.width)
        if topo.node(s) != topo.node(p.rank):  # a ready flag per slice
            flags += [omap.track(mine.region(t)) for t in mine.tiles_in(block)]
        else:
            flags.append(omap.track(block))
    kernel = Kernel(b.producer(), space, items, wg_tile, order.astype(np.int64),
                    grid(p, shmem_loss=True),
                    persistent=True, exit_waits=tuple(flags), fair_share=True,
                    store_queue=p.store_queue(p.world - 1))
    name = "embedding+a2a" if aware else "embedding+a2a (oblivious)"
    return Plan(layout, inputs, [KernelPhase(name, kernel, [pmap, omap], "a2a", fused=True)],
                slots, result)


# ------------------------------------------------------------------ inputs and reference

def inputs(cfg, rank: int, world: int) -> dict[str, np.ndarray]:
    """This rank's tables (``--values``: small integers or normal) and row ids (uniform
    over each table's rows) from a generator seeded by (seed, rank)."""
    from collectives.reference import NP_DTYPE

    T, rows = int(cfg.param("tables")), int(cfg.param("rows"))
    rng = np.random.default_rng([cfg.seed, rank, 17])
    dt = NP_DTYPE[cfg.dtype]
    if cfg.values == "int":
        table = rng.integers(-2, 3, (T * rows, cfg.n)).astype(dt)
    else:
        table = rng.standard_normal((T * rows, cfg.n)).astype(dt)
    ids = rng.integers(0, rows, (cfg.m, T * cfg.k)).astype(np.int64)
    return {"E": table, "I": ids}


def _pool(table: np.ndarray, ids: np.ndarray, T: int, rows: int, L: int,
          lengths: np.ndarray) -> np.ndarray:
    """numpy's sum pooling of each bag's first ``lengths`` ids: (B, T x D) in fp32."""
    B, D = ids.shape[0], table.shape[1]
    out = np.empty((B, T, D), np.float32)
    for t in range(T):
        looked = table[t * rows + ids[:, t * L:(t + 1) * L]]  # (B, L, D)
        used = np.arange(L)[None, :] < lengths[:, t:t + 1]  # (B, L)
        out[:, t] = (looked * used[:, :, None]).sum(axis=1, dtype=np.float32)
    return out.reshape(B, T * D)


def _lengths(cfg, rank: int) -> np.ndarray:
    return bag_lengths(cfg.seed, rank, cfg.m, int(cfg.param("tables")), int(cfg.param("rows")),
                       cfg.k, bool(cfg.param("fixed_lookups")))


def reference(comm, cfg, x: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """numpy pooling of this rank's tables, then MPI's ``Alltoallv`` by sample chunks:
    (own samples, W x T x D). Tolerance: integer values in fp32 are exact (0); in fp16
    the pooled sum is rounded once on its store (u |ref|); normal values add the sum
    order (L u32 + 2 u) x the pooled magnitudes."""
    from mpi4py import MPI

    from collectives.common import ring_chunks
    from collectives.reference import UNIT_ROUNDOFF

    T, rows, L = int(cfg.param("tables")), int(cfg.param("rows")), cfg.k
    table = x["E"].astype(np.float32)
    chunks = ring_chunks(cfg.m, comm.size)

    def a2a(pooled: np.ndarray) -> np.ndarray:
        r0, r1 = chunks[comm.rank]
        width = pooled.shape[1]
        got = np.empty((comm.size, r1 - r0, width), np.float32)
        send = [(b - a) * width for a, b in chunks]
        comm.Alltoallv([np.ascontiguousarray(pooled), send, None, MPI.FLOAT],
                       [got, [(r1 - r0) * width] * comm.size, None, MPI.FLOAT])
        return got.transpose(1, 0, 2).reshape(r1 - r0, comm.size * width)

    lengths = _lengths(cfg, comm.rank)
    ref = a2a(_pool(table, x["I"], T, rows, L, lengths))
    u = UNIT_ROUNDOFF[cfg.dtype]
    if cfg.values == "int":
        if cfg.dtype == "fp32":
            return ref, np.zeros_like(ref)
        return ref, u * np.abs(ref)
    mag = a2a(_pool(np.abs(table), x["I"], T, rows, L, lengths))
    return ref, (L * UNIT_ROUNDOFF["fp32"] + 2 * u) * mag * 1.01  # not a parameter: numerics


def bounds(cfg, spec, world: int) -> tuple[float, float]:
    """(the pooling's reads at the HBM's peak, in seconds; the bytes a rank sends to its
    peers: the pooled rows of every sample but its own), for ``runs.lower_bounds``."""
    from emulator.model.cost import DTYPE_BYTES

    e = DTYPE_BYTES[cfg.dtype]
    T = int(cfg.param("tables"))
    # rank 0's pooled rows (each rank pools its own bags: its bound is one of the job's)
    reads = int(_lengths(cfg, 0).sum()) * (cfg.n * e + INDEX_BYTES)
    own = cfg.m // world  # the smallest chunk
    return reads / spec.hbm_bw, (cfg.m - own) * T * cfg.n * e


def host_memory(cfg, spec) -> int:
    """One rank's host memory: its plan (a work item per bag, a tracker slot per slice) and,
    in a numeric run, its tables, ids, pooled output, received output and reference."""
    from emulator.model.cost import DTYPE_BYTES

    T, W = int(cfg.param("tables")), cfg.ranks
    bags = cfg.m * T
    plan = (64 << 20) + 160 * bags  # not a parameter: host memory
    if cfg.timing_only:
        return plan
    e = DTYPE_BYTES[cfg.dtype]
    table = T * int(cfg.param("rows")) * cfg.n
    pooled = cfg.m * T * cfg.n
    out = -(-cfg.m // W) * W * T * cfg.n
    return (plan + (200 << 20) + table * (e + 4)  # not a parameter: host memory
            + bags * cfg.k * 8 + pooled * (e + 8)  # not a parameter: host memory
            + out * (e + 16))  # not a parameter: host memory
