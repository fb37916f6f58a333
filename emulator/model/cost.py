"""Cost model: modelled durations and DRAM traffic from the device spec.

Every formula names its source. Symbols: P = peak dense FLOP/s of the device
(``cus x clock x flops_per_cycle_per_cu[dtype]``), S = WG slots per stage
(``cus x wgs_per_cu``), BW = HBM bytes/s, L = link bytes/s per direction,
lat = link latency, e = bytes per input element, eo = bytes per output element.

GEMM stage (a set of at most S WGs running at once; T3 "stages"). A WG
computes an output tile (h x w) over its slice of K (kK = K, or K/split for a
split-K GEMM, whose WGs update the same tile):
- compute  = max over WGs of (2 h w kK) x S / P: each WG owns 1/S of the CUs'
  throughput and the stage lasts as long as its largest WG (wave quantisation).
- reads    = U + max(0, 1 - L2in/Wk) x (R - U) - P, with U the stage's distinct
  A row panels (h kK e) and B column panels (kK w e), R = sum over WGs of
  (h + w) kK e and the L2 model (``emulator/model/cost.py``, "the L2 across
  stages"): the WGs of a stage walk K together, so each panel's K-step is read
  from DRAM once and served from the L2 to its other readers while the stage's
  working set Wk = U x 2 k_step / kK (two K-steps of every panel) fits in L2in;
  what does not fit is re-read by every WG that uses it. P: the panels this
  stage shares with the previous stage of the same kernel, times the share of
  that stage's panels L2in holds, min(1, L2in / its panels' bytes): all of them
  when they fitted, and a share that falls smoothly as the working set grows past
  the L2 (ASSUMPTION: the L2's replacement is not strict LRU, whose cyclic scans
  of a working set larger than the cache would keep nothing: a hashed
  set-associative cache keeps a share about proportional to its capacity). So the WG order decides
  the traffic: which tiles share a stage (its distinct panels) and which
  consecutive stages share panels. L2in is the L2 left for inputs: all of it
  when GEMM outputs bypass the L2 (T3 allocates them uncached), L2 minus the
  stage's output bytes when outputs are cached (write-allocate: they occupy
  L2 until written back). Beside communication traffic that passes through the
  L2 (``[memory] comm_through_l2``), L2 is the share of it the kernel keeps
  (``emulator/model/cache.py``), within the stage and for the next one.
- writes   = h w eo per WG written to local HBM; an op-and-store update costs
  ``update_cost`` x a write (T3: CCDWL = 2 x CCDL after it, for the next access to
  its bank group: ``DeviceSpec.update_cost``). Every output byte
  reaches DRAM (uncached, or written back).
- timeline: a read phase of ``max(compute, reads at the rate the HBM leaves)``
  then a bursty write phase (T3: "a read phase followed by a bursty write
  phase"). Tiles remote-mapped to a peer leave on the route instead; the stage
  retires when its link stores have drained (or, with a store queue, when all
  but its bound have: ``Kernel.store_queue``).
GEMV stage (decode: a few right-hand-side columns w): the same panels and
reads as a GEMM stage (each weight row panel read once, the vector shared in
L2), its FLOPs on the vector ALUs: compute = max over WGs of 2 h w kK x S / Pv
(Pv = vector FLOP/s; 0 if the spec gives none): memory-bound in practice.
Elementwise stage (a reduction of n source copies into one tile, or a copy
when n = 1): reads n h w e per WG, (n - 1) h w vector FLOPs, compute = max
over WGs x S / Pv, or the WG's latency bound on its n h w e bytes of reads (below) if
longer; writes as above (memory-bound: bytes at the HBM rate the arbitration leaves).
Memory-bound kernels (GEMV, embedding pooling, elementwise): latency and row locality.
- Latency (Little's law): a WG keeps ``wg_inflight_bytes`` of reads in flight, each
  answered after the DRAM latency ``mem_latency_s`` plus the queueing behind the
  communication the DRAM's queue holds meanwhile (``delay``), so one WG reads at most
  inflight / latency: a WG's reads of B bytes take at least B x latency / inflight
  (its compute time, the cap on its HBM reservation). P WGs at once reach P x that:
  few WGs cannot fill the HBM.
- Row locality of random row reads (embedding pooling: each looked-up row is R =
  row bytes / access bytes accesses in one DRAM row, the rows themselves random):
  a row's first access opens it (a miss, ``dram_row_miss_cost`` x a hit's channel
  time); each later access hits only if no other WG opened another row in that bank
  meanwhile, which with P concurrent WGs over the HBM's ``dram_banks`` banks happens
  with probability h = 1 / (1 + P / banks). Data per channel time: R / (m + (R - 1)
  (h + (1 - h) m)); the reads' HBM reservation is their bytes over that. So time
  first falls with the number of WGs (latency hidden) and then rises (locality
  lost): the occupancy trade-off. Streaming reads (GEMM panels, GEMV weight rows)
  keep their locality.
Persistent kernels: P resident WGs each get 1 / max(P, S) of the matrix rate
(never more than in a full stage) and 1 / max(P, CUs) of the vector rate.
Link transfer of B bytes: B at the route's rate through the ports of its route
(``topology.py``: a link, a switch's up port then the receiver's down port, a
CPU link, a NIC), arrival = end + the route's latency.
DMA command: ``dma_setup_s`` (set up in the engine's queue, under the running
transfer when queued behind one), then the source read (B at the HBM) and the link
transfer stream concurrently; the engine is busy until both end.
Writes landing from peers are charged to the receiver's HBM as they stream in,
from (arrival - B / L) on (``update_cost`` x B for updates, B for stores);
the data is usable when both the last byte has arrived and the HBM has
absorbed it.
CU-driven collective step (baseline kernels): reads of its inputs at the HBM
and the link transfer stream concurrently; a local result is written after
the reads.
How the communication stream shares the HBM with a running GEMM is the
arbitration policy's (``emulator/model/arbitration.py``).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import numpy as np

from devices.spec import DeviceSpec
from emulator.model import params

DTYPE_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}  # not a parameter: the dtypes' sizes
L2_FLOOR = 1e-3  # not a parameter: a guard, the L2 left to a kernel is never 0


@dataclass(frozen=True)
class StageCost:
    flops: float
    compute_s: float
    read_bytes: float
    write_bytes: float  # bytes written to local HBM
    write_cost_bytes: float  # bytes x update_cost for updates
    remote_bytes: dict  # dst rank -> bytes stored/updated into a peer over the link
    read_cost_bytes: float | None = None  # HBM channel time of the reads, in bytes at the
    # peak rate (None: read_bytes; more when random rows lose their row locality)

    @property
    def read_time_bytes(self) -> float:
        return self.read_bytes if self.read_cost_bytes is None else self.read_cost_bytes


SPAN = 1 << 30  # a panel's bounds in one int64 key: rows, columns and K below 2**30


def _sorted(where: np.ndarray, slice_: np.ndarray, *more: np.ndarray) -> tuple:
    """``where`` and ``slice_`` (and ``more``, alike) sorted by (where, slice), with
    ``same``: whether each key equals the one before it (one shorter)."""
    order = np.lexsort((slice_, where))
    where, slice_ = where[order], slice_[order]
    same = (where[1:] == where[:-1]) & (slice_[1:] == slice_[:-1])
    return (where, slice_, same, *(m[order] for m in more))


class Panels:
    """A set of operand panels: A row panels (rows r0:r1) and B column panels (columns
    c0:c1), each over a K slice k0:k1, as two int64 keys per panel, sorted and distinct:
    ``where`` r0 x SPAN + r1 for A, (SPAN + c0) x SPAN + c1 for B, ``slice`` k0 x SPAN +
    k1. Numpy arrays rather than a set of tuples: a stage holds hundreds of panels and is
    costed once per stage."""

    __slots__ = ("where", "slice", "size")

    def __init__(self, where: np.ndarray, slice_: np.ndarray, size: np.ndarray):
        self.where, self.slice, self.size = where, slice_, size  # size: elements

    @classmethod
    def of(cls, wgs: np.ndarray) -> "Panels":
        """The distinct A row panels and B column panels (with their K slices) ``wgs``
        (rows r0, r1, c0, c1, k0, k1) read."""
        if not len(wgs):
            return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
        w = wgs.astype(np.int64, copy=False)
        if int(w.min()) < 0 or int(w.max()) >= SPAN:
            raise ValueError(f"tile bounds beyond 2**30: {int(w.min())}..{int(w.max())}")
        kslice = w[:, 4] * SPAN + w[:, 5]
        where = np.concatenate([w[:, 0] * SPAN + w[:, 1],
                                (SPAN + w[:, 2]) * SPAN + w[:, 3]])
        where, slice_, same = _sorted(where, np.concatenate([kslice, kslice]))
        keep = np.ones(len(where), bool)
        keep[1:] = ~same
        where, slice_ = where[keep], slice_[keep]
        size = ((where % SPAN) - (where // SPAN) % SPAN) * ((slice_ % SPAN) - slice_ // SPAN)
        return cls(where, slice_, size)

    def __len__(self) -> int:
        return len(self.where)

    def elements(self) -> int:
        return int(self.size.sum())

    def shared(self, other: "Panels") -> int:
        """Elements of the panels both sets hold."""
        if not len(self) or not len(other):
            return 0
        _, _, both, size = _sorted(np.concatenate([self.where, other.where]),
                                   np.concatenate([self.slice, other.slice]),
                                   np.concatenate([self.size, other.size]))
        return int(size[:-1][both].sum())  # each set distinct: a panel in both is a pair
        # of neighbours


@dataclass(frozen=True)
class _Shape:
    """A stage's items as its cost reads them (``CostModel._shape``): count, FLOPs and the
    largest WG's, the largest K slice and tile area, the largest WG's streamed bytes
    ((h + w) kK e), the naive reads, the output elements' bytes, the panels and their bytes."""

    n: int
    flops: float
    flops_max: float
    kk_max: float
    area: float
    stream_max: float
    naive: float
    out: float
    panels: "Panels"
    unique: float


PANEL_MEMO = 256  # not a parameter: a bound on memory (entries kept by CostModel's
# panel memo before they start again), which no modelled time depends on


class CostModel:
    def __init__(self, spec: DeviceSpec, dtype: str):
        self.spec = spec
        self.dtype = dtype
        self.e = DTYPE_BYTES[dtype]
        self.peak = spec.peak_flops(dtype)
        self.slots = spec.wgs_per_stage
        # the queueing (s) a memory request finds in the DRAM's queue besides the unloaded
        # latency: set by the kernel runner for a stage that runs beside queued
        # communication (loaded latency, ``emulator/model/gemm.py``), else 0
        self.delay = 0.0
        # the share of the L2 the running kernel keeps beside communication traffic that
        # passes through it (``emulator/model/cache.py``): set by the kernel runner for a
        # stage that runs beside such traffic, else 1
        self.l2_share = 1.0
        # bytes/s a concurrent CU kernel's loads and stores take from the L2's bandwidth
        # while the stage runs (``emulator/engine/cu_side.py``), else 0
        self.l2_taken = 0.0
        # the kernel model times modelled GEMM kernels (off where the device's ``[gemm]``
        # is disabled: the ``gemm-efficiency`` counterfactual, their stages at the peak on
        # their useful FLOPs; a device without the section builds no modelled kernel but
        # a hand-built one, as a test's, keeps its clock)
        self.kernel_model = spec.gemm is None or spec.gemm.enabled
        # a stage's memo (``KernelRunner``'s, per memo key: a stage whose cost its key
        # decides, with ``delay``, ``l2_share`` and ``l2_taken``): what ``gemm_compute`` and
        # ``with_local_writes`` derived from its items' rows and from the panels the stage
        # before left in the L2, so an equal stage is costed again at each new share
        # without deriving them again; else None
        self.stage_memo: dict | None = None
        self._panel_memo: dict = {}  # wgs contents -> (panels, bytes): ``_panels``
        self._held_last: tuple = (None, None, 0.0)  # (panels, resident, bytes): ``_held``
        self._shape_last: tuple = (None, None)  # (wgs, its _Shape): ``_shape``
        self._writes_last: tuple = (None, None, None, None)  # ``with_local_writes``
        self.l2_reset()

    def stage(self, wgs: np.ndarray, local_ops: list[str], remote: list[list[int]],
              rank: int, outputs_cached: bool = False) -> StageCost:
        """Cost of one GEMM stage. ``wgs`` rows (r0, r1, c0, c1, k0, k1); ``local_ops[i]``
        is 'store', 'update' or 'none'; ``remote[i]`` the ranks WG i's tile is also
        written to (this rank itself for a write into another local buffer)."""
        flops, compute, reads = self.gemm_compute(wgs, outputs_cached)
        return self.with_writes(wgs, flops, compute, reads, local_ops, remote, rank)

    def wg_seconds(self, flops: float, peak: float | None, resident: int | None = None,
                   vector: bool = False) -> float:
        """Time of a WG's ``flops``: each WG has 1/S of the peak in a stage; with P resident
        (persistent kernels) 1/max(P, S) of the matrix peak, so a persistent grid never
        beats an ordinary full grid of the same work by quantisation alone (a WG computes
        no faster than in a full stage), and 1/max(P, CUs) of the vector peak (a light
        memory-bound kernel: fewer WGs each issue more); 0 if the spec gives no such rate."""
        if not peak:
            return 0.0
        if resident is None:
            return flops * self.slots / peak
        return flops * max(resident, self.spec.cus if vector else self.slots) / peak

    def gemm_compute(self, wgs: np.ndarray, outputs_cached: bool = False,
                     resident: int | None = None, vector: bool = False, kernel=None
                     ) -> tuple[float, float, float]:
        """(FLOPs, compute seconds, DRAM read bytes) of GEMM (or GEMV: ``vector``) WGs run
        at once; ``kernel``: the ``GemmKernel`` they belong to (its clock when modelled:
        ``emulator/model/gemm.py``)."""
        memo = self.stage_memo
        st = memo.get("shape") if memo is not None else None
        if st is None:
            st = self._shape(wgs)
            if memo is not None:
                memo["shape"] = st
        n = st.n
        peak = self.spec.vector_flops(self.dtype) if vector else self.peak
        fixup = 0.0
        if kernel is not None and kernel.modelled and not self.kernel_model:
            compute = st.flops / peak if n else 0.0
        elif kernel is not None and kernel.modelled and n:
            cus = self.spec.cus
            if self.l2_taken and kernel.l2_bw:  # the L2 a concurrent CU kernel leaves
                kernel = dataclasses.replace(kernel, l2_bw=max(
                    kernel.l2_bw - self.l2_taken, kernel.l2_bw * L2_FLOOR))
            compute = kernel.stage_seconds(
                n, st.kk_max, cus, peak, self.spec.partial_stage == "spread",
                st.area, self.delay, None if resident is None else max(
                    resident, cus if vector else cus * kernel.per_cu))
            fixup = kernel.fixup_bytes(n, st.kk_max, cus)
        else:  # the fixed tile: its stages at ``matrix_efficiency`` of the matrix peak
            eff = 1.0 if vector else self.spec.matrix_efficiency
            compute = (self.wg_seconds(st.flops_max, peak, resident, vector) / eff
                       if n else 0.0)
            if not vector and n and self._fixed_latency():
                compute = self.fixed_latency_time(compute, st.kk_max)
        if vector and n:  # a GEMV WG streams its weight rows: latency-bound when few
            compute = max(compute, self.latency_time(st.stream_max))
        unique = st.unique
        if not unique:
            return st.flops, compute, fixup
        l2 = self._l2_left(st.out, outputs_cached)
        # the stage's WGs walk K together: the L2 holds the current K-steps of its panels
        window = unique * min(1.0, 2 * params.value("k_step") / st.kk_max)
        reads = unique + max(0.0, 1.0 - l2 / window) * (st.naive - unique)
        held = memo.get("held") if memo is not None else None
        if held is None:  # panels the previous stage left in L2: their bytes, and the share
            self._l2_owed()
            share = self._resident_share if len(self._resident) else 0.0  # of them kept
            held = (self._held(st.panels) if share else 0.0, share)
            if memo is not None:
                memo["held"] = held
        if held[1]:
            reads -= held[0] * held[1]
        return st.flops, compute, max(0.0, reads) + fixup

    def _shape(self, wgs: np.ndarray) -> "_Shape":
        """What a stage's cost takes from its items' rows alone (sums, maxima, panels), kept
        for the last array asked: a stage is costed again at each L2 share, loaded latency
        and L2 bandwidth it meets and committed after, on the same array (``launch._rows``),
        and only the formulas that read those change between them."""
        last = self._shape_last
        if last[0] is wgs:
            return last[1]
        h = (wgs[:, 1] - wgs[:, 0]).astype(np.float64)
        w = (wgs[:, 3] - wgs[:, 2]).astype(np.float64)
        kk = (wgs[:, 5] - wgs[:, 4]).astype(np.float64)
        flops = 2.0 * h * w * kk
        n = len(flops)
        panels, unique = self._panels(wgs)
        st = _Shape(n, float(flops.sum()), float(flops.max()) if n else 0.0,
                    float(kk.max()) if n else 0.0,
                    float((h * w).max()) if n else 0.0,  # a wider tile of a thin chunk
                    float(((h + w) * kk).max() * self.e) if n else 0.0,
                    float(((h + w) * kk * self.e).sum()) if unique else 0.0,
                    float(((wgs[:, 1] - wgs[:, 0]) * (wgs[:, 3] - wgs[:, 2])).sum()) * self.e,
                    panels, unique)
        self._shape_last = (wgs, st)  # (kept alive, so no other array takes its id)
        return st

    # ---------------------------------------------------------------- the L2 across stages
    def _panels(self, wgs: np.ndarray) -> tuple[Panels, float]:
        """The A row panels and B column panels ``wgs`` read (``Panels``) and their bytes,
        kept per distinct ``wgs`` (its contents): a stage is costed again at each L2
        share and loaded latency it meets (``_time_items``), and its panels are committed
        after, on the same items."""
        key = (wgs.shape, wgs.dtype.str, wgs.tobytes())
        hit = self._panel_memo.get(key)
        if hit is None:
            panels = Panels.of(wgs)
            hit = (panels, float(panels.elements() * self.e))
            if len(self._panel_memo) >= PANEL_MEMO:
                self._panel_memo.clear()
            self._panel_memo[key] = hit
        return hit

    def _held(self, panels: Panels) -> float:
        """Bytes of ``panels`` the previous stage left resident (the last answer kept: a
        stage asks once per L2 share it is costed at)."""
        last = self._held_last
        if last[0] is panels and last[1] is self._resident:
            return last[2]
        held = float(panels.shared(self._resident) * self.e)
        self._held_last = (panels, self._resident, held)
        return held

    def l2_inputs(self, wgs: np.ndarray, outputs_cached: bool) -> float:
        """L2 bytes left for inputs: all of it when outputs bypass it, less the stage's
        outputs when they write-allocate."""
        return self._l2_left(self._shape(wgs).out, outputs_cached)

    def _l2_left(self, out: float, outputs_cached: bool) -> float:
        """``l2_inputs`` of items whose outputs take ``out`` bytes."""
        return max(0.0, self.spec.l2_bytes * self.l2_share - (out if outputs_cached else 0.0))

    def l2_reset(self) -> None:
        """A new kernel: nothing of its inputs is in the L2 yet."""
        self._owed = None
        self._resident, self._resident_share = Panels.of(np.zeros((0, 6), np.int64)), 0.0

    def l2_defer(self, commit) -> None:
        """``commit()`` makes an ``l2_commit`` that is owed: it is made when the L2's state
        is next read (a stage's hits on the panels the previous one left), and not at all
        if another commit or a reset comes first (a stage whose memo already holds those
        hits reads nothing of it). The state read is the same either way."""
        self._owed = commit

    def _l2_owed(self) -> None:
        owed, self._owed = self._owed, None
        if owed is not None:
            owed()

    def l2_commit(self, wgs: np.ndarray, outputs_cached: bool) -> None:
        """A stage has run: its panels stay in the L2 for the next stage, all of them if they
        fit beside its cached outputs, else the share of them the L2 holds (module
        docstring); the next stage's hits are that share of the panels it shares."""
        self._owed = None
        self._resident, held = self._panels(wgs)
        self._resident_share = min(1.0, self.l2_inputs(wgs, outputs_cached) / held) if held \
            else 0.0

    def latency_time(self, nbytes: float) -> float:
        """A WG's least time to read ``nbytes`` (Little's law: inflight / latency per WG, the
        latency loaded by ``delay``); 0 when the device does not give both."""
        s = self.spec
        if not (s.mem_latency_s and s.wg_inflight_bytes):
            return 0.0
        return nbytes * (s.mem_latency_s + self.delay) / s.wg_inflight_bytes

    def _fixed_latency(self) -> bool:
        """The fixed tile hides the memory latency as a pipeline (``fixed_latency_time``): on
        a device whose GEMMs are the fixed tile (no ``[gemm]`` section: T3's simulated
        GPU) that gives a latency."""
        return self.spec.gemm is None and bool(self.spec.mem_latency_s)

    def fixed_latency_time(self, compute: float, kk: float) -> float:
        """A fixed-tile WG's time over a K slice of ``kk`` whose steps compute in
        ``compute`` all told: the kernel model's pipeline (``emulator/model/gemm.py``) with
        ``fixed_stages`` (a parameter) K steps in the pipeline, each answered after the (loaded)
        latency L: L (the prologue) + steps x max(step, L / (stages - 1))."""
        steps = max(1, math.ceil(kk / params.value("k_step")))
        lat = self.spec.mem_latency_s + self.delay
        return lat + steps * max(compute / steps,
                                 lat / max(1.0, params.value("fixed_stages") - 1))

    def latency_bound(self, producer) -> bool:
        """Whether the compute time of ``producer``'s WGs depends on the memory latency (so
        on ``delay``): a GEMM whose kernel model has a latency (or the fixed tile on a
        device that gives one: ``_fixed_latency``), a GEMV or embedding pooling on a
        device that gives its WGs' requests in flight."""
        kernel = getattr(producer, "kernel", None)
        if kernel is not None and kernel.modelled:
            return bool(kernel.latency_s and self.kernel_model)
        if producer.kind == "gemm" and self._fixed_latency():
            return True
        s = self.spec
        return producer.kind in ("gemv", "embedding", "elementwise") and bool(
            s.mem_latency_s and s.wg_inflight_bytes)

    def row_efficiency(self, concurrent: int, row_bytes: float) -> float:
        """Data bytes per byte of HBM channel time when ``concurrent`` WGs each read random
        rows of ``row_bytes`` (module docstring: row locality); 1 when not modelled."""
        s = self.spec
        m = s.dram_row_miss_cost
        if not s.dram_banks or m <= 1.0:
            return 1.0
        r = max(1.0, row_bytes / s.dram.access_bytes)
        hit = 1.0 / (1.0 + max(1, concurrent) / s.dram_banks)
        return r / (m + (r - 1.0) * (hit + (1.0 - hit) * m))

    def gather_compute(self, wgs: np.ndarray, width: int, index_bytes: int,
                       resident: int | None = None) -> tuple[float, float, float]:
        """(FLOPs, compute seconds, DRAM read bytes) of embedding-pooling WGs run at once:
        item (r0, r1, c0, c1, k0, k1) pools r1 - r0 bags of k1 - k0 random rows of
        ``width`` elements each (one add per element read, plus the row ids). Compute:
        the slower of the vector ALUs and the WG's latency bound."""
        bags = (wgs[:, 1] - wgs[:, 0]).astype(np.float64)
        rows = bags * (wgs[:, 5] - wgs[:, 4]).astype(np.float64)
        reads = rows * (width * self.e + index_bytes)
        flops = rows * width
        if not len(wgs):
            return 0.0, 0.0, 0.0
        i = int(np.argmax(reads))
        compute = max(self.wg_seconds(float(flops[i]), self.spec.vector_flops(self.dtype),
                                      resident, vector=True), self.latency_time(float(reads[i])))
        return float(flops.sum()), compute, float(reads.sum())

    def elementwise_compute(self, wgs: np.ndarray, copies: int,
                            resident: int | None = None) -> tuple[float, float, float]:
        """(FLOPs, compute seconds, DRAM read bytes) of elementwise WGs summing ``copies``
        source tiles each (a copy when 1): the slower of the vector ALUs and the WG's
        latency bound on its reads (Little's law, as a GEMV's)."""
        elems = ((wgs[:, 1] - wgs[:, 0]) * (wgs[:, 3] - wgs[:, 2])).astype(np.float64)
        flops = (copies - 1) * elems
        compute = (max(self.wg_seconds(float(flops.max()), self.spec.vector_flops(self.dtype),
                                       resident, vector=True),
                       self.latency_time(float(copies * elems.max() * self.e)))
                   if len(flops) else 0.0)
        return float(flops.sum()), compute, float(copies * elems.sum() * self.e)

    def with_writes(self, wgs: np.ndarray, flops: float, compute: float, reads: float,
                    local_ops: list[str], remote: list[list[int]], rank: int,
                    out_e: float | None = None) -> StageCost:
        """A stage's cost: its compute and reads plus where its tiles are written
        (``out_e``: bytes per element of the output buffer, default the run's dtype)."""
        h = (wgs[:, 1] - wgs[:, 0]).astype(np.float64)
        w = (wgs[:, 3] - wgs[:, 2]).astype(np.float64)
        out_bytes = h * w * (out_e or self.e)
        upd = self.spec.update_cost
        write = write_cost = 0.0
        remote_bytes: dict[int, float] = {}
        for i, op in enumerate(local_ops):
            if op != "none":
                write += out_bytes[i]
                write_cost += out_bytes[i] * (upd if op == "update" else 1.0)
            for dst in remote[i]:
                if dst == rank:
                    write += out_bytes[i]
                    write_cost += out_bytes[i]
                else:
                    remote_bytes[dst] = remote_bytes.get(dst, 0.0) + out_bytes[i]
        return StageCost(flops, compute, reads, write, write_cost, remote_bytes)

    def with_local_writes(self, wgs: np.ndarray, flops: float, compute: float, reads: float,
                          op: str, out_e: float | None = None) -> StageCost:
        """``with_writes`` for items that all write their tiles locally with ``op`` (no
        target): the same sums, without a loop per item."""
        if op == "none":
            return StageCost(flops, compute, reads, 0.0, 0.0, {})
        memo = self.stage_memo
        if memo is not None and "writes" in memo:
            return StageCost(flops, compute, reads, *memo["writes"], {})
        last = self._writes_last  # the same items costed again (``_shape``): the same sums
        if last[0] is wgs and last[1] == op and last[2] == out_e:
            return StageCost(flops, compute, reads, *last[3], {})
        out_bytes = ((wgs[:, 1] - wgs[:, 0]).astype(np.float64)
                     * (wgs[:, 3] - wgs[:, 2]).astype(np.float64) * (out_e or self.e))
        factor = self.spec.update_cost if op == "update" else 1.0
        sums = (sum(out_bytes.tolist(), 0.0), sum((out_bytes * factor).tolist(), 0.0))
        self._writes_last = (wgs, op, out_e, sums)
        if memo is not None:
            memo["writes"] = sums
        return StageCost(flops, compute, reads, *sums, {})

    def update_cost_bytes(self, nbytes: float, op: str) -> float:
        """HBM time-equivalent bytes of a write landing as ``op``."""
        return nbytes * (self.spec.update_cost if op == "update" else 1.0)
