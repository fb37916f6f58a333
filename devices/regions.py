"""Geometry of 2-D array regions: what a tile, a chunk or a transfer covers.

Pure Python and numpy (no MPI), so maps, collectives and the model import it
without initialising MPI.
"""

from __future__ import annotations

import bisect

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


def shift_rows(region, rows: int) -> tuple:
    """``region`` moved ``rows`` rows down (same columns)."""
    return (region[0] + rows, region[1] + rows, region[2], region[3])


def tile_grid(row_blocks: list[tuple[int, int]], ncols: int, tile_m: int, tile_n: int,
              group: int = 1) -> np.ndarray:
    """Tiles (row0, row1, col0, col1): each row block (a ring chunk) tiled on its own, in
    the WG rasterisation order: row-major (``group`` = 1), or grouped (CUTLASS's
    threadblock swizzle, Triton's GROUP_SIZE_M): bands of ``group`` tile rows, each
    walked column by column, so that WGs dispatched together share B column panels."""
    g = max(1, group)
    cols = np.arange(0, ncols, tile_n, dtype=np.int64)
    nc = len(cols)
    col_end = np.minimum(cols + tile_n, ncols)
    parts = []
    for r0, r1 in row_blocks:
        rows = np.arange(r0, r1, tile_m, dtype=np.int64)
        nr = len(rows)
        if not nr or not nc:
            continue
        # each tile's (row index, column index) in order, written in place (no sort: a
        # grid of 10^6 tiles is built in milliseconds): the whole bands of g tile rows,
        # each walked column by column, then the last band's rows left over
        ri, ci = np.empty(nr * nc, np.int64), np.empty(nr * nc, np.int64)
        full = nr // g * g
        if full:
            nb = full // g
            ri[: full * nc].reshape(nb, nc, g)[...] = (
                np.arange(nb, dtype=np.int64)[:, None, None] * g
                + np.arange(g, dtype=np.int64)[None, None, :])
            ci[: full * nc].reshape(nb, nc, g)[...] = np.arange(nc, dtype=np.int64)[:, None]
        if full < nr:
            ri[full * nc :].reshape(nc, nr - full)[...] = np.arange(full, nr, dtype=np.int64)
            ci[full * nc :].reshape(nc, nr - full)[...] = np.arange(nc, dtype=np.int64)[:, None]
        out = np.empty((nr * nc, 4), np.int64)
        out[:, 0] = rows[ri]
        np.minimum(out[:, 0] + tile_m, r1, out=out[:, 1])
        out[:, 2] = cols[ci]
        out[:, 3] = col_end[ci]
        parts.append(out)
    if not parts:
        return np.zeros((0, 4), np.int64)
    return parts[0] if len(parts) == 1 else np.concatenate(parts)


class RegularGrid:
    """``tile_grid(row_blocks, ncols, tile_m, tile_n)`` (row-major, group 1) without its
    array: the rows of any tile ids computed when asked, so a grid of millions of tiles
    costs nothing until a stage reads its WGs. Indexing like the (n, 4) int64 array it
    stands for (``grid[ids]``, ``grid[ids, col]``; ``np.asarray(grid)`` builds it all)."""

    ndim = 2
    dtype = np.dtype(np.int64)

    def __init__(self, row_blocks, ncols: int, tile_m: int, tile_n: int):
        self.blocks = [(int(a), int(b)) for a, b in row_blocks if b > a]
        self.ncols, self.tm, self.tn = int(ncols), int(tile_m), int(tile_n)
        self.nct = -(-self.ncols // self.tn) if self.ncols > 0 else 0
        counts = [-(-(b - a) // self.tm) * self.nct for a, b in self.blocks]
        self.first = np.cumsum([0] + counts).astype(np.int64)  # first tile id per block
        self._first = self.first.tolist()  # (the same as ints, for ``row``)
        self.starts = np.array([a for a, _ in self.blocks] or [0], np.int64)
        self.ends = np.array([b for _, b in self.blocks] or [0], np.int64)
        self.n = int(self.first[-1])
        self.shape = (self.n, 4)

    def __len__(self) -> int:
        return self.n

    def rows(self, ids) -> np.ndarray:
        ids = np.asarray(ids, np.int64).reshape(-1)
        if len(ids) and (ids.min() < 0 or ids.max() >= self.n):
            raise IndexError(f"tile ids outside 0..{self.n - 1}")
        b = np.searchsorted(self.first, ids, "right") - 1
        ri, ci = np.divmod(ids - self.first[b], max(1, self.nct))
        r0 = self.starts[b] + ri * self.tm
        c0 = ci * self.tn
        return np.stack([r0, np.minimum(r0 + self.tm, self.ends[b]), c0,
                         np.minimum(c0 + self.tn, self.ncols)], axis=1)

    def row(self, t: int) -> tuple[int, int, int, int]:
        """``rows([t])[0]`` as a tuple of ints, by integer arithmetic (a tile's route
        asks for one region at a time)."""
        t = int(t)
        if not 0 <= t < self.n:
            raise IndexError(f"tile ids outside 0..{self.n - 1}")
        b = bisect.bisect_right(self._first, t) - 1
        ri, ci = divmod(t - self._first[b], max(1, self.nct))
        r0 = self.blocks[b][0] + ri * self.tm
        c0 = ci * self.tn
        return r0, min(r0 + self.tm, self.blocks[b][1]), c0, min(c0 + self.tn, self.ncols)

    def __getitem__(self, key):
        if isinstance(key, tuple):
            rows, cols = key
            return self[rows][:, cols]
        if isinstance(key, (int, np.integer)):
            return self.rows([key])[0]
        if isinstance(key, slice):
            key = np.arange(self.n)[key]
        return self.rows(key)

    def __array__(self, dtype=None, copy=None):
        a = self.rows(np.arange(self.n))
        return a if dtype is None else a.astype(dtype)

    def tolist(self) -> list:
        return np.asarray(self).tolist()

    def tiles_in(self, region) -> range | list[int] | None:
        """The ids of the tiles exactly covering ``region`` when it lies in whole tiles of
        one block or is a run of whole blocks (all columns); None otherwise (the caller
        checks it the long way)."""
        r0, r1, c0, c1 = (int(x) for x in region)
        if r1 <= r0 or c1 <= c0:
            return None
        i = int(np.searchsorted(self.starts, r0, "right")) - 1
        if i < 0 or self.starts[i] != r0 and (r0 - self.starts[i]) % self.tm:
            return None
        if c0 == 0 and c1 == self.ncols and self.starts[i] == r0:
            j = i
            while j < len(self.blocks) and self.ends[j] < r1:
                if j + 1 >= len(self.blocks) or self.starts[j + 1] != self.ends[j]:
                    return None
                j += 1
            if j < len(self.blocks) and self.ends[j] == r1:
                return range(int(self.first[i]), int(self.first[j + 1]))
        a, b = self.blocks[i]
        if r1 > b or (r1 != b and (r1 - a) % self.tm) or c0 % self.tn or \
                (c1 != self.ncols and c1 % self.tn) or c1 > self.ncols:
            return None
        ri = range((r0 - a) // self.tm, -(-(r1 - a) // self.tm))
        ci = range(c0 // self.tn, -(-c1 // self.tn))
        base = int(self.first[i])
        return [base + x * self.nct + y for x in ri for y in ci]
