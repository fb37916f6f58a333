"""numba compute kernels of the emulated GPU: tiled GEMM stages and fp16 helpers.

A GEMM runs as stages of WG tiles. Each WG tile is a dot product over the whole
K dimension computed with fp32 accumulation (numba's ``np.dot`` calls BLAS
without the GIL); fp16 operands are stored as fp16 (passed to numba as their
uint16 bit patterns, since numba has no float16 arrays) and widened to fp32 on
the way in, and results are rounded back to fp16 on the way out, as tensor
cores do. Kernels are compiled once into numba's on-disk cache
(``cache=True``) and release the GIL (``nogil=True``) so the DMA engine thread
runs while a stage computes.

Public wrappers validate shapes and dtypes; the private ``_kernels`` do no checks.
"""

from __future__ import annotations

import warnings

import numpy as np
from numba import njit
from numba.core.errors import NumbaPerformanceWarning

# A[r0:r1, :] is a contiguous row block at run time; numba types it as layout 'A'.
warnings.filterwarnings("ignore", category=NumbaPerformanceWarning)

_JIT = dict(cache=True, nogil=True)


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
def _pack_b_f32(b: np.ndarray, tile_n: int, out: np.ndarray) -> None:
    """B (K x N) -> column panels out[j] = B[:, j*tile_n : (j+1)*tile_n], zero padded."""
    k, n = b.shape
    for j in range(out.shape[0]):
        c0 = j * tile_n
        w = min(tile_n, n - c0)
        for kk in range(k):
            for c in range(w):
                out[j, kk, c] = b[kk, c0 + c]
            for c in range(w, tile_n):
                out[j, kk, c] = 0.0


@njit(**_JIT)
def _pack_b_f16(b: np.ndarray, tile_n: int, out: np.ndarray) -> None:
    k, n = b.shape
    row = np.empty(n, np.float32)
    for kk in range(k):
        _f16_bits_to_f32(b[kk], row)
        for j in range(out.shape[0]):
            c0 = j * tile_n
            w = min(tile_n, n - c0)
            for c in range(w):
                out[j, kk, c] = row[c0 + c]
            for c in range(w, tile_n):
                out[j, kk, c] = 0.0


@njit(**_JIT)
def _gemm_stage_f32(a: np.ndarray, bp: np.ndarray, tiles: np.ndarray, tile_n: int,
                    out: np.ndarray) -> None:
    """One GEMM stage: out[t, :h, :] = A[r0:r1, k0:k1] @ Bpanel[c0 // tile_n][k0:k1]."""
    k = a.shape[1]
    for t in range(tiles.shape[0]):
        r0, r1, c0, k0, k1 = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 4], tiles[t, 5]
        if k0 == 0 and k1 == k:
            out[t, : r1 - r0, :] = np.dot(a[r0:r1, :], bp[c0 // tile_n])
        else:  # a split-K WG: its slice of the dot-product dimension
            out[t, : r1 - r0, :] = np.dot(np.ascontiguousarray(a[r0:r1, k0:k1]),
                                          bp[c0 // tile_n][k0:k1])


@njit(**_JIT)
def _gemm_stage_f16(a: np.ndarray, bp: np.ndarray, tiles: np.ndarray, tile_n: int,
                    out: np.ndarray) -> None:
    """fp16 A (as bits): the A row panel is widened once per run of tiles sharing it."""
    k = a.shape[1]
    panel = np.empty((out.shape[1], k), np.float32)
    cur0, cur1 = -1, -1
    for t in range(tiles.shape[0]):
        r0, r1, c0, k0, k1 = tiles[t, 0], tiles[t, 1], tiles[t, 2], tiles[t, 4], tiles[t, 5]
        h = r1 - r0
        if r0 != cur0 or r1 != cur1:
            for i in range(h):
                _f16_bits_to_f32(a[r0 + i], panel[i])
            cur0, cur1 = r0, r1
        if k0 == 0 and k1 == k:
            out[t, :h, :] = np.dot(panel[:h], bp[c0 // tile_n])
        else:
            out[t, :h, :] = np.dot(np.ascontiguousarray(panel[:h, k0:k1]),
                                   bp[c0 // tile_n][k0:k1])


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


def add(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """x + y in the storage dtype; fp16 adds in fp32 and rounds once (RNE)."""
    _need(x.shape == y.shape and x.dtype == y.dtype, f"add needs equal arrays, got "
          f"{x.dtype}{x.shape} and {y.dtype}{y.shape}")
    if x.dtype == np.float16:
        out = np.empty(x.shape, np.float16)
        _add_f16(np.ascontiguousarray(x).view(np.uint16).ravel(),
                 np.ascontiguousarray(y).view(np.uint16).ravel(), out.view(np.uint16).ravel())
        return out
    return x + y


def pack_b(b: np.ndarray, tile_n: int) -> np.ndarray:
    """Pack B (K x N, fp16 or fp32) into fp32 column panels (N/tile_n, K, tile_n).

    This is the operand staging a GEMM kernel does on its way into the matrix
    units; it is an emulation workspace, not a modelled memory access.
    """
    _need(b.ndim == 2 and b.flags.c_contiguous, f"B must be a C-contiguous matrix, got {b.shape}")
    _need(tile_n > 0, f"tile_n must be > 0, got {tile_n}")
    k, n = b.shape
    out = np.empty(((n + tile_n - 1) // tile_n, k, tile_n), np.float32)
    if b.dtype == np.float16:
        _pack_b_f16(b.view(np.uint16), tile_n, out)
    elif b.dtype == np.float32:
        _pack_b_f32(b, tile_n, out)
    else:
        raise ValueError(f"B must be float16 or float32, got {b.dtype}")
    return out


def gemm_stage(a: np.ndarray, bp: np.ndarray, tiles: np.ndarray, out: np.ndarray) -> None:
    """Compute the WG tiles of one stage into ``out`` (ntiles x tile_m x tile_n, fp32).

    ``tiles`` rows are (row0, row1, col0, col1, k0, k1): an output tile and the
    slice of K its WG sums (the whole of K unless the GEMM is split-K); each
    tile needs row1 - row0 <= tile_m, col0 a multiple of tile_n. Columns beyond
    col1 in ``out`` hold the zero-padded panel's products and are ignored.
    """
    _need(a.ndim == 2 and a.flags.c_contiguous, f"A must be a C-contiguous matrix, got {a.shape}")
    _need(bp.ndim == 3 and bp.dtype == np.float32, f"B panels must be fp32 (P, K, tn), got "
          f"{bp.dtype}{bp.shape}")
    _need(bp.shape[1] == a.shape[1], f"K mismatch: A has {a.shape[1]}, B panels {bp.shape[1]}")
    _need(tiles.ndim == 2 and tiles.shape[1] == 6 and tiles.dtype == np.int64,
          f"tiles must be int64 (n, 6), got {tiles.dtype}{tiles.shape}")
    _need(out.ndim == 3 and out.dtype == np.float32 and out.shape[0] >= tiles.shape[0]
          and out.shape[2] == bp.shape[2], f"out must be fp32 (>= {tiles.shape[0]}, tm, "
          f"{bp.shape[2]}), got {out.dtype}{out.shape}")
    tn = bp.shape[2]
    if tiles.shape[0]:
        h = tiles[:, 1] - tiles[:, 0]
        _need(bool((h > 0).all() and (h <= out.shape[1]).all()), "tile heights out of range")
        _need(bool((tiles[:, 2] % tn == 0).all()), "tile col0 must be multiples of tile_n")
        _need(bool((tiles[:, 1] <= a.shape[0]).all()), "tile rows exceed A")
        _need(bool(((tiles[:, 4] >= 0) & (tiles[:, 4] < tiles[:, 5])
                    & (tiles[:, 5] <= a.shape[1])).all()), "tile K ranges out of range")
    if a.dtype == np.float16:
        _gemm_stage_f16(a.view(np.uint16), bp, tiles, tn, out)
    elif a.dtype == np.float32:
        _gemm_stage_f32(a, bp, tiles, tn, out)
    else:
        raise ValueError(f"A must be float16 or float32, got {a.dtype}")


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel on tiny inputs."""
    for dt in (np.float16, np.float32):
        a = np.ones((3, 5), dt)
        b = np.ones((5, 4), dt)
        bp = pack_b(b, 2)
        out = np.empty((2, 3, 2), np.float32)
        gemm_stage(a, bp, np.array([[0, 3, 0, 2, 0, 5], [0, 3, 2, 4, 1, 3]], np.int64), out)
        add(a, a)
    f32_to_f16(f16_to_f32(np.ones(3, np.float16)))
