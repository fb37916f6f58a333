"""Independent numerics reference: numpy GEMMs per rank, then MPI's own collectives.

Not an algorithm of this package: the check every configuration is held to.

Nothing here uses the emulator's HBM, maps, tracker or kernels: each rank
computes its producer output with numpy from the same inputs (in float64 for normal
values, so the reference's own error is negligible), and MPI's ``Reduce_scatter`` (chunk
counts as the emulator uses them; the block form when they are even), ``Allreduce``,
``Allgatherv`` or ``Alltoallv`` moves and sums it (for ``ag-gemm`` MPI gathers the input
rows first and numpy multiplies). Tolerances (elementwise; u = unit roundoff of the
storage dtype, u32 of fp32; R = roundings of a stored value: one per write or add, N x S
for a reduction over N ranks of S split-K WGs, S otherwise; P the partial products, one
per rank and K slice; coll the operation's collective):

- integer-valued inputs, fp32: every partial and sum is an integer below 2^24,
  so any summation order is exact: tolerance 0 (bit-exact).
- integer-valued inputs, fp16/bf16: partials are exact in fp32, then rounded to
  the storage dtype on every write and add: |err| <= (R + 1) u coll(|P|).
- normal-valued inputs: the same storage term (each rounding also allowed the
  underflow of a subnormal result, half the smallest subnormal), since every stored value is a partial
  sum of the partials and so at most coll(sum |P|) in magnitude (a worst-case bound,
  but on the partials' own magnitudes, which grow like sqrt(K), not on |A| |B|, which
  grows like K); plus the emulated GEMM's fp32 sums, whose error Higham and Mary's
  probabilistic bound puts at lambda sqrt(K) u32 coll(|A| |B|) (lambda = 8: the
  bound fails for an element with probability below 1e-13). An error worst-case in K
  (K u32 |A||B|) made the old tolerance several standard deviations of the output at
  16 ranks in bf16, so a result missing a rank's contribution, or all zero, passed.

``detection`` says how well a tolerance tells right from wrong at a size: the fraction
of elements in which one rank's contribution (its own partial product) exceeds the
tolerance, so that an element missing it, or holding it twice, fails; a tile of n
elements missing it passes with probability about (1 - detection)^n. Below ``WEAK``
the run says the check is weak there.
"""

from __future__ import annotations

import math

import numpy as np
from mpi4py import MPI

from devices.hbm import STORAGE_DTYPES

UNIT_ROUNDOFF = {"fp16": 2.0**-11, "bf16": 2.0**-8, "fp32": 2.0**-24}
UNDERFLOW = {"fp16": 2.0**-25, "bf16": 2.0**-134, "fp32": 2.0**-150}  # the largest error of
# a rounding into the subnormal range (half the smallest subnormal), where u |x| is less
LAMBDA = 8.0  # not a parameter: numerics. Higham & Mary (SIAM J. Sci. Comput. 41(5), 2019), Theorem 2.4: the
# bound lambda sqrt(n) u holds with probability >= 1 - 2 exp(-lambda^2 (1 - u)^2 / 2)
WEAK = 0.05  # not a parameter: numerics; below which the run warns (a 64-element tile missing a rank's
# contribution would then pass with probability above 3%)
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
    out = np.empty((r1 - r0, x.shape[1]), x.dtype)
    if len({b - a for a, b in chunks}) == 1:
        comm.Reduce_scatter_block(x, out, op=MPI.SUM)
    else:
        comm.Reduce_scatter(x, out, recvcounts=_chunk_counts(chunks, x.shape[1]), op=MPI.SUM)
    return out


def all_reduce(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    out = np.empty_like(x)
    comm.Allreduce(x, out, op=MPI.SUM)
    return out


def _mpi_type(x: np.ndarray):
    return MPI.DOUBLE if x.dtype == np.float64 else MPI.FLOAT


def all_gather(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    out = np.empty((sum(b - a for a, b in chunks), x.shape[1]), x.dtype)
    comm.Allgatherv(np.ascontiguousarray(x), [out, _chunk_counts(chunks, x.shape[1]), None,
                                              _mpi_type(x)])
    return out


def all_to_all(comm: MPI.Intracomm, x: np.ndarray, chunks) -> np.ndarray:
    r0, r1 = chunks[comm.rank]
    cols = x.shape[1]
    out = np.empty((comm.size * (r1 - r0), cols), x.dtype)
    comm.Alltoallv([np.ascontiguousarray(x), _chunk_counts(chunks, cols), None, _mpi_type(x)],
                   [out, [(r1 - r0) * cols] * comm.size, None, _mpi_type(x)])
    return out


def compute_reference(comm: MPI.Intracomm, a: np.ndarray, b: np.ndarray, dtype: str,
                      values: str, chunks: list[tuple[int, int]], collective, consumer: bool,
                      roundings: int, split_k: int = 1, k_blocks: int = 1
                      ) -> tuple[np.ndarray, np.ndarray]:
    """The rank's expected result (in the layout the emulator checks) and its tolerance.

    ``collective(comm, x, chunks)`` is MPI's own collective for the operation (one of
    the functions above); ``consumer``: the collective gathers the inputs, which numpy
    then multiplies (else numpy's product is the collective's input); ``roundings``:
    R below (an operation's registry entry gives all three); ``split_k``: the K slices
    each of whose partial products is stored on its own; ``k_blocks``: the even column
    blocks of K (``K j // k_blocks``) a configuration may accumulate one by one, each sum
    rounded (FiCCO's 2D schedules)."""
    u = UNIT_ROUNDOFF[dtype]
    if values == "int":  # exact partials: fp32 is exact and enough
        a32, b32 = a.astype(np.float32), b.astype(np.float32)
        if consumer:
            g = collective(comm, a32, chunks)
            ref = g @ b32
            mag = _slices_abs(g, b32, split_k, k_blocks, ref)
        else:
            p = a32 @ b32
            ref = collective(comm, p, chunks)
            mag = collective(comm, _slices_abs(a32, b32, split_k, k_blocks, p), chunks)
        top = float(comm.allreduce(float(mag.max()) if mag.size else 0.0, MPI.MAX))
        if dtype == "fp32" and top < 2**24:
            return ref, np.zeros_like(ref)
        return ref, (roundings + 1) * u * mag
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    k = a.shape[1]
    if consumer:
        g = collective(comm, a64, chunks)
        ref = g @ b64
        parts = _slices_abs(g, b64, split_k, k_blocks, ref)
        ab = np.abs(g) @ np.abs(b64)
    else:
        p = a64 @ b64
        ref = collective(comm, p, chunks)
        parts = collective(comm, _slices_abs(a64, b64, split_k, k_blocks, p), chunks)
        ab = collective(comm, np.abs(a64) @ np.abs(b64), chunks)
    fp32 = LAMBDA * np.sqrt(k) * UNIT_ROUNDOFF["fp32"] * ab
    tol = (roundings + 1) * (u * (parts + fp32) * 1.01 + UNDERFLOW[dtype]) + fp32  # not a parameter: numerics
    return ref, tol.astype(np.float32)


def _slices_abs(a: np.ndarray, b: np.ndarray, split_k: int, k_blocks: int = 1,
                product: np.ndarray | None = None) -> np.ndarray:
    """A bound on the magnitude of every stored partial of ``a @ b``: |A B| whole (of
    ``product``, ``a @ b`` already formed, when given); summed over the ``k_blocks`` even
    column blocks of K a configuration accumulates one by one; with split-K, whose K
    slices a device's kernel cuts as it will, |A| |B| (at least the sum over any slicing
    of |A_s B_s|)."""
    if split_k > 1:
        return np.abs(a) @ np.abs(b)
    if k_blocks <= 1:
        return np.abs(a @ b if product is None else product)
    k = a.shape[1]
    cuts = [k * j // k_blocks for j in range(k_blocks + 1)]
    return sum(np.abs(a[:, k0:k1] @ b[k0:k1]) for k0, k1 in zip(cuts[:-1], cuts[1:]) if k1 > k0)


def detection(comm: MPI.Intracomm, a: np.ndarray, b: np.ndarray, tol: np.ndarray,
              consumer: bool) -> float | None:
    """The fraction of checked elements (all ranks) in which a contribution of one rank
    exceeds the tolerance: this rank's partial product (a reducing or gathering
    operation), or its gathered input's product (``consumer``: compared on the rows
    this rank checks). None when the shapes do not line up (an operation's own
    layout)."""
    own = np.abs(a.astype(np.float32) @ b.astype(np.float32))
    if consumer or own.shape != tol.shape:
        rows = min(own.shape[0], tol.shape[0])
        own, t = own[:rows], tol[:rows]
        if own.shape != t.shape:
            return None
    else:
        t = tol
    got = comm.allgather((int((own > t).sum()), int(own.size)))
    total = sum(n for _, n in got)
    return sum(c for c, _ in got) / total if total else None


def check(result: np.ndarray, ref: np.ndarray, tol: np.ndarray) -> tuple[bool, float, str]:
    """(pass, max abs error, note): NaN/Inf in the result is a failure, named as such."""
    ok, err, _, note = check_against(result, ref, tol)
    return ok, err, note


def check_against(result: np.ndarray, ref: np.ndarray, tol: np.ndarray
                  ) -> tuple[bool, float, float, str]:
    """(pass, max abs error, largest error as a fraction of its element's tolerance (inf
    where an element with tolerance 0 is off; nan for a non-finite result), note).

    In few passes over the output (it is checked after every configuration of a run):
    the error is formed in place, a result is finite when its minimum and maximum are
    (both propagate a NaN), and the fraction is ``err / tol`` in place, its 0 / 0 (no
    error where the tolerance is 0) left out of the maximum; the same values as the
    element-wise expression (``_fractions``), which it takes for a non-finite reference
    or a negative tolerance."""
    res = result.astype(np.float32)
    if res.size and not (np.isfinite(res.min()) and np.isfinite(res.max())):
        finite = np.isfinite(res)
        nan = int(np.isnan(res).sum())
        return False, float("nan"), float("nan"), (
            f"output has {nan} NaN and {int((~finite).sum()) - nan} Inf values"
            + (" (the reference is not finite either)" if not np.isfinite(ref).all() else ""))
    err = _into(np.subtract, res, ref)
    np.abs(err, out=err)
    max_err = float(err.max()) if err.size else 0.0
    bad = int(np.count_nonzero(err > tol))
    if not err.size:
        worst = 0.0
    elif not math.isfinite(max_err) or not tol.min() >= 0:  # a reference not finite, tol < 0
        worst = float(_fractions(err, tol).max())
    else:  # err / tol: inf where a tolerance of 0 has an error, NaN (for 0) where it has none
        with np.errstate(divide="ignore", invalid="ignore"):
            q = _into(np.divide, err, tol)
        worst = float(np.fmax.reduce(q, axis=None))  # NaNs left out
        worst = 0.0 if worst != worst else worst
    return bad == 0, max_err, worst, (f"{bad} elements beyond tolerance" if bad else "")


def _into(ufunc, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``ufunc(x, y)``, written into ``x`` (the check's own copy) when it has the result's
    dtype."""
    return ufunc(x, y, out=x) if np.result_type(x, y) == x.dtype else ufunc(x, y)


def _fractions(err: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Each element's error as a fraction of its tolerance; where the tolerance is 0,
    inf for an error and 0 for none."""
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(tol > 0, err / np.where(tol > 0, tol, 1.0),
                        np.where(err > 0, np.inf, 0.0))
