"""Each compute kernel against a plain numpy version (the roundings against the formats' definitions)."""

import numpy as np
import pytest

from devices import kernels


def _half_value(bits: np.ndarray) -> np.ndarray:
    """IEEE binary16 bit patterns -> their values (float64), from the format's definition."""
    b = bits.astype(np.int64)
    sign = np.where(b >> 15, -1.0, 1.0)
    exp, mant = (b >> 10) & 0x1F, (b & 0x3FF).astype(np.float64)
    val = np.where(exp == 0, mant * 2.0**-24, (1 + mant / 1024) * 2.0 ** (exp - 15))
    val = np.where(exp == 31, np.where(mant == 0, np.inf, np.nan), val)
    return sign * val


def test_f16_to_f32_is_exact_on_every_bit_pattern():
    bits = np.arange(1 << 16, dtype=np.uint16)
    got = kernels.f16_to_f32(bits.view(np.float16))
    ref = _half_value(bits)
    nan = np.isnan(ref)
    assert got.dtype == np.float32 and np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].astype(np.float64), ref[~nan])
    assert np.array_equal(np.signbit(got[~nan]), np.signbit(ref[~nan]))  # -0 kept


def test_f32_to_f16_rounds_to_nearest_even():
    """Against the two halves around each value (from the format's definition): the
    nearer one, the even one on a tie; beyond the largest half's rounding range, inf."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(500_000) * np.exp(rng.uniform(-25, 12, 500_000))).astype(np.float32)
    # ties, the largest half, overflow, subnormals, signed zero, inf
    x[:8] = [65504, 65519.99, 65520, 2.0**-24, 2.0**-25, 3 * 2.0**-26, -0.0, np.inf]
    got = kernels.f32_to_f16(x)
    halves = _half_value(np.arange(0x7C01, dtype=np.uint16))  # +0 .. +inf, increasing
    mag = np.abs(x.astype(np.float64))
    hi = np.searchsorted(halves, mag)  # first half >= |x|
    lo = np.maximum(hi - 1, 0)
    with np.errstate(invalid="ignore"):  # inf - inf at x = inf, which ``mag >= ..`` takes
        up, down = halves[hi] - mag, mag - halves[lo]
    pick = np.where((up < down) | ((up == down) & (hi % 2 == 0)) | (halves[lo] == mag), hi, lo)
    pick = np.where(halves[lo] == mag, lo, pick)
    pick = np.where(mag >= 65520.0, 0x7C00, pick)  # rounds past 65504: inf
    ref = pick.astype(np.uint16) | (np.signbit(x).astype(np.uint16) << 15)
    assert np.array_equal(got.view(np.uint16), ref)
    assert got.view(np.uint16)[2] == 0x7C00 and got.view(np.uint16)[4] == 0  # tie to even 0
    assert got.view(np.uint16)[5] == 1  # 0.75 x 2^-24: up to the smallest subnormal
    assert np.isnan(kernels.f32_to_f16(np.array([np.nan], np.float32)))[0]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gemm_stage_matches_numpy_on_uneven_tiles(dtype):
    rng = np.random.default_rng(2)
    m, n, k, tm, tn = 301, 259, 97, 64, 48
    a = rng.integers(-3, 4, (m, k)).astype(dtype)
    b = rng.integers(-3, 4, (k, n)).astype(dtype)
    tiles = np.array([(r, min(r + tm, m), c, min(c + tn, n), 0, k)
                      for r in range(0, m, tm) for c in range(0, n, tn)], np.int64)
    out = np.full((len(tiles), tm, tn), np.nan, np.float32)
    kernels.gemm_stage(kernels.widen(a), kernels.widen(b), tiles, out)
    ref = a.astype(np.float32) @ b.astype(np.float32)
    for i, (r0, r1, c0, c1, _, _) in enumerate(tiles):
        assert np.array_equal(out[i, : r1 - r0, : c1 - c0], ref[r0:r1, c0:c1]), i


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_split_k_wgs_sum_to_the_tile(dtype):
    """Split-K: three WGs each sum their K slice; their partial tiles add up to the tile."""
    rng = np.random.default_rng(5)
    a = rng.integers(-3, 4, (70, 50)).astype(dtype)
    b = rng.integers(-3, 4, (50, 40)).astype(dtype)
    tiles = np.array([(0, 64, 0, 32, k0, k1) for k0, k1 in ((0, 17), (17, 34), (34, 50))],
                     np.int64)
    out = np.empty((3, 64, 32), np.float32)
    kernels.gemm_stage(kernels.widen(a), kernels.widen(b), tiles, out)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    assert np.array_equal(out[1], a32[0:64, 17:34] @ b32[17:34, 0:32])
    assert np.array_equal(out.sum(axis=0), (a32 @ b32)[0:64, 0:32])


def test_gemm_stage_float_values_close_to_numpy():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((130, 70)).astype(np.float32)
    b = rng.standard_normal((70, 90)).astype(np.float32)
    tiles = np.array([[0, 64, 0, 64, 0, 70], [64, 128, 64, 90, 0, 70], [128, 130, 0, 64, 0, 70]],
                     np.int64)
    out = np.empty((3, 64, 64), np.float32)
    kernels.gemm_stage(kernels.widen(a), kernels.widen(b), tiles, out)
    ref = a @ b
    assert np.allclose(out[1, :64, :26], ref[64:128, 64:90], rtol=1e-5, atol=1e-4)
    assert np.allclose(out[2, :2, :64], ref[128:130, 0:64], rtol=1e-5, atol=1e-4)


def test_add_fp16_rounds_once():
    rng = np.random.default_rng(4)
    x = rng.standard_normal(10_001).astype(np.float16)
    y = rng.standard_normal(10_001).astype(np.float16)
    ref = (x.astype(np.float32) + y.astype(np.float32)).astype(np.float16)
    assert np.array_equal(kernels.add(x, y), ref)
    assert np.array_equal(kernels.add(x.astype(np.float32), y.astype(np.float32)),
                          x.astype(np.float32) + y.astype(np.float32))


def test_wrappers_reject_bad_shapes_and_dtypes():
    a = np.ones((4, 3), np.float32)
    bp = kernels.widen(np.ones((5, 4), np.float32))
    out = np.empty((1, 4, 2), np.float32)
    with pytest.raises(ValueError, match="K mismatch"):
        kernels.gemm_stage(a, bp, np.array([[0, 4, 0, 2, 0, 3]], np.int64), out)
    with pytest.raises(ValueError, match="float16 or float32"):
        kernels.widen(np.ones((3, 3), np.float64))
    with pytest.raises(ValueError, match="tile columns out of range of B"):
        kernels.gemm_stage(np.ones((4, 5), np.float32), bp, np.array([[0, 4, 2, 6, 0, 5]],
                                                                     np.int64),
                            np.empty((1, 4, 8), np.float32))
    with pytest.raises(ValueError, match="tiles must be int64"):
        kernels.gemm_stage(np.ones((4, 5), np.float32), bp, np.array([[0, 4, 0, 2, 0, 5]], np.int32), out)


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_gemm_stage_runs_and_lone_wgs_in_any_order(dtype):
    """WGs in a stage may come in any order: side-by-side runs on a row panel (one BLAS
    call), lone WGs, runs broken by a K slice or a gap, a row panel revisited later.
    The in-place form (whole-K WGs) gives the same products in an output-shaped canvas."""
    rng = np.random.default_rng(6)
    m, n, k = 96, 160, 40
    a = rng.integers(-3, 4, (m, k)).astype(dtype)
    b = rng.integers(-3, 4, (k, n)).astype(dtype)
    tiles = np.array([(32, 64, 0, 32, 0, k), (32, 64, 32, 64, 0, k), (32, 64, 64, 96, 0, 20),
                      (32, 64, 96, 128, 0, k), (0, 32, 128, 160, 0, k), (0, 32, 0, 32, 0, k),
                      (32, 64, 128, 160, 0, k), (64, 96, 32, 64, 20, k),
                      (64, 96, 64, 96, 20, k), (32, 64, 64, 96, 20, k)], np.int64)
    out = np.full((len(tiles), 32, 32), np.nan, np.float32)
    kernels.gemm_stage(kernels.widen(a), kernels.widen(b), tiles, out)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    for i, (r0, r1, c0, c1, k0, k1) in enumerate(tiles):
        assert np.array_equal(out[i], a32[r0:r1, k0:k1] @ b32[k0:k1, c0:c1]), i
    whole = tiles[(tiles[:, 4] == 0) & (tiles[:, 5] == k)]
    rect = np.array([(r, r + 32, c, c + 32, 0, k) for r in (32, 64) for c in range(0, n, 32)]
                    + [(0, 32, 64, 96, 0, k), (0, 32, 96, 128, 0, k)], np.int64)
    for wgs in (whole, rect):
        canvas = np.full((m, n), np.nan, np.float32)
        kernels.gemm_blocks(kernels.widen(a), kernels.widen(b), wgs, canvas)
        written = np.zeros((m, n), bool)
        for r0, r1, c0, c1, _, _ in wgs:
            written[r0:r1, c0:c1] = True
        assert np.array_equal(canvas[written], (a32 @ b32)[written])
        assert np.isnan(canvas[~written]).all()
