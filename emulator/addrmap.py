"""The address-space map: where every tile a producer writes goes (T3's configuration calls).

A collective is expressed as calls on this map, made before the producer runs:

- ``remote_map(region, dst_rank, op)``: the producer's writes to ``region`` go
  straight to the same region of ``dst_rank`` (fine-grained peer stores or
  updates) and are not written locally;
- ``dma_map(region, dst_rank, op, after=k)``: the region is written locally and
  tracked; when every element has seen ``k`` updates the DMA engine sends it to
  ``dst_rank`` as ``op``;
- ``track(region, after=k)``: written locally and tracked, nothing forwarded (a
  fully reduced chunk whose completion ends the collective).

Unmapped tiles are written locally with the producer's own op. Regions are
rectangles of the output made of whole tiles (the output tile grid is the same
on every rank, so a region names the same tracker slots everywhere). A tile may
be mapped at most once; violations raise ``MapError`` when the map is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from devices.dma import DmaCommand
from devices.hbm import Region, region_elems
from devices.tracker import TrackedRegion

OPS = ("store", "update")


class MapError(ValueError):
    """A map that cannot be right: overlapping, misaligned or out-of-range regions."""


@dataclass(frozen=True)
class Route:
    """What happens to one tile the producer finishes."""

    local_op: str  # "store", "update" or "none" (remote-mapped only)
    remote_rank: int = -1
    remote_op: str = "none"
    tracked: bool = False  # the local write signals this rank's tracker


@dataclass
class _Entry:
    kind: str  # "remote", "dma" or "track"
    region: Region
    tiles: list[int]
    dst_rank: int = -1
    op: str = "update"
    after: int = 1
    incoming_op: str = "update"


@dataclass
class CompiledMap:
    routes: list[Route]
    commands: list[DmaCommand]  # tracker entries in DMA queue order (sinks included)
    incoming: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (elems/update, op)


def tile_grid(row_blocks: list[tuple[int, int]], ncols: int, tile_m: int, tile_n: int) -> np.ndarray:
    """Output tiles (row0, row1, col0, col1): each row block (a ring chunk) tiled on its own."""
    tiles = []
    for r0, r1 in row_blocks:
        for a in range(r0, r1, tile_m):
            for c in range(0, ncols, tile_n):
                tiles.append((a, min(a + tile_m, r1), c, min(c + tile_n, ncols)))
    return np.array(tiles, dtype=np.int64).reshape(-1, 4)


class AddressMap:
    def __init__(self, buffer: str, tiles: np.ndarray, rank: int, world: int,
                 producer_op: str = "store"):
        if producer_op not in OPS:
            raise MapError(f"producer op {producer_op!r} not in {OPS}")
        self.buffer = buffer
        self.tiles = tiles
        self.rank = rank
        self.world = world
        self.producer_op = producer_op
        self._index = {(int(t[0]), int(t[2])): i for i, t in enumerate(tiles)}
        self._owner: dict[int, int] = {}  # tile -> entry index
        self.entries: list[_Entry] = []

    # ---------------------------------------------------------------- building
    def tiles_in(self, region: Region) -> list[int]:
        """Tile ids exactly covering ``region``; MapError if it cuts a tile."""
        r0, r1, c0, c1 = region
        t = self.tiles
        inside = (t[:, 0] >= r0) & (t[:, 1] <= r1) & (t[:, 2] >= c0) & (t[:, 3] <= c1)
        ids = np.flatnonzero(inside).tolist()
        if sum(region_elems(tuple(self.tiles[i])) for i in ids) != region_elems(region) or not ids:
            raise MapError(f"region {region} of {self.buffer} is not a union of whole tiles")
        return ids

    def _add(self, entry: _Entry) -> None:
        if entry.op not in OPS:
            raise MapError(f"op {entry.op!r} not in {OPS}")
        if entry.kind != "track" and not (0 <= entry.dst_rank < self.world):
            raise MapError(f"destination rank {entry.dst_rank} outside 0..{self.world - 1}")
        if entry.kind != "track" and entry.dst_rank == self.rank:
            raise MapError(f"region {entry.region} mapped to its own rank {self.rank}")
        if entry.after < 1:
            raise MapError(f"after={entry.after} must be >= 1")
        for t in entry.tiles:
            if t in self._owner:
                prev = self.entries[self._owner[t]]
                raise MapError(f"tile {tuple(self.tiles[t])} mapped twice: by {prev.kind} "
                               f"{prev.region} and by {entry.kind} {entry.region}")
        for t in entry.tiles:
            self._owner[t] = len(self.entries)
        self.entries.append(entry)

    def remote_map(self, region: Region, dst_rank: int, op: str = "update") -> None:
        self._add(_Entry("remote", region, self.tiles_in(region), dst_rank, op))

    def dma_map(self, region: Region, dst_rank: int, op: str = "update", after: int = 2,
                incoming_op: str = "update") -> None:
        self._add(_Entry("dma", region, self.tiles_in(region), dst_rank, op, after, incoming_op))

    def track(self, region: Region, after: int = 1, incoming_op: str = "update") -> None:
        self._add(_Entry("track", region, self.tiles_in(region), -1, "update", after, incoming_op))

    # ---------------------------------------------------------------- compiling
    def compile(self) -> CompiledMap:
        """Per-tile routes and the DMA queue (one command per dma_map/track entry)."""
        routes = [Route(self.producer_op) for _ in range(len(self.tiles))]
        commands: list[DmaCommand] = []
        incoming: dict[str, tuple[int, str]] = {}
        for entry in self.entries:
            for t in entry.tiles:
                if entry.kind == "remote":
                    routes[t] = Route("none", entry.dst_rank, entry.op)
                else:
                    routes[t] = Route(self.producer_op, tracked=True)
            if entry.kind == "remote":
                continue
            elems = [region_elems(tuple(self.tiles[t])) for t in entry.tiles]
            name = f"{entry.kind}{list(entry.region)}"
            trigger = TrackedRegion(
                name=name,
                slots=np.array(entry.tiles, np.int64),
                thresholds=np.array(elems, np.int64) * entry.after,
                label=(f"after={entry.after} -> rank {entry.dst_rank} {entry.op}"
                       if entry.kind == "dma" else f"after={entry.after}, kept locally"),
                meta={"tiles": entry.tiles, "after": entry.after},
            )
            # updates each element expects from peers = after - 1 local write
            incoming[name] = (entry.after - 1, entry.incoming_op)
            commands.append(DmaCommand(
                trigger=trigger, buffer=self.buffer,
                src=entry.region if entry.kind == "dma" else None,
                dst_rank=entry.dst_rank, dst=entry.region if entry.kind == "dma" else None,
                op=entry.op, dst_slots=list(entry.tiles) if entry.kind == "dma" else [],
                dst_elems=elems if entry.kind == "dma" else []))
        return CompiledMap(routes, commands, incoming)
