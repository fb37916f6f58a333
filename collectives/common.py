"""What every collective builder shares: the problem on one rank, chunks, tile spaces."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from devices.spec import DeviceSpec
from emulator.engine.addrmap import AddressMap, TileSpace, tile_grid
from emulator.engine.plan import Slots
from emulator.engine.kernel import Kernel, make_wgs
from emulator.engine.producers import TiledGemm
from emulator.engine.registry import Param
from emulator.model.gemm import GemmKernel
from emulator.model.gemm import choose as choose_kernel
from emulator.model.topology import Topology


def ring_chunks(rows: int, world: int) -> list[tuple[int, int]]:
    """Row ranges of the N chunks (the first rows % N chunks get one row more)."""
    base, extra = divmod(rows, world)
    bounds = [0]
    for c in range(world):
        bounds.append(bounds[-1] + base + (1 if c < extra else 0))
    return [(bounds[c], bounds[c + 1]) for c in range(world)]


def expert_chunks(rows: int, world: int, skew: float) -> list[tuple[int, int]]:
    """Row ranges of the N chunks of an all-to-all whose destinations are experts with
    uneven loads: chunk c (the rows bound for rank c's expert) gets a share proportional
    to (c + 1) ** -skew (Zipf's law over the experts, rank 0 the hottest; the same split
    on every sender, as a router's skew is); the rows are rounded by largest remainder
    (ties to the lower rank). ``skew`` 0 is the balanced split (``ring_chunks``)."""
    if skew == 0:
        return ring_chunks(rows, world)
    w = np.arange(1, world + 1, dtype=np.float64) ** -float(skew)
    exact = rows * w / w.sum()
    counts = np.floor(exact).astype(np.int64)
    extra = rows - int(counts.sum())
    order = sorted(range(world), key=lambda c: (-(exact[c] - counts[c]), c))
    for c in order[:extra]:
        counts[c] += 1
    bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
    return [(int(bounds[c]), int(bounds[c + 1])) for c in range(world)]


def dispatch_rows(rows: int, world: int, skew: float) -> np.ndarray:
    """``[s, d]``: the rows (tokens) rank s routes to rank d's expert in the dispatch
    all-to-all (``a2a+gemm``). Rank s holds ``world`` x its ring chunk of ``rows`` tokens
    and splits them over the experts as ``expert_chunks`` does (the same skew on every
    sender); skew 0: one block of its ring chunk's rows per destination, so every expert
    receives ``rows``."""
    out = np.zeros((world, world), np.int64)
    for s, (a, b) in enumerate(ring_chunks(rows, world)):
        for d, (x, y) in enumerate(expert_chunks(world * (b - a), world, skew)):
            out[s, d] = y - x
    return out


def _bounds(sizes) -> list[tuple[int, int]]:
    ends = np.cumsum(np.asarray(sizes, np.int64)).tolist()
    return [(e - int(n), e) for e, n in zip(ends, sizes)]


EXPERT_SKEW = Param(0.0, "uneven expert loads: the rows bound for rank c's expert get a share "
                    "proportional to (c + 1) ** -expert_skew of every sender's rows (Zipf; "
                    "0 = balanced, 1: rank 0's expert takes about 3x the mean at 8 ranks)",
                    low=0.0, high=4.0, source="off: balanced experts (the papers' runs)")


@dataclass(frozen=True)
class Problem:
    """One rank's view of a collective: output M x N (chunked by rows), K, split-K."""

    rank: int
    world: int
    m: int
    n: int
    k: int
    spec: DeviceSpec
    dtype: object  # numpy dtype of the stored data
    split: int = 1  # WGs per output tile (split-K)
    params: tuple[tuple[str, float], ...] = ()  # the run's parameters (--param), resolved
    seed: int = 0  # the run's --seed (inputs a plan depends on: embedding bag lengths)
    dispatch: bool = False  # the dispatch all-to-all (a2a+gemm): ``m`` is the rows every
    # expert receives when balanced; with ``expert_skew`` each rank receives its own
    # (``routed``) and ``chunks`` are the rows of each sender in this rank's input
    launch: tuple[int, int, int] = ()  # (rows, N, K) of the GEMM launches the kernel is
    # chosen for (``with_launch``); () : the whole GEMM (the most rows of any rank)

    def param(self, name: str, default: float | None = None) -> float:
        """The run's value of parameter ``name`` (``default``: a plan built without a run's
        parameters, e.g. by a test, takes the registered default)."""
        for n, v in self.params:
            if n == name:
                return v
        if default is None:
            raise KeyError(f"the run has no parameter {name!r}")
        return default

    @property
    def dtype_name(self) -> str:
        """The run's dtype as the CLI names it (``fp16``, ``bf16``, ``fp32``)."""
        from devices.kernels import is_bf16

        dt = np.dtype(self.dtype)  # (bf16 by name: no import of its module to ask)
        return "bf16" if is_bf16(dt) else {np.dtype(np.float16): "fp16",
                                            np.dtype(np.float32): "fp32"}[dt]

    @cached_property
    def topology(self) -> Topology:
        """Where the job's GPUs sit: nodes, sockets, routes."""
        return Topology.of(self.spec, self.world)

    @cached_property
    def ring(self) -> tuple[int, ...]:
        """The topology's ring over all ranks (node by node: crosses the network least)."""
        return self.topology.ring()

    @cached_property
    def ring_pos(self) -> int:
        return self.ring.index(self.rank)

    def ring_at(self, s: int) -> int:
        """The rank ``s`` places after this one on the ring (``-1``: the one before)."""
        return self.ring[(self.ring_pos + s) % self.world]

    @property
    def left(self) -> int:
        """Where ring algorithms send (T3: i -> i-1)."""
        return self.ring_at(-1)

    @property
    def right(self) -> int:
        return self.ring_at(1)

    @cached_property
    def chunks(self) -> list[tuple[int, int]]:
        """Row ranges of the N chunks: even (``ring_chunks``), or as the run's
        ``expert_skew`` splits an all-to-all among uneven experts (``expert_chunks``); for
        the dispatch, the rows each sender's tokens take in this rank's input
        (``recv_chunks``)."""
        if self.dispatch:
            return self.recv_chunks(self.rank)
        return expert_chunks(self.m, self.world, self.param("expert_skew", 0.0))

    # ---- the dispatch all-to-all (a2a+gemm), whose experts may receive uneven rows
    @cached_property
    def routed(self) -> np.ndarray:
        """``[s, d]``: rows rank s sends rank d (``dispatch_rows``; every entry the ring
        chunk of its sender when the operation is not the dispatch)."""
        skew = self.param("expert_skew", 0.0) if self.dispatch else 0.0
        return dispatch_rows(self.m, self.world, skew)

    def recv_chunks(self, q: int) -> list[tuple[int, int]]:
        """Rank q's input rows from each sender, in sender order."""
        return _bounds(self.routed[:, q])

    def x_block(self, s: int, d: int) -> tuple[int, int]:
        """Rows of rank s's tokens bound for rank d, in rank s's X (by destination)."""
        return _bounds(self.routed[s])[d]

    def rows_at(self, q: int) -> int:
        """Rows rank q's GEMM computes (``m`` but for an uneven dispatch)."""
        return int(self.routed[:, q].sum()) if self.dispatch else self.m

    @property
    def rows_here(self) -> int:
        return self.rows_at(self.rank)

    @property
    def rows_most(self) -> int:
        """The most rows any rank's GEMM computes (buffers are the same size everywhere:
        peers address them)."""
        return max(self.rows_at(q) for q in range(self.world))

    @property
    def x_rows(self) -> int:
        """The most tokens any rank holds (its X, one block per destination)."""
        return int(self.routed.sum(axis=1).max())

    @property
    def max_chunk(self) -> int:
        return max(r1 - r0 for r0, r1 in self.chunks)

    def chunk(self, c: int) -> tuple[int, int]:
        return self.chunks[c % self.world]

    def owners(self, rows) -> np.ndarray:
        """The rank whose chunk holds each of ``rows``."""
        return np.searchsorted([r1 for _, r1 in self.chunks], rows, side="right")

    def chunk_region(self, c: int, cols: int | None = None) -> tuple[int, int, int, int]:
        r0, r1 = self.chunk(c)
        return (r0, r1, 0, self.n if cols is None else cols)

    def chunk_elems(self, c: int) -> int:
        r0, r1 = self.chunk(c)
        return (r1 - r0) * self.n

    def slot_region(self, sender: int, owner: int) -> tuple[int, int, int, int]:
        """Rows of ``sender``'s block in ``owner``'s receive buffer (world x max chunk rows)."""
        rows = self.chunk(owner)[1] - self.chunk(owner)[0]
        base = sender * self.max_chunk
        return (base, base + rows, 0, self.n)

    @cached_property
    def kernel(self) -> GemmKernel:
        """The GEMM kernel this problem's GEMM launches run (``emulator/model/gemm.py``):
        chosen, as a BLAS heuristic would, for the launches' shape (``launch``: a
        configuration that splits the GEMM into smaller launches chooses for those, as
        each launch of a library GEMM runs its own heuristic), else for the whole GEMM;
        on the most rows of any rank, so that every rank tiles its buffers alike (peers
        address them). The device's fixed tile when it has no ``[gemm]`` section."""
        rows, n, k = self.launch or (self.rows_most, self.n, self.k)
        return choose_kernel(self.spec, max(1, rows), max(1, n), max(1, k), self.split,
                             self.dtype_name)

    def with_launch(self, rows: int, n: int | None = None, k: int | None = None
                    ) -> "Problem":
        """This problem with its GEMM run as launches of ``rows`` x ``n`` x ``k`` (default
        the whole N, K): its ``kernel`` is chosen for that shape, and its spaces take that
        kernel's tiles."""
        return replace(self, launch=(int(rows), int(n or self.n), int(k or self.k)))

    @property
    def tile_m(self) -> int:
        """Rows of the GEMM's WG tiles."""
        return self.kernel.tile_m

    @property
    def stage_size(self) -> int:
        """Work items of one GEMM stage (a wave): the CUs x the kernel's WGs per CU, over
        the WGs the heuristic's split-K gives each item."""
        return self.kernel.items(self.spec.cus)

    @property
    def others(self) -> list[int]:
        """Peers in staggered order: rank+1, rank+2, ... (rank itself excluded)."""
        return [(self.rank + s) % self.world for s in range(1, self.world)]

    @property
    def tile_n(self) -> int:
        """Width of the WG tiles of chunk-aligned outputs.

        A chunk thinner than a WG tile (T3's big models at TP 32: 2048 tokens / 32
        = 64 rows against 128-row tiles) is tiled with wider tiles of about the
        same area, w = wg_tile_n x ceil(wg_tile_m / rows), as a BLAS picks a
        wider macro tile for a short matrix. With 64 x 128 tiles the staggered
        GEMM would run twice the WGs and read every B column panel twice as
        often as the baseline's 128 x 128 grid; with 64 x 256 it reads B as
        often as the baseline does. One width per problem (from the thinnest
        chunk), so every rank's spaces have the same tiles.
        """
        tm, tn = self.kernel.tile_m, self.kernel.tile_n
        rows = min(r1 - r0 for r0, r1 in self.chunks)
        return tn if rows >= tm else tn * -(-tm // rows)

    def space(self, slots: Slots, buffer: str, row_blocks, cols: int | None = None,
              tile_n: int | None = None) -> TileSpace:
        tiles = tile_grid(list(row_blocks), self.n if cols is None else cols,
                          self.tile_m, tile_n or self.tile_n, self.spec.wg_raster_group)
        return TileSpace(buffer, tiles, slots.alloc(f"{buffer} tile", len(tiles)))

    def store_queue(self, destinations: int) -> float:
        """Bytes of remote stores per destination a GEMM stage may leave queued behind it
        (``Kernel.store_queue``): its own (``STAGE``). Stores leave as the epilogue issues
        them and a WG retires as the link accepts its tile's stores, so in a model of
        whole waves a wave's stores drain while the next wave computes and the link holds
        the kernel back only when it falls a wave behind. (It replaced an unsourced
        quarter of the L2 split over the destinations, which decided every RS-W and RS-A
        result.) ``destinations`` is kept for the callers: the queue is per destination."""
        from emulator.engine.kernel import STAGE

        return STAGE

    def gemm(self, space: TileSpace, tile_ids, a: str = "A", gates=None,
             cached: bool = False, store_queue: float = 0.0) -> Kernel:
        """The tiled GEMM over ``tile_ids`` of ``space`` in that order (``split`` WGs per
        tile); ``gates``: stage -> signals every WG of the stage waits on; ``store_queue``:
        see ``Kernel``."""
        wgs, wg_tile = make_wgs(space, tile_ids, self.k, self.split)
        kernel = Kernel(TiledGemm(a, "B", cached, self.kernel), space, wgs, wg_tile,
                        np.arange(len(wgs)),
                        self.stage_size, store_queue=store_queue)
        return kernel.with_stage_gates(gates) if gates else kernel

    def producer_op(self) -> str:
        return "update" if self.split > 1 else "store"

    def sm_share(self, sms: int) -> float:
        """The share of the CUs a concurrent CU kernel of ``sms`` thread blocks (one per
        CU) holds, at most half (the producer keeps the rest)."""
        return min(0.5, sms / self.spec.cus)


def plain_gemm(p: Problem, slots: Slots, rows=None, a: str = "A") -> tuple[Kernel, AddressMap]:
    """The baseline producer: plain tiles, row-major WG order, outputs stored (cached)."""
    space = p.space(slots, "C", rows or [(0, p.rows_here)], tile_n=p.kernel.tile_n)
    job = p.gemm(space, range(len(space)), a=a, cached=True)
    amap = AddressMap(space, p.rank, p.world, p.producer_op(), job.local_writes(),
                      local_ok=True)
    return job, amap
