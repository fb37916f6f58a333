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

**K decompositions** (the library's, inside one work item of the plan, so the tracker
and the numerics see one tile as before):

- **split-K** by s: each tile's K loop is split over s WGs of the same wave (a stage
  holds S / s tiles), each over ceil(steps / s) steps; their fp32 partial tiles go to a
  workspace and are read back by the reduction (cuBLASLt's reduction in the compute
  type): 2 x s x tm x tn x 4 bytes per tile, charged to the HBM with the stage's reads.
  ASSUMPTION: the workspace is in DRAM (an L2 that keeps it would make this cheaper).
- **stream-K** (CUTLASS's data-parallel + stream-K hybrid): full waves as data-parallel,
  and a last wave of n < S tiles spreads its n x steps K iterations evenly over up to S
  WGs, which share tiles through the same workspace (one partial per WG). Only where the
  catalogue says the library's heuristic picks such kernels (``[gemm] stream_k``; no
  preset does: CUTLASS ships stream-K kernels, but no source found shows cuBLAS's or
  hipBLASLt's heuristic choosing them for these GPUs' f16 GEMMs).

The heuristic (``choose``): every tile of the catalogue, data-parallel, split by each
factor cuBLASLt's own search tries (``SPLIT_K``, each WG keeping at least a K step) whose
WGs still fit one wave (the case split-K is for: CUTLASS's split-K example, "small M and
N, large K", a grid too small to fill the GPU; a library does not split a GEMM that fills
it) and
stream-K where a partial wave remains (and the catalogue allows it), is predicted with
the same formulas over the GEMM's tiles (ceil(M / tm) x ceil(N / tn)) as waves (a partial
last wave as ``partial_stage`` places it), against the HBM roofline of its compulsory
traffic plus the partials' round trip; the least predicted time wins, ties to the larger
tile, then the catalogue's order, then data-parallel, split-K (the smaller factor),
stream-K: deterministic, as a BLAS heuristic's table is. A run that splits K itself (``--split-k`` > 1: T3's updates) gets data-parallel kernels
only; a persistent kernel runs its tile data-parallel. Not modelled yet: the operand
layouts of forward and backward GEMMs, and a latency that rises with the memory's load
from the GEMM's own traffic (``latency_ns`` is the unloaded pointer-chase latency).

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
from dataclasses import dataclass, replace

from devices.spec import TileShape  # noqa: F401  (the catalogue's tiles)
from emulator.model import params


@dataclass(frozen=True)
class GemmKernel:
    """The kernel one problem's GEMMs run (``choose``): its tile, and whether its clock is
    the kernel model's (``modelled``) or the device's fixed tile at the peak."""

    tile_m: int
    tile_n: int
    per_cu: int  # WGs resident per CU
    tile_k: int = 64  # not a parameter: every caller gives the tile's own K step
    stages: int = 2
    efficiency: float = 1.0  # the main loop's fraction of the matrix peak
    latency_s: float = 0.0  # the memory latency a WG's loads see (0: not modelled)
    l2_bw: float = 0.0  # the L2's bytes/s, shared by the WGs' K steps (0: not modelled)
    elem_bytes: int = 2  # bytes per input element
    modelled: bool = False  # tile quantisation, efficiency and latency hiding apply
    predicted_s: float = 0.0  # the heuristic's prediction for the problem (0: fixed tile)
    split_k: int = 1  # WGs the library splits each tile's K loop over (their fp32 partial
    # sums reduced through a workspace): one work item of the plan runs as split_k WGs
    stream_k: bool = False  # a partial last wave's K iterations spread over every WG

    @classmethod
    def fixed(cls, spec) -> "GemmKernel":
        """The device's one tile at the peak (no ``[gemm]`` section)."""
        return cls(spec.wg_tile_m, spec.wg_tile_n, spec.wgs_per_cu)

    def slots(self, cus: int) -> int:
        """WGs of one stage (a wave): every CU holds ``per_cu``."""
        return cus * self.per_cu

    def items(self, cus: int) -> int:
        """Work items (tiles, or the run's own K slices of them) of one stage: the wave's
        WGs over the WGs each item's K loop is split over."""
        return max(1, self.slots(cus) // self.split_k)

    def data_parallel(self) -> "GemmKernel":
        """This kernel without the heuristic's split-K and stream-K (a persistent kernel's
        WGs each own their items)."""
        return replace(self, split_k=1, stream_k=False)

    def stage_wgs(self, n: int, kk: float, cus: int) -> tuple[int, int]:
        """(WGs, K steps of the longest) of a stage of ``n`` items over K slices of ``kk``:
        split-K's ``split_k`` WGs per item, each over ceil(steps / split_k) steps; under
        stream-K a stage of fewer items than a wave's spreads its n x steps iterations
        evenly over up to the wave's WGs (CUTLASS's data-parallel + stream-K hybrid)."""
        steps = max(1, math.ceil(kk / self.tile_k))
        if self.stream_k and n < self.items(cus):
            wgs = max(1, min(self.slots(cus), n * steps))
            return wgs, math.ceil(n * steps / wgs)
        return n * self.split_k, math.ceil(steps / self.split_k)

    def fixup_bytes(self, n: int, kk: float, cus: int) -> float:
        """Bytes of the fp32 partial tiles a stage of ``n`` items writes to the workspace and
        reads back to reduce them (0 when every item is one WG's): each WG sharing a tile
        writes its partial once and the reduction reads it once."""
        wgs, _ = self.stage_wgs(n, kk, cus)
        fp32 = 4  # not a parameter: the partials are fp32
        return 2.0 * wgs * self.tile_m * self.tile_n * fp32 if wgs > n else 0.0

    def stage_seconds(self, n: int, kk: float, cus: int, peak: float, spread: bool,
                      area: float = 0.0, delay: float = 0.0,
                      resident: int | None = None) -> float:
        """The compute time of a stage of ``n`` items over K slices of ``kk`` (its longest
        WG): its WGs (``stage_wgs``) share the peak as a wave's slots, or, fewer than a
        wave on a device that spreads them (``spread``), as ceil(WGs / CUs) per CU;
        ``resident``: the WGs sharing the peak when the caller knows them (persistent)."""
        wgs, steps = self.stage_wgs(n, kk, cus)
        if resident is None:
            slots = self.slots(cus)
            resident = -(-wgs // cus) * cus if spread and wgs < slots else slots
        return self.step_seconds(steps, min(kk, self.tile_k), resident, peak, area, delay)

    def wg_seconds(self, kk: float, slots: int, peak: float, area: float = 0.0,
                   delay: float = 0.0) -> float:
        """A WG's time over a K slice of ``kk`` when ``slots`` WGs share the peak (module
        docstring); ``area``: the output elements it computes when more than one tile's
        (a wider tile of a thin chunk), else the whole tile's (tile quantisation);
        ``delay``: the queueing its loads find in the DRAM's queue besides the unloaded
        latency (loaded latency: ``Dram.queued``)."""
        return self.step_seconds(max(1, math.ceil(kk / self.tile_k)), min(kk, self.tile_k),
                                 slots, peak, area, delay)

    def step_seconds(self, steps: int, tk: float, slots: int, peak: float, area: float = 0.0,
                     delay: float = 0.0) -> float:
        """A WG's time over ``steps`` K steps of ``tk`` (``wg_seconds``)."""
        scale = max(1.0, area / (self.tile_m * self.tile_n))
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
                "split_k": self.split_k, "stream_k": self.stream_k,
                "predicted_us": self.predicted_s * 1e6}

    @property
    def name(self) -> str:
        """The tile and its K decomposition, as ``t3emu gemm`` and summaries print it."""
        return (f"{self.tile_m}x{self.tile_n}x{self.tile_k}"
                + (f" split-K {self.split_k}" if self.split_k > 1 else "")
                + (" stream-K" if self.stream_k else ""))


# The split-K factors cuBLASLt's own search tries for an algorithm that supports split-K
# (NVIDIA CUDALibrarySamples, cuBLASLt LtSgemmCustomFind: splitKSequenceA = {2, 3, 4, 5, 6,
# 8, 12, 16, 32}); the heuristic here predicts each with the model's clock
SPLIT_K = params.table("split_k", (2, 3, 4, 5, 6, 8, 12, 16, 32), "factors",
                       "the split-K factors the GEMM heuristic tries",
                       "library: NVIDIA CUDALibrarySamples cuBLASLt LtSgemmCustomFind, "
                       "splitKSequenceA")


def _kernel(spec, tile: TileShape, e: int) -> GemmKernel:
    g = spec.gemm
    return GemmKernel(tile.m, tile.n, tile.per_cu, tile.k, tile.stages, g.mainloop_efficiency,
                      spec.mem_latency_s, spec.l2_bw, e, True)


def predict(spec, kernel: GemmKernel, m: int, n: int, k: int, split: int, e: int,
            peak: float) -> float:
    """The heuristic's time of an ``m`` x ``n`` GEMM over inner ``k`` split over ``split``
    WGs per tile by the run, ``e`` bytes per element: waves of the kernel's items (with
    its split-K or stream-K), or the HBM roofline of the compulsory traffic (A and B read
    once, C written once, the partial tiles' round trip) if that is longer."""
    tiles = -(-m // kernel.tile_m) * -(-n // kernel.tile_n) * split
    per = kernel.items(spec.cus)
    full, last = divmod(tiles, per)
    kk = -(-k // split)
    spread = spec.partial_stage == "spread"
    compute = full * kernel.stage_seconds(per, kk, spec.cus, peak, spread)
    fixup = full * kernel.fixup_bytes(per, kk, spec.cus)
    if last:
        compute += kernel.stage_seconds(last, kk, spec.cus, peak, spread)
        fixup += kernel.fixup_bytes(last, kk, spec.cus)
    traffic = (m * k + k * n + split * m * n) * e + fixup
    return max(compute, traffic / spec.hbm_bw)


def choose(spec, m: int, n: int, k: int, split: int, dtype: str) -> GemmKernel:
    """The kernel for an ``m`` x ``n`` x ``k`` GEMM (``split`` WGs per tile): the device's
    fixed tile without a ``[gemm]`` section, else the catalogue's kernel of least
    predicted time (ties: the larger tile, the catalogue's order, then data-parallel,
    split-K by the smaller factor, stream-K)."""
    if spec.gemm is None or not spec.gemm.enabled:
        return GemmKernel.fixed(spec)
    return candidates(spec, m, n, k, split, dtype)[0]


def candidates(spec, m: int, n: int, k: int, split: int, dtype: str,
               decompositions: bool = True) -> list[GemmKernel]:
    """Every catalogue tile as a kernel with its predicted time, best first: data-parallel,
    split-K by each of ``SPLIT_K`` whose WGs still fit one wave and each keep a K step, and
    stream-K where a partial wave remains and the catalogue says the library picks it
    (``[gemm] stream_k``) (``decompositions``; none when the run splits K itself)."""
    from emulator.model.cost import DTYPE_BYTES

    peak, e = spec.peak_flops(dtype), DTYPE_BYTES[dtype]
    out = []
    for i, tile in enumerate(spec.gemm.tiles):
        base = _kernel(spec, tile, e)
        variants = [base]
        if decompositions and split == 1:
            steps = -(-k // tile.k)
            tiles = -(-m // tile.m) * -(-n // tile.n)
            # split-K's case: too few tiles for a wave, split to fill it (one wave at most)
            variants += [replace(base, split_k=s) for s in SPLIT_K
                         if s <= steps and tiles * s <= base.slots(spec.cus)]
            if spec.gemm.stream_k and tiles % base.items(spec.cus):
                variants.append(replace(base, stream_k=True))
        for kern in variants:
            t = predict(spec, kern, m, n, k, split, e, peak)
            out.append(((t, -tile.m * tile.n, i, kern.stream_k, kern.split_k),
                        replace(kern, predicted_s=t)))
    out.sort(key=lambda x: x[0])
    return [x[1] for x in out]
