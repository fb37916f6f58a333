"""numba kernels of the emulated GPU whose arithmetic is a loop in a WG's own order: the
GEMV WGs of a decode step and the embedding-bag WGs of a DLRM layer.

Each sums in fp32 in the order the WG's threads do (ascending K for a GEMV row, ascending
id for a bag), which no single numpy call reproduces; the BLAS-bound and elementwise
kernels need no compiler and live in ``devices.kernels``, so only runs of these two
producers import numba. Compiled once into numba's on-disk cache (``cache=True``;
``emulator.runtime.numba_cache``) and run without the GIL (``nogil=True``) so a DMA
engine's thread runs while a stage computes. ``devices.kernels`` validates the arguments.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_JIT = dict(cache=True, nogil=True)


@njit(**_JIT)
def gemv_rows(a: np.ndarray, x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """GEMV WGs: out[r, c] = sum_k a[r, k] x[k, c] over each WG's rows, columns (the few
    right-hand sides of a decode step) and K slice, in fp32, k in ascending order (a WG's
    threads each own rows and stream their weights once)."""
    for t in range(tiles.shape[0]):
        r0, r1, c0, c1, k0, k1 = tiles[t]
        for r in range(r0, r1):
            for c in range(c0, c1):
                acc = np.float32(0.0)
                for kk in range(k0, k1):
                    acc += a[r, kk] * x[kk, c]
                out[r, c] = acc


@njit(**_JIT)
def embedding_bags(table: np.ndarray, ids: np.ndarray, rows: int, items: np.ndarray,
                   out: np.ndarray) -> None:
    """Embedding-bag WGs (sum pooling): item (s0, s1, c0, c1, j0, j1) pools, for each
    sample s in [s0, s1), the rows ``ids[s, j0:j1]`` of table t = c0 // D (rows t x
    ``rows`` .. of ``table``) into out[s, c0:c1], in fp32, ids in ascending j."""
    d = table.shape[1]
    for t in range(items.shape[0]):
        s0, s1, c0, c1, j0, j1 = items[t]
        base = (c0 // d) * rows
        for s in range(s0, s1):
            for c in range(c1 - c0):
                out[s, c0 + c] = np.float32(0.0)
            for j in range(j0, j1):
                r = base + ids[s, j]
                for c in range(c1 - c0):
                    out[s, c0 + c] += table[r, c]


def warm_up() -> None:
    """Compile (or load from numba's cache) both kernels."""
    a = np.ones((3, 5), np.float32)
    tiles = np.array([[0, 3, 0, 2, 0, 5]], np.int64)
    gemv_rows(a, np.ones((5, 4), np.float32), tiles, np.empty((3, 4), np.float32))
    embedding_bags(a, np.zeros((2, 2), np.int64), 3, np.array([[0, 2, 0, 5, 0, 2]], np.int64),
                   np.empty((2, 5), np.float32))
