"""Independent numerics reference: numpy GEMMs per rank, then MPI's own collectives.

Not an algorithm of this package: the check every configuration is held to.

Nothing here uses the emulator's HBM, maps, tracker or kernels: each rank
computes its producer output with numpy in fp32 from the same inputs, and
MPI's ``Reduce_scatter`` (chunk counts as the emulator uses them; the block
form when they are even), ``Allreduce``, ``Allgatherv`` or ``Alltoallv`` moves
and sums it (for ``ag-gemm`` MPI gathers the input rows first and numpy
multiplies). Tolerances (elementwise, u = unit roundoff of the storage dtype,
R = roundings of a stored value: one per write or add, N x S for a reduction
over N ranks of S split-K WGs, S otherwise):

- integer-valued inputs, fp32: every partial and sum is an integer below 2^24,
  so any summation order is exact: tolerance 0 (bit-exact).
- integer-valued inputs, fp16: partials are exact in fp32, then rounded to
  fp16 on every write and add: |err| <= (R + 1) u S with S = the same
  collective applied to |partial|.
- normal-valued inputs: the K-sum order also differs (BLAS panels vs numpy):
  |err| <= (K u32 + (R + 1) u) S' with S' the collective of |A| |B|.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from devices.hbm import STORAGE_DTYPES

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}
NP_DTYPE = STORAGE_DTYPES  # the run's dtype name -> its numpy storage type


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


def _chunk_counts(chunks, cols):
    return [(r1 - r0) * cols for r0, r1 in chunks]


def reduce_scatter(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    """MPI's reduce-scatter of ``x`` by row chunks (the block form when they are even)."""
    r0, r1 = chunks[comm.rank]
    out = np.empty((r1 - r0, x.shape[1]), np.float32)
    if len({b - a for a, b in chunks}) == 1:
        comm.Reduce_scatter_block(x, out, op=MPI.SUM)
    else:
        comm.Reduce_scatter(x, out, recvcounts=_chunk_counts(chunks, x.shape[1]), op=MPI.SUM)
    return out


def all_reduce(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    return out


def all_gather(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    out = np.empty((sum(b - a for a, b in chunks), x.shape[1]), np.float32)
    comm.Allgatherv(np.ascontiguousarray(x), [out, _chunk_counts(chunks, x.shape[1]), None,
                                              MPI.FLOAT])
    return out


def all_to_all(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    r0, r1 = chunks[comm.rank]
    cols = x.shape[1]
    out = np.empty((comm.size * (r1 - r0), cols), np.float32)
    comm.Alltoallv([np.ascontiguousarray(x), _chunk_counts(chunks, cols), None, MPI.FLOAT],
                   [out, [(r1 - r0) * cols] * comm.size, None, MPI.FLOAT])
    return out


def compute_reference(comm: MPI.Intracomm, a: np.ndarray, b: np.ndarray, dtype: str,
                      values: str, chunks: list[tuple[int, int]], collective, consumer: bool,
                      roundings: int) -> tuple[np.ndarray, np.ndarray]:
    """The rank's expected result (in the layout the emulator checks) and its tolerance.

    ``collective(comm, x, chunks)`` is MPI's own collective for the operation (one of
    the functions above); ``consumer``: the collective gathers the inputs, which numpy
    then multiplies (else numpy's product is the collective's input); ``roundings``:
    R below (an operation's registry entry gives all three)."""
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    if consumer:
        ref = collective(comm, a32, chunks) @ b32
        mag = ((collective(comm, np.abs(a32), chunks) @ np.abs(b32)) if values != "int"
               else np.abs(ref))
    else:
        ref = collective(comm, a32 @ b32, chunks)
        if values == "int":
            mag = collective(comm, np.abs(a32 @ b32), chunks)
        else:
            mag = collective(comm, np.abs(a32) @ np.abs(b32), chunks)
    u = UNIT_ROUNDOFF[dtype]
    if values == "int":
        top = float(comm.allreduce(float(mag.max()) if mag.size else 0.0, MPI.MAX))
        if dtype == "fp32" and top < 2**24:
            return ref, np.zeros_like(ref)
        return ref, (roundings + 1) * u * mag
    k = a.shape[1]
    return ref, (k * UNIT_ROUNDOFF["fp32"] + (roundings + 1) * u) * mag * 1.01


def check(result: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> tuple[bool, float, str]:
    """(pass, max abs error, note): NaN/Inf in the result is a failure, named as such."""
    res = result.astype(np.float32)
    finite = np.isfinite(res)
    if not finite.all():
        nan = int(np.isnan(res).sum())
        return False, float("nan"), (f"output has {nan} NaN and {int((~finite).sum()) - nan} "
                                     f"Inf values" + (" (the reference is not finite either)"
                                                      if not np.isfinite(ref).all() else ""))
    err = np.abs(res - ref)
    max_err = float(err.max()) if err.size else 0.0
    bad = int((err > tol).sum())
    return bad == 0, max_err, (f"{bad} elements beyond tolerance" if bad else "")
