"""numba compute kernels of the emulated GPU: tiled GEMM stages, GEMV, elementwise sums
and copies, and fp16 helpers.

A GEMM runs as stages of WG tiles. Each WG tile is a dot product over the whole
K dimension (or its split-K slice) computed with fp32 accumulation (numba's
``np.dot`` calls BLAS without the GIL); the WGs of a stage that sit side by side
on one row panel are computed by a single BLAS call and scattered into their
tiles, so a stage runs at the host BLAS's speed (``t3emu bench`` measures it
against numpy's ``matmul``); fp16 operands are stored as fp16 (passed to numba as their
uint16 bit patterns, since numba has no float16 arrays) and widened to fp32 on
the way in (``widen``), and results are rounded back to fp16 on the way out, as tensor
cores do. Kernels are compiled once into numba's on-disk cache
(``cache=True``) and release the GIL (``nogil=True``) so the DMA engine thread
runs while a stage computes.

Public wrappers validate shapes and dtypes; the private ``_kernels`` do no checks.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np
from numba import njit
from numba.core.errors import NumbaPerformanceWarning

# A[r0:r1, :] is a contiguous row block at run time; numba types it as layout 'A'.
warnings.filterwarnings("ignore", category=NumbaPerformanceWarning)

_JIT = dict(cache=True, nogil=True)
BF16 = np.dtype(ml_dtypes.bfloat16)  # stored as 2 bytes; widened exactly, rounded by ml_dtypes


@njit(**_JIT)
def _f16_bits_to_f32(h: np.ndarray, out: np.ndarray) -> None:
    """IEEE binary16 bit patterns -> float32 (exact, subnormals, inf and NaN kept)."""
    o = out.view(np.uint32)
    for i in range(h.size):
        x = np.uint32(h.flat[i])
        sign = (x >> 15) << 31
        exp = (x >> 10) & 0x1F
        mant = x & 0x3FF
        if exp == 0:
            if mant == 0:
                bits = sign
            else:  # subnormal half: normalise
                e = 0
                while (mant & 0x400) == 0:
                    mant <<= 1
                    e += 1
                bits = sign | ((113 - e) << 23) | ((mant & 0x3FF) << 13)
        elif exp == 31:
            bits = sign | (0xFF << 23) | (mant << 13)
        else:
            bits = sign | ((exp + 112) << 23) | (mant << 13)
        o.flat[i] = bits


@njit(**_JIT)
def _f32_to_f16_bits(f: np.ndarray, out: np.ndarray) -> None:
    """float32 -> IEEE binary16 bit patterns, round to nearest even (as numpy does)."""
    fb = f.view(np.uint32)
    for i in range(f.size):
        x = fb.flat[i]
        sign = (x >> 16) & 0x8000
        exp = np.int64((x >> 23) & 0xFF)
        mant = x & 0x7FFFFF
        if exp == 0xFF:
            h = sign | 0x7C00 | (0x200 if mant != 0 else 0)
        else:
            e = exp - 112  # rebias 127 -> 15
            if e >= 31:
                h = sign | 0x7C00
            elif e <= 0:
                if e < -10:
                    h = sign
                else:
                    m = mant | 0x800000
                    shift = np.uint32(14 - e)
                    hm = m >> shift
                    rem = m & ((np.uint32(1) << shift) - 1)
                    half = np.uint32(1) << (shift - 1)
                    if rem > half or (rem == half and (hm & 1) == 1):
                        hm += 1
                    h = sign | hm
            else:
                hm = (np.uint32(e) << 10) | (mant >> 13)
                rem = mant & 0x1FFF
                if rem > 0x1000 or (rem == 0x1000 and (hm & 1) == 1):
                    hm += 1
                h = sign | hm
        out.flat[i] = np.uint16(h)


@njit(**_JIT)
def _widen_f16(x: np.ndarray, out: np.ndarray) -> None:
    for i in range(x.shape[0]):
        _f16_bits_to_f32(x[i], out[i])


@njit(**_JIT)
def _run_end(tiles: np.ndarray, t: int) -> int:
    """End of the run of WGs from ``t`` that share their rows and K slice and whose
    columns follow on (one row panel)."""
    r0, r1, k0, k1 = tiles[t, 0], tiles[t, 1], tiles[t, 4], tiles[t, 5]
    e = t + 1
    while (e < tiles.shape[0] and tiles[e, 0] == r0 and tiles[e, 1] == r1
           and tiles[e, 4] == k0 and tiles[e, 5] == k1 and tiles[e, 2] == tiles[e - 1, 3]):
        e += 1
    return e


@njit(**_JIT)
def _block_end(tiles: np.ndarray, t: int) -> int:
    """End of the block of WGs from ``t``: runs (row panels) with the same columns and K
    slice whose rows follow on, i.e. a rectangle of the output listed row by row."""
    e = _run_end(tiles, t)
    c0, c1 = tiles[t, 2], tiles[e - 1, 3]
    while e < tiles.shape[0] and tiles[e, 0] == tiles[e - 1, 1] and tiles[e, 2] == c0:
        f = _run_end(tiles, e)
        if tiles[f - 1, 3] != c1 or tiles[e, 4] != tiles[t, 4] or tiles[e, 5] != tiles[t, 5]:
            break
        e = f
    return e


@njit(**_JIT)
def _product(a: np.ndarray, b: np.ndarray, r0: int, r1: int, c0: int, c1: int, k0: int,
             k1: int) -> np.ndarray:
    """A[r0:r1, k0:k1] @ B[k0:k1, c0:c1] in one BLAS call (fp32 accumulation)."""
    if k0 == 0 and k1 == a.shape[1]:
        panel = a[r0:r1]
    else:
        panel = np.ascontiguousarray(a[r0:r1, k0:k1])
    if c0 == 0 and c1 == b.shape[1] and k0 == 0 and k1 == b.shape[0]:
        return np.dot(panel, b)
    return np.dot(panel, np.ascontiguousarray(b[k0:k1, c0:c1]))


@njit(**_JIT)
def _gemm_stage(a: np.ndarray, b: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    t = 0
    while t < tiles.shape[0]:
        e = _run_end(tiles, t)
        r0, r1 = tiles[t, 0], tiles[t, 1]
        c0 = tiles[t, 2]
        prod = _product(a, b, r0, r1, c0, tiles[e - 1, 3], tiles[t, 4], tiles[t, 5])
        for u in range(t, e):
            w = tiles[u, 3] - tiles[u, 2]
            s = tiles[u, 2] - c0
            out[u, : r1 - r0, :w] = prod[:, s : s + w]
        t = e


@njit(**_JIT)
def _gemm_blocks(a: np.ndarray, b: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    t = 0
    while t < tiles.shape[0]:
        e = _block_end(tiles, t)
        r0, r1, c0, c1 = tiles[t, 0], tiles[e - 1, 1], tiles[t, 2], tiles[e - 1, 3]
        k0, k1 = tiles[t, 4], tiles[t, 5]
        if c0 == 0 and c1 == out.shape[1] and k0 == 0 and k1 == a.shape[1] \
                and c1 == b.shape[1]:  # whole rows: BLAS writes them in place
            np.dot(a[r0:r1], b, out[r0:r1])
        elif c0 == 0 and c1 == out.shape[1]:
            out[r0:r1] = _product(a, b, r0, r1, c0, c1, k0, k1)
        else:
            out[r0:r1, c0:c1] = _product(a, b, r0, r1, c0, c1, k0, k1)
        t = e


@njit(**_JIT)
def _add_f16(x: np.ndarray, y: np.ndarray, out: np.ndarray) -> None:
    """out = fp16(fp32(x) + fp32(y)) on bit patterns (a CU's add of two fp16 copies)."""
    n = x.size
    blk = 4096
    fx = np.empty(blk, np.float32)
    fy = np.empty(blk, np.float32)
    for s in range(0, n, blk):
        e = min(n, s + blk)
        _f16_bits_to_f32(x[s:e], fx[: e - s])
        _f16_bits_to_f32(y[s:e], fy[: e - s])
        fx[: e - s] += fy[: e - s]
        _f32_to_f16_bits(fx[: e - s], out[s:e])


@njit(**_JIT)
def _gemv_rows(a: np.ndarray, x: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
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
def _embedding_bags(table: np.ndarray, ids: np.ndarray, rows: int, items: np.ndarray,
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


@njit(**_JIT)
def _sum_into(acc: np.ndarray, src: np.ndarray, first: bool) -> None:
    """acc (fp32) = src or acc + src, elementwise over equal 2-D shapes (src fp32)."""
    for i in range(acc.shape[0]):
        for j in range(acc.shape[1]):
            if first:
                acc[i, j] = src[i, j]
            else:
                acc[i, j] += src[i, j]


# ---------------------------------------------------------------- public wrappers

def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def f16_to_f32(h: np.ndarray) -> np.ndarray:
    _need(h.dtype == np.float16, f"f16_to_f32 needs float16, got {h.dtype}")
    out = np.empty(h.shape, np.float32)
    _f16_bits_to_f32(np.ascontiguousarray(h).view(np.uint16), out)
    return out


def f32_to_f16(f: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    _need(f.dtype == np.float32, f"f32_to_f16 needs float32, got {f.dtype}")
    if out is None:
        out = np.empty(f.shape, np.float16)
    _need(out.shape == f.shape and out.dtype == np.float16 and out.flags.c_contiguous,
          f"f32_to_f16 output must be C-contiguous float16 {f.shape}, got {out.dtype} {out.shape}")
    _f32_to_f16_bits(np.ascontiguousarray(f), out.view(np.uint16))
    return out


def _is_bf16(x: np.ndarray) -> bool:
    return x.dtype == BF16


def bf16_to_f32(h: np.ndarray) -> np.ndarray:
    """bfloat16 -> float32, exact (a bf16 is the top half of an fp32's bits)."""
    _need(_is_bf16(h), f"bf16_to_f32 needs bfloat16, got {h.dtype}")
    bits = np.ascontiguousarray(h).view(np.uint16).astype(np.uint32) << 16
    return bits.view(np.float32)


def narrow(f: np.ndarray, dtype) -> np.ndarray:
    """fp32 results as the storage dtype: rounded once, to nearest even (fp16: this
    module's kernel; bf16: ``ml_dtypes``' cast); fp32 as is."""
    dtype = np.dtype(dtype)
    if dtype == np.float16:
        return f32_to_f16(np.ascontiguousarray(f, np.float32))
    if dtype == BF16:
        return np.ascontiguousarray(f, np.float32).astype(BF16)
    return f


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y in the storage dtype; fp16 and bf16 add in fp32 and round once (RNE)."""
    _need(x.shape == y.shape and x.dtype == y.dtype, f"add needs equal arrays, got "
          f"{x.dtype}{x.shape} and {y.dtype}{y.shape}")
    if _is_bf16(x):
        return (bf16_to_f32(x) + bf16_to_f32(y)).astype(BF16)
    if x.dtype == np.float16:
        out = np.empty(x.shape, np.float16)
        _add_f16(np.ascontiguousarray(x).view(np.uint16).ravel(),
                 np.ascontiguousarray(y).view(np.uint16).ravel(), out.view(np.uint16).ravel())
        return out
    return x + y


def widen(x: np.ndarray) -> np.ndarray:
    """An operand (fp16 or fp32 matrix) as the fp32 the matrix units compute in (fp32 as is).

    This is the operand staging a GEMM kernel does on its way into the matrix
    units; it is an emulation workspace, not a modelled memory access.
    """
    _need(x.ndim == 2, f"operand must be a matrix, got {x.shape}")
    if x.dtype == np.float32:
        return np.ascontiguousarray(x)
    if _is_bf16(x):
        return bf16_to_f32(x)
    _need(x.dtype == np.float16, f"operand must be float16, bfloat16 or float32, got {x.dtype}")
    out = np.empty(x.shape, np.float32)
    _widen_f16(np.ascontiguousarray(x).view(np.uint16), out)
    return out


def _check_stage(a: np.ndarray, b: np.ndarray, tiles: np.ndarray) -> None:
    for name, x in (("A", a), ("B", b)):
        _need(x.ndim == 2 and x.dtype == np.float32 and x.flags.c_contiguous,
              f"{name} must be a C-contiguous fp32 matrix (see widen), got {x.dtype}{x.shape}")
    _need(b.shape[0] == a.shape[1], f"K mismatch: A has {a.shape[1]}, B {b.shape[0]}")
    _need(tiles.ndim == 2 and tiles.shape[1] == 6 and tiles.dtype == np.int64,
          f"tiles must be int64 (n, 6), got {tiles.dtype}{tiles.shape}")
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
          f"out must be fp32 (>= {tiles.shape[0]}, tm, tn), got {out.dtype}{out.shape}")
    if tiles.shape[0]:
        _need(bool((tiles[:, 1] - tiles[:, 0] <= out.shape[1]).all()
                   and (tiles[:, 3] - tiles[:, 2] <= out.shape[2]).all()),
              "tiles larger than out's tiles")
    _gemm_stage(a, b, tiles, out)


def gemm_blocks(a: np.ndarray, b: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """Compute the WGs of one stage in place in ``out`` (the output's shape, fp32): WG
    (r0, r1, c0, c1, k0, k1) writes ``out[r0:r1, c0:c1]`` (WGs must not overlap: no
    split-K). WGs listed row by row over a rectangle of the output are computed by one
    BLAS call per rectangle, written straight into ``out`` when it spans whole rows."""
    _check_stage(a, b, tiles)
    _need(out.ndim == 2 and out.dtype == np.float32 and out.flags.c_contiguous
          and out.shape[0] >= a.shape[0] and out.shape[1] == b.shape[1],
          f"out must be a C-contiguous fp32 ({a.shape[0]}, {b.shape[1]}), got "
          f"{out.dtype}{out.shape}")
    _gemm_blocks(a, b, tiles, out)


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
          and out.shape[0] >= a.shape[0], f"out must be fp32 (>= {a.shape[0]}, {x.shape[1]}), "
          f"got {out.dtype}{out.shape}")
    _gemv_rows(a, x, tiles, out)


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
    _need(table.dtype == np.float32 and table.ndim == 2, f"table must be 2-D fp32, got "
          f"{table.dtype}{table.shape}")
    _need(ids.dtype == np.int64 and ids.ndim == 2, f"ids must be 2-D int64, got {ids.dtype}")
    _need(items.dtype == np.int64 and items.ndim == 2 and items.shape[1] == 6,
          "items must be int64 (n, 6)")
    _need(out.dtype == np.float32 and out.ndim == 2 and out.flags.c_contiguous,
          f"out must be C-contiguous fp32, got {out.dtype}{out.shape}")
    if len(items):
        _need(int(ids.min()) >= 0 and int(ids.max()) < rows, f"row ids outside [0, {rows})")
        _need(int((items[:, 3] - items[:, 2]).max()) <= table.shape[1]
              and int(items[:, 3].max()) <= out.shape[1], "items outside the output")
    _embedding_bags(table, ids, rows, items, out)


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
          f"sum_into needs an fp32 accumulator and a source of its shape, got "
          f"{acc.dtype}{acc.shape} and {src.dtype}{src.shape}")
    _sum_into(acc, widen(src), first)


def warm_up(dtypes: tuple[str, ...] = ("fp16", "fp32")) -> None:
    """Compile (or load from numba's cache) the kernels runs of these dtypes use."""
    for dt in (np.float16 if d == "fp16" else np.float32 for d in dtypes):
        a = widen(np.ones((3, 5), dt))
        b = widen(np.ones((5, 4), dt))
        tiles = np.array([[0, 3, 0, 2, 0, 5], [0, 3, 2, 4, 0, 5], [0, 3, 2, 4, 1, 3]], np.int64)
        gemm_stage(a, b, tiles, np.empty((3, 3, 2), np.float32))
        gemm_blocks(a, b, tiles[:2], np.empty((3, 4), np.float32))
        gemm_blocks(a, b, tiles[1:2], np.empty((3, 4), np.float32))
        add(np.ones(3, dt), np.ones(3, dt))
        gemv_rows(a, b, tiles[:1], np.empty((3, 4), np.float32))
        embedding_bags(a, np.zeros((2, 2), np.int64), 3,
                       np.array([[0, 2, 0, 5, 0, 2]], np.int64), np.empty((2, 5), np.float32))
        acc = np.empty((2, 2), np.float32)
        sum_into(acc, np.ones((2, 2), dt), True)
        sum_into(acc, np.ones((2, 2), dt))
        if dt == np.float16:
            f32_to_f16(f16_to_f32(np.ones(3, np.float16)))
