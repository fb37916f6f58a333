"""A kernel: work items of one producer, run as stages (or by a persistent grid), every
finished tile routed through the map.

The runner knows nothing of collectives. It computes a group of work items with
the producer's kernel (all of them at the first stage when no item waits on a
signal and the workspace allows it: one BLAS call per block of rows), then
hands each item's tile to its route: a local store or
update (signalling the local tracker if the tile is tracked) and/or fine-grained
stores or updates by the producing WG itself into peers' HBM (put-with-signal).
A work item may wait on signal handles (``gates``); a stage is split into groups
of items with the same gates, so one late tile holds back only the items that
need it. Fusion is entirely in the routes and gates, as in T3.

Two ways to run:
- ordinary kernels: stages of ``stage_size`` items (T3's stages); a stage's
  groups start when the CUs are free and their gates have completed, and the next
  stage starts when all its groups have retired;
- persistent kernels (``persistent=P``): P physical WGs, each with its own
  modelled timeline, run the task list round-robin (task i on WG i mod P); after
  its last task each WG polls its share of ``exit_waits``. With ``fair_share`` a
  round's WGs that wait on the same gates are served by the HBM together (one
  reservation from the earliest WG's start, shared fairly, as a stage's WGs are),
  each WG ending no earlier than its own start plus its compute: a fluid model of
  thousands of small tasks (embedding bags) at the cost of one reservation per round.
A WG that completes the last tile of a region a NIC sends (the last WG of a
slice) pays the NIC's issue cost twice (the put and the flag put). A stage's
remote stores leave through a store queue per destination: with
``store_queue`` = Q bytes the stage retires once all but Q bytes of them have
left (the link keeps streaming the rest behind the next stage); with Q = 0 it
holds its WGs until they have all left; with ``STAGE`` Q is the stage's own stores to
that destination: a stage retires once its stores have begun to leave, i.e. once the
stores of the stage before it have left (WGs retire as the link accepts their tiles'
stores, so a wave's stores drain while the next wave computes, and the link pushes back
on the kernel only when it falls a whole wave behind).

This module holds the kernel's description (pure data, no MPI); ``launch.py``
runs it.
"""

from __future__ import annotations

import bisect
import dataclasses
from dataclasses import dataclass, field

import numpy as np

from devices.signals import Signal
from emulator.engine.addrmap import TileSpace

Gates = tuple[Signal, ...]


STAGE = -1.0  # ``Kernel.store_queue``: one stage's own stores per destination


@dataclass(frozen=True)
class Kernel:
    producer: object  # a ``producers.Producer``
    space: TileSpace  # the output buffer's tiles
    wgs: np.ndarray  # (n, 6): r0, r1, c0, c1, k0, k1 of each work item
    wg_tile: np.ndarray  # work item -> output tile id
    order: np.ndarray  # work item ids in dispatch order
    stage_size: int  # items per stage (persistent: the P physical WGs)
    gates: dict[int, Gates] = field(default_factory=dict)  # work item -> signals it waits on
    persistent: bool = False
    exit_waits: tuple[Signal, ...] = ()  # persistent: flags polled by the WGs at exit
    store_queue: float = 0.0  # bytes of remote stores per destination a stage may leave
    # queued behind it (0: a stage retires when its remote stores have left; ``STAGE``:
    # its own stores, so a stage's stores drain while the next stage computes)
    fair_share: bool = False  # persistent: a round's WGs share the HBM fairly (served as
    # one group from the earliest WG's start; O(rounds), for grids of many small tasks);
    # False: each WG reserves on its own in WG order
    launches: tuple[int, ...] = ()  # positions in ``order`` where another launch of the
    # same stream begins (the kernel is a sequence of launches: each starts a stage, pays
    # the launch cost and finds none of its inputs in the L2)

    def __post_init__(self):
        if self.stage_size < 1:
            raise ValueError(f"a kernel needs stage_size >= 1, got {self.stage_size}")
        if self.exit_waits and not self.persistent:
            raise ValueError("exit_waits are polled by a persistent kernel's WGs")
        bounds = [0, *self.launches, len(self.order)]
        if self.launches and (self.persistent or any(b >= a for a, b in zip(bounds[1:],
                                                                              bounds))):
            raise ValueError(f"launch starts {self.launches} must increase inside "
                             f"0..{len(self.order)} (ordinary kernels only)")

    def stages(self) -> list[np.ndarray]:
        cached = self.__dict__.get("_stages")
        if cached is None:
            o, size = self.order, self.stage_size
            bounds = [0, *self.launches, len(o)]
            cached = [o[i : min(i + size, b)] for a, b in zip(bounds, bounds[1:])
                      for i in range(a, b, size)]
            if isinstance(self.wgs, LaunchItems) and _identity(o):
                for ids in cached:  # (stages of consecutive items: no check per stage)
                    self.wgs.know_consecutive(ids)
            object.__setattr__(self, "_stages", cached)
        return cached

    def launch_stages(self) -> set[int]:
        """The stages that begin a launch after the first."""
        starts, n, out = set(self.launches), 0, set()
        for s, ids in enumerate(self.stages()):
            if n in starts:
                out.add(s)
            n += len(ids)
        return out

    def _gated(self) -> np.ndarray:
        """Which items wait on a signal (cached)."""
        got = self.__dict__.get("_gated_mask")
        if got is None:
            got = np.zeros(len(self.wgs), bool)
            if self.gates:
                got[[w for w, g in self.gates.items() if g]] = True
            object.__setattr__(self, "_gated_mask", got)
        return got

    def _any_gated(self, ids: np.ndarray) -> bool:
        """Whether an item of ``ids`` waits on a signal (consecutive items of launches: by
        the sorted gated items, nothing per item)."""
        if not self.gates:
            return False
        last = self.__dict__.get("_gated_last")  # a stage's items are asked several times
        if last is not None and last[0] is ids:
            return last[1]
        sp = self.wgs.span(ids) if isinstance(self.wgs, LaunchItems) else None
        if sp is None:
            out = bool(self._gated()[ids].any())
        else:
            got = self.__dict__.get("_gated_ids")
            if got is None:
                got = sorted(w for w, g in self.gates.items() if g)
                object.__setattr__(self, "_gated_ids", got)
            a, n = sp[3], sp[1]
            i = bisect.bisect_left(got, a)
            out = i < len(got) and got[i] < a + n
        object.__setattr__(self, "_gated_last", (ids, out))  # (ids kept alive: never
        return out  # another array under the same identity)

    def _gate_sets(self) -> tuple[np.ndarray, list[Gates]]:
        """Each item's set of gates as an index into the distinct sets (0: none; two
        items share an index when they wait on the same signals in the same order),
        and the sets (cached: a stage's groups and gates are then array operations)."""
        got = self.__dict__.get("_gate_sets_cache")
        if got is None:
            index = np.zeros(len(self.wgs), np.int64)
            sets: list[Gates] = [()]
            known: dict[tuple, int] = {(): 0}
            for w, g in self.gates.items():
                key = tuple(id(x) for x in g)
                j = known.get(key)
                if j is None:
                    j = known[key] = len(sets)
                    sets.append(tuple(g))
                index[w] = j
            got = (index, sets)
            object.__setattr__(self, "_gate_sets_cache", got)
        return got

    def _first_seen(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The gate-set index of each of ``ids`` and the distinct ones in order of first
        appearance."""
        last = self.__dict__.get("_first_seen_last")  # a stage's items are asked several
        if last is not None and last[0] is ids:  # times (its run, groups and gates)
            return last[1]
        index = self._gate_sets()[0][ids]
        uniq, first = np.unique(index, return_index=True)
        got = (index, uniq[np.argsort(first, kind="stable")])
        object.__setattr__(self, "_first_seen_last", (ids, got))  # (ids kept alive)
        return got

    def groups(self, ids: np.ndarray) -> list[np.ndarray]:
        """The stage's items split where their gates differ (in dispatch order); one group
        when they agree (every item of a T3 consumer stage waits on the same regions)."""
        if not self._any_gated(ids):
            return [ids]
        ids = np.asarray(ids, np.int64)
        index, order = self._first_seen(ids)
        if len(order) == 1:
            return [ids]
        return [ids[index == j] for j in order]

    def gates_of(self, ids: np.ndarray) -> Gates:
        if not self._any_gated(ids):
            return ()
        _, order = self._first_seen(np.asarray(ids, np.int64))
        sets = self._gate_sets()[1]
        seen: dict[int, Signal] = {}
        for j in order:
            for g in sets[j]:
                seen.setdefault(id(g), g)
        return tuple(seen.values())

    def local_writes(self) -> np.ndarray:
        """How many work items write each output tile."""
        if isinstance(self.wgs, LaunchItems):  # run by run, nothing per item
            return self.wgs.tile_counts(len(self.space))
        return np.bincount(self.wg_tile, minlength=len(self.space)).astype(np.int64)

    def with_gates(self, gates: dict[int, Gates]) -> Kernel:
        """The kernel with work item w waiting on ``gates[w]``."""
        return dataclasses.replace(self, gates=gates)

    def with_stage_gates(self, stage_gates: dict[int, Gates]) -> Kernel:
        """The kernel with every item of stage s waiting on ``stage_gates[s]``."""
        return self.with_gates({int(w): g for s, ids in enumerate(self.stages())
                                for g in [stage_gates.get(s, ())] if g for w in ids})


def _identity(order: np.ndarray, block: int = 1 << 20) -> bool:
    """``order`` is 0, 1, ..., n - 1 (checked a block at a time)."""
    for a in range(0, len(order), block):
        part = order[a : a + block]
        if not np.array_equal(part, np.arange(a, a + len(part))):
            return False
    return True


def make_wgs(space: TileSpace, tile_ids: list[int] | np.ndarray, k: int,
             split: int) -> tuple[np.ndarray, np.ndarray]:
    """WGs for the given tiles, in that order: ``split`` WGs per tile over K slices."""
    bounds = np.array([k * j // split for j in range(split + 1)], np.int64)
    tiles = np.asarray(tile_ids, np.int64).reshape(-1)
    wg_tile = np.repeat(tiles, split)
    wgs = np.empty((len(wg_tile), 6), np.int64)
    wgs[:, :4] = space.tiles[wg_tile]
    wgs[:, 4] = np.tile(bounds[:-1], len(tiles))
    wgs[:, 5] = np.tile(bounds[1:], len(tiles))
    return wgs, wg_tile




class LaunchItems:
    """The work items (r0, r1, c0, c1, k0, k1) of a stream of launches, each a run of
    consecutive tile ids of a ``RegularGrid`` over one K slice, computed when a stage
    asks for its rows: a kernel of millions of WGs holds a few numbers per run.
    Indexes like the (n, 6) int64 array it stands for; ``tiles`` stands for ``wg_tile``."""

    ndim = 2
    dtype = np.dtype(np.int64)

    def __init__(self, grid, runs: list[tuple[int, int, int, int]]):
        self.grid = grid
        self.first = np.array([a for a, _, _, _ in runs], np.int64)
        sizes = np.array([b - a for a, b, _, _ in runs], np.int64)
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        self.k = np.array([(k0, k1) for _, _, k0, k1 in runs], np.int64).reshape(-1, 2)
        self.n = int(self.offsets[-1])
        self.shape = (self.n, 6)  # not a parameter: six columns per WG row
        self.tiles = _TileIds(self)
        self._last: tuple = (None, None, None)  # (key, tile ids, rows): a stage asks twice
        self._span: tuple = (None, None)  # (items array, its ``span``)
        self._shape: tuple = (None, None)  # (items array, its ``stage_shape``)
        self._slices: dict[int, np.ndarray] = {}  # id -> arrays of consecutive items
        self._offsets = self.offsets.tolist()
        self._first = self.first.tolist()

    def __len__(self) -> int:
        return self.n

    def tile_counts(self, ntiles: int) -> np.ndarray:
        """How many items write each of ``ntiles`` tiles."""
        out = np.zeros(ntiles, np.int64)
        for a, n in zip(self.first.tolist(), np.diff(self.offsets).tolist()):
            out[a : a + n] += 1
        return out

    def _ids(self, key) -> np.ndarray:
        if isinstance(key, slice):
            return np.arange(self.n)[key]
        ids = np.asarray(key, np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise IndexError(f"work items outside 0..{self.n - 1}")
        return ids

    def _lookup(self, key) -> tuple[np.ndarray, np.ndarray]:
        """(tile ids, rows) of work items ``key``; the last answer is kept (a stage's items
        are asked for by its cost, its routing and its program order)."""
        ids = self._ids(key)
        run_of = len(ids) > 1 and ids[-1] - ids[0] == len(ids) - 1 and bool(
            (np.diff(ids) == 1).all())  # a run of consecutive items: remembered
        k = (len(ids), int(ids[0])) if run_of else None
        if k is not None and self._last[0] == k:
            return self._last[1], self._last[2]
        run = np.searchsorted(self.offsets, ids, "right") - 1
        tiles = self.first[run] + (ids - self.offsets[run])
        out = np.empty((len(ids), 6), np.int64)
        out[:, :4] = self.grid.rows(tiles)
        out[:, 4:] = self.k[run]
        self._last = (k, tiles, out)
        return tiles, out

    def span(self, ids) -> tuple[int, int, int, int] | None:
        """(first tile id, items, run, first item) when work items ``ids`` are consecutive
        items of one run (so their tiles are consecutive ids over one K slice), else None.
        The same array asked again (a stage's cost, routing and program order ask) is
        answered from the last answer."""
        if ids is self._span[0]:
            return self._span[1]
        got = None
        n = len(ids) if isinstance(ids, np.ndarray) and ids.ndim == 1 else 0
        if n:
            a = int(ids[0])
            r = bisect.bisect_right(self._offsets, a) - 1
            if (0 <= r < len(self._offsets) - 1 and a + n <= self._offsets[r + 1]
                    and int(ids[-1]) - a == n - 1 and self._consecutive(ids)):
                got = (self._first[r] + a - self._offsets[r], n, r, a)
            self._span = (ids, got)
        return got

    def _consecutive(self, ids: np.ndarray) -> bool:
        known = self._slices.get(id(ids))
        if known is not None and known is ids:
            return True
        return len(ids) == 1 or bool((ids[1:] - ids[:-1] == 1).all())

    def know_consecutive(self, ids: np.ndarray) -> None:
        """``ids`` (kept alive here, never written) holds consecutive item ids: a kernel's
        stages cut from an order of consecutive items (``span`` then skips the check)."""
        self._slices[id(ids)] = ids

    def stage_shape(self, ids) -> tuple[tuple, int, int] | None:
        """(signature, first row, row span) of work items ``ids`` when they are a ``span``
        that lies in one row block of the grid in whole-height tile rows: their rows
        relative to the first row (and their K slice) are a function of the signature
        alone, so stages with equal signatures are the same arithmetic at different rows.
        None otherwise."""
        if ids is self._shape[0]:
            return self._shape[1]
        sp = self.span(ids)
        got = None
        if sp is not None:
            t0, n, r, _ = sp
            g = self.grid
            b = bisect.bisect_right(g.first, t0) - 1
            if 0 <= b < len(g.blocks) and t0 + n <= g.first[b + 1]:
                nct = max(1, g.nct)
                ri0, ci0 = divmod(t0 - int(g.first[b]), nct)
                rows = (t0 + n - 1 - int(g.first[b])) // nct - ri0 + 1
                r0 = int(g.starts[b]) + ri0 * g.tm
                if r0 + rows * g.tm <= g.ends[b]:  # no tile row cut short by the block's end
                    got = (ci0, n, int(self.k[r, 0]), int(self.k[r, 1])), r0, rows * g.tm
        self._shape = (ids, got)
        return got

    def item_elems(self, ids) -> np.ndarray:
        """The output elements of each of work items ``ids``, which have a
        ``stage_shape``: whole-height tile rows, the last tile column maybe narrower."""
        (ci0, n, _, _), _, _ = self.stage_shape(ids)
        g = self.grid
        ci = (np.arange(ci0, ci0 + n, dtype=np.int64)) % max(1, g.nct)
        return g.tm * np.minimum(g.tn, g.ncols - ci * g.tn)

    def rows(self, key) -> np.ndarray:
        """``self[key]`` without its copy: the array kept as the last answer, never written
        here again (a new answer is a new array), for a caller that only reads it."""
        return self._lookup(key)[1]

    def tile_ids(self, key) -> np.ndarray:
        sp = self.span(key) if isinstance(key, np.ndarray) else None
        if sp is not None:
            return np.arange(sp[0], sp[0] + sp[1], dtype=np.int64)
        return self._lookup(key)[0]

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows, cols = key
            return self[rows][:, cols]
        if isinstance(key, (int, np.integer)):
            return self[[key]][0]
        return self._lookup(key)[1].copy()

    def __array__(self, dtype=None, copy=None):
        a = self[np.arange(self.n)]
        return a if dtype is None else a.astype(dtype)


class _TileIds:
    """``wg_tile`` of ``LaunchItems``: the tile id of each work item, when asked."""

    ndim = 1
    dtype = np.dtype(np.int64)

    def __init__(self, items: LaunchItems):
        self.items = items
        self.shape = (items.n,)

    def __len__(self) -> int:
        return self.items.n

    def __getitem__(self, key):
        if isinstance(key, (int, np.integer)):
            return int(self.items.tile_ids([key])[0])
        return self.items.tile_ids(key)

    def __array__(self, dtype=None, copy=None):
        a = self.items.tile_ids(np.arange(self.items.n))
        return a if dtype is None else a.astype(dtype)
