"""Geometry of 2-D array regions: what a tile, a chunk or a transfer covers.

Pure Python and numpy (no MPI), so maps, collectives and the model import it
without initialising MPI.
"""

from __future__ import annotations

import numpy as np

Region = tuple[int, int, int, int]  # (row0, row1, col0, col1) of a 2-D array


def region_elems(region: Region) -> int:
    return (region[1] - region[0]) * (region[3] - region[2])


def region_shape(region: Region) -> tuple[int, int]:
    return region[1] - region[0], region[3] - region[2]


def join(a: Region, b: Region, width: int) -> Region | None:
    """The union of regions ``a`` then ``b`` of an array ``width`` columns wide, if it is a
    region: ``b`` continues ``a``'s rows to the right, or ``b``'s whole rows follow
    ``a``'s whole rows (then the union is contiguous). Else None."""
    if a[0] == b[0] and a[1] == b[1] and a[3] == b[2]:
        return (a[0], a[1], a[2], b[3])
    if a[2] == b[2] == 0 and a[3] == b[3] == width and a[1] == b[0]:
        return (a[0], b[1], 0, width)
    return None


def tile_grid(row_blocks: list[tuple[int, int]], ncols: int, tile_m: int, tile_n: int,
              group: int = 1) -> np.ndarray:
    """Tiles (row0, row1, col0, col1): each row block (a ring chunk) tiled on its own, in
    the WG rasterisation order: row-major (``group`` = 1), or grouped (CUTLASS's
    threadblock swizzle, Triton's GROUP_SIZE_M): bands of ``group`` tile rows, each
    walked column by column, so that WGs dispatched together share B column panels."""
    parts = []
    g = max(1, group)
    cols = np.arange(0, ncols, tile_n, dtype=np.int64)
    for r0, r1 in row_blocks:
        rows = np.arange(r0, r1, tile_m, dtype=np.int64)
        if not len(rows) or not len(cols):
            continue
        i = np.arange(len(rows))
        # bands of g tile rows, each walked column by column: sort by (band, column, row)
        ri, ci = np.repeat(i, len(cols)), np.tile(np.arange(len(cols)), len(rows))
        order = np.lexsort((ri, ci, ri // g))
        a, c = rows[ri[order]], cols[ci[order]]
        parts.append(np.stack([a, np.minimum(a + tile_m, r1), c,
                               np.minimum(c + tile_n, ncols)], axis=1))
    if not parts:
        return np.zeros((0, 4), np.int64)
    return np.concatenate(parts).astype(np.int64)
