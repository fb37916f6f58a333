"""Memory-controller arbitration between the compute and the communication stream.

The HBM is a ``BandwidthTimeline``: reservations made earlier in a rank's
program order keep their bandwidth, later ones get what is left (a fluid model
of the DRAM queues). A policy decides two things for the communication stream
(DMA reads, NMC updates and stores landing from peers):

- ``lookahead``: how many GEMM stages are reserved before the DMA entries a
  stage triggers (0 for both policies here: entries are reserved ahead of the
  next stage, so their share below is what they get while it runs);
- ``comm(...)``: the rate the stream may take while compute runs.

Policies (T3, "Memory-controller arbitration"):

``RoundRobin`` (used by ``t3``): two streams alternate, falling back to the
other when one is empty. Fluid form: while a later GEMM stage exists, the
communication stream gets at most ``share`` (1/2) of the bandwidth and compute
the rest; once compute is done, communication takes all of it.

``Mca`` (used by ``t3-mca``): compute first; communication is issued only while
DRAM queue occupancy is under a threshold; communication that has waited too
long is issued anyway; the stream drains at kernel end. Fluid form:
- occupancy threshold T (5, 10, 30 requests or no limit): a DRAM queue served
  as an M/M/1 queue holds T requests on average at utilisation T/(T+1), so
  the total may only reach a ceiling of T/(T+1) of the peak while
  communication is admitted (no limit: the peak);
- T is chosen from the GEMM's memory intensity seen in its first stage, before
  any communication: utilisation u1 = its DRAM bytes / (its duration x peak);
  u1 >= 0.75 -> 5, >= 0.5 -> 10, >= 0.25 -> 30, else no limit (ASSUMPTION:
  T3 names the four thresholds but not the intensity bands; we split the
  range evenly);
- compute first: while a later GEMM stage runs, communication gets what the
  GEMM leaves under the ceiling, (T/(T+1) - u1) of the peak, using the
  intensity MCA measured;
- anti-starvation: never less than 1/(T+1) of the peak (at least one request
  in T+1 is communication);
- drain: with no later stage, communication takes the whole bandwidth.
So a light GEMM lets communication use more than round-robin's half, and a
memory-bound GEMM keeps nearly all of the bandwidth.

``Exclusive``: no compute runs alongside (a kernel of its own, or an isolated
ideal run): the stream takes what it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emulator.model.clock import BandwidthTimeline


@dataclass
class CommWindow:
    """Where a communication request sits relative to the compute stream."""

    compute_after: bool = False  # a later GEMM stage will compete for the HBM


class Exclusive:
    name = "exclusive"
    lookahead = 0

    def observe_first_stage(self, utilisation: float) -> None:
        pass

    def comm(self, hbm: BandwidthTimeline, ready: float, nbytes: float,
             window: CommWindow) -> float:
        return hbm.reserve(ready, nbytes)[1]

    def describe(self) -> dict:
        return {"policy": self.name}


class RoundRobin(Exclusive):
    name = "round-robin"

    def __init__(self, share: float = 0.5):
        self.share = share

    def comm(self, hbm: BandwidthTimeline, ready: float, nbytes: float,
             window: CommWindow) -> float:
        cap = self.share * hbm.rate if window.compute_after else None
        return hbm.reserve(ready, nbytes, cap)[1]

    def describe(self) -> dict:
        return {"policy": self.name, "comm_share": self.share}


MCA_THRESHOLDS = ((0.75, 5), (0.5, 10), (0.25, 30))  # (first-stage utilisation >=, T)


class Mca(RoundRobin):
    name = "mca"

    def __init__(self):
        super().__init__()
        self.threshold: float = math.inf
        self.first_stage_utilisation: float | None = None

    def observe_first_stage(self, utilisation: float) -> None:
        if self.first_stage_utilisation is not None:
            return
        self.first_stage_utilisation = utilisation
        self.threshold = next((t for u, t in MCA_THRESHOLDS if utilisation >= u), math.inf)

    @property
    def ceiling_fraction(self) -> float:
        t = self.threshold
        return 1.0 if math.isinf(t) else t / (t + 1.0)

    @property
    def comm_fraction(self) -> float:
        """Communication's share of the peak while a GEMM stage runs."""
        floor = 0.0 if math.isinf(self.threshold) else 1.0 / (self.threshold + 1.0)
        u1 = self.first_stage_utilisation or 0.0
        return min(1.0, max(floor, self.ceiling_fraction - u1))

    def comm(self, hbm: BandwidthTimeline, ready: float, nbytes: float,
             window: CommWindow) -> float:
        if not window.compute_after:
            return hbm.reserve(ready, nbytes)[1]  # drain
        return hbm.reserve(ready, nbytes, self.comm_fraction * hbm.rate)[1]

    def describe(self) -> dict:
        return {"policy": self.name,
                "occupancy_threshold": None if math.isinf(self.threshold) else self.threshold,
                "first_stage_utilisation": self.first_stage_utilisation,
                "ceiling_fraction": self.ceiling_fraction, "comm_fraction": self.comm_fraction}


POLICIES = {"exclusive": Exclusive, "round-robin": RoundRobin, "mca": Mca}


def policy_named(name: str) -> Exclusive:
    """A new policy object by its name (``POLICIES``)."""
    if name not in POLICIES:
        raise ValueError(f"arbitration policy {name!r} not in {', '.join(POLICIES)}")
    return POLICIES[name]()
