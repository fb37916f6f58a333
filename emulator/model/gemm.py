"""The GEMM kernel a BLAS library launches for a problem: its tile shape, its occupancy,
and the clock of its main loop (``cost.py`` times its stages with it).

A device's ``[gemm]`` section (``devices.spec.GemmSpec``) lists the thread-block tiles
its vendor library ships (CUTLASS's for NVIDIA GPUs, hipBLASLt's macro tiles for AMD),
each with its K step, software-pipeline depth and resident WGs per CU, and the fraction
of the matrix peak a large GEMM's main loop reaches (a published measurement of cuBLAS
or hipBLASLt on that GPU). Without the section (or with ``enabled = false``: the
catalogue listed by ``t3emu gemm``, not used by runs) a GEMM runs the device's one
``wg_tile_m x wg_tile_n`` tile at the peak (``GemmKernel.fixed``: the clock before
this model, T3's simulated GPU).

With the section, a WG of tile ``tm x tn`` over a K slice of ``kk`` (``GemmKernel``):

- **tile quantisation**: a WG computes its whole tile whatever part of it lies inside
  the matrix (the MMA instructions cover the tile; the edge is masked, not skipped), so
  its work is ``2 tm tn kk`` FLOPs. (A configuration whose chunks are thinner than
  ``tm`` tiles them with wider tiles of at least the same area, ``common.Problem.tile_n``:
  such a tile is charged its own area, as the real kernel's tile spans the chunks.)
- **main loop**: with S = CUs x WGs per CU resident, each WG has 1/S of the peak times
  the measured main-loop efficiency eta; one K step (``tk``) takes
  ``c = 2 tm tn tk S / (P eta)``, or longer when the S WGs' loads of the step's panels,
  ``S (tm + tn) tk e`` bytes, take longer at the L2's measured bandwidth (``[memory]
  l2_gb_per_s``): a small tile's arithmetic intensity cannot keep the matrix units fed;
- **latency hiding** (Little's law per WG): the pipeline keeps ``stages - 1`` K steps'
  loads in flight, each answered after the memory latency L (``[memory] latency_ns``),
  so a step takes at least ``L / (stages - 1)``; a WG with little work per step (a thin
  tile, few warps) is latency-bound. The steps: ``ceil(kk / tk)``;
- **prologue**: the pipeline fills before the first step (one latency L per wave).

A WG's time is then ``L + steps x max(c, L / (stages - 1))`` (c with the L2 bound); a
stage (a wave of S WGs) lasts as long as its longest WG (wave quantisation), and its
reads and writes go to the HBM as before (``cost.py``).

The heuristic (``choose``): every tile of the catalogue is predicted with the same
formulas over the GEMM's tiles (ceil(M / tm) x ceil(N / tn), split-K WGs), as waves of
S (a partial last wave as ``partial_stage`` places it), against the HBM roofline of its
compulsory traffic; the least predicted time wins, ties to the larger tile, then to the
catalogue's order: deterministic, as a BLAS heuristic's table is. Not modelled yet:
stream-K, a heuristic's own choice of split-K (the run's ``--split-k`` is used), the
operand layouts of forward and backward GEMMs, and a latency that rises with the
memory's load from the GEMM's own traffic (``latency_ns`` is the unloaded pointer-chase
latency).

**Loaded latency** (``launch.py``): a stage's loads also wait behind the communication
requests the DRAM's queue holds while the stage computes (``Dram.queued``: the bursts
offered and not yet served, at most the queue, or the room the arbitration policy lets
communication take: MCA's T requests per channel, none under compute-exclusive), so L
becomes L + queued / the HBM's rate in the prologue and in the pipeline's bound
``L / (stages - 1)``. A burst that fills the queue thus stalls a latency-bound K loop
although the HBM's bandwidth is not used up; a kernel whose steps hide the latency
with room to spare does not feel it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from devices.spec import TileShape  # noqa: F401  (the catalogue's tiles)


@dataclass(frozen=True)
class GemmKernel:
    """The kernel one problem's GEMMs run (``choose``): its tile, and whether its clock is
    the kernel model's (``modelled``) or the device's fixed tile at the peak."""

    tile_m: int
    tile_n: int
    per_cu: int  # WGs resident per CU
    tile_k: int = 64
    stages: int = 2
    efficiency: float = 1.0  # the main loop's fraction of the matrix peak
    latency_s: float = 0.0  # the memory latency a WG's loads see (0: not modelled)
    l2_bw: float = 0.0  # the L2's bytes/s, shared by the WGs' K steps (0: not modelled)
    elem_bytes: int = 2  # bytes per input element
    modelled: bool = False  # tile quantisation, efficiency and latency hiding apply
    predicted_s: float = 0.0  # the heuristic's prediction for the problem (0: fixed tile)

    @classmethod
    def fixed(cls, spec) -> "GemmKernel":
        """The device's one tile at the peak (no ``[gemm]`` section)."""
        return cls(spec.wg_tile_m, spec.wg_tile_n, spec.wgs_per_cu)

    def slots(self, cus: int) -> int:
        """WGs of one stage (a wave): every CU holds ``per_cu``."""
        return cus * self.per_cu

    def wg_seconds(self, kk: float, slots: int, peak: float, area: float = 0.0,
                   delay: float = 0.0) -> float:
        """A WG's time over a K slice of ``kk`` when ``slots`` WGs share the peak (module
        docstring); ``area``: the output elements it computes when more than one tile's
        (a wider tile of a thin chunk), else the whole tile's (tile quantisation);
        ``delay``: the queueing its loads find in the DRAM's queue besides the unloaded
        latency (loaded latency: ``Dram.queued``)."""
        scale = max(1.0, area / (self.tile_m * self.tile_n))
        steps = max(1, math.ceil(kk / self.tile_k))
        tk = min(kk, self.tile_k)
        step = 2.0 * self.tile_m * self.tile_n * tk * slots * scale / (peak * self.efficiency)
        if self.l2_bw:  # every WG loads its step's panels from the L2 at once
            step = max(step, slots * (self.tile_m + self.tile_n) * tk * self.elem_bytes
                       * scale / self.l2_bw)
        latency = self.latency_s + delay if self.latency_s else 0.0
        return latency + steps * max(step, latency / max(1, self.stages - 1))

    def describe(self) -> dict:
        return {"tile": f"{self.tile_m}x{self.tile_n}x{self.tile_k}", "wgs_per_cu": self.per_cu,
                "stages": self.stages, "efficiency": self.efficiency,
                "latency_ns": self.latency_s * 1e9, "modelled": self.modelled,
                "predicted_us": self.predicted_s * 1e6}


def _kernel(spec, tile: TileShape, e: int) -> GemmKernel:
    g = spec.gemm
    return GemmKernel(tile.m, tile.n, tile.per_cu, tile.k, tile.stages, g.mainloop_efficiency,
                      spec.mem_latency_s, spec.l2_bw, e, True)


def predict(spec, kernel: GemmKernel, m: int, n: int, k: int, split: int, e: int,
            peak: float) -> float:
    """The heuristic's time of an ``m`` x ``n`` GEMM over inner ``k`` split over ``split``
    WGs per tile, ``e`` bytes per element: waves of the kernel's WGs, or the HBM roofline
    of the compulsory traffic (A and B read once, C written once) if that is longer."""
    tiles = -(-m // kernel.tile_m) * -(-n // kernel.tile_n)
    wgs = tiles * split
    slots = kernel.slots(spec.cus)
    full, last = divmod(wgs, slots)
    kk = -(-k // split)
    compute = full * kernel.wg_seconds(kk, slots, peak)
    if last:  # a partial wave: as many slots, or spread over the CUs first
        part = (-(-last // spec.cus) * spec.cus if spec.partial_stage == "spread" else slots)
        compute += kernel.wg_seconds(kk, part, peak)
    traffic = (m * k + k * n + split * m * n) * e
    return max(compute, traffic / spec.hbm_bw)


def choose(spec, m: int, n: int, k: int, split: int, dtype: str) -> GemmKernel:
    """The kernel for an ``m`` x ``n`` x ``k`` GEMM (``split`` WGs per tile): the device's
    fixed tile without a ``[gemm]`` section, else the catalogue's tile of least predicted
    time (ties: the larger tile, then the catalogue's order)."""
    if spec.gemm is None or not spec.gemm.enabled:
        return GemmKernel.fixed(spec)
    return candidates(spec, m, n, k, split, dtype)[0]


def candidates(spec, m: int, n: int, k: int, split: int, dtype: str) -> list[GemmKernel]:
    """Every catalogue tile as a kernel with its predicted time, best first."""
    from emulator.model.cost import DTYPE_BYTES

    peak, e = spec.peak_flops(dtype), DTYPE_BYTES[dtype]
    out = []
    for i, tile in enumerate(spec.gemm.tiles):
        kern = _kernel(spec, tile, e)
        t = predict(spec, kern, m, n, k, split, e, peak)
        out.append((t, -tile.m * tile.n, i, GemmKernel(**{**kern.__dict__, "predicted_s": t})))
    out.sort(key=lambda x: x[:3])
    return [x[3] for x in out]
