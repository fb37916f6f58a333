"""Cost model: modelled durations and DRAM traffic from the device spec.

Every formula names its source. Symbols: P = peak dense FLOP/s of the device
(``cus x clock x flops_per_cycle_per_cu[dtype]``), S = WG slots per stage
(``cus x wgs_per_cu``), BW = HBM bytes/s, L = link bytes/s per direction,
lat = link latency, e = bytes per input element, eo = bytes per output element.

GEMM stage (a set of at most S WG tiles running at once; T3 "stages"):
- compute  = max over tiles of (2 h w K) x S / P: each WG owns 1/S of the CUs'
  throughput and the stage lasts as long as its largest tile (wave
  quantisation).
- reads    = U + max(0, 1 - L2/U) x (R - U), with U the stage's distinct A row
  panels (h K e) and B column panels (K w e) and R = sum over tiles of
  (h + w) K e: panels are read from DRAM once if they fit in L2, and the part
  that does not fit is re-read by every WG that uses it.
- writes   = sum of h w eo over tiles written to local HBM; an op-and-store
  update costs ``nmc_update_cost`` x a write (T3: CCDWL = 2 x CCDL). GEMM
  outputs are uncached (T3), so every output byte reaches DRAM.
- timeline: a read phase of ``max(compute, reads at the rate the HBM leaves)``
  then a bursty write phase (T3: "a read phase followed by a bursty write
  phase"). Tiles remote-mapped to a peer leave on the link instead; the stage
  retires when its link stores have drained.
Link transfer of B bytes: B / L on the sender's outgoing link, arrival = end +
lat. DMA command: ``dma_setup_s``, then the source read (B at the HBM) and the
link transfer stream concurrently; the engine is busy until both end.
Remote updates are charged to the receiver's HBM from their arrival
(``nmc_update_cost`` x B for updates, B for stores).
CU-driven collective step (baseline RS/AG kernels): reads of its inputs at the
HBM and the link transfer stream concurrently; a local result is written after
the reads.
Arbitration: the compute stream may use all of BW; the communication stream is
capped at ``comm_share`` x BW while it overlaps compute (round-robin between two
streams gives each half under contention; T3 "round-robin with fallback").
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from devices.spec import DeviceSpec

DTYPE_BYTES = {"fp16": 2, "fp32": 4}


@dataclass(frozen=True)
class StageCost:
    flops: float
    compute_s: float
    read_bytes: float
    write_bytes: float  # bytes written to local HBM
    write_cost_bytes: float  # bytes x nmc_update_cost for updates
    remote_bytes: dict  # dst rank -> bytes stored/updated into a peer over the link


@dataclass(frozen=True)
class RoundRobin:
    """T3's baseline arbitration: compute and communication streams alternate."""

    name: str = "round-robin"
    comm_share: float = 0.5


class CostModel:
    def __init__(self, spec: DeviceSpec, dtype: str, policy: RoundRobin | None = None):
        self.spec = spec
        self.dtype = dtype
        self.e = DTYPE_BYTES[dtype]
        self.peak = spec.peak_flops(dtype)
        self.slots = spec.wgs_per_stage
        self.policy = policy or RoundRobin()

    @property
    def comm_cap(self) -> float:
        return self.policy.comm_share * self.spec.hbm_bw

    def stage(self, tiles: np.ndarray, k: int, local_ops: list[str],
              remote: list[int]) -> StageCost:
        """Cost of one stage. ``tiles`` rows (r0, r1, c0, c1); ``local_ops[i]`` is 'store',
        'update' or 'none'; ``remote[i]`` is the peer a tile is remote-mapped to or -1."""
        h = (tiles[:, 1] - tiles[:, 0]).astype(np.float64)
        w = (tiles[:, 3] - tiles[:, 2]).astype(np.float64)
        flops = 2.0 * h * w * k
        compute = float(flops.max()) * self.slots / self.peak if len(flops) else 0.0
        rows = {(int(a), int(b)) for a, b, _, _ in tiles}
        cols = {(int(c), int(d)) for _, _, c, d in tiles}
        unique = (sum(b - a for a, b in rows) + sum(d - c for c, d in cols)) * k * self.e
        naive = float(((h + w) * k * self.e).sum())
        l2 = self.spec.l2_bytes
        reads = unique + max(0.0, 1.0 - l2 / unique) * (naive - unique) if unique else 0.0
        out_bytes = h * w * self.e
        write = write_cost = 0.0
        remote_bytes: dict[int, float] = {}
        for i, op in enumerate(local_ops):
            if op == "store":
                write += out_bytes[i]
                write_cost += out_bytes[i]
            elif op == "update":
                write += out_bytes[i]
                write_cost += out_bytes[i] * self.spec.nmc_update_cost
            if remote[i] >= 0:
                remote_bytes[remote[i]] = remote_bytes.get(remote[i], 0.0) + out_bytes[i]
        return StageCost(float(flops.sum()), compute, reads, write, write_cost, remote_bytes)

    def update_cost_bytes(self, nbytes: float, op: str) -> float:
        """HBM time-equivalent bytes of a write landing as ``op``."""
        return nbytes * (self.spec.nmc_update_cost if op == "update" else 1.0)
