"""The producer protocol: what a kernel's work items (WGs) read, compute into which tile,
and what they cost. The kernel runner (``kernel.py``) knows nothing else of them.

A work item is one row of an int64 (n, 6) array ``(r0, r1, c0, c1, k0, k1)``: the
output tile ``[r0:r1, c0:c1]`` it writes and the slice ``[k0:k1)`` of its inner
dimension (for elementwise kernels ``k0`` picks the item's sources). A producer:

- ``cost(model, items, resident)`` -> (FLOPs, compute seconds, DRAM read bytes) of
  items that run at once (the model's formulas, ``emulator/model/cost.py``);
- ``bind(hbm, runtime)`` -> a ``Workspace`` (numeric runs only), whose
  ``compute(items)`` runs the numba kernel and ``data(j, region)`` gives the fp32
  values item ``j`` produced for ``region`` of the output;
- ``whole`` : items own their tiles (no split-K overlap): the workspace computes
  in place in an output-shaped canvas.

Implementations: ``TiledGemm`` (compute-bound: FLOPs at the matrix rate), ``Gemv``
(FLOPs at the vector rate, weights read once: memory-bound), ``Elementwise``
(sum of N source copies into one tile, or a copy / gather / scatter of row
blocks: bytes at the HBM rate) and ``EmbeddingBag`` (sum pooling of random table
rows: memory-bound, latency and DRAM row locality).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from devices.regions import Region


class Workspace(Protocol):
    canvas: np.ndarray | None  # output-shaped fp32 (items own their tiles)
    buf: np.ndarray | None  # one fp32 tile per item of a stage (split-K)
    # ahead: the items' results land in the canvas and their operands are never written
    # by the kernel's own routes, so when no item waits on a signal (every input is
    # resident) the runner may compute all items at once, in one call per block of rows:
    # the same numbers (modulo BLAS blocking in the last bit), modelled time untouched
    ahead: bool

    def compute(self, items: np.ndarray) -> None: ...


class Producer(Protocol):
    kind: str

    def cost(self, model, items: np.ndarray, resident: int | None = None
             ) -> tuple[float, float, float]: ...

    def bind(self, hbm, runtime, items: np.ndarray, stage_size: int, out: str) -> Workspace: ...


def _whole_k(items: np.ndarray, k: int) -> bool:
    return bool(((items[:, 4] == 0) & (items[:, 5] == k)).all()) if len(items) else True


class _GemmWorkspace:
    """Operands widened to fp32 (fp16 A rows widened as a stage first reads them, since a
    consumer GEMM's input arrives while it runs) and a canvas or per-WG buffers."""

    def __init__(self, hbm, runtime, a: str, b: str, items: np.ndarray, stage_size: int,
                 out: str, kernel: str):
        from devices import kernels  # numba: only runs that compute import it

        self.kernels, self.kernel = kernels, kernel
        self.a = hbm.view(a)
        self.a32 = self.a if self.a.dtype == np.float32 else np.empty(self.a.shape, np.float32)
        self.b32 = kernels.widen(hbm.view(b))
        self.canvas = self.buf = None
        self.ahead = False  # may compute every item at once (see ``Workspace.ahead``)
        if kernel == "gemv" or _whole_k(items, self.a.shape[1]):  # WGs own their tiles
            self.canvas = runtime.workspace(hbm.specs[out].shape)
            self.ahead = True
        else:  # split-K: partial tiles overlap, one buffer per WG
            tm = int((items[:, 1] - items[:, 0]).max())
            tn = int((items[:, 3] - items[:, 2]).max())
            self.buf = np.empty((stage_size, tm, tn), np.float32)

    def compute(self, items: np.ndarray) -> None:
        k = self.kernels
        if self.a32 is not self.a:
            for r0, r1 in {(int(r[0]), int(r[1])) for r in items}:
                self.a32[r0:r1] = k.widen(self.a[r0:r1])
        if self.kernel == "gemv":
            k.gemv_rows(self.a32, self.b32, items, self.canvas)
        elif self.canvas is not None:
            k.gemm_blocks(self.a32, self.b32, items, self.canvas)
        else:
            k.gemm_stage(self.a32, self.b32, items, self.buf)


@dataclass(frozen=True)
class TiledGemm:
    """C = A @ B by output tiles (T3's producer): FLOPs at the matrix rate, operand panels
    shared through the L2 (``outputs_cached``: outputs write-allocate in the L2, else
    they bypass it as T3's uncached output allocation does)."""

    a: str = "A"
    b: str = "B"
    outputs_cached: bool = False
    kernel: object = None  # the ``emulator.model.gemm.GemmKernel`` it runs (None: the
    # device's fixed tile at the peak)
    kind: str = "gemm"

    def cost(self, model, items, resident=None):
        return model.gemm_compute(items, self.outputs_cached, resident, kernel=self.kernel)

    def bind(self, hbm, runtime, items, stage_size, out):
        return _GemmWorkspace(hbm, runtime, self.a, self.b, items, stage_size, out, "gemm")


@dataclass(frozen=True)
class Gemv:
    """y = W @ x for a few right-hand sides (decode): each WG streams its rows of W once;
    FLOPs at the vector rate, so the time is the weights' bytes at the HBM rate."""

    a: str = "W"
    b: str = "x"
    kind: str = "gemv"

    def cost(self, model, items, resident=None):
        return model.gemm_compute(items, False, resident, vector=True)

    def bind(self, hbm, runtime, items, stage_size, out):
        return _GemmWorkspace(hbm, runtime, self.a, self.b, items, stage_size, out, "gemv")


@dataclass(frozen=True)
class Source:
    """One source copy of an elementwise item: ``buffer`` rows/cols shifted by (dr, dc)
    from the output tile (a slot of a slot buffer, or another block for a gather)."""

    buffer: str
    dr: int = 0
    dc: int = 0

    def region(self, tile: Region) -> Region:
        return (tile[0] + self.dr, tile[1] + self.dr, tile[2] + self.dc, tile[3] + self.dc)


class _ElementwiseWorkspace:
    def __init__(self, hbm, runtime, groups, out: str):
        from devices import kernels

        self.hbm, self.kernels, self.groups = hbm, kernels, groups
        self.canvas = runtime.workspace(hbm.specs[out].shape)
        self.buf = None
        self.ahead = False  # its sources may be what earlier items' routes wrote

    def compute(self, items: np.ndarray) -> None:
        for it in items:
            tile = tuple(int(x) for x in it[:4])
            acc = self.canvas[tile[0]:tile[1], tile[2]:tile[3]]
            for j, src in enumerate(self.groups[int(it[4])]):
                r = src.region(tile)
                self.kernels.sum_into(acc, self.hbm.view(src.buffer, r), first=j == 0)


@dataclass(frozen=True)
class Elementwise:
    """A memory-bound kernel: each output tile is the sum of its sources (item ``k0``
    indexes ``groups``: a tuple of ``Source`` per group). One source: a copy (gather and
    scatter are copies whose sources sit elsewhere). Sums in fp32, one rounding."""

    groups: tuple[tuple[Source, ...], ...]
    kind: str = "elementwise"

    def __post_init__(self):
        if not self.groups or any(not g for g in self.groups):
            raise ValueError("an elementwise kernel needs at least one source per group")
        if len({len(g) for g in self.groups}) != 1:
            raise ValueError("every group of an elementwise kernel sums the same number of "
                             "copies")

    @property
    def copies(self) -> int:
        return len(self.groups[0])

    def cost(self, model, items, resident=None):
        return model.elementwise_compute(items, self.copies, resident)

    def bind(self, hbm, runtime, items, stage_size, out):
        return _ElementwiseWorkspace(hbm, runtime, self.groups, out)


class _EmbeddingWorkspace:
    def __init__(self, hbm, runtime, bag: EmbeddingBag, out: str):
        from devices import kernels

        self.kernels, self.bag = kernels, bag
        self.table = kernels.widen(hbm.view(bag.table))  # the tables are resident inputs
        self.ids = hbm.view(bag.ids)
        self.canvas = runtime.workspace(hbm.specs[out].shape)
        self.buf = None
        self.ahead = True  # reads only the tables and ids, which no route writes

    def compute(self, items: np.ndarray) -> None:
        self.kernels.embedding_bags(self.table, self.ids, self.bag.rows, items, self.canvas)


@dataclass(frozen=True)
class EmbeddingBag:
    """Sum pooling of embedding bags (DLRM): item (s0, s1, c0, c1, j0, j1) pools, for each
    sample in [s0, s1), the ``j1 - j0`` rows its ids name in table t = c0 // ``dim`` into
    the output row's columns [c0, c1). Memory-bound with random row reads (the model's
    ``gather_compute``; ``read_efficiency``: the rows' DRAM locality with that many WGs at
    once)."""

    table: str = "E"  # (tables x rows, dim)
    ids: str = "I"  # int64 (samples, tables x L)
    rows: int = 1  # rows per table
    dim: int = 1  # embedding dimension D
    index_bytes: int = 8  # not a parameter: int64 row ids, bytes per id read
    kind: str = "embedding"

    def cost(self, model, items, resident=None):
        return model.gather_compute(items, self.dim, self.index_bytes, resident)

    def read_efficiency(self, model, concurrent: int) -> float:
        return model.row_efficiency(concurrent, self.dim * model.e)

    def bind(self, hbm, runtime, items, stage_size, out):
        return _EmbeddingWorkspace(hbm, runtime, self, out)
