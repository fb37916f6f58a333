"""FiCCO: finer-grain overlap of an all-gather or all-to-all dispatch with the GEMM it
feeds, its transfers offloaded to DMA engines (Pal et al., FiCCO, arXiv:2512.10236).

Rank r's GEMM is C = G B_r, G the M x K input gathered from every rank: for SP+TP
(``ag+gemm``) rank s contributes its shard, rows ``chunk(s)`` of G; for EP
(``a2a+gemm``) rank s holds one block of rows per destination (its tokens routed to
each GPU's expert; ``Problem.x_block``) and block d lands at rows ``recv_chunks(d)[s]``
of G on rank d (``chunk(s)`` with balanced experts; with ``expert_skew`` each rank's G
has its own rows, and a rank addresses a peer's pieces in the peer's rows). Every
schedule here is one kernel phase of the one mechanism:

- the transfers are ``dma_map`` pushes issued up front, one DMA engine per peer
  (``engine``), each engine's queue in step order, so every step drives every link
  at once (FiCCO) or one link (shard-based overlap); or, ``executor="cu"``, CU-driven
  library transfers on a share of the CUs (FiCCO-CU);
- the GEMM is a sequence of launches (``Kernel.launches``) of one stream, each
  gated on the signals of the input rows it reads (arrivals or gathers);
- gathers and scatters are device-local copies on a DMA engine of their own
  (``copy_map``), triggered by the pieces' arrival or the GEMM tiles' completion.

Buffers (1D schedules): ``AG`` is M rows of G in global order (pieces land in
place) followed by a gather area; ``C`` is M result rows followed by the GEMM's
output rows for the gathered blocks, which the scatters copy into place (the GEMM
reads and writes the same row numbers). Tile grids are aligned to the pieces, so a
piece is whole tiles. 2D: ``G`` (M x K) receives the gathered column blocks and the
GEMM accumulates C += G[:, block j] B[block j] (updates).
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem, ring_chunks
from devices.commands import DISPATCH, Executor
from devices.regions import RegularGrid, tile_grid
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.kernel import Kernel, LaunchItems
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.producers import TiledGemm
from emulator.engine.registry import Operation, Param
from emulator.model import params

ARBITRATION = "fr-fcfs"  # a stock GPU's HBM (as Flux's)
SCHEDULES = ("uniform-fused-1d", "hetero-fused-1d", "hetero-unfused-1d", "uniform-fused-2d")
# ASSUMPTION: RCCL's collective kernels on MI300X run 32 channels of one thread block
# each (RCCL's default channel count on a full mesh of 8), 32 of 304 CUs
CU_SHARE = Param(32 / 304, "share of the CUs the CU-driven (library) transfers hold "
                 "(FiCCO-CU)", low=0.01, high=0.5, source={
                     "assumption": "RCCL's kernels on MI300X hold one CU per channel, 32 "
                                   "channels (RCCL's default on gfx942 is not stated by "
                                   "FiCCO); 16 to 64 channels",
                     "low": 16 / 304, "high": 64 / 304})
CU_DISPATCH = Param(1, "how the CU-driven transfers' thread blocks get their CUs beside the "
                    "GEMM: 0 partitioned (CU masking), 1 prioritised (launched ahead of the "
                    "GEMMs they feed, or on a higher-priority stream), 2 plain (launched beside "
                    "a running GEMM at the same priority; emulator/engine/cu_side.py)",
                    low=0, high=2, integer=True, source={
                        "assumption": "FiCCO issues each step's transfers before the GEMMs "
                                      "that consume them, so the library's kernels are "
                                      "dispatched first (prioritised by launch order); the "
                                      "study does not say how its RCCL kernels were "
                                      "launched: from CU masking (0) to plain (2)",
                        "low": 0, "high": 2})
COPY2D = Param(1, "2D copies: 1 = emulated as one 1D copy of the same bytes (as the study "
               "did), 0 = strided (one DMA command per band of tile rows)", low=0, high=1,
               integer=True, source="paper: FiCCO (Pal et al., arXiv:2512.10236): 2D "
                                    "copies emulated as 1D ones of the same bytes")
TILE_LEVEL = Param(0, "1: build every tile and work item as arrays (the tile-level path) "
                   "instead of computing them when a stage asks (the same modelled times; "
                   "for checking the coalesced path)", low=0, high=1, integer=True,
                   source="off: a check of the emulator's own paths (same times)")
# the heuristic's thresholds, in multiples of the machine balance (peak FLOP/s over HBM
# bytes/s): below LOW uniform-fused-1D, above HIGH hetero-unfused-1D, else hetero-fused
OTB_LOW = Param(1.0, "ficco-auto: op-to-byte ratio (x the machine balance) below which "
                "uniform-fused-1D is picked", low=0.0, high=1e6, at_most="otb_high",
                source="paper: FiCCO's heuristic, below the machine's balance")
OTB_HIGH = Param(5.0, "ficco-auto: op-to-byte ratio (x the machine balance) above which "
                 "hetero-unfused-1D is picked", low=0.0, high=1e6,
                 source="paper: FiCCO's heuristic, above about 5x the machine's balance")


def dispatch(op: Operation) -> bool:
    """The operation is the all-to-all dispatch (else the all-gather): its layout is this
    module's."""
    return getattr(op.parts, "layout", None) is dispatch_layout


class _Setup:
    """One rank's FiCCO buffers, spaces and maps."""

    def __init__(self, p: Problem, op: Operation, slots: Slots, gather,
                 executor: str = "dma", two_d: bool = False, whole: bool = False,
                 output: bool = True, cu_dispatch: str | None = None):
        self.p, self.op, self.slots = p, op, slots
        self.a2a = dispatch(op)
        W, r = p.world, p.rank
        self.two_d, self.executor = two_d, executor
        # pieces: (s, j) -> rows (1D: sub-rows of chunk s; 2D: all of chunk s) and columns
        self.steps = 1 if whole else W
        self.cols = [(p.k * j // self.steps, p.k * (j + 1) // self.steps)
                     for j in range(self.steps)] if two_d else [(0, p.k)] * self.steps
        self.piece = self._piece_map(r)  # (s, j) -> region in this rank's G
        self._peer_pieces: dict[int, dict] = {r: self.piece}
        self._peer_ag: dict[int, TileSpace] = {}  # ``ag_at``'s spaces of the peers
        # the gather area (1D fused): block j holds the pieces of ``gather(q)[j]`` in order;
        # every rank's HBM layout and tracker slots must match (peers address them), so
        # the arrays take the largest rank's area and each space's slots are padded to the
        # largest rank's count
        self.gather = gather
        self.gathered, self.blocks, end = self._gather_area(r)
        area = max(self._gather_area(q)[2] for q in range(W))
        self.private = area  # shard-based: the input before its copy into the symmetric
        most = max(b - a for q in range(W) for a, b in self._chunks_of(q))  # buffer
        self.rows = area + (most if executor == "shard" else 0)
        self.p = p = p.with_launch(*self._launch_shape())  # its kernel, for its launches
        tm, tn = p.tile_m, p.kernel.tile_n
        if two_d:  # every rank's slots padded to the largest rank's count
            grids = [_grid_2d(p, self.cols, self._chunks_of(q)) for q in range(W)]
            most = max(len(g) for g in grids)
            grid = grids[r]
            self.ag = TileSpace("AG", grid, slots.alloc("AG tile", len(grid)))
            slots.alloc("AG pad", most - len(grid))
            self.g = TileSpace("G", grid, slots.alloc("G tile", len(grid)))
            slots.alloc("G pad", most - len(grid))
            cg = _grid(p, [(0, p.rows_here)], p.n)
            self.c = TileSpace("C", cg, slots.alloc("C tile", len(cg)))
            slots.alloc("C pad", max(len(RegularGrid([(0, p.rows_at(q))], p.n, tm, tn))
                                     for q in range(W)) - len(cg))
        else:
            self.g = None
            blocks = {q: self._row_blocks(q) for q in range(W)}
            self._blocks = blocks
            self.ag = self._space(slots, "AG", blocks, p.k, p.k)
            self.c = (self._space(slots, "C", blocks, p.n, tn, p.spec.wg_raster_group)
                      if output else _untracked(p, slots, "C", blocks[r]))
        # this rank's input: its shard in place (all-gather) or its blocks in X (dispatch)
        writes = np.zeros(len(self.ag), np.int64)
        own_rows = p.chunk(r)
        if not self.a2a and executor != "shard":
            writes[self.ag.tiles_in((*own_rows, 0, p.k))] = 1
        if executor == "shard" and not self.a2a and own_rows[1] > own_rows[0]:
            writes[self.ag.tiles_in(self.private_region)] = 1
        self.amap = AddressMap(self.ag, r, W, "store", writes, incoming_op="store", local_ok=True,
                                   steady=True)
        self.resident = np.flatnonzero(writes)  # AG tiles resident at the start
        self.x = self.xmap = None
        if self.a2a:
            grids = {q: self._x_grid(q) for q in range(W)}
            xt = grids[r]
            self.x = TileSpace("X", xt, slots.alloc("X tile", len(xt)))
            slots.alloc("X pad", max(len(g) for g in grids.values()) - len(xt))
            self.xmap = AddressMap(self.x, r, W, "store", np.ones(len(xt), np.int64),
                                   incoming_op="store", local_ok=True,
                                   steady=True)
        self.maps: list[AddressMap] = []  # push maps, one per engine
        self._keys: list = []
        self.gmap: AddressMap | None = None
        self.copy_1d = bool(p.param("copy2d", COPY2D.default))
        self.cu_share = p.param("cu_share", CU_SHARE.default)
        self.cu_dispatch = cu_dispatch or DISPATCH[int(p.param("cu_dispatch",
                                                               CU_DISPATCH.default))]

    def _launch_shape(self) -> tuple[int, int, int]:
        """(rows, N, K) of the schedule's decomposed GEMM launches, the largest on any rank
        (every rank tiles alike): 2D, all rows over a column block of K; fused 1D, a
        gathered block; else a piece (shard-based: a whole shard). A schedule's other
        launches (hetero's local shard) run the same kernel."""
        p, W = self.p, self.p.world
        if self.two_d:
            return p.rows_most, p.n, max(b - a for a, b in self.cols)
        if any(self.gather(q) for q in range(W)):
            rows = max(b - a for q in range(W) for a, b in self._gather_area(q)[1])
        else:
            rows = max(y - x for q in range(W) for s in range(W)
                       for x, y in self._pieces_of(s, q))
        return rows, p.n, p.k

    @property
    def private_region(self) -> tuple[int, int, int, int]:
        a, b = self.p.chunk(self.p.rank)
        return (self.private, self.private + b - a, 0, self.p.k)

    def _chunks_of(self, q: int) -> list[tuple[int, int]]:
        """Each sender's rows in rank q's G."""
        return self.p.recv_chunks(q) if self.a2a else self.p.chunks

    def _pieces_of(self, s: int, q: int | None = None) -> list[tuple[int, int]]:
        """Rank s's pieces (rows in rank q's G, default this rank's), step by step (empty
        ones kept)."""
        a, b = self._chunks_of(self.p.rank if q is None else q)[s]
        if self.two_d or self.steps == 1:
            return [(a, b)] * self.steps
        return [(a + x, a + y) for x, y in ring_chunks(b - a, self.p.world)]

    def _piece_map(self, q: int) -> dict[tuple[int, int], tuple[int, int, int, int]]:
        """(s, j) -> piece j of rank s in rank q's G (rows and columns; non-empty ones)."""
        out = {}
        for s in range(self.p.world):
            for j, (x, y) in enumerate(self._pieces_of(s, q)):
                if y > x and self.cols[j][1] > self.cols[j][0]:
                    out[(s, j)] = (x, y, *self.cols[j])
        return out

    def ag_at(self, q: int) -> TileSpace:
        """Rank q's AG tiles (a peer's G has rows of its own in an uneven dispatch), at
        the same tracker slots as this rank's."""
        if q == self.p.rank:
            return self.ag
        got = self._peer_ag.get(q)
        if got is None:  # built once per peer: every push to it maps into it
            p = self.p
            if self.two_d:
                grid = _grid_2d(p, self.cols, self._chunks_of(q))
            else:
                grid = _grid(p, self._blocks[q], p.k, p.k, 1)
            got = self._peer_ag[q] = TileSpace("AG", grid, self.ag.slot_base)
        return got

    def piece_at(self, q: int, s: int, j: int) -> tuple[int, int, int, int] | None:
        """Piece j of rank s where it lands in rank q's G (None: empty)."""
        if q not in self._peer_pieces:
            self._peer_pieces[q] = self._piece_map(q)
        return self._peer_pieces[q].get((s, j))

    def _gather_area(self, q: int):
        """Rank q's gather area: (piece -> its rows there, block of each step, end row)."""
        row, gathered, blocks = self.p.rows_at(q), {}, []
        members_of = self.gather(q)
        for j, members in enumerate(members_of):
            start = row
            for s in members:
                x, y = self._pieces_of(s, q)[j]
                if y > x:
                    gathered[(s, j)] = (row, row + y - x)
                    row += y - x
            blocks.append((start, row))
        return gathered, blocks, row

    def _row_blocks(self, q: int) -> list[tuple[int, int]]:
        """Rank q's row blocks of AG and C: every piece, its gather area, its private
        shard."""
        pieces = sorted({pc for s in range(self.p.world) for pc in self._pieces_of(s, q)
                         if pc[1] > pc[0]})
        a, b = self._chunks_of(q)[q]
        private = [(self.private, self.private + b - a)] if (
            self.executor == "shard" and b > a) else []
        return pieces + list(self._gather_area(q)[0].values()) + private

    def _space(self, slots: Slots, buffer: str, blocks: dict, ncols: int, tn: int,
               group: int = 1) -> TileSpace:
        p = self.p
        grid = _grid(p, blocks[p.rank], ncols, tn, group)
        space = TileSpace(buffer, grid, slots.alloc(f"{buffer} tile", len(grid)))
        most = max(len(RegularGrid(bl, ncols, p.tile_m, tn)) for bl in blocks.values())
        slots.alloc(f"{buffer} pad", most - len(grid))
        return space

    def _x_grid(self, q: int) -> np.ndarray:
        """Rank q's X: one block of rows per destination, tiled by the pieces they make
        there."""
        p = self.p
        if self.two_d:
            return _grid_2d(p, self.cols, [p.x_block(q, d) for d in range(p.world)])
        rows = []
        for d in range(p.world):
            x0 = p.x_block(q, d)[0]
            a = p.recv_chunks(d)[q][0]
            rows += [(x0 + x - a, x0 + y - a) for x, y in self._pieces_of(q, d) if y > x]
        return tile_grid(rows, p.k, p.tile_m, p.k)

    # ------------------------------------------------------------------ sources
    def source(self, j: int, d: int) -> tuple[AddressMap | None, tuple]:
        """Where rank r's piece j for rank d sits: (its space, region)."""
        p = self.p
        if not self.a2a:
            return self.ag, self.piece[(p.rank, j)]
        x, y, c0, c1 = self.piece_at(d, p.rank, j)
        x0 = p.x_block(p.rank, d)[0]
        a = p.recv_chunks(d)[p.rank][0]
        return self.x, (x0 + x - a, x0 + y - a, c0, c1)

    def engine(self, d: int) -> Executor:
        """The executor of transfers to peer ``d``: DMA engine (d - r - 1) mod (E - 1) (the
        last engine does the local copies), or a group of the CU-driven kernel."""
        p = self.p
        E = p.spec.dma_engines
        s = (d - p.rank - 1) % p.world
        if self.executor == "cu":
            return Executor("cu", s, self.cu_share / max(1, p.world - 1), streams=True,
                            library=True, dispatch=self.cu_dispatch)  # FiCCO's CU-driven
            # transfers: RCCL's kernels
        return Executor("dma", s % max(1, E - 1), streams=True)

    @property
    def local_engine(self) -> Executor:
        return Executor("dma", max(0, self.p.spec.dma_engines - 1), streams=True)

    def push_map(self, key) -> AddressMap:
        """The map of the pushes to ``key`` (a peer: a map holds one entry per region)."""
        for m, k in zip(self.maps, self._keys):
            if k == key:
                return m
        space = self.x if self.a2a else self.ag
        writes = np.ones(len(space), np.int64) if self.a2a else self.amap.local_writes
        m = AddressMap(space, self.p.rank, self.p.world, "store", writes,
                       incoming_op="store", local_ok=True,
                                   steady=True)
        self.maps.append(m)
        self._keys.append(key)
        return m

    def push(self, j: int, d: int, executor: Executor | None = None) -> list:
        """Push piece j of this rank to rank ``d``'s AG (bands of tile rows when 2D copies
        are strided); returns the trigger signals (this rank's resident piece)."""
        dst = self.piece_at(d, self.p.rank, j)
        if dst is None:
            return []
        ex = executor or self.engine(d)
        m = self.push_map(d)
        space, region = self.source(j, d)
        sigs = []
        for src, to in self._bands(region, dst):
            sigs.append(m.dma_map(src, d, op="store", after=1,
                                  to=self.ag_at(d) if self.a2a else None,
                                  to_region=to if self.a2a else None, executor=ex))
        return sigs

    def _bands(self, src, dst):
        if not self.two_d or self.copy_1d:
            return [(src, dst)]
        tm = self.p.tile_m
        out = []
        for a in range(src[0], src[1], tm):
            b = min(a + tm, src[1])
            da = dst[0] + a - src[0]
            out.append(((a, b, src[2], src[3]), (da, da + b - a, dst[2], dst[3])))
        return out

    # ------------------------------------------------------------------ the plan
    def plan(self, kernel: Kernel, cmap: AddressMap, name: str) -> Plan:
        p = self.p
        rows = self.rows if not self.two_d else p.rows_most
        layout = [("B", (p.k, p.n), p.dtype), ("C", (rows, p.n), p.dtype),
                  ("AG", (rows, p.k), p.dtype)]
        if self.two_d:
            layout.append(("G", (p.rows_most, p.k), p.dtype))
        if self.a2a:
            layout.append(("X", (p.x_rows, p.k), p.dtype))
        inputs = {"B": ("B", 0), "A": ("X", 0) if self.a2a else
                  ("AG", self.private if self.executor == "shard" else p.chunk(p.rank)[0])}
        preload = []
        for space, tiles in ([(self.ag, self.resident)] +
                             ([(self.x, np.arange(len(self.x)))] if self.a2a else [])):
            if len(tiles):
                preload.append(([space.slot(t) for t in tiles],
                                 [space.elems(t) for t in tiles]))
        maps = [cmap, *self.maps, self.amap] + ([self.xmap] if self.a2a else [])  # pushes
        # first in program order (the gathers wait for peers' pushes)
        if self.gmap is not None:
            maps.append(self.gmap)
        phase = KernelPhase(name, kernel, maps, "a2a" if self.a2a else "ag", fused=True,
                            preload=preload)
        return Plan(layout, inputs, [phase], self.slots, [("C", (0, p.rows_here, 0, p.n))],
                    arbitration=ARBITRATION)


def _grid(p: Problem, blocks, ncols: int, tn: int | None = None, group: int | None = None):
    """The tiles of ``blocks`` x ``ncols``: a ``RegularGrid`` (computed when asked) when the
    WG raster is row-major, else the array."""
    tm, tn = p.tile_m, tn or p.kernel.tile_n
    g = p.spec.wg_raster_group if group is None else group
    if g <= 1 and not p.param("tile_level", TILE_LEVEL.default):
        return RegularGrid(blocks, ncols, tm, tn)
    return tile_grid(blocks, ncols, tm, tn, g)


def _grid_2d(p: Problem, cols, rows=None) -> np.ndarray:
    """Tiles of tile_m rows of each row block (default: the chunks) by the column
    blocks."""
    tm = p.tile_m
    out = []
    for a, b in rows or p.chunks:
        if b <= a:
            continue
        x = np.arange(a, b, tm, dtype=np.int64)
        band = np.stack([x, np.minimum(x + tm, b)], axis=1)
        for c0, c1 in cols:
            if c1 > c0:
                out.append(np.concatenate([band, np.tile([[c0, c1]], (len(x), 1))], axis=1))
    return np.concatenate(out).astype(np.int64) if out else np.zeros((0, 4), np.int64)


def _launch_kernel(p: Problem, space: TileSpace, launches: list[tuple[list[tuple], int, int]],
                   a: str, split: int = 1) -> tuple[Kernel, list[int]]:
    """One stream of GEMM launches: launch i = the tiles of its row blocks over K slice
    (k0, k1); returns the kernel (ungated) and the position of each launch's first
    item."""
    if space.lazy:  # a regular grid: the launches as runs of tile ids, no array per WG
        runs, starts, n = [], [], 0
        for regions, k0, k1 in launches:
            starts.append(n)
            for region in regions:
                ids = space.tiles_in(region)
                if not isinstance(ids, range):
                    runs = None
                    break
                runs.append((ids.start, ids.stop, k0, k1))
                n += len(ids)
            if runs is None:
                break
        if runs is not None:
            items = LaunchItems(space.tiles, runs)
            kernel = Kernel(TiledGemm(a, "B", True, p.kernel), space, items, items.tiles,
                            np.arange(len(items)), p.stage_size,
                            launches=tuple(s for s in starts[1:] if 0 < s < len(items)))
            return kernel, starts
    parts, tiles, starts, n = [], [], [], 0
    for regions, k0, k1 in launches:
        starts.append(n)
        for region in regions:
            ids = np.asarray(space.tiles_in(region), np.int64)
            w = np.empty((len(ids), 6), np.int64)
            w[:, :4] = space.tiles[ids]
            w[:, 4], w[:, 5] = k0, k1
            parts.append(w)
            tiles.append(ids)
            n += len(ids)
    wgs = np.concatenate(parts) if parts else np.zeros((0, 6), np.int64)
    wg_tile = np.concatenate(tiles) if tiles else np.zeros(0, np.int64)
    kernel = Kernel(TiledGemm(a, "B", True, p.kernel), space, wgs, wg_tile,
                    np.arange(len(wgs)),
                    p.stage_size, launches=tuple(s for s in starts[1:] if 0 < s < len(wgs)))
    return kernel, starts


def _gate_launches(kernel: Kernel, starts: list[int], gates: list[tuple]) -> Kernel:
    """Launch i's first stage waits on ``gates[i]``."""
    first = {}
    pos = 0
    for s, ids in enumerate(kernel.stages()):
        first.setdefault(pos, s)
        pos += len(ids)
    stage_gates = {}
    for st, g in zip(starts, gates):
        if st in first and g:
            stage_gates[first[st]] = tuple({id(x): x for x in g}.values())
    return kernel.with_stage_gates(stage_gates)


def schedule(p: Problem, op: Operation, name: str, executor: str = "dma") -> Plan:
    """One of FiCCO's four schedules (``SCHEDULES``), transfers by ``executor``."""
    W, r = p.world, p.rank
    peers = p.others
    two_d = name == "uniform-fused-2d"
    fused = name in ("uniform-fused-1d", "hetero-fused-1d")
    members = [r] + peers if name.startswith("uniform") else peers
    slots = Slots()

    def gather(q: int) -> list[list[int]]:
        if not fused:
            return []
        ms = [(q + s) % W for s in range(W)]
        return [ms if name.startswith("uniform") else ms[1:]] * W

    st = _Setup(p, op, slots, gather, executor, two_d)
    p = st.p  # its GEMM launches' kernel
    # transfers: every step's piece to every peer, issued up front (engine queues in order)
    own_sigs: list = []
    for j in range(st.steps):
        for d in peers:
            own_sigs += st.push(j, d)
    # arrivals: every peer's pieces tracked here
    arrived = {}
    for (s, j), region in st.piece.items():
        if s != r:
            arrived[(s, j)] = st.amap.track(region, after=1)
    # this rank's own pieces: resident (all-gather) or copied from X (dispatch)
    own = {}
    for j in range(st.steps):
        if (r, j) not in st.piece:
            continue
        region = st.piece[(r, j)]
        if st.a2a:
            xs, xr = st.source(j, r)
            sig = st.xmap.track(xr, after=1)
            own_sigs.append(sig)
            if not (fused and name.startswith("uniform")) and not two_d:
                own[(r, j)] = st.xmap.copy_map(xr, st.ag, region, sig, st.local_engine)
            else:
                own[(r, j)] = (xr, sig)
        else:
            own[(r, j)] = st.amap.track(region, after=1)
            own_sigs.append(own[(r, j)])
    if two_d:
        launches, gates = [], []
        for j in range(st.steps):
            c0, c1 = st.cols[j]
            if c1 <= c0:
                continue
            sigs = []
            for s in [r] + peers:
                if (s, j) not in st.piece:
                    continue
                region = st.piece[(s, j)]
                for src, to in st._bands(region, region):
                    if s == r and st.a2a:
                        xr, trig = own[(r, j)]
                        xsrc = (xr[0] + src[0] - region[0], xr[0] + src[1] - region[0],
                                src[2], src[3])
                        sigs.append(st.xmap.copy_map(xsrc, st.g, to, trig, st.local_engine))
                    else:
                        trig = own[(r, j)] if s == r else arrived[(s, j)]
                        sigs.append(st.amap.copy_map(src, st.g, to, trig, st.local_engine))
            if p.rows_here:
                launches.append(([(0, p.rows_here, 0, p.n)], c0, c1))
                gates.append(sigs)
        kernel, starts = _launch_kernel(p, st.c, launches, "G")
        cmap = AddressMap(st.c, r, W, "update", kernel.local_writes(), local_ok=True)
    else:
        launches, gates, scatters = [], [], []
        if not name.startswith("uniform"):  # the local shard at once
            a, b = p.chunk(r)
            if b > a:
                launches.append(([(a, b, 0, p.n)], 0, p.k))
                gates.append([own[(r, j)] for j in range(W) if (r, j) in own])
        for j in range(W):
            if fused:
                sigs = []
                for s in members:
                    if (s, j) not in st.piece:
                        continue
                    g0, g1 = st.gathered[(s, j)]
                    to = (g0, g1, 0, p.k)
                    if s == r and st.a2a:
                        xr, trig = own[(r, j)]
                        sigs.append(st.xmap.copy_map(xr, st.ag, to, trig, st.local_engine))
                    else:
                        trig = own[(r, j)] if s == r else arrived[(s, j)]
                        sigs.append(st.amap.copy_map(st.piece[(s, j)], st.ag, to, trig,
                                                     st.local_engine))
                    scatters.append(((g0, g1, 0, p.n), st.piece[(s, j)][:2]))
                b0, b1 = st.blocks[j]
                if b1 > b0:
                    launches.append(([(b0, b1, 0, p.n)], 0, p.k))
                    gates.append(sigs)
            else:  # one small GEMM per received piece, straight into C
                for s in peers:
                    if (s, j) in st.piece:
                        x, y = st.piece[(s, j)][:2]
                        launches.append(([(x, y, 0, p.n)], 0, p.k))
                        gates.append([arrived[(s, j)]])
        kernel, starts = _launch_kernel(p, st.c, launches, "AG")
        cmap = AddressMap(st.c, r, W, "store", kernel.local_writes(), local_ok=True)
        for src, (x, y) in scatters:  # each gathered piece's rows back to their place in C
            done = cmap.track(src, after=1, whole=True)
            cmap.copy_map(src, st.c, (x, y, 0, p.n), done, st.local_engine, signal=False)
    if starts:  # the first launch also waits on the pushes' triggers: they go first in
        gates[0] = list(gates[0]) + own_sigs  # program order (resident from the start)
    kernel = _gate_launches(kernel, starts, gates)
    return st.plan(kernel, cmap, "ficco")


def _empty(p: Problem, space: TileSpace) -> Kernel:
    """A kernel with no work (a phase of executors only)."""
    return Kernel(TiledGemm("AG", "B", True, p.kernel), space, np.zeros((0, 6), np.int64),
                  np.zeros(0, np.int64), np.zeros(0, np.int64), p.stage_size)


def _shard_order(p: Problem) -> tuple[Executor, list[int]]:
    """Shard-based overlap's transfers: one copy engine, and the peers in step order (step
    s's shard comes from rank r + s, so this rank's goes to r - s)."""
    return Executor("dma", 0, streams=True), [(p.rank - s) % p.world for s in range(1, p.world)]


def shard(p: Problem, op: Operation) -> Plan:
    """Shard-based overlap (PyTorch's async TP): the local shard copied into the symmetric
    buffer and GEMMed; at step s the whole shard of rank r + s arrives from that one peer
    (pushed by its copy engine, every rank's pushes on one engine in step order) while the
    previous shard's GEMM runs."""
    W, r = p.world, p.rank
    slots = Slots()
    st = _Setup(p, op, slots, lambda q: [], "shard", whole=True)
    p = st.p  # its GEMM launches' kernel
    region = st.piece.get((r, 0))
    gates, launches, pushes = [], [], []
    engine, order = _shard_order(p)
    if st.a2a:  # this rank's block for each peer (an uneven dispatch: its own rows there)
        m = st.push_map(("shard", 0))
        for d in order:
            to = st.piece_at(d, r, 0)
            if to is not None:
                pushes.append(m.dma_map(st.source(0, d)[1], d, op="store", after=1,
                                        to=st.ag_at(d), to_region=to, executor=engine))
    if region is not None:
        if st.a2a:
            xr = st.source(0, r)[1]
            own = st.xmap.copy_map(xr, st.ag, region, st.xmap.track(xr, after=1),
                                   st.local_engine)
        else:
            priv = st.private_region
            own = st.amap.copy_map(priv, st.ag, region, st.amap.track(priv, after=1),
                                   st.local_engine)
            if order:
                pushes.append(st.push_map(("shard", 0)).dma_map(
                    st.private_region, order, op="store", after=1, to=st.ag,
                    to_region=region, executor=engine))
        launches.append(([(region[0], region[1], 0, p.n)], 0, p.k))
        gates.append([own])
    for s in range(1, W):
        c = (r + s) % W
        if (c, 0) in st.piece:
            x, y = st.piece[(c, 0)][:2]
            launches.append(([(x, y, 0, p.n)], 0, p.k))
            gates.append([st.amap.track(st.piece[(c, 0)], after=1)])
    if gates:  # the pushes' triggers go first in program order
        gates[0] = gates[0] + pushes
    kernel, starts = _launch_kernel(p, st.c, launches, "AG")
    cmap = AddressMap(st.c, r, W, "store", kernel.local_writes(), local_ok=True)
    return st.plan(_gate_launches(kernel, starts, gates), cmap, "ficco")


def ideal(p: Problem, op: Operation) -> Plan:
    """FiCCO's ideal (perfect decomposition, no losses): the whole GEMM alone and the whole
    collective by DMA on every link alone, each on a clock of its own; the time is the
    longer."""
    slots = Slots()
    plan = _comm_phase(p, op, slots, "comm", True, "dma")
    space = _untracked(p, slots, "C", [(0, p.rows_here)])  # one GEMM over all its rows,
    # tiled as the serial baseline's (``plain_gemm``), not per sender's block
    kernel, _ = _launch_kernel(p, space, [([(0, p.rows_here, 0, p.n)], 0, p.k)], "AG")
    cmap = AddressMap(space, p.rank, p.world, "store", kernel.local_writes(), local_ok=True)
    plan.phases.append(KernelPhase("gemm", kernel, [cmap], plan.phases[0].stream,
                                   clock="gemm"))
    plan.isolated = True
    return plan


def serial(p: Problem, op: Operation) -> Plan:
    """The serial baseline: the library collective as a CU kernel, then one GEMM (T3's
    ``sequential``), the received data landing as one stream (paper-scale transfers)."""
    from collectives.baselines import sequential
    from emulator.engine.plan import StepsPhase

    plan = sequential(p, op, "direct")
    for ph in plan.phases:
        if isinstance(ph, StepsPhase):
            for step in ph.steps:
                step.steady = True
    return plan


def pick(p: Problem) -> str:
    """The heuristic (static): M <= K -> uniform-fused-2D; else by the sharded GEMM's
    op-to-byte ratio (FLOPs over the bytes of A, B and C) against the machine balance
    (peak FLOP/s over HBM bytes/s): below ``otb_low`` x the balance uniform-fused-1D,
    above ``otb_high`` x hetero-unfused-1D, else hetero-fused-1D."""
    return _pick(p)[0]


def _pick(p: Problem) -> tuple[str, str]:
    """``pick``'s schedule and the reason, in words."""
    if p.m <= p.k:
        return "uniform-fused-2d", f"M = {p.m} <= K = {p.k}"
    e = p.dtype.itemsize if hasattr(p.dtype, "itemsize") else np.dtype(p.dtype).itemsize
    otb = 2.0 * p.m * p.n * p.k / ((p.m * p.k + p.n * p.k + p.m * p.n) * e)
    # the machine balance as the study's heuristic states it: peak FLOP/s over the
    # datasheet's HBM rate (247 FLOP/B on MI300X), not the model's sustained ceiling
    balance = (p.spec.peak_flops("fp16" if e == 2 else "fp32")
               / (p.spec.hbm_datasheet or p.spec.hbm_bw))
    low, high = p.param("otb_low", OTB_LOW.default), p.param("otb_high", OTB_HIGH.default)
    where = (f"M = {p.m} > K = {p.k}; OTB {otb:.0f} FLOP/B = {otb / balance:.2f} x the "
             f"machine balance {balance:.0f} FLOP/B")
    if otb < low * balance:
        return "uniform-fused-1d", f"{where} < otb_low = {low:g}"
    if otb > high * balance:
        return "hetero-unfused-1d", f"{where} > otb_high = {high:g}"
    return "hetero-fused-1d", f"{where}, from otb_low = {low:g} to otb_high = {high:g}"


def _picked(p: Problem, op: Operation, executor: str = "dma") -> Plan:
    """The heuristic's schedule, with its pick recorded in the plan."""
    sched, why = _pick(p)
    plan = schedule(p, op, sched, executor=executor)
    plan.choice = {"chosen": f"ficco-{sched}", "why": why}
    return plan


def picks(p: Problem, executor: str = "dma") -> tuple[str, dict]:
    """The configuration whose plan ``_picked`` builds (the schedule's, on ``executor``)
    and the choice it records."""
    sched, why = _pick(p)
    return (f"ficco-{sched}" if executor == "dma" else f"ficco-cu-{sched}",
            {"chosen": f"ficco-{sched}", "why": why})


def auto(p: Problem, op: Operation) -> Plan:
    return _picked(p, op)


def auto_cu(p: Problem, op: Operation) -> Plan:
    return _picked(p, op, executor="cu")


# ---------------------------------------------------------------- the dispatch operation
def dispatch_layout(p: Problem, algorithm: str, recv_buffer: bool = False):
    """The serial baseline's arrays: X (this rank's blocks, one per destination), AG (the
    rows received, in source order), B and C."""
    arrays = [("B", (p.k, p.n), p.dtype), ("C", (p.rows_most, p.n), p.dtype),
              ("AG", (p.rows_most, p.k), p.dtype), ("X", (max(1, p.x_rows), p.k), p.dtype)]
    return arrays, {"B": ("B", 0), "A": ("X", 0)}, [("C", (0, p.rows_here, 0, p.n))]


def dispatch_steps(p: Problem, slots: Slots, algorithm: str, nmc: bool) -> list:
    """The library all-to-all as a CU kernel: block d of X to rank d's AG rows of this
    rank's chunk, to every peer at once; the own block copied; wait for every peer's."""
    from collectives.direct import _gather_wait
    from emulator.engine.steps import CuStep

    i = p.rank
    base = slots.alloc("a2a recv from", p.world)
    steps = []
    for d in p.others + [i]:
        x0, x1 = p.x_block(i, d)
        a, b = p.recv_chunks(d)[i]
        if b == a:  # no token of this rank's for d's expert
            continue
        steps.append(CuStep(f"a2a send block {d}", "a2a", [("X", (x0, x1, 0, p.k))],
                            ("AG", (a, b, 0, p.k)), d,
                            signal_slots=[base + i] if d != i else [],
                            signal_elems=[(b - a) * p.k] if d != i else [],
                            concurrent=bool(steps)))
    if p.world > 1:
        wait, nbytes = _gather_wait(p, slots, base, "a2a blocks",
                                    lambda s: int(p.routed[s, i]) * p.k)
        writers = sum(1 for s in p.others if p.routed[s, i])
        steps.append(CuStep("a2a final", "a2a", [], None, i, wait, nbytes,
                            writers=max(1, writers)))
    return steps


def _routed(cfg, world: int) -> np.ndarray:
    """The run's dispatch matrix (``dispatch_rows``)."""
    from collectives.common import dispatch_rows

    return dispatch_rows(cfg.m, world, cfg.param("expert_skew"))


def dispatch_inputs(cfg, rank: int, world: int) -> dict[str, np.ndarray]:
    """This rank's tokens (its block for each destination, in destination order) and its
    expert's weights."""
    from collectives.reference import make_inputs

    rows = int(_routed(cfg, world)[rank].sum())
    x, w = make_inputs(rows, cfg.n, cfg.k, cfg.dtype, cfg.values, cfg.seed, rank)
    return {"A": x, "B": w}


def dispatch_collective(comm, x: np.ndarray, routed: np.ndarray) -> np.ndarray:
    """MPI's ``Alltoallv`` of the dispatch: block d of ``x`` (``routed[rank, d]`` rows) to
    rank d; the rows received from every source, in source order."""
    from mpi4py import MPI

    cols, me = x.shape[1], comm.rank
    out = np.empty((int(routed[:, me].sum()), cols), np.float32)
    comm.Alltoallv([np.ascontiguousarray(x, np.float32), (routed[me] * cols).tolist(), None,
                    MPI.FLOAT], [out, (routed[:, me] * cols).tolist(), None, MPI.FLOAT])
    return out


def dispatch_reference(comm, cfg, x: dict[str, np.ndarray]):
    """numpy's GEMM of the rows MPI's ``Alltoallv`` delivers; the tolerance allows one
    rounding per accumulation step of the 2D schedule."""
    from collectives.reference import compute_reference

    return compute_reference(comm, x["A"], x["B"], cfg.dtype, cfg.values,
                             _routed(cfg, comm.size), dispatch_collective, True, comm.size,
                             cfg.split_k, comm.size)


# ---------------------------------------------------------------- losses (DIL, CIL)
SPLITS = params.table("ficco_dil_splits", (8, 64), "pieces",
                      "the ways FiCCO's DIL splits a GEMM (by rows or by K)",
                      "paper: FiCCO (Pal et al., arXiv:2512.10236), inefficiency losses: "
                      "GEMMs split 8 and 64 ways")


def _pieces(n: int, ways: int) -> dict[int, int]:
    """The sizes of ``n`` split ``ways`` ways (ring chunks) and how many of each."""
    out: dict[int, int] = {}
    for a, b in ring_chunks(n, ways):
        if b > a:
            out[b - a] = out.get(b - a, 0) + 1
    return out


def _untracked(p: Problem, slots: Slots, buffer: str, blocks) -> TileSpace:
    """An output space nothing tracks: its tiles take no tracker slots (a GEMM alone, an
    empty kernel's)."""
    return TileSpace(buffer, _grid(p, blocks, p.n), slots.alloc(f"{buffer} tile", 0))


def dil(p: Problem, op: Operation) -> Plan:
    """The runs DIL is computed from (Pal et al., FiCCO, arXiv:2512.10236), each phase isolated on a clock
    of its own: ``comm``, the whole collective by DMA on every link; ``comm8``, the same in
    W pieces per shard, one step after another (FiCCO's steps); ``gemm``, the whole GEMM;
    ``rows<S>-<h>`` / ``k<S>-<d>`` (S = 8, 64): one GEMM of the GEMM split S ways by rows
    (h rows) or by K (depth d, accumulating into C), alone. The report sums each shape's
    time x its count (the decomposed operations' total isolated time) over the whole's."""
    slots = Slots()
    first = _comm_phase(p, op, slots, "comm", True, "dma")
    phases = first.phases + _comm_phase(p, op, slots, "comm8", False, "dma").phases
    stream = phases[0].stream
    m = p.rows_here
    full = _untracked(p, slots, "C", [(0, m)])

    def gemm_phase(name: str, q: Problem, space: TileSpace, rows: int, k0: int, k1: int,
                   op_: str):
        kernel, _ = _launch_kernel(q, space, [([(0, rows, 0, p.n)], k0, k1)], "AG")
        cmap = AddressMap(space, p.rank, p.world, op_, kernel.local_writes(), local_ok=True)
        phases.append(KernelPhase(name, kernel, [cmap], stream, clock=name))

    gemm_phase("gemm", p, full, m, 0, p.k, "store")
    for ways in SPLITS:  # each shape's launch runs the kernel chosen for it
        for h in _pieces(m, ways):
            q = p.with_launch(h)
            gemm_phase(f"rows{ways}-{h}", q, _untracked(q, slots, "CL", [(0, h)]), h, 0, p.k,
                       "store")
        for d in _pieces(p.k, ways):
            q = p.with_launch(m, p.n, d)
            gemm_phase(f"k{ways}-{d}", q, TileSpace("CL", _grid(q, [(0, m)], p.n),
                                                   full.slot_base), m, 0, d, "update")
    return Plan(first.layout + [("CL", (p.rows_most, p.n), p.dtype)], first.inputs, phases,
                slots,
                first.result, isolated=True, arbitration=ARBITRATION)


# each CIL measurement of ``cil``: (transfers' kind, its GEMM alone, its transfers alone);
# the run of both together is ``cil-<kind>`` (``.kernel`` and ``.executors`` windows)
CIL_RUNS = (("dma", "rows8", "comm8"), ("cu", "rows8", "comm8"),
            ("shard", "shard-gemm", "shard-comm"))


def cil(p: Problem, op: Operation) -> Plan:
    """The runs CIL is computed from: ``comm8`` (the collective in W pieces per shard by
    DMA, alone), ``rows8`` (the GEMM as 8 launches by rows, alone) and ``cil-dma`` /
    ``cil-cu``: the same launches run concurrently with the same pieces moved by DMA
    engines / by CU-driven transfers (no dependence between them), whose ``.kernel`` and
    ``.executors`` windows the report sets against the runs alone. Shard-based overlap's
    CIL the same way: ``shard-comm`` (every shard whole, to one peer after another on one
    copy engine, as ``shard`` moves them), ``shard-gemm`` (the GEMM as W launches by rows,
    one shard's rows each) and ``cil-shard``, the two together."""
    (_, rows, pieces), _, (_, shard_gemm, shard_comm) = CIL_RUNS
    slots = Slots()
    first = _comm_phase(p, op, slots, pieces, False, "dma")

    def launches(ways: int):
        blocks = [(a, b) for a, b in ring_chunks(p.rows_here, ways) if b > a]
        q = p.with_launch(max(b - a for a, b in blocks))  # the launches' kernel

        def kernel() -> Kernel:
            space = _untracked(q, slots, "C", blocks)
            return _launch_kernel(q, space, [([(a, b, 0, p.n)], 0, p.k) for a, b in blocks],
                                  "AG")[0]
        return kernel

    stream = first.phases[0].stream

    def alone(name: str, kernel: Kernel) -> KernelPhase:
        return KernelPhase(name, kernel, [AddressMap(kernel.space, p.rank, p.world, "store",
                                                     kernel.local_writes(), local_ok=True)],
                           stream, clock=name)

    rows8, shards = launches(SPLITS[0]), launches(p.world)
    phases = first.phases + [alone(rows, rows8())]
    phases += _comm_phase(p, op, slots, "cil-dma", False, "dma", rows8).phases
    phases += _comm_phase(p, op, slots, "cil-cu", False, "cu", rows8).phases
    phases += _comm_phase(p, op, slots, shard_comm, True, "dma", one_engine=True).phases
    phases.append(alone(shard_gemm, shards()))
    phases += _comm_phase(p, op, slots, "cil-shard", True, "dma", shards,
                          one_engine=True).phases
    return Plan(first.layout, first.inputs, phases, slots, first.result, isolated=True,
                arbitration=ARBITRATION)


def _comm_phase(p: Problem, op: Operation, slots: Slots, name: str, whole: bool,
                executor: str, kernel_of=None, one_engine: bool = False,
                cu_dispatch: str | None = None) -> Plan:
    """A phase of the collective alone (or beside ``kernel_of()``'s kernel): every shard
    pushed whole or in W pieces to every peer (``one_engine``: to one peer after another,
    r - 1, r - 2, ..., on one copy engine: shard-based overlap's transfers); ``cu_dispatch``:
    how a CU kernel's blocks get their CUs (default: the run's ``cu_dispatch``)."""
    r = p.rank
    st = _Setup(p, op, slots, lambda q: [], executor, whole=whole, output=False,
                cu_dispatch=cu_dispatch)
    engine, peers = _shard_order(p) if one_engine else (None, p.others)
    for j in range(st.steps):
        for d in peers:
            st.push(j, d, engine)
        if (r, j) in st.piece:
            if st.a2a:
                xr = st.source(j, r)[1]
                st.xmap.copy_map(xr, st.ag, st.piece[(r, j)], st.xmap.track(xr, after=1),
                                 st.local_engine)
    for (s, _), region in st.piece.items():
        if s != r:
            st.amap.track(region, after=1)
    kernel = kernel_of() if kernel_of else _empty(p, st.c)
    cmap = AddressMap(kernel.space, r, p.world, "store", kernel.local_writes(), local_ok=True)
    plan = st.plan(kernel, cmap, name)
    ph = plan.phases[0]
    ph.clock = name
    ph.parts = kernel_of is not None
    return plan
