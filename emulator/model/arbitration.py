"""Memory-controller arbitration: how the communication stream enters the DRAM queues
that a running GEMM also uses (``dram.py`` holds the queue; T3, "Memory-controller
arbitration").

A policy answers, for each burst of communication bytes offered at time t while
a later GEMM stage will compete (``CommWindow.compute_after``), two things
(``admit``): how many of its bytes find the queue full of communication, so that
they are served alone and the GEMM's requests cannot enter (``blocking``), and
the rate cap of the rest. With no compute after it, every policy drains the
stream at the whole rate (T3: "drained at kernel boundaries").

- ``RoundRobin`` (``t3``): compute and communication alternate, each falling back
  to the other when it is empty. Nothing limits what communication puts in the
  queue: a burst bigger than the room the queue has left (Q minus the
  communication backlog) fills it, and those bytes are served before any later
  GEMM request gets in; the rest alternate with the GEMM (at most ``share`` = 1/2
  of the rate).
- ``Mca`` (``t3-mca``): compute first; communication is issued only while the
  queue's occupancy is under a threshold T, so it never fills the queue (no
  blocking), and it gets what the GEMM leaves: T (5, 10, 30 requests or no
  limit) is chosen from the queue occupancy the GEMM's first, isolated stage
  shows: the mean requests per channel its bursts keep in the queue
  (``launch.queue_occupancy``: each K step's loads arrive as one burst, as the
  stage's WGs walk K together, and its output leaves as one write burst; a burst
  fills the queue up to its size and drains at the HBM's rate), q1; q1 >= 3 -> 5,
  >= 1 -> 10, >= 1/3 -> 30, else no limit (ASSUMPTION: T3 names the four
  thresholds, not the occupancies that pick them; the band edges are the
  occupancies an M/M/1 channel holds at utilisation 0.75, 0.5 and 0.25, u / (1 -
  u): the range split evenly; without a measured occupancy, a stage's q1 is that
  M/M/1 occupancy of its utilisation u1, ``occupancy``). By the same
  queue model a channel holds T requests on average at utilisation T/(T+1), so
  communication is served only while the total stays under that ceiling
  (``ceiling``), and at most T requests per channel of it are ahead of a GEMM
  request (``comm_room``: loaded latency). Compute first: the next GEMM stage is reserved before
  the communication its previous stage triggered (``lookahead`` = 1), so the
  GEMM's reads and write bursts take what they need and communication the rest
  under the ceiling. Anti-starvation: a request that has waited the DRAM's
  wait limit (``DramSpec.starvation_s``) is issued anyway, without the ceiling,
  at most at round-robin's share and without filling the queue; as the GEMM's
  stage was reserved first (the fluid timeline keeps earlier reservations), it
  gets what the GEMM leaves, so a memory-bound GEMM that keeps the total over the
  ceiling no longer holds communication back until its read phase ends; the
  stream drains at kernel end.
- ``ComputeExclusive``: communication only when the GEMM has no request: the
  GEMM's stage is reserved first, and communication gets at most what the GEMM
  leaves on average, (1 - u1) of the peak, with no anti-starvation (T3: it
  wastes bandwidth).
- ``FrFcfs``: the plain first-come-first-served sharing a copy engine sees on
  GPUs without such arbitration: a burst is served in arrival order, ahead of
  every GEMM request that comes after it (all of it blocks).
- ``Alone``: no compute alongside (a kernel of its own, an isolated ideal run):
  the stream takes what it needs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from emulator.model.dram import Dram
from emulator.model import params


@dataclass
class CommWindow:
    """Where a communication request sits relative to the compute stream."""

    compute_after: bool = False  # a later GEMM stage will compete for the HBM


class Alone:
    name = "alone"
    lookahead = 0
    starved_share = 0.5  # of the rate, for requests issued after the wait limit
    preempt_share = 0.0  # of the rate communication may take from compute reserved before
    # it in program order that it overlaps in modelled time (``Dram._serve``): none here,
    # as no compute runs alongside

    def observe_first_stage(self, utilisation: float, reads: float | None = None,
                            occupancy: float | None = None) -> None:
        """The DRAM utilisation of the kernel's first (isolated) stage, of its reads, and
        the queue's mean occupancy over it (requests per channel; None: not measured)."""

    def admit(self, dram: Dram, t: float, nbytes: float,
              window: CommWindow) -> tuple[float, float | None]:
        """(bytes of this burst served alone ahead of the GEMM, rate cap of the rest)."""
        return 0.0, None

    def ceiling(self, dram: Dram, window: CommWindow) -> float | None:
        """The total rate under which communication may be served (None: the peak)."""
        return None

    def comm_room(self, dram: Dram) -> float | None:
        """The bytes of the queue communication may hold ahead of a compute request (None:
        all of it; loaded latency, ``Dram.queued``)."""
        return None

    def describe(self) -> dict:
        return {"policy": self.name}


class RoundRobin(Alone):
    name = "round-robin"

    def __init__(self, share: float = 0.5):
        self.share = share
        self.preempt_share = share  # it alternates with a GEMM stage reserved before it

    def admit(self, dram: Dram, t: float, nbytes: float, window: CommWindow):
        if not window.compute_after:
            return 0.0, None
        over = dram.backlog(t) + nbytes - dram.queue_bytes
        return min(nbytes, max(0.0, over)), self.share * dram.rate

    def describe(self) -> dict:
        return {"policy": self.name, "comm_share": self.share}


class FrFcfs(Alone):
    name = "fr-fcfs"
    preempt_share = 1.0  # a burst is served ahead of the GEMM requests behind it, whichever
    # was reserved first

    def admit(self, dram: Dram, t: float, nbytes: float, window: CommWindow):
        return (nbytes if window.compute_after else 0.0), None


def mca_thresholds() -> tuple[tuple[float, float], ...]:
    """(the first stage's queue occupancy >=, T): T3's thresholds, each picked from the
    occupancy (M/M/1) of its utilisation band (``mca_band_low`` + its step)."""
    low, step = params.value("mca_band_low"), params.value("mca_band_step")
    bands = (low + 2 * step, low + step, low)  # u1 >= 0.75, 0.5, 0.25 as run
    return tuple((occupancy(u), t) for u, t in zip(bands, params.value("mca_thresholds")))


def occupancy(utilisation: float) -> float:
    """Mean requests per channel in a queue served at ``utilisation`` of its rate (M/M/1:
    u / (1 - u)), the model that also turns a threshold T into MCA's ceiling T/(T+1)."""
    return math.inf if utilisation >= 1.0 else utilisation / (1.0 - utilisation)


class Mca(Alone):
    name = "mca"
    lookahead = 1  # compute first: a GEMM stage is reserved before the communication
    # its previous stage triggered

    def __init__(self):
        self.threshold: float = math.inf
        self.first_stage_utilisation: float | None = None
        self.first_stage_occupancy: float | None = None
        self.read_utilisation: float | None = None

    def observe_first_stage(self, utilisation: float, reads: float | None = None,
                            occupancy_: float | None = None) -> None:
        """The first (isolated) stage's DRAM utilisation, its read phase's, and the queue's
        mean occupancy over it (``launch.queue_occupancy``; None: an M/M/1 queue at the
        stage's utilisation, u / (1 - u))."""
        if self.first_stage_utilisation is not None:
            return
        self.first_stage_utilisation = utilisation
        self.read_utilisation = reads
        q = occupancy(utilisation) if occupancy_ is None else occupancy_
        self.first_stage_occupancy = q
        self.threshold = next((t for o, t in mca_thresholds() if q >= o * (1 - 1e-12)),
                              math.inf)

    @property
    def ceiling_fraction(self) -> float:
        t = self.threshold
        return 1.0 if math.isinf(t) else t / (t + 1.0)

    def ceiling(self, dram: Dram, window: CommWindow) -> float | None:
        """Communication is issued only while the total stays under the occupancy
        threshold's utilisation ceiling (the GEMM's own reservations come first)."""
        return self.ceiling_fraction * dram.rate if window.compute_after else None

    def comm_room(self, dram: Dram) -> float | None:
        """Communication enters a channel's queue only under T requests: at most T accesses
        per channel are ahead of a compute request."""
        if math.isinf(self.threshold):
            return None
        return self.threshold * dram.channels * dram.access_bytes

    def describe(self) -> dict:
        return {"policy": self.name,
                "occupancy_threshold": None if math.isinf(self.threshold) else self.threshold,
                "first_stage_utilisation": self.first_stage_utilisation,
                "first_stage_occupancy": self.first_stage_occupancy,
                "first_stage_read_utilisation": self.read_utilisation,
                "ceiling_fraction": self.ceiling_fraction}


class ComputeExclusive(Mca):
    name = "compute-exclusive"

    @property
    def comm_fraction(self) -> float:
        return max(1e-3, 1.0 - (self.first_stage_utilisation or 0.0))

    def admit(self, dram: Dram, t: float, nbytes: float, window: CommWindow):
        return 0.0, (self.comm_fraction * dram.rate if window.compute_after else None)

    def ceiling(self, dram: Dram, window: CommWindow) -> float | None:
        return None

    def comm_room(self, dram: Dram) -> float | None:
        """Communication only in the GEMM's gaps: never ahead of a compute request."""
        return 0.0

    def describe(self) -> dict:
        return {"policy": self.name, "first_stage_utilisation": self.first_stage_utilisation,
                "comm_fraction": self.comm_fraction}


POLICIES = {"alone": Alone, "round-robin": RoundRobin, "mca": Mca,
            "compute-exclusive": ComputeExclusive, "fr-fcfs": FrFcfs}


def policy_named(name: str) -> Alone:
    """A new policy object by its name (``POLICIES``)."""
    if name not in POLICIES:
        raise ValueError(f"arbitration policy {name!r} not in {', '.join(POLICIES)}")
    return POLICIES[name]()
