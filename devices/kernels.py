"""Compute kernels of the emulated GPU: tiled GEMM stages, elementwise sums and copies,
and the fp16/bf16 conversions; GEMV and embedding-bag WGs come from
``devices.loop_kernels`` (numba).

A GEMM runs as stages of WG tiles. Each WG tile is a dot product over the whole
K dimension (or its split-K slice) computed with fp32 accumulation by the host BLAS
(numpy's ``matmul``, which releases the GIL); the WGs of a stage that sit side by side
on one row panel are computed by a single BLAS call and scattered into their tiles, so a
stage runs at the host BLAS's speed (``t3emu bench`` measures it against one ``matmul``
of the whole GEMM). fp16 and bf16 operands are stored as 2 bytes and widened exactly to
fp32 on the way in (``widen``); results are rounded back once, to nearest even, on the
way out (``narrow``), as tensor cores do. None of these needs a compiler: a run whose
producers are GEMMs and copies imports no numba (a rank starts in about half the time).

Public functions validate shapes and dtypes; the private helpers do no checks.
"""

from __future__ import annotations

import numpy as np


_BF16: dict = {}  # dtype (or its name, type) -> whether it is bfloat16


def is_bf16(dt) -> bool:
    """Whether ``dt`` is bfloat16, stored as 2 bytes (``ml_dtypes``' type, widened exactly,
    rounded by its cast), asked by name: ``ml_dtypes`` is imported only by the runs that use
    it (``devices.hbm.STORAGE_DTYPES``). Kept per ``dt`` (asked per tile written; a
    dtype's name is formed in Python)."""
    got = _BF16.get(dt)
    if got is None:
        got = _BF16[dt] = np.dtype(dt).name == "bfloat16"
    return got


def _runs(tiles: np.ndarray, blocks: bool) -> list[tuple[int, int]]:
    """[start, end) of each run of WGs that one BLAS call computes: WGs that share their
    rows and K slice and whose columns follow on (one row panel); with ``blocks``, runs
    with the same columns and K slice whose rows follow on are joined (a rectangle of the
    output listed row by row)."""
    n = tiles.shape[0]
    if n == 0:
        return []
    t = tiles
    cont = np.zeros(n, bool)
    cont[1:] = ((t[1:, 0] == t[:-1, 0]) & (t[1:, 1] == t[:-1, 1]) & (t[1:, 4] == t[:-1, 4])
                & (t[1:, 5] == t[:-1, 5]) & (t[1:, 2] == t[:-1, 3]))
    starts = np.flatnonzero(~cont).tolist()
    runs = list(zip(starts, starts[1:] + [n]))
    if not blocks:
        return runs
    out: list[tuple[int, int]] = []
    i = 0
    while i < len(runs):
        s, e = runs[i]
        c0, c1, k0, k1 = t[s, 2], t[e - 1, 3], t[s, 4], t[s, 5]
        while i + 1 < len(runs):
            f0, f1 = runs[i + 1]
            if not (t[f0, 0] == t[f0 - 1, 1] and t[f0, 2] == c0 and t[f1 - 1, 3] == c1
                    and t[f0, 4] == k0 and t[f0, 5] == k1):
                break
            e = f1
            i += 1
        out.append((s, e))
        i += 1
    return out


def _product(a: np.ndarray, b: np.ndarray, r0: int, r1: int, c0: int, c1: int, k0: int,
             k1: int) -> np.ndarray:
    """A[r0:r1, k0:k1] @ B[k0:k1, c0:c1] in one BLAS call (fp32 accumulation)."""
    panel = a[r0:r1] if k0 == 0 and k1 == a.shape[1] else np.ascontiguousarray(a[r0:r1, k0:k1])
    if c0 == 0 and c1 == b.shape[1] and k0 == 0 and k1 == b.shape[0]:
        return np.matmul(panel, b)
    return np.matmul(panel, np.ascontiguousarray(b[k0:k1, c0:c1]))


# ---------------------------------------------------------------- public wrappers

def _need(cond: bool, msg) -> None:
    """Raise ValueError(msg) unless ``cond``; ``msg`` may be a callable, so that a message
    with the operands' shapes is formatted only when it is raised (these run per tile)."""
    if not cond:
        raise ValueError(msg() if callable(msg) else msg)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    _need(h.dtype == np.float16, lambda: f"f16_to_f32 needs float16, got {h.dtype}")
    return np.ascontiguousarray(h).astype(np.float32)  # exact


def f32_to_f16(f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    _need(f.dtype == np.float32, lambda: f"f32_to_f16 needs float32, got {f.dtype}")
    if out is None:
        out = np.empty(f.shape, np.float16)
    _need(out.shape == f.shape and out.dtype == np.float16 and out.flags.c_contiguous,
          lambda: f"f32_to_f16 output must be C-contiguous float16 {f.shape}, got "
          f"{out.dtype} {out.shape}")
    with np.errstate(over="ignore"):  # beyond 65504: inf, as the hardware rounds
        np.copyto(out, f, casting="same_kind")  # IEEE round to nearest even
    return out


def _is_bf16(x: np.ndarray) -> bool:
    return is_bf16(x.dtype)


def bf16_to_f32(h: np.ndarray) -> np.ndarray:
    """bfloat16 -> float32, exact (a bf16 is the top half of an fp32's bits)."""
    _need(_is_bf16(h), lambda: f"bf16_to_f32 needs bfloat16, got {h.dtype}")
    bits = np.ascontiguousarray(h).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def narrow(f: np.ndarray, dtype) -> np.ndarray:
    """fp32 results as the storage dtype: rounded once, to nearest even (fp16: numpy's
    IEEE cast; bf16: ``ml_dtypes``' cast); fp32 as is."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return f32_to_f16(np.ascontiguousarray(f, np.float32))
    if is_bf16(dtype):
        return np.ascontiguousarray(f, np.float32).astype(dtype)
    return f


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y in the storage dtype; fp16 and bf16 add in fp32 and round once (RNE)."""
    _need(x.shape == y.shape and x.dtype == y.dtype, lambda: f"add needs equal arrays, got "
          f"{x.dtype}{x.shape} and {y.dtype}{y.shape}")
    if _is_bf16(x):
        return (bf16_to_f32(x) + bf16_to_f32(y)).astype(x.dtype)
    if x.dtype == np.float16:
        return f32_to_f16(f16_to_f32(x) + f16_to_f32(y))
    return x + y


def widen(x: np.ndarray) -> np.ndarray:
    """An operand (fp16 or fp32 matrix) as the fp32 the matrix units compute in (fp32 as is).

    This is the operand staging a GEMM kernel does on its way into the matrix
    units; it is an emulation workspace, not a modelled memory access.
    """
    _need(x.ndim == 2, lambda: f"operand must be a matrix, got {x.shape}")
    if x.dtype == np.float32:
        return np.ascontiguousarray(x)
    if _is_bf16(x):
        return bf16_to_f32(x)
    _need(x.dtype == np.float16,
          lambda: f"operand must be float16, bfloat16 or float32, got {x.dtype}")
    return f16_to_f32(x)


def _check_stage(a: np.ndarray, b: np.ndarray, tiles: np.ndarray) -> None:
    for name, x in (("A", a), ("B", b)):
        _need(x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous,
              lambda: f"{name} must be a C-contiguous fp32 matrix (see widen), got "
              f"{x.dtype}{x.shape}")
    _need(b.shape[0] == a.shape[1], lambda: f"K mismatch: A has {a.shape[1]}, B {b.shape[0]}")
    _need(tiles.ndim == 2 and tiles.shape[1] == 6 and tiles.dtype == np.int64,
          lambda: f"tiles must be int64 (n, 6), got {tiles.dtype}{tiles.shape}")
    if tiles.shape[0]:
        _need(bool(((tiles[:, 0] >= 0) & (tiles[:, 0] < tiles[:, 1])).all()
                   and (tiles[:, 1] <= a.shape[0]).all()), "tile rows out of range of A")
        _need(bool(((tiles[:, 2] >= 0) & (tiles[:, 2] < tiles[:, 3])).all()
                   and (tiles[:, 3] <= b.shape[1]).all()), "tile columns out of range of B")
        _need(bool(((tiles[:, 4] >= 0) & (tiles[:, 4] < tiles[:, 5])
                    & (tiles[:, 5] <= a.shape[1])).all()), "tile K ranges out of range")


def gemm_stage(a: np.ndarray, b: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """Compute the WGs of one stage into ``out`` (>= ntiles x tile_m x tile_n, fp32), one
    tile per WG: for split-K WGs, whose partial tiles overlap.

    ``a`` and ``b`` are fp32 (``widen``). ``tiles`` rows are (row0, row1, col0, col1,
    k0, k1): an output tile and the slice of K its WG sums. WG t's product lands in
    ``out[t, :row1-row0, :col1-col0]`` (the rest of ``out[t]`` is left as it was).
    WGs listed one after another on one row panel, with columns that follow on, are
    computed by one BLAS call (as a GPU's WGs of one row share their A panel in L2).
    """
    _check_stage(a, b, tiles)
    _need(out.ndim == 3 and out.dtype == np.float32 and out.shape[0] >= tiles.shape[0],
          lambda: f"out must be fp32 (>= {tiles.shape[0]}, tm, tn), got {out.dtype}{out.shape}")
    if tiles.shape[0]:
        _need(bool((tiles[:, 1] - tiles[:, 0] <= out.shape[1]).all()
                   and (tiles[:, 3] - tiles[:, 2] <= out.shape[2]).all()),
              "tiles larger than out's tiles")
    for s, e in _runs(tiles, blocks=False):
        r0, r1, c0 = (int(x) for x in tiles[s, :3])
        prod = _product(a, b, r0, r1, c0, int(tiles[e - 1, 3]), int(tiles[s, 4]),
                        int(tiles[s, 5]))
        for u in range(s, e):
            w = int(tiles[u, 3] - tiles[u, 2])
            o = int(tiles[u, 2]) - c0
            out[u, : r1 - r0, :w] = prod[:, o : o + w]


def gemm_blocks(a: np.ndarray, b: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """Compute the WGs of one stage in place in ``out`` (the output's shape, fp32): WG
    (r0, r1, c0, c1, k0, k1) writes ``out[r0:r1, c0:c1]`` (WGs must not overlap: no
    split-K). WGs listed row by row over a rectangle of the output are computed by one
    BLAS call per rectangle, written straight into ``out`` when it spans whole rows."""
    _check_stage(a, b, tiles)
    _need(out.ndim == 2 and out.dtype == np.float32 and out.flags.c_contiguous
          and out.shape[0] >= a.shape[0] and out.shape[1] == b.shape[1],
          lambda: f"out must be a C-contiguous fp32 ({a.shape[0]}, {b.shape[1]}), got "
          f"{out.dtype}{out.shape}")
    for s, e in _runs(tiles, blocks=True):
        r0, r1 = int(tiles[s, 0]), int(tiles[e - 1, 1])
        c0, c1 = int(tiles[s, 2]), int(tiles[e - 1, 3])
        k0, k1 = int(tiles[s, 4]), int(tiles[s, 5])
        if c0 == 0 and c1 == out.shape[1] == b.shape[1] and k0 == 0 and k1 == a.shape[1]:
            np.matmul(a[r0:r1], b, out=out[r0:r1])  # whole rows: BLAS writes them in place
        else:
            out[r0:r1, c0:c1] = _product(a, b, r0, r1, c0, c1, k0, k1)


def gemv_rows(a: np.ndarray, x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """Compute GEMV WGs in place in ``out`` (fp32, rows of ``a`` x columns of ``x``).

    Parameters
    ----------
    a : (M, K) fp32 matrix (the weights; ``widen`` fp16 first).
    x : (K, B) fp32 right-hand sides (B small: the tokens of a decode step).
    tiles : int64 (n, 6) rows (row0, row1, col0, col1, k0, k1), one per WG.
    out : (>= M, B) fp32, C-contiguous; WG t writes ``out[row0:row1, col0:col1]``.
    """
    _check_stage(a, x, tiles)
    _need(out.ndim == 2 and out.dtype == np.float32 and out.shape[1] == x.shape[1]
          and out.shape[0] >= a.shape[0],
          lambda: f"out must be fp32 (>= {a.shape[0]}, {x.shape[1]}), "
          f"got {out.dtype}{out.shape}")
    from devices import loop_kernels  # numba: only GEMV runs import it

    loop_kernels.gemv_rows(a, x, tiles, out)


def embedding_bags(table: np.ndarray, ids: np.ndarray, rows: int, items: np.ndarray,
                   out: np.ndarray) -> None:
    """Pool embedding bags in place in ``out`` (fp32).

    Parameters
    ----------
    table : (T x rows, D) fp32 rows of T tables (``widen`` fp16 first).
    ids : (batch, T x L) int64 row ids, each in [0, rows): bag (s, t) is ids[s, tL:(t+1)L].
    rows : rows per table.
    items : int64 (n, 6) rows (s0, s1, c0, c1, j0, j1): samples, output columns (one
        table's D columns: t = c0 // D) and the ids' columns pooled.
    out : (batch, T x D) fp32, C-contiguous.
    """
    _need(table.dtype == np.float32 and table.ndim == 2, lambda: f"table must be 2-D fp32, got "
          f"{table.dtype}{table.shape}")
    _need(ids.dtype == np.int64 and ids.ndim == 2,
          lambda: f"ids must be 2-D int64, got {ids.dtype}")
    _need(items.dtype == np.int64 and items.ndim == 2 and items.shape[1] == 6,
          "items must be int64 (n, 6)")
    _need(out.dtype == np.float32 and out.ndim == 2 and out.flags.c_contiguous,
          lambda: f"out must be C-contiguous fp32, got {out.dtype}{out.shape}")
    if len(items):
        _need(int(ids.min()) >= 0 and int(ids.max()) < rows, lambda: f"row ids outside [0, {rows})")
        _need(int((items[:, 3] - items[:, 2]).max()) <= table.shape[1]
              and int(items[:, 3].max()) <= out.shape[1], "items outside the output")
    from devices import loop_kernels  # numba: only embedding runs import it

    loop_kernels.embedding_bags(table, ids, rows, items, out)


def sum_into(acc: np.ndarray, src: np.ndarray, first: bool = False) -> None:
    """``acc = src`` (``first``) or ``acc += src`` elementwise, in fp32 (a memory-bound
    reduction kernel's step: each source copy is widened once, added once; the caller
    rounds the sum to the storage dtype once at the end).

    Parameters
    ----------
    acc : fp32 2-D array, updated in place.
    src : fp16 or fp32 2-D array of the same shape (fp16 is widened exactly).
    """
    _need(acc.dtype == np.float32 and acc.ndim == 2 and src.shape == acc.shape,
          lambda: f"sum_into needs an fp32 accumulator and a source of its shape, got "
          f"{acc.dtype}{acc.shape} and {src.dtype}{src.shape}")
    if first:
        np.copyto(acc, widen(src))
    else:
        np.add(acc, widen(src), out=acc)
