"""The modelled clock: resources with timelines, reserved in program order.

Modelled time never reads the wall clock. Every operation has a ready time
(from its inputs' timestamps, local or carried by signals) and reserves the
resources it uses; its start is when they can serve it, its end follows from
the cost model. Reservations of one rank are made in a fixed *program order*
(``ProgramOrder``), whatever order the compute and DMA threads reach them in on
the host, so the same configuration always gives the same times.

Resources:
- ``BandwidthTimeline`` (HBM, each outgoing link direction): a rate in bytes/s
  shared by overlapping transfers. A reservation of B bytes from time t with a
  rate cap c takes, in each interval, min(c, rate - already reserved) until B
  bytes are served ("water filling"); earlier reservations keep their share.
- ``SerialResource`` (the CUs running one kernel, each DMA engine): busy until
  its current operation ends.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field


class BandwidthTimeline:
    def __init__(self, name: str, rate: float):
        if not rate > 0:
            raise ValueError(f"{name}: rate must be > 0, got {rate}")
        self.name = name
        self.rate = float(rate)
        self._t: list[float] = [0.0]  # breakpoints
        self._u: list[float] = [0.0]  # reserved rate in [t[i], t[i+1]); the last runs to infinity
        self.busy_bytes = 0.0

    def _split(self, x: float) -> int:
        i = bisect.bisect_right(self._t, x) - 1
        if self._t[i] == x:
            return i
        self._t.insert(i + 1, x)
        self._u.insert(i + 1, self._u[i])
        return i + 1

    def reserve(self, ready: float, nbytes: float, cap: float | None = None) -> tuple[float, float]:
        """Serve ``nbytes`` from ``ready`` at most at ``cap`` bytes/s; return (start, end)."""
        if ready < 0 or nbytes < 0:
            raise ValueError(f"{self.name}: negative ready {ready} or bytes {nbytes}")
        if nbytes == 0:
            return ready, ready
        cap = self.rate if cap is None else min(cap, self.rate)
        if not cap > 0:
            raise ValueError(f"{self.name}: rate cap must be > 0, got {cap}")
        self.busy_bytes += nbytes
        i = self._split(ready)
        remaining = float(nbytes)
        start = None
        eps = self.rate * 1e-12
        while True:
            t0 = self._t[i]
            t1 = self._t[i + 1] if i + 1 < len(self._t) else math.inf
            avail = min(cap, self.rate - self._u[i])
            if avail > eps:
                if start is None:
                    start = t0
                if avail * (t1 - t0) >= remaining:
                    end = t0 + remaining / avail
                    if end < t1:
                        self._split(end)
                    self._u[i] += avail
                    return start, end
                self._u[i] += avail
                remaining -= avail * (t1 - t0)
            i += 1


class SerialResource:
    """A resource that serves one operation at a time (CUs of one kernel, a DMA engine)."""

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0

    def reserve(self, ready: float, duration: float) -> tuple[float, float]:
        start = max(ready, self.free_at)
        self.free_at = start + duration
        return start, self.free_at


class ProgramOrderTimeout(RuntimeError):
    pass


class ProgramOrder:
    """A turnstile: operation ``k`` reserves its resources only after operations 0..k-1."""

    def __init__(self, name: str, watchdog_s: float):
        self.name = name
        self.watchdog_s = watchdog_s
        self._next = 0
        self._cv = threading.Condition()

    @contextmanager
    def turn(self, index: int, what: str):
        deadline = time.monotonic() + self.watchdog_s
        with self._cv:
            while self._next != index:
                if self._next > index:
                    raise RuntimeError(f"{self.name}: operation {index} ({what}) reserved twice")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ProgramOrderTimeout(
                        f"{self.name}: {what} (program-order op {index}) waited {self.watchdog_s:g}"
                        f" s for op {self._next} to reserve its resources")
                self._cv.wait(min(left, 0.5))
        try:
            yield
        finally:
            with self._cv:
                self._next = index + 1
                self._cv.notify_all()


@dataclass
class Event:
    """One modelled interval, for traces and timeline tests."""

    track: str
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict)


class RankClock:
    """One rank's modelled resources and its log of modelled events."""

    def __init__(self, rank: int, hbm_bw: float, link_bw: float, dma_engines: int,
                 watchdog_s: float):
        self.rank = rank
        self.hbm = BandwidthTimeline(f"hbm[{rank}]", hbm_bw)
        self.link_bw = link_bw
        self.links: dict[int, BandwidthTimeline] = {}
        self.cu = SerialResource(f"cu[{rank}]")
        self.dma = [SerialResource(f"dma{e}[{rank}]") for e in range(dma_engines)]
        self.order = ProgramOrder(f"rank {rank} program order", watchdog_s)
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def link(self, dst: int) -> BandwidthTimeline:
        """The outgoing link direction from this rank towards ``dst``."""
        if dst not in self.links:
            self.links[dst] = BandwidthTimeline(f"link[{self.rank}->{dst}]", self.link_bw)
        return self.links[dst]

    def dma_engine(self) -> SerialResource:
        """The engine that frees first (lowest index on ties): deterministic."""
        return min(self.dma, key=lambda e: e.free_at)

    def log(self, track: str, name: str, start: float, end: float, **args) -> None:
        with self._lock:
            self.events.append(Event(track, name, start, end, args))
