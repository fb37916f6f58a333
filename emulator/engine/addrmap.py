"""The address-space map: where every tile a producer writes goes (T3's configuration calls).

A collective is expressed as calls on maps, made before the producer runs. A
map covers one buffer's ``TileSpace`` (its tile grid and the tracker slots of
its tiles, identical on every rank, so a sender can name a receiver's slots):

- ``remote_map(region, dst_ranks, op, to=, keep_local=)``: the producer's
  writes to ``region`` go straight to peers (fine-grained peer stores or
  updates), into the same region or into ``to=(space, region)``; they are not
  written locally unless ``keep_local``;
- ``dma_map(region, dst_ranks, op, after=k, to=, executor=)``: the region is
  tracked; when every element has seen ``k`` writes (the producer's own and the
  peers'), the executor sends it to each destination as ``op``: DMA engine i
  (``Executor("dma", i)``, the default engine 0), NIC i (put, fence, flag put)
  or a concurrent CU-driven kernel (``Executor("cu", share=f)``, which can add
  local copies to the region on the way: ``adds=``);
- ``pull_map(region, src_rank, after=k, flag=, executor=)``: once this rank's
  ``flag`` signal completes (the source said its region is ready), a DMA engine
  of this rank gets ``region`` from ``src_rank`` into the same local region;
- ``flag_map(region, dst_ranks, flags, after=k)``: once the region is complete
  here, a DMA engine writes a flag (no data) into each destination's ``flags``
  space (the tiles of ``region`` there): what a pulling peer waits on;
- ``copy_map(region, to, to_region, trigger=, executor=)``: once ``trigger`` (any
  signal) completes, a DMA engine of this rank copies ``region`` into ``to_region``
  of the local buffer of ``to`` (a gather or a scatter); returns the signal of the
  copy's completion (over ``to``'s slots). A copy reads its region and claims no
  tile of this map (several copies may read one region);
- ``track(region, after=k)``: tracked, nothing forwarded (a finished chunk, or
  an input region a consumer waits for);
- ``local(region)``: written here with the producer's op, untracked (data that
  has nowhere to go: a one-rank job's chunk, an all-to-all block to itself).

A collective's map must place every tile of its space exactly once. A map built
with ``local_ok=True`` (a GEMM with no collective, a consumer's own output)
writes its unmapped tiles locally with the producer's own op. Regions are
rectangles made of whole tiles. A tile mapped twice or never (without
``local_ok``), a region that cuts a tile, a rank outside the job, a destination
region of another shape, or ``after`` smaller than the producer's own writes
raise ``MapError`` when the map is built, before anything runs.

Every entry returns its signal handle (a ``TrackedRegion``): what a work item, a
kernel launch or a persistent WG's exit poll can wait on.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from devices.commands import DMA0, DmaCommand, Executor
from devices.regions import RegularGrid, Region, region_elems, tile_grid
from devices.signals import Signal, TrackedRegion

OPS = ("store", "update")


class MapError(ValueError):
    """A map that cannot be right: overlapping, misaligned or out-of-range regions."""


@dataclass(frozen=True, eq=False)
class TileSpace:
    """A buffer's tile grid and the tracker slot of each tile (``slot_base + tile``)."""

    buffer: str
    tiles: np.ndarray
    slot_base: int

    def __post_init__(self):
        if not isinstance(self.tiles, RegularGrid):  # a grid computes its tiles when asked
            object.__setattr__(self, "tiles", np.asarray(self.tiles, np.int64).reshape(-1, 4))

    def _lists(self) -> tuple[list, list, dict]:
        """Tile id -> region (Python ints), -> elements, region -> id: built on first use
        (a timing-only run of millions of tiles never needs them)."""
        got = self.__dict__.get("_cache")
        if got is None:
            regions = [tuple(t) for t in self.tiles.tolist()]
            got = (regions, [(r1 - r0) * (c1 - c0) for r0, r1, c0, c1 in regions],
                   {r: i for i, r in enumerate(regions)})
            object.__setattr__(self, "_cache", got)
        return got

    @property
    def tile_elems(self) -> np.ndarray:
        """Elements of every tile (int64)."""
        t = self.tiles
        return (t[:, 1] - t[:, 0]) * (t[:, 3] - t[:, 2])

    def elems_of(self, ids) -> np.ndarray:
        """Elements of tiles ``ids`` (int64)."""
        t = self.tiles[np.asarray(ids, np.int64)]
        return (t[:, 1] - t[:, 0]) * (t[:, 3] - t[:, 2])

    @property
    def lazy(self) -> bool:
        return isinstance(self.tiles, RegularGrid)

    def __len__(self) -> int:
        return len(self.tiles)

    def slot(self, t: int) -> int:
        return self.slot_base + int(t)

    def region(self, t: int) -> Region:
        if self.lazy and "_cache" not in self.__dict__:
            return self.tiles.row(t)
        return self._lists()[0][t]

    def elems(self, t: int) -> int:
        if self.lazy and "_cache" not in self.__dict__:
            return int(self.elems_of([t])[0])
        return self._lists()[1][t]

    def tile_at(self, region: Region) -> int:
        t = self._lists()[2].get(tuple(region))
        if t is None:
            raise MapError(f"{region} is not a tile of {self.buffer}")
        return t

    def tiles_at(self, regions: np.ndarray) -> np.ndarray:
        """``tile_at`` of every row of ``regions`` (n x 4) at once: tiles do not overlap,
        so a tile is known by its first row and column (a sorted key, no dict of every
        tile); MapError if a region is not exactly a tile."""
        regions = np.asarray(regions, np.int64).reshape(-1, 4)
        keyed = self.__dict__.get("_keyed")
        if keyed is None:
            t = np.asarray(self.tiles, np.int64).reshape(-1, 4)
            width = int(t[:, 3].max()) + 1 if len(t) else 1
            key = t[:, 0] * width + t[:, 2]
            order = np.argsort(key, kind="stable")
            keyed = (width, key[order], order, t)
            object.__setattr__(self, "_keyed", keyed)
        width, keys, order, t = keyed
        if not len(keys):
            bad = np.ones(len(regions), bool)
        else:  # a key off the grid finds a tile of other bounds: the comparison catches it
            ids = order[np.minimum(np.searchsorted(keys, regions[:, 0] * width + regions[:, 2]),
                                   len(keys) - 1)]
            bad = (t[ids] != regions).any(axis=1)
        if bad.any():
            raise MapError(f"{tuple(int(x) for x in regions[np.flatnonzero(bad)[0]])} is not "
                           f"a tile of {self.buffer}")
        return ids

    def tiles_in(self, region: Region) -> list[int]:
        """Tile ids exactly covering ``region``; MapError if it cuts a tile."""
        cache = self.__dict__.get("_cache")
        exact = cache[2].get(tuple(map(int, region))) if cache is not None else None
        if exact is not None:  # the common case: a map entry per tile
            return [exact]
        if self.lazy:
            ids = self.tiles.tiles_in(region)
            if ids is not None:
                return ids
        r0, r1, c0, c1 = (int(x) for x in region)
        by_row = self.__dict__.get("_by_row")
        if by_row is None:  # tile ids sorted by first row, to look at the region's rows only
            order = np.argsort(self.tiles[:, 0], kind="stable")
            by_row = (order, self.tiles[order, 0])
            object.__setattr__(self, "_by_row", by_row)
        order, rows = by_row
        cand = np.sort(order[np.searchsorted(rows, r0, "left"):np.searchsorted(rows, r1, "left")])
        t = self.tiles[cand]
        inside = (t[:, 1] <= r1) & (t[:, 2] >= c0) & (t[:, 3] <= c1)
        ids = cand[inside].tolist()
        t = self.tiles
        covered = int(((t[ids, 1] - t[ids, 0]) * (t[ids, 3] - t[ids, 2])).sum()) if ids else 0
        if covered != region_elems(region):
            raise MapError(f"region {region} of {self.buffer} is not a union of whole tiles")
        return ids


@dataclass(frozen=True)
class Target:
    """One remote write of a tile: where it lands and which tracker slot it signals."""

    rank: int
    buffer: str
    region: Region
    op: str
    slot: int


@dataclass(frozen=True)
class Route:
    """What happens to one tile the producer finishes."""

    local_op: str  # "store", "update" or "none"
    targets: tuple[Target, ...] = ()
    slot: int = -1  # the local tracker slot the local write signals (-1: untracked)


@dataclass
class _Entry:
    kind: str  # "remote", "dma" or "track"
    region: Region
    tiles: list[int]
    dsts: tuple[int, ...] = ()
    op: str = "update"
    after: int = 1
    to: TileSpace | None = None
    to_region: Region | None = None
    keep_local: bool = False
    executor: Executor = DMA0
    adds: tuple[tuple[str, Region], ...] = ()
    src_rank: int = -1  # pull: the rank read from
    flag: TrackedRegion | None = None  # pull: the source's flag it waits for
    signal: TrackedRegion | None = None
    whole: bool = False  # track: one tracker counter for the whole region (its first tile's)


class Routes(Mapping):
    """Tile id -> ``Route`` for the tiles the producer writes. Routes with targets are kept
    one by one; the others (a local write with the producer's op, tracked or not) are two
    arrays, so a map of millions of tiles costs no object per tile: ``plain[t]`` (its
    route has no target) and ``slot[t]`` (the tracker slot its local write signals, or
    -1)."""

    def __init__(self, producer_op: str, written: np.ndarray, slot: np.ndarray,
                 explicit: dict[int, Route]):
        self.producer_op = producer_op
        self.written = written
        self.slot = slot
        self.explicit = explicit
        self.plain = written.copy()
        if explicit:
            self.plain[list(explicit)] = False
        self._default = Route(producer_op)

    def __getitem__(self, t: int) -> Route:
        r = self.explicit.get(t)
        if r is not None:
            return r
        if 0 <= t < len(self.written) and self.written[t]:
            s = int(self.slot[t])
            return self._default if s < 0 else Route(self.producer_op, slot=s)
        raise KeyError(t)

    def parts(self, t: int) -> tuple[str, int, tuple]:
        """(local op, slot, targets) of tile ``t``'s route, without making a ``Route`` for
        a plain tile (a persistent kernel's rounds ask per WG)."""
        r = self.explicit.get(t)
        if r is not None:
            return r.local_op, r.slot, r.targets
        if 0 <= t < len(self.written) and self.written[t]:
            return self.producer_op, int(self.slot[t]), ()
        raise KeyError(t)

    def __iter__(self):
        return iter(np.flatnonzero(self.written).tolist())

    def __len__(self) -> int:
        return int(self.written.sum())


def route_parts(routes, t: int) -> tuple[str, int, tuple]:
    """``Routes.parts`` of ``routes`` (a ``Routes`` or a plain dict of ``Route``s)."""
    parts = getattr(routes, "parts", None)
    if parts is not None:
        return parts(t)
    r = routes[t]
    return r.local_op, r.slot, r.targets


@dataclass
class CompiledMap:
    routes: Routes  # tile id -> route, for tiles the producer writes
    commands: list[DmaCommand]  # one per (dma_map entry, destination) and per track entry
    incoming: dict[int, tuple[int, str, str]] = field(default_factory=dict)  # id(signal) ->
    # (peer writes per element, their op, the buffer they land in)
    signals: list[TrackedRegion] = field(default_factory=list)  # one per tracked entry
    whole: dict[int, int] = field(default_factory=dict)  # slot of a region tracked whole ->
    # the element-writes the producer's own tiles make into it
    steady: set[int] = field(default_factory=set)  # id(signal): peers' data lands as one
    # stream (``Dram.stream``), the map was built with ``steady=True``


def _as_ids(tiles) -> np.ndarray:
    """Tile ids (a ``range`` from a regular grid, or a list) as an int64 array."""
    if isinstance(tiles, range):
        return np.arange(tiles.start, tiles.stop, tiles.step, dtype=np.int64)
    return np.asarray(tiles, np.int64)


class AddressMap:
    """The map over one ``TileSpace``. ``local_writes[t]`` is how many producer WGs write
    tile t (0: the producer never writes it; S for a split-K GEMM)."""

    def __init__(self, space: TileSpace, rank: int, world: int, producer_op: str = "store",
                 local_writes: np.ndarray | None = None, incoming_op: str = "update",
                 local_ok: bool = False, steady: bool = False):
        if producer_op not in OPS:
            raise MapError(f"producer op {producer_op!r} not in {OPS}")
        self.space = space
        self.rank = rank
        self.world = world
        self.producer_op = producer_op
        self.incoming_op = incoming_op
        self.local_ok = local_ok
        self.steady = steady  # data landing in its regions is served as one stream each
        self.local_writes = (np.ones(len(space), np.int64) if local_writes is None
                             else np.asarray(local_writes, np.int64))
        self._owner = np.full(len(space), -1, np.int32)  # tile -> the entry that maps it
        self.entries: list[_Entry] = []
        self.copies: list[DmaCommand] = []  # copy_map's commands, in the order they were made
        self._compiled: tuple | None = None  # (entries and copies it was compiled from, it)

    @property
    def buffer(self) -> str:
        return self.space.buffer

    @property
    def tiles(self) -> np.ndarray:
        return self.space.tiles

    def tiles_in(self, region: Region) -> list[int]:
        return self.space.tiles_in(region)

    # ---------------------------------------------------------------- building
    def _dsts(self, dst_ranks: int | Sequence[int], to: TileSpace | None) -> tuple[int, ...]:
        dsts = (dst_ranks,) if isinstance(dst_ranks, (int, np.integer)) else tuple(dst_ranks)
        if not dsts:
            raise MapError("no destination rank")
        for d in dsts:
            if not 0 <= int(d) < self.world:
                raise MapError(f"destination rank {d} outside 0..{self.world - 1}")
            if int(d) == self.rank and (to is None or to.buffer == self.buffer):
                raise MapError(f"region mapped onto itself on rank {self.rank}")
        if len(set(dsts)) != len(dsts):
            raise MapError(f"destination ranks {dsts} repeat")
        return tuple(int(d) for d in dsts)

    def _where(self, entry: _Entry) -> str:
        if entry.kind == "dma":
            return f"-> ranks {list(entry.dsts)} {entry.op} by {entry.executor.queue}"
        if entry.kind == "pull":
            return f"pulled from rank {entry.src_rank}"
        if entry.kind == "flag":
            return f"flags to ranks {list(entry.dsts)}"
        return "kept locally"

    def _add(self, entry: _Entry) -> None:
        if entry.op not in OPS:
            raise MapError(f"op {entry.op!r} not in {OPS}")
        if entry.after < 1:
            raise MapError(f"after={entry.after} must be >= 1")
        if entry.to is not None:
            if entry.to_region is None:
                entry.to_region = entry.region
            r, d = entry.region, entry.to_region
            if (r[1] - r[0], r[3] - r[2]) != (d[1] - d[0], d[3] - d[2]):
                raise MapError(f"destination region {d} is not the shape of {r}")
        tiles, lw, owner = entry.tiles, self.local_writes, self._owner
        ids = _as_ids(tiles)
        seen = lw[ids]
        lo, hi = (int(seen.min()), int(seen.max())) if len(seen) else (0, 0)
        if lo != hi:
            raise MapError(f"region {entry.region}: tiles see different numbers of local "
                           f"writes {sorted({int(x) for x in np.unique(seen)})}")
        if len(seen) and entry.kind in ("dma", "track") and entry.after < lo:
            raise MapError(f"region {entry.region}: after={entry.after} is below the "
                           f"producer's own {int(lw[tiles[0]])} writes")
        taken = ids[owner[ids] >= 0]
        if len(taken):
            t = int(taken[0])
            prev = self.entries[int(owner[t])]
            raise MapError(f"tile {self.space.region(t)} of {self.buffer} mapped twice: "
                           f"by {prev.kind} {prev.region} and by {entry.kind} {entry.region}")
        owner[ids] = len(self.entries)
        if entry.kind in ("dma", "track", "pull", "flag"):
            sp = self.space
            if entry.whole:  # one counter: the region's first tile's slot (the tiles cover
                # the region exactly: ``tiles_in``)
                ids = ids[:1]
                elems = np.array([region_elems(entry.region) * entry.after], np.int64)
            else:
                elems = sp.elems_of(ids) * entry.after
            entry.signal = TrackedRegion(
                name=f"{self.buffer}{list(entry.region)}",
                slots=sp.slot_base + ids,
                thresholds=elems,
                label=f"after={entry.after}, {self._where(entry)}", meta={"after": entry.after})
        self.entries.append(entry)

    def remote_map(self, region: Region, dst_ranks: int | Sequence[int], op: str = "update",
                   to: TileSpace | None = None, to_region: Region | None = None,
                   keep_local: bool = False) -> None:
        self._add(_Entry("remote", region, self.tiles_in(region), self._dsts(dst_ranks, to), op,
                         1, to, to_region, keep_local))

    def dma_map(self, region: Region, dst_ranks: int | Sequence[int], op: str = "update",
                after: int = 2, to: TileSpace | None = None,
                to_region: Region | None = None, executor: Executor = DMA0,
                adds: Sequence[tuple[str, Region]] = ()) -> Signal:
        if adds and executor.kind != "cu":
            raise MapError(f"region {region}: only a CU kernel adds copies on the way "
                           f"(executor {executor.queue})")
        self._add(_Entry("dma", region, self.tiles_in(region), self._dsts(dst_ranks, to), op,
                         after, to, to_region, executor=executor, adds=tuple(adds)))
        return self.entries[-1].signal

    def track(self, region: Region, after: int = 1, whole: bool = False) -> Signal:
        """``whole``: the region's tiles count into one tracker counter (a region nothing
        waits on tile by tile; its writes signal one slot per stage, not one per tile)."""
        self._add(_Entry("track", region, self.tiles_in(region), (), "update", after,
                         whole=whole))
        return self.entries[-1].signal

    def pull_map(self, region: Region, src_rank: int, flag: Signal, after: int = 1,
                 executor: Executor = DMA0) -> Signal:
        """Get ``region`` of ``src_rank``'s buffer into this rank's once ``flag`` (a local
        signal the source writes) completes; returns the signal of its arrival here."""
        if executor.kind != "dma":
            raise MapError(f"region {region}: pulls are DMA reads, not {executor.queue}")
        if not 0 <= src_rank < self.world or src_rank == self.rank:
            raise MapError(f"pull source rank {src_rank} must be a peer in 0..{self.world - 1}")
        self._add(_Entry("pull", region, self.tiles_in(region), (), "store", after,
                         executor=executor, src_rank=int(src_rank), flag=flag))
        return self.entries[-1].signal

    def flag_map(self, region: Region, dst_ranks: int | Sequence[int], flags: TileSpace,
                 after: int = 1, executor: Executor = DMA0) -> Signal:
        """When ``region`` is complete here, write a flag into each destination's
        ``flags`` space (no data); returns the local completion signal."""
        self._add(_Entry("flag", region, self.tiles_in(region), self._dsts(dst_ranks, flags),
                         "update", after, flags, executor=executor))
        return self.entries[-1].signal

    def copy_map(self, region: Region, to: TileSpace, to_region: Region, trigger: Signal,
                 executor: Executor = DMA0, signal: bool = True) -> Signal | None:
        """Copy ``region`` of this rank's buffer into ``to_region`` of ``to`` (a local
        buffer, or another region of this one) on a DMA engine once ``trigger`` completes;
        returns the signal of the copy's completion (``signal=False``: nothing waits for
        it, none is kept; the phase still ends after it)."""
        if executor.kind != "dma":
            raise MapError(f"region {region}: local copies run on a DMA engine, not "
                           f"{executor.queue}")
        r, d = tuple(map(int, region)), tuple(map(int, to_region))
        if (r[1] - r[0], r[3] - r[2]) != (d[1] - d[0], d[3] - d[2]):
            raise MapError(f"copy destination {d} is not the shape of {r}")
        if to.buffer == self.buffer and r[0] < d[1] and d[0] < r[1] and r[2] < d[3] \
                and d[2] < r[3]:
            raise MapError(f"copy of {r} onto itself in {self.buffer}")
        if not (r[0] >= 0 and r[2] >= 0 and r[1] > r[0] and r[3] > r[2]):
            raise MapError(f"copy source {r} of {self.buffer} is empty or negative")
        if not signal:
            self.copies.append(DmaCommand(
                trigger=trigger, buffer=self.buffer, src=r, dst_rank=self.rank,
                dst_buffer=to.buffer, dst=d, op="store", executor=executor, copy=True))
            return None
        tiles = np.asarray(to.tiles_in(d), np.int64)
        elems = to.elems_of(tiles)
        slots = to.slot_base + tiles
        result = TrackedRegion(f"{to.buffer}{list(d)} copy", slots, elems,
                               f"a copy of {self.buffer}{list(r)} by {executor.queue}",
                               {"after": 1})
        self.copies.append(DmaCommand(
            trigger=trigger, result=result, buffer=self.buffer, src=r, dst_rank=self.rank,
            dst_buffer=to.buffer, dst=d, op="store", dst_slots=slots.tolist(),
            dst_elems=elems.tolist(), executor=executor, copy=True))
        return result

    def flag_signal(self, flags: TileSpace, region: Region, label: str = "") -> Signal:
        """The signal of the flags a peer's ``flag_map`` writes here for ``region``."""
        tiles = flags.tiles_in(region)
        return TrackedRegion(f"{flags.buffer} flags{list(region)}",
                             np.array([flags.slot(t) for t in tiles], np.int64),
                             np.array([region_elems(flags.region(t)) for t in tiles], np.int64),
                             label or "flag from the source", {"after": 1})

    def local(self, region: Region) -> None:
        """The region stays here, written with the producer's op, untracked (a one-rank
        collective's own chunk, an all-to-all's block to itself)."""
        self._add(_Entry("local", region, self.tiles_in(region), (), self.producer_op))

    # ---------------------------------------------------------------- compiling
    def _dst_tiles(self, entry: _Entry) -> tuple[TileSpace, list[int]]:
        """The destination space and, per source tile, the destination tile."""
        space = entry.to or self.space
        if entry.to is None:
            return space, list(entry.tiles)
        dr, dc = entry.to_region[0] - entry.region[0], entry.to_region[2] - entry.region[2]
        src = np.asarray(self.space.tiles[np.asarray(entry.tiles, np.int64)], np.int64)
        return space, space.tiles_at(src + np.array([dr, dr, dc, dc])).tolist()

    def compile(self) -> CompiledMap:
        """Per-tile routes and the DMA queue entries; MapError if a tile is never mapped.
        Compiled once while no entry is added: every run of a plan (a point's
        counterfactual runs) takes the same routes and commands (a run reads them and sets
        only the commands' program order, which it fixes anew)."""
        key = (len(self.entries), len(self.copies))
        if self._compiled is not None and self._compiled[0] == key:
            return self._compiled[1]
        compiled = self._compile()
        self._compiled = (key, compiled)
        return compiled

    def _compile(self) -> CompiledMap:
        if not self.local_ok and (self._owner < 0).any():
            never = np.flatnonzero(self._owner < 0).tolist()
            raise MapError(f"rank {self.rank}: {len(never)} tile(s) of {self.buffer} never "
                           f"mapped, e.g. {self.space.region(never[0])}: a collective's map "
                           f"must place every tile (local_ok=True keeps unmapped tiles local)")
        explicit: dict[int, Route] = {}
        slot = np.full(len(self.space), -1, np.int64)
        lw = self.local_writes
        whole: dict[int, int] = {}
        commands: list[DmaCommand] = []
        incoming: dict[int, tuple[int, str, str]] = {}
        signals: list[TrackedRegion] = []
        for entry in self.entries:
            space, dst_tiles = self._dst_tiles(entry)
            if entry.kind == "local":
                continue  # the default route: a local write with the producer's op
            if entry.kind == "remote":
                for t, dt in zip(entry.tiles, dst_tiles):
                    if lw[t] == 0:
                        continue
                    targets = tuple(Target(d, space.buffer, space.region(dt), entry.op,
                                           space.slot(dt)) for d in entry.dsts)
                    explicit[t] = Route(self.producer_op if entry.keep_local else "none",
                                        targets)
                continue
            if entry.kind == "pull":  # the slots count the data's arrival, not local writes
                sig = entry.signal
                commands.append(DmaCommand(
                    trigger=entry.flag, result=sig, buffer=self.buffer, src=entry.region, dst_rank=self.rank,
                    dst_buffer=self.buffer, dst=entry.region, op="store",
                    dst_slots=[int(s) for s in sig.slots],
                    dst_elems=[int(e) for e in sig.thresholds // entry.after],
                    executor=entry.executor, pull=True, src_rank=entry.src_rank))
                signals.append(sig)
                continue
            tiles = _as_ids(entry.tiles)
            mine = tiles[lw[tiles] > 0]
            slot[mine] = self.space.slot_base + (tiles[0] if entry.whole else mine)
            if entry.whole and len(mine):  # (every tile sees the same writes: ``_add``)
                whole[int(self.space.slot_base + tiles[0])] = (
                    region_elems(entry.region) * int(lw[mine[0]]))
            elems = (self.space.elems_of(tiles).tolist() if not entry.whole
                     else [int(entry.signal.thresholds[0]) // entry.after])
            trigger = entry.signal
            signals.append(trigger)
            local = int(lw[entry.tiles[0]])
            incoming[id(trigger)] = (entry.after - local, self.incoming_op, self.buffer)
            if entry.kind == "track":
                commands.append(DmaCommand(trigger=trigger, buffer=self.buffer, src=None))
                continue
            for d in entry.dsts:
                commands.append(DmaCommand(
                    trigger=trigger, buffer=self.buffer, src=entry.region, dst_rank=d,
                    dst_buffer=space.buffer, dst=entry.to_region or entry.region, op=entry.op,
                    dst_slots=[space.slot(dt) for dt in dst_tiles], dst_elems=elems,
                    executor=entry.executor, adds=entry.adds, flag_only=entry.kind == "flag"))
        routes = Routes(self.producer_op, lw > 0, slot, explicit)
        return CompiledMap(routes, commands + self.copies, incoming, signals, whole,
                           {id(g) for g in signals} if self.steady else set())
