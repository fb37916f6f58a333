"""The emulated GPU's HBM: a symmetric heap on one MPI window per rank.

Every rank allocates the same arrays at the same offsets (``malloc``), so a
region of a peer's array is addressed exactly like the local one. Within a
node the window is a shared-memory window (``Win.Allocate_shared``); across
nodes it is an RMA window (``Win.Allocate``). Accesses:

- ``load``: a read of the local HBM;
- ``store``: a plain write (``MPI_Put``), local or remote;
- ``update``: an op-and-store add (near-memory compute), local or remote. fp32
  uses ``MPI_Accumulate(SUM)``. MPICH 5.0.2's shared-memory accumulate adds
  ``MPI_FLOAT16_T`` bit patterns as integers (MPICH's accumulate on shared memory), and
  MPI has no bfloat16, so fp16 and bf16 updates are made atomic the way a memory
  controller serialises them: MPI compare-and-swap locks on every 64-row stripe of the
  array the region touches, get, add in fp32, round once, put, release.

Every byte is counted by the HBM it lands in (target rank), stream (producer
or collective) and kind (read, write, update), so data movement is measured
from the operations that ran.

Timing-only runs (``payload=False``) allocate no arrays: the same operations
are issued and counted with the same sizes, but no data moves, so paper-scale
shapes cost only the protocol (tracker signals, DMA triggers, modelled time).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

from devices.kernels import is_bf16
from devices.mpiutil import Backoff, one_node
from devices.regions import Region, region_elems, region_shape


KINDS = ("read", "write", "update")
_ALIGN = 64
_N_LOCKS = 4096
_LOCK_ROWS = 64  # fp16 update locks cover stripes of this many rows of an array
WIN_INFO = {"alloc_shared_noncontig": "true"}


class _StorageDtypes(Mapping):
    """A run's dtype name -> the numpy type its arrays are stored in. ``bf16``'s type comes
    from ``ml_dtypes``, imported on its first use: its import registers every one of its
    types with numpy, about 0.6 s of CPU per rank, which a run of another dtype (and so
    every fp16 or fp32 rank of a job on a shared host) does not pay."""

    _eager = {"fp16": np.float16, "fp32": np.float32}
    _names = ("fp16", "bf16", "fp32")

    def __getitem__(self, name: str):
        if name == "bf16":
            import ml_dtypes

            return ml_dtypes.bfloat16
        return self._eager[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)


STORAGE_DTYPES = _StorageDtypes()
# MPI has no bfloat16: its arrays move as 16-bit words (puts and gets only; its updates,
# like fp16's, are locked get-add-put)
_MPI_TYPES = {np.dtype(np.float32): MPI.FLOAT, np.dtype(np.float16): MPI.FLOAT16_T,
              np.dtype(np.float64): MPI.DOUBLE, np.dtype(np.int64): MPI.INT64_T}


def _mpi_type(dt: np.dtype):
    """The MPI datatype an array of ``dt`` moves as (bfloat16 as 16-bit words); None if
    none."""
    return MPI.UINT16_T if is_bf16(dt) else _MPI_TYPES.get(dt)


def _buf(data: np.ndarray) -> np.ndarray:
    """A buffer MPI can describe (bfloat16 as its 16-bit words)."""
    return data.view(np.uint16) if is_bf16(data.dtype) else data


@dataclass(frozen=True)
class ArraySpec:
    name: str
    shape: tuple[int, int]
    dtype: np.dtype
    offset: int

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize


def allocate_window(comm: MPI.Intracomm, size: int,
                    info: MPI.Info = MPI.INFO_NULL) -> tuple[MPI.Win, memoryview]:
    """A window of ``size`` bytes per rank and this rank's memory: shared within a node, RMA
    across nodes."""
    if one_node(comm):
        win = MPI.Win.Allocate_shared(size, 1, info=info, comm=comm)
        return win, win.Shared_query(comm.rank)[0]
    win = MPI.Win.Allocate(size, 1, info=info, comm=comm)
    return win, win.tomemory()


def is_shared(win: MPI.Win) -> bool:
    """Whether ``win`` is a shared-memory window (every rank on one node): peers' loads and
    stores reach it without this rank's help. Else one-sided operations from other
    nodes may need this rank to make MPI progress (``mpiutil.progress``) while it waits."""
    return win.Get_attr(MPI.WIN_CREATE_FLAVOR) == MPI.WIN_FLAVOR_SHARED


class Segment:
    """Memory a rank's runs share: one window allocated once per job (the emulated
    GPU's DRAM is there before any kernel runs) and bound by each run in turn.

    ``bind(size)`` returns (window, this rank's memory) of at least ``size`` bytes,
    growing the window (collectively, as a symmetric heap does: every rank takes the
    largest size any rank asks for, so ranks whose runs need different sizes, e.g. a
    tracker with a slot per tile of an uneven expert's GEMM, grow it together) only
    when a run needs more than any before it. The window stays in a passive-target
    epoch (``Lock_all``) while bound."""

    def __init__(self, comm: MPI.Intracomm, info: dict[str, str] | None = None):
        self.comm = comm
        self.info = dict(info or {})
        self.size = 0
        self.win: MPI.Win = MPI.WIN_NULL
        self.mem: memoryview | None = None
        self.stale = 0  # the first bytes a run bound before may have written (``claim``)

    def bind(self, size: int) -> tuple[MPI.Win, memoryview]:
        size = self.comm.allreduce(int(size), MPI.MAX)  # one decision for every rank
        if size > self.size or self.win == MPI.WIN_NULL:
            self.free()
            info = MPI.Info.Create()
            for key, value in self.info.items():
                info.Set(key, value)
            self.win, self.mem = allocate_window(self.comm, size, info)
            info.Free()
            self.size = size
            # a new window may hold anything (MPI promises no zeroed memory): counted as
            # written whole
            self.stale = size
            self.win.Lock_all()
        return self.win, self.mem

    def claim(self, size: int) -> int:
        """A run that binds ``size`` bytes writes them: how many of the first of them
        may hold what a run before wrote (the rest reads as zero), so a run that needs
        its memory zeroed zeroes only those (a tracker of millions of slots reused
        config after config, or bound fresh: nothing to write)."""
        stale, self.stale = min(self.stale, size), max(self.stale, size)
        return stale

    def free(self) -> None:
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
            self.win = MPI.WIN_NULL
            self.mem = None
            self.size = 0


class Hbm:
    """One rank's HBM. ``layout`` is the list of (name, shape, dtype) to malloc; every
    array reads as zero except those named ``overwritten`` (the caller writes them whole
    before anyone reads them, e.g. inputs)."""

    def __init__(self, comm: MPI.Intracomm, layout: Iterable[tuple[str, tuple[int, int], object]],
                 streams: Iterable[str], payload: bool = True, segment: Segment | None = None,
                 overwritten: Iterable[str] = ()):
        self.comm = comm
        self.payload = payload
        self.rank = comm.rank
        self.streams = tuple(streams)
        self.specs: dict[str, ArraySpec] = {}
        offset = 0
        for name, shape, dtype in layout:
            dt = np.dtype(dtype)
            if _mpi_type(dt) is None:
                raise ValueError(f"HBM array {name!r}: unsupported dtype {dt}")
            spec = ArraySpec(name, (int(shape[0]), int(shape[1])), dt, offset)
            self.specs[name] = spec
            offset += (spec.nbytes + _ALIGN - 1) // _ALIGN * _ALIGN
        self.nbytes = offset
        size = (max(self.nbytes, _ALIGN) if payload else _ALIGN) + _N_LOCKS * 8
        self._own = segment is None  # a window of its own, freed with this HBM
        self._segment = segment or Segment(comm, WIN_INFO)
        self.win, mem = self._segment.bind(size)
        stale = self._segment.claim(size)
        self.win.Sync()
        self._lock_base = size - _N_LOCKS * 8
        raw = np.frombuffer(mem, dtype=np.uint8, count=size)
        # what a run does not write whole first must read as zero (updates add to it):
        # what an earlier run may have written (the rest of the memory reads as zero)
        skip = sorted((self.specs[n].offset, self.specs[n].offset + self.specs[n].nbytes)
                      for n in set(overwritten) if payload)
        pos = 0
        for lo, hi in skip + [(size, size)]:
            raw[pos:min(lo, stale)] = 0
            pos = max(pos, hi)
        self.win.Sync()
        self.arrays: dict[str, np.ndarray] = {
            s.name: raw[s.offset : s.offset + s.nbytes].view(s.dtype).reshape(s.shape)
            for s in self.specs.values()
        } if payload else {}
        self._types: dict[tuple, MPI.Datatype] = {}
        # traffic[target_rank, stream, kind] in bytes, counted at the HBM the access lands in
        self.traffic = np.zeros((comm.size, len(self.streams), len(KINDS)), np.int64)
        self._cell = {(st, kind): (i, j) for i, st in enumerate(self.streams)
                      for j, kind in enumerate(KINDS)}  # (a lookup per count, not a search)
        comm.Barrier()  # no peer writes into this HBM before it is zeroed

    # ------------------------------------------------------------ accounting
    def count(self, target: int, stream: str, kind: str, nbytes: int) -> None:
        i, j = self._cell.get((stream, kind)) or (self.streams.index(stream),
                                                   KINDS.index(kind))  # (ValueError: unknown)
        self.traffic[target, i, j] += int(nbytes)

    def traffic_by_rank(self) -> np.ndarray:
        """Collective: every rank's HBM traffic (rank x stream x kind), summed over origins."""
        total = np.zeros_like(self.traffic)
        self.comm.Allreduce(self.traffic, total, op=MPI.SUM)
        return total

    # ------------------------------------------------------------ addressing
    def _check(self, name: str, region: Region) -> ArraySpec:
        spec = self.specs[name]
        r0, r1, c0, c1 = region
        if not (0 <= r0 < r1 <= spec.shape[0] and 0 <= c0 < c1 <= spec.shape[1]):
            raise ValueError(f"region {region} outside {name}{spec.shape}")
        return spec

    def _target(self, name: str, region: Region) -> tuple[int, int, MPI.Datatype]:
        spec = self._check(name, region)
        r0, r1, c0, c1 = region
        disp = spec.offset + (r0 * spec.shape[1] + c0) * spec.dtype.itemsize
        if r1 - r0 == 1 or c1 - c0 == spec.shape[1]:  # whole rows: contiguous
            return disp, region_elems(region), _mpi_type(spec.dtype)
        key = (spec.dtype, r1 - r0, c1 - c0, spec.shape[1])
        dt = self._types.get(key)
        if dt is None:
            dt = _mpi_type(spec.dtype).Create_vector(r1 - r0, c1 - c0, spec.shape[1]).Commit()
            self._types[key] = dt
        return disp, 1, dt

    def view(self, name: str, region: Region | None = None) -> np.ndarray:
        """The local array (or a region of it); reading it is not counted, use ``load``."""
        if not self.payload:
            raise RuntimeError(f"HBM array {name!r}: a timing-only run holds no data")
        a = self.arrays[name]
        if region is None:
            return a
        return a[region[0] : region[1], region[2] : region[3]]

    # ------------------------------------------------------------ operations
    def region_bytes(self, name: str, region: Region) -> int:
        return region_elems(region) * self._check(name, region).dtype.itemsize

    def load(self, name: str, region: Region, stream: str) -> np.ndarray | None:
        """Read a region of the local HBM (a contiguous copy; None in a timing-only run)."""
        if not self.payload:
            self.count(self.rank, stream, "read", self.region_bytes(name, region))
            return None
        self.win.Sync()
        data = np.ascontiguousarray(self.view(name, region))
        self.count(self.rank, stream, "read", data.nbytes)
        return data

    def get(self, name: str, region: Region, stream: str, rank: int) -> np.ndarray | None:
        """Read a region of ``rank``'s array (``MPI_Get``; counted as a read of that HBM)."""
        if not self.payload:
            self.count(rank, stream, "read", self.region_bytes(name, region))
            return None
        spec = self.specs[name]
        data = np.empty(region_shape(region), spec.dtype)
        self.win.Get(_buf(data), rank, target=self._target(name, region))
        self.win.Flush(rank)
        self.count(rank, stream, "read", data.nbytes)
        return data

    def store(self, name: str, region: Region, data: np.ndarray | None, stream: str,
              rank: int | None = None) -> None:
        """Plain write of ``data`` into ``rank``'s array region (default: local); flushed."""
        rank = self.rank if rank is None else rank
        if not self.payload:
            self.count(rank, stream, "write", self.region_bytes(name, region))
            return
        data = np.ascontiguousarray(data, dtype=self.specs[name].dtype)
        self.win.Put(_buf(data), rank, target=self._target(name, region))
        self.win.Flush(rank)
        self.count(rank, stream, "write", data.nbytes)

    def update(self, name: str, region: Region, data: np.ndarray | None, stream: str,
               rank: int | None = None) -> None:
        """Op-and-store add of ``data`` into ``rank``'s array region, atomically; flushed."""
        rank = self.rank if rank is None else rank
        if not self.payload:
            self.count(rank, stream, "update", self.region_bytes(name, region))
            return
        spec = self.specs[name]
        data = np.ascontiguousarray(data, dtype=spec.dtype)
        target = self._target(name, region)
        if spec.dtype.itemsize == 2:  # fp16, bf16: no MPI sum of their own
            self._locked_update(rank, target, region, data, spec.offset)
        else:
            self.win.Accumulate(data, rank, target=target, op=MPI.SUM)
            self.win.Flush(rank)
        self.count(rank, stream, "update", data.nbytes)

    def _locked_update(self, rank: int, target: tuple, region: Region,
                           data: np.ndarray, offset: int) -> None:
        """Lock every row stripe the region touches (ascending lock ids: no deadlock), so
        overlapping updates of different shapes (a tile, a DMA chunk) still serialise."""
        stripes = range(region[0] // _LOCK_ROWS, (region[1] - 1) // _LOCK_ROWS + 1)
        locks = sorted({(offset // _ALIGN * 7919 + s) % _N_LOCKS for s in stripes})
        held = []
        try:
            for lock in locks:
                self._acquire(rank, self._lock_base + 8 * lock)
                held.append(self._lock_base + 8 * lock)
            cur = np.empty_like(data)
            self.win.Get(_buf(cur), rank, target=target)
            self.win.Flush(rank)
            from devices import kernels  # numba: imported only by runs that move data

            new = kernels.add(cur, data)  # referenced until the flush: a Put to another
            self.win.Put(_buf(new), rank, target=target)  # node may read it only then
            self.win.Flush(rank)
        finally:
            zero, got = np.zeros(1, np.int64), np.empty(1, np.int64)
            for disp in reversed(held):
                self.win.Fetch_and_op(zero, got, rank, disp, MPI.REPLACE)
                self.win.Flush(rank)

    def _acquire(self, rank: int, disp: int) -> None:
        me = np.array([self.rank + 1], np.int64)
        zero = np.zeros(1, np.int64)
        got = np.empty(1, np.int64)
        backoff = Backoff(1e-6, 1e-3, factor=2.0)
        while True:
            self.win.Compare_and_swap(me, zero, got, rank, disp)
            self.win.Flush(rank)
            if got[0] == 0:
                return
            backoff.nap()

    def free(self) -> None:
        """Release this run's binding (and the window, unless it lives in a segment)."""
        if self.win == MPI.WIN_NULL:
            return
        for dt in self._types.values():
            dt.Free()
        self._types.clear()
        self.arrays.clear()
        if self._own:
            self._segment.free()
        self.win = MPI.WIN_NULL
