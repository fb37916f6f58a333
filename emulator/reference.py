"""Independent numerics reference: numpy GEMM per rank, then MPI's own collectives.

Nothing here uses the emulator's HBM, maps, tracker or kernels: each rank
computes its partial output with numpy in fp32 from the same inputs, and MPI's
``Reduce_scatter`` (chunk counts as the ring uses them) or ``Allreduce`` sums
the partials. Tolerances (elementwise, u = unit roundoff of the storage dtype):

- integer-valued inputs, fp32: every partial and sum is an integer below 2^24,
  so any summation order is exact: tolerance 0 (bit-exact).
- integer-valued inputs, fp16: partials are exact in fp32, then rounded to fp16
  once per device and once per addition: |err| <= (N + 1) u S with
  S = sum over ranks of |partial| (reduced by MPI as well).
- normal-valued inputs: the K-sum order also differs (BLAS panels vs numpy):
  |err| <= (K u32 + (N + 1) u) S' with S' = sum over ranks of |A| |B|.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from mpi4py import MPI

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "fp32": 2.0**-24}
NP_DTYPE = {"fp16": np.float16, "fp32": np.float32}


def make_inputs(m: int, n: int, k: int, dtype: str, values: str, seed: int,
                rank: int) -> tuple[np.ndarray, np.ndarray]:
    """This rank's A (m x k) and B (k x n): its K-slice of a tensor-parallel GEMM."""
    rng = np.random.default_rng([seed, rank])
    dt = NP_DTYPE[dtype]
    if values == "int":
        a = rng.integers(-2, 3, (m, k)).astype(dt)
        b = rng.integers(-2, 3, (k, n)).astype(dt)
    else:
        a = rng.standard_normal((m, k)).astype(dt)
        b = rng.standard_normal((k, n)).astype(dt)
    return a, b


@dataclass
class Reference:
    rs: np.ndarray  # this rank's reduced chunk (rows r0:r1)
    rs_tol: np.ndarray
    ar: np.ndarray | None  # the whole reduced output (all-reduce only)
    ar_tol: np.ndarray | None


def compute_reference(comm: MPI.Intracomm, a: np.ndarray, b: np.ndarray, dtype: str,
                      values: str, chunks: list[tuple[int, int]], need_ar: bool) -> Reference:
    n_world = comm.size
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    partial = a32 @ b32
    if values == "int":
        mag = np.abs(partial)
    else:
        mag = np.abs(a32) @ np.abs(b32)
    cols = partial.shape[1]
    counts = [(r1 - r0) * cols for r0, r1 in chunks]
    r0, r1 = chunks[comm.rank]

    def rs(x: np.ndarray) -> np.ndarray:
        out = np.empty((r1 - r0, cols), np.float32)
        comm.Reduce_scatter(x, out, recvcounts=counts, op=MPI.SUM)
        return out

    def ar(x: np.ndarray) -> np.ndarray:
        out = np.empty_like(x)
        comm.Allreduce(x, out, op=MPI.SUM)
        return out

    u = UNIT_ROUNDOFF[dtype]
    k = a.shape[1]

    def tol(s: np.ndarray) -> np.ndarray:
        if values == "int":
            if dtype == "fp32" and float(comm.allreduce(s.max() if s.size else 0.0, MPI.MAX)) < 2**24:
                return np.zeros_like(s)
            return (n_world + 1) * u * s
        return (k * UNIT_ROUNDOFF["fp32"] + (n_world + 1) * u) * s * 1.01

    ref_rs = rs(partial)
    tol_rs = tol(rs(mag))
    if need_ar:
        ref_ar = ar(partial)
        tol_ar = tol(ar(mag))
        return Reference(ref_rs, tol_rs, ref_ar, tol_ar)
    return Reference(ref_rs, tol_rs, None, None)


def check(result: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> tuple[bool, float, str]:
    """(pass, max abs error, note): NaN/Inf in the result is a failure, named as such."""
    res = result.astype(np.float32)
    finite = np.isfinite(res)
    if not finite.all():
        return False, float("nan"), f"{int((~finite).sum())} non-finite output values"
    err = np.abs(res - ref)
    max_err = float(err.max()) if err.size else 0.0
    bad = int((err > tol).sum())
    return bad == 0, max_err, (f"{bad} elements beyond tolerance" if bad else "")
