"""The DRAM of one emulated GPU: a memory controller whose request queues are shared by
streams, served at the HBM's rate under an arbitration policy (``arbitration.py``).

What the model keeps, per rank (parameters: ``devices.spec.DramSpec``):

- **Service**: a ``BandwidthTimeline`` at the HBM's peak rate mu. Every stream's
  requests take their share of it; reservations are made in the rank's program
  order (``clock.py``), and a reservation made earlier keeps what it got.
- **The request queues**: C channels x D entries of A bytes (T3 Table 1's HBM2:
  C = 32 channels of 32 GB/s; D = 64, GPGPU-Sim's FR-FCFS scheduler queue, the
  simulator family T3 builds on; A = 64-byte accesses). All channels see the
  same mix (addresses interleave over them), so the model keeps one queue of
  Q = C x D x A bytes (128 KB on t3-sim) rather than C copies of it.
- **Streams**: the compute stream (a GEMM stage's reads paced by its compute, then
  its bursty writes; ``launch.py``) and the communication stream (DMA reads,
  stores and near-memory updates landing from peers, a CU kernel's traffic),
  ``comm``. A communication request is *offered* to the queue at a rate: a DMA
  read burst at once (T3: "RS reads of a stage's regions, issued as soon as both
  copies have landed"), data landing from a link at the link's rate.
- **Backlog**: the communication bytes offered and not yet served, summed over
  the stream's recent requests (``backlog``). While the backlog is over Q the
  queue is full of communication requests, so no compute request can enter it:
  those bytes are served at the whole rate and the compute stream stalls
  ("bursts fill the DRAM queues and stall the GEMM's reads", T3). This is how a
  burst slows the GEMM by more than a fair share of the bandwidth; the policy
  decides whether a burst may fill the queue at all.
- **Bursts**: requests are batched into bursts of ``burst_bytes`` (64 KB by
  default: 1024 accesses) and each burst is admitted and served as one; results
  move by less than 0.5% between 16 KB and 128 KB bursts (a burst is
  at most the queue)
  (``tests/test_arbitration.py``; docs/concepts.md gives the figures).
- **Anti-starvation**: a policy that holds communication back (MCA's occupancy
  ceiling) holds each request at most ``starvation_s`` (1 us, a stated
  assumption in ``DramSpec``): what is still unserved then is issued anyway,
  at most at ``starved_share`` of the rate (round-robin's) and without filling
  the queue; a GEMM stage reserved before it keeps what it has (program order),
  so it gets what the GEMM leaves.
- **Read/write turnaround**: writes served while another stream reads make the
  channel turn its bus around: tWTR + tRTW (``turnaround_s``) per batch of
  ``write_batch`` writes (GPGPU-Sim's write queue drains between its high and
  low watermarks). A communication write that lands while a GEMM stage reads
  (``CommWindow.compute_after``) costs its bytes x (1 or ``update_cost``)
  plus ``turnaround_bytes`` per byte; a kernel's own read and write phases follow
  each other, so they pay none.
- **Row switches between streams**: a stream alone keeps its rows open (streaming reads
  and writes hit the open row; what its own row changes cost is in the sustained rate).
  Two streams served at once interleave in the banks: the FR-FCFS scheduler serves a
  bank's queued hits to the open row first, so a bank's share of the full queue,
  k = C x D / ``banks`` requests, holds one open row if its requests are all one
  stream's and two if both streams' are there, with probability
  p(s) = 1 - s^k - (1 - s)^k for a stream taking s of the rate; each such batch costs
  one more row switch, (``row_miss_cost`` - 1) hits' channel time. So bytes T served
  together, at shares s and 1 - s, take T x p(s) x (m - 1) / k more channel time
  (``switch_bytes``, summed over the intervals of a reservation, where the other
  stream's rate is what the timeline holds). The reservation made later in program
  order pays it, served from its start at whatever rate is free (communication's under
  its policy's share, as its own bytes); one stream's own requests, or two streams that
  never overlap in time, pay none.
- **Counterfactual** (``DramSpec.shared`` = False, the ``contention`` ablation of
  ``ablation.py``): communication is served by a DRAM of its own at the same rate
  (``comm``, ``stream``), under no policy and with no read/write turnaround, so
  it neither waits for the compute stream nor slows it.
- **Observability**: every reservation is logged by stream (``log``): the trace
  draws bandwidth by stream and the queue's communication backlog as counter
  tracks, and the report draws DRAM traffic over time.
"""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from devices.spec import DramSpec
from emulator.model.clock import BandwidthTimeline


# Communication served more than this before the start of a stage that asks what passed
# through the cache (``through``) is dropped (stages are asked in program order, which
# follows modelled time closely; a stage runs for microseconds to a few milliseconds).
THROUGH_HORIZON_S = 10e-3
# Communication bursts served more than this before a new one is offered are dropped from
# the backlog (program order follows modelled time closely; a queue of 128 KB drains in
# about 0.1 us at 1 TB/s, so 10 us keeps every burst that could still be queued).
BACKLOG_HORIZON_S = 10e-6


def mixed_batches(share: float, k: float) -> float:
    """The chance that a bank's ``k`` queued requests hold both streams' rows when one
    stream takes ``share`` of the rate: 1 - s^k - (1 - s)^k (module docstring)."""
    return 1.0 - share ** k - (1.0 - share) ** k


class Dram:
    """One GPU's memory controller and HBM (see the module docstring)."""

    def __init__(self, name: str, rate: float, dram: DramSpec, record: bool = False):
        self.rate = float(rate)
        self.timeline = BandwidthTimeline(name, self.rate, kinds=True)
        self.displaced = 0.0  # compute bytes communication took (``preempt``), not re-served
        self.channels = dram.channels_for(self.rate)
        self.access_bytes = float(dram.access_bytes)
        self.queue_bytes = float(self.channels * dram.queue_depth * dram.access_bytes)
        self.burst_bytes = float(min(dram.burst_bytes, self.queue_bytes))
        self.starvation_s = float(dram.starvation_s)
        # extra bytes of channel time per byte written while another stream reads
        self.turnaround_bytes = (dram.turnaround_s * self.rate / self.channels
                                 / (dram.write_batch * dram.access_bytes))
        # row switches between streams (module docstring): requests per bank of a full
        # queue, and the extra channel time per mixed batch, in bytes of a hit's time
        self.bank_requests = (self.channels * dram.queue_depth / dram.banks
                              if dram.banks else 0.0)
        self.switch_cost = (dram.row_miss_cost - 1.0) if dram.banks else 0.0
        self.switched = 0.0  # bytes of channel time row switches between streams took
        self.record = record
        self.log: list[tuple[str, float, float, float]] = []  # (stream, start, end, bytes)
        self.comm_log: list[tuple] = []  # every communication burst, as ``_comm`` (counters)
        self._lanes: dict[float, BandwidthTimeline] = {}
        self._comm: deque = deque(maxlen=4096)  # not a parameter: bookkeeping; (offered at, start, end, bytes) of comm bursts
        self._queued = SpanLog(4, 4096)  # not a parameter: bookkeeping; the bursts of ``comm`` alone (``queued``)
        self._through = SpanLog(3, 1 << 16)  # not a parameter: bookkeeping; (start, end, bytes) of every communication reservation (``through``)
        self.apart: Dram | None = None  # communication's own DRAM (the counterfactual)
        if not dram.shared:
            import dataclasses

            self.apart = Dram(f"{name} comm", rate, dataclasses.replace(dram, shared=True),
                              record)
            self.apart.log, self.apart.comm_log = self.log, self.comm_log

    # ------------------------------------------------------------------ plain service
    def reserve(self, ready: float, nbytes: float, cap: float | None = None,
                stream: str = "cu-kernel", compute: bool = False) -> tuple[float, float]:
        """Serve ``nbytes`` of one stream from ``ready`` at most at ``cap``; (start, end).
        ``compute``: a GEMM stage's, which communication served later in program order but
        at the same time may take its policy's share of (``preempt``)."""
        start, end, _ = self.timeline.fill(ready, nbytes, cap, compute=compute)
        if self.record and nbytes > 0:
            self.log.append((stream, start, end, nbytes))
        return start, self._switch(None, start, end, nbytes, compute)

    def switch_bytes(self, start: float, end: float, nbytes: float, compute: bool) -> float:
        """Channel time (bytes at a hit's rate) the row switches between ``nbytes`` served
        in [start, end) and the other stream's requests served there take (module
        docstring): per interval of the timeline, T x p(s) x (m - 1) / k with T the two
        streams' bytes and s this one's share. The other stream: communication and
        library kernels for a compute reservation, compute for any other."""
        if self.switch_cost <= 0 or end <= start or nbytes <= 0:
            return 0.0
        if compute and not self.timeline.others_after(start):  # compute's alone there:
            return 0.0  # no interval has another stream's rate (what the loop finds)
        k, own = self.bank_requests, nbytes / (end - start)
        eps = self.rate * 1e-9  # not a parameter: a numerical tolerance
        total = 0.0
        for dt, u, c in self.timeline.rates(start, end):
            other = u - c if compute else c
            if other > eps:
                both = own + other
                total += both * dt * mixed_batches(own / both, k)
        return total * self.switch_cost / k

    def _switch(self, policy, start: float, end: float, nbytes: float,
                compute: bool) -> float:
        """Serve the row switches ``nbytes`` served in [start, end) cause (``switch_bytes``)
        from ``start``: compute's and policy-less reservations' at the free rate,
        communication's as its own bytes under ``policy``; when the reservation ends."""
        extra = self.switch_bytes(start, end, nbytes, compute)
        if extra <= self.rate * 1e-15:
            return end
        if policy is None:
            s, e, _ = self.timeline.fill(start, extra, None, compute=compute)
        else:
            s, e = self._serve(policy, start, extra, None)
        self.switched += extra
        if self.record:
            self.log.append(("row switches", s, e, extra))
        return max(end, e)

    def _serve(self, policy, ready: float, nbytes: float,
               cap: float | None) -> tuple[float, float]:
        """Communication's reservation: the free rate, then up to the policy's share of the
        rate taken from compute reserved earlier in program order (``preempt``: traffic
        shares the DRAM with the stages it overlaps in modelled time, whatever the
        order they were reserved in); the bytes taken are owed to the compute stream."""
        s, e, taken = self.timeline.preempt(ready, nbytes, cap,
                                            getattr(policy, "preempt_share", 0.0))
        if taken > 0:
            self.displaced += taken
            if self.record:  # (the compute stream's bytes there: served later, ``settle``)
                self.log.append(("gemm displaced", s, e, -taken))
        return s, e

    def settle(self, t: float) -> float:
        """Serve the compute bytes communication displaced (``_serve``) from ``t``, before
        the kernel's next stage (or at its end); when they are served."""
        if self.displaced <= self.rate * 1e-15:
            self.displaced = 0.0
            return t
        nbytes, self.displaced = self.displaced, 0.0
        return self.reserve(t, nbytes, None, "gemm displaced", compute=True)[1]

    # ------------------------------------------------------------------ communication
    def backlog(self, t: float) -> float:
        """Communication bytes offered by ``t`` and not yet served at ``t`` (each burst's
        bytes taken as served evenly over its service interval)."""
        comm = self._comm
        while comm and comm[0][2] < t - BACKLOG_HORIZON_S:  # long served: forget them
            comm.popleft()
        return _unserved(comm, t)

    def queued(self, t0: float, t1: float, room: float | None = None) -> float:
        """The communication bytes a compute request entering the queue between ``t0`` and
        ``t1`` finds ahead of it, on average: the bursts offered and not yet served (each
        served evenly over its service interval), at most the queue's bytes or the
        ``room`` a policy lets communication take. Bursts only: a steady stream below the
        HBM's rate (``stream``) keeps no backlog in the queue."""
        q = self._queued
        q.drop_before(2, t0 - BACKLOG_HORIZON_S)
        room = self.queue_bytes if room is None else min(room, self.queue_bytes)
        if room <= 0 or not q:
            return 0.0
        if t1 <= t0:
            return min(room, _unserved(q, t0))
        return min(room, _mean_unserved(q.overlapping(0, 2, t0, t1), t0, t1))

    def through(self, t0: float, t1: float) -> float:
        """Communication bytes (cost bytes) served between ``t0`` and ``t1`` (each
        reservation's bytes spread evenly over its service): what passed through a
        memory-side cache meanwhile (``emulator/model/cache.py``). Only what was reserved
        before the question, in program order."""
        q = self._through
        q.drop_before(1, t0 - THROUGH_HORIZON_S)
        return bytes_within(q.overlapping(0, 1, t0, t1, instants=True), t0, t1)

    def comm(self, policy, ready: float, nbytes: float, window, stream: str = "comm",
             offered_rate: float | None = None) -> float:
        """Serve ``nbytes`` (cost bytes) of communication offered from ``ready`` (all at
        once, or at ``offered_rate`` bytes/s: burst i is offered whole when its first
        byte arrives), burst by burst under ``policy``; when the last is served."""
        if self.apart is not None:
            return self.apart.comm(_APART, ready, nbytes, window, stream, offered_rate)
        if nbytes <= 0:
            return ready
        end = ready
        bursts = max(1, math.ceil(nbytes / self.burst_bytes - 1e-9))
        size = nbytes / bursts
        for i in range(bursts):
            t = ready + (i * size / offered_rate if offered_rate else 0.0)
            blocking, cap = policy.admit(self, t, size, window)
            s0 = e = t
            if blocking > 0:  # the queue is full of communication: served alone
                s0, e = self._serve(policy, t, blocking, None)
            if size - blocking > 0:
                t1, rest = t, size - blocking
                if cap is not None:
                    t1, cap = self._via_lane(cap, t, rest)
                s1, e1 = self._held(policy, window, t, t1, rest, cap)
                s0, e = (s1, e1) if blocking <= 0 else (min(s0, s1), max(e, e1))
            e = self._switch(policy, s0, e, size, False)
            self._comm.append((t, s0, e, size))
            self._queued.append((t, s0, e, size))
            self._through.append((s0, e, size))
            if self.record:
                self.log.append((stream, s0, e, size))
                self.comm_log.append((s0, s0, e, size))
            end = max(end, e)
        return end

    def stream(self, policy, ready: float, nbytes: float, window, stream: str = "comm",
               rate: float | None = None) -> float:
        """Serve ``nbytes`` (cost bytes) of communication offered steadily at ``rate`` from
        ``ready`` (a copy engine's reads paced by its link, data landing from a link): a
        stream that never fills the queue (rate below the HBM's) under a policy that sets
        no ceiling is one reservation at most at ``rate`` (its bursts coalesced: what a
        transfer of GBs costs in model time, not a burst each); otherwise burst by burst
        (``comm``). When the last byte is served."""
        if self.apart is not None:
            return self.apart.stream(_APART, ready, nbytes, window, stream, rate)
        if nbytes <= 0:
            return ready
        rate = self.rate if rate is None else rate
        ceiling = policy.ceiling(self, window)
        if rate > self.rate or not (ceiling is None or ceiling >= self.rate):
            return self.comm(policy, ready, nbytes, window, stream, rate)
        s0, e = self._serve(policy, ready, nbytes, rate)
        e = self._switch(policy, s0, e, nbytes, False)
        self._comm.append((ready, s0, e, nbytes))
        self._through.append((s0, e, nbytes))
        if self.record:
            self.log.append((stream, s0, e, nbytes))
            self.comm_log.append((s0, s0, e, nbytes))
        return e

    def _held(self, policy, window, offered: float, ready: float, nbytes: float,
              cap: float | None) -> tuple[float, float]:
        """Serve ``nbytes`` offered at ``offered`` under the policy's ceiling; what is still
        unserved after the wait limit is issued anyway (anti-starvation) at the share
        the policy gives a starved request."""
        ceiling = policy.ceiling(self, window)
        if ceiling is None or ceiling >= self.rate:
            return self._serve(policy, ready, nbytes, cap)
        until = max(ready, offered + self.starvation_s)
        s1, e1, left = self.timeline.fill(ready, nbytes, cap, ceiling, until)
        if left <= 0:
            return s1, e1
        t2, cap2 = self._via_lane(policy.starved_share * self.rate, until, left)
        s2, e2 = self.timeline.reserve(t2, left, cap2)
        return (s1 if left < nbytes else s2), e2

    def _via_lane(self, cap: float, t: float, nbytes: float) -> tuple[float, float | None]:
        """The stream's bursts together get at most ``cap``: when this one's share of the
        lane starts, and its rate there."""
        t1, le = self._lane(cap).reserve(t, nbytes)
        return t1, (nbytes / (le - t1) if le > t1 else None)

    def _lane(self, cap: float) -> BandwidthTimeline:
        """The communication stream's own timeline at a policy's rate cap: its bursts share
        the cap (in time order) before they take their part of the HBM."""
        lane = self._lanes.get(cap)
        if lane is None:
            lane = self._lanes[cap] = BandwidthTimeline(f"{self.timeline.name} comm", cap)
        return lane

    def write_cost(self, nbytes: float, op: str, update_cost: float, mixed: bool) -> float:
        """Cost bytes of ``nbytes`` written as ``op``; ``mixed``: while another stream reads
        (read/write turnaround)."""
        cost = nbytes * (update_cost if op == "update" else 1.0)
        mixed = mixed and self.apart is None  # apart: no compute reads on its bus
        return cost + (nbytes * self.turnaround_bytes if mixed else 0.0)

    def counters(self, bin_s: float = 1e-6) -> list:
        """Counter samples for the trace (``clock.Event``s on ``counter:`` tracks), one per
        ``bin_s`` of modelled time: HBM bandwidth by stream (GB/s, each reservation's
        bytes spread evenly over its service) and the communication backlog in the queue
        (KB, capped at the queue's size: beyond it the requests wait outside)."""
        from emulator.model.clock import Event

        if not self.log:
            return []
        end = max(e for _, _, e, _ in self.log)
        nbins = int(end / bin_s) + 1
        bw = self.bandwidth(0.0, bin_s, nbins)
        out = []
        for b in range(nbins):
            t = b * bin_s
            out.append(Event("counter:HBM GB/s", "bandwidth", t, t,
                             {s: v[b] / 1e9 for s, v in bw.items()}))
            out.append(Event("counter:DRAM queue, communication KB", "backlog", t, t,
                             {"backlog": min(self.queue_bytes, self.backlog_at(t)) / 1024}))  # not a parameter: KiB
        return out

    def bandwidth(self, t0: float, bin_s: float, nbins: int) -> dict[str, list[float]]:
        """Bytes/s served to each stream in ``nbins`` bins of ``bin_s`` from ``t0`` (each
        logged reservation's bytes spread evenly over its service). The GEMM's bytes that
        communication took (``_serve``: logged as negative "gemm displaced" bytes where
        they were reserved, and positive where ``settle`` serves them) are counted in the
        GEMM's reads, never drawn as a stream of their own; a bin where the bytes taken
        exceed the reads' even spread shows 0, not a negative rate."""
        merge = {"gemm displaced": "gemm reads"}
        bw = {s: [0.0] * nbins for s in sorted({merge.get(s, s) for s, _, _, _ in self.log})}
        for stream, start, stop, nbytes in self.log:
            stream = merge.get(stream, stream)
            if stop <= start or stop <= t0:
                continue
            rate = nbytes / (stop - start)
            first = max(0, int((start - t0) / bin_s))
            for b in range(first, min(nbins, int((stop - t0) / bin_s) + 1)):
                lo, hi = max(start, t0 + b * bin_s), min(stop, t0 + (b + 1) * bin_s)
                if hi > lo:
                    bw[stream][b] += rate * (hi - lo) / bin_s
        for series in bw.values():
            series[:] = [max(0.0, v) for v in series]
        return bw

    def backlog_at(self, t: float) -> float:
        """``backlog`` over every communication burst logged (the trace's counters), counted
        from its service start."""
        return _unserved(self.comm_log, t)

    def describe(self) -> dict:
        return {"queue_bytes": self.queue_bytes, "burst_bytes": self.burst_bytes,
                "starvation_s": self.starvation_s,
                "turnaround_bytes_per_byte": self.turnaround_bytes}


class _Apart:
    """The policy of communication's own DRAM (the counterfactual): no compute competes."""

    starved_share = 1.0

    @staticmethod
    def admit(dram: Dram, t: float, nbytes: float, window) -> tuple[float, None]:
        return 0.0, None

    @staticmethod
    def ceiling(dram: Dram, window) -> None:
        return None


_APART = _Apart()


class SpanLog:
    """A log of communication's reservations, as ``deque(maxlen=maxlen)`` of tuples of
    ``width`` floats (oldest first) kept in numpy columns, so that the few of thousands
    that overlap a stage's window are found by array comparisons (``overlapping``) and
    summed in the log's order, with the same arithmetic as over every tuple."""

    def __init__(self, width: int, maxlen: int):
        self.maxlen = maxlen
        self._a = np.empty((64, width), np.float64)  # not a parameter: first capacity
        self._lo = self._hi = 0

    def __len__(self) -> int:
        return self._hi - self._lo

    def __iter__(self):
        return iter(self._a[self._lo : self._hi].tolist())

    def append(self, row: tuple) -> None:
        if self._hi == len(self._a):
            n = self._hi - self._lo
            a = self._a if self._lo >= len(self._a) // 2 else np.empty(
                (2 * len(self._a), self._a.shape[1]), np.float64)
            a[:n] = self._a[self._lo : self._hi]
            self._a, self._lo, self._hi = a, 0, n
        self._a[self._hi] = row
        self._hi += 1
        if self._hi - self._lo > self.maxlen:  # (a full deque drops its oldest)
            self._lo += 1

    def drop_before(self, col: int, t: float) -> None:
        """Forget the oldest rows while their column ``col`` is below ``t`` (a deque's
        ``popleft`` while ``q[0][col] < t``)."""
        a, lo, hi = self._a, self._lo, self._hi
        while lo < hi and a[lo, col] < t:
            lo += 1
        self._lo = lo

    SCAN = 64  # not a parameter: below this many rows a loop is faster than arrays

    def overlapping(self, first: int, last: int, t0: float, t1: float,
                    instants: bool = False):
        """The rows (oldest first) whose [column ``first``, column ``last``) overlaps
        [t0, t1): max(t0, first) < min(t1, last); with ``instants`` also those with last <=
        first and t0 <= first < t1. The rows no caller of this log counts anything for,
        left out; every log of fewer than ``SCAN`` rows whole."""
        if len(self) < self.SCAN:
            return self
        v = self._a[self._lo : self._hi]
        a, b = v[:, first], v[:, last]
        keep = (b > t0) & (a < t1) & (b > a) if t1 > t0 else np.zeros(len(v), bool)
        if instants:
            keep |= (b <= a) & (t0 <= a) & (a < t1)
        return v[np.flatnonzero(keep)].tolist()


def bytes_within(spans, t0: float, t1: float) -> float:
    """Bytes of ``spans`` ((start, end, bytes), each spread evenly over [start, end]; an
    instant one counted where it falls) between ``t0`` and ``t1``."""
    total = 0.0
    if t1 <= t0:  # (no span overlaps an empty window; an instant one needs t0 <= start < t1)
        return total
    for start, end, nbytes in spans:  # (this runs per stage: comparisons, no calls)
        if end > start:  # max(t0, start) < min(t1, end): the span overlaps the window
            if end > t0 and start < t1:
                total += nbytes * ((t1 if t1 < end else end)
                                   - (t0 if t0 > start else start)) / (end - start)
        elif t0 <= start < t1:
            total += nbytes
    return total


def _mean_unserved(bursts, a: float, b: float) -> float:
    """``_unserved`` averaged over [a, b] (b > a): each burst holds its bytes from its offer
    to its service start, then drains linearly to its service end."""
    total = 0.0
    for offered, start, end, nbytes in bursts:
        lo, hi = max(a, offered), min(b, end)
        if hi <= lo:
            continue
        whole = max(0.0, min(hi, start) - lo)  # held whole before its service starts
        total += nbytes * whole
        x0, x1 = max(lo, start), hi
        if x1 > x0 and end > start:  # draining: nbytes (end - t) / (end - start)
            total += nbytes * ((end - x0) ** 2 - (end - x1) ** 2) / (2.0 * (end - start))
    return total / (b - a)


def _unserved(bursts, t: float) -> float:
    """Bytes of ``bursts`` ((offered at, service start, service end, bytes)) offered by ``t``
    and not yet served at ``t``, each served evenly over its service interval."""
    left = 0.0
    for offered, start, end, nbytes in bursts:
        if offered <= t < end:
            left += nbytes if t <= start else nbytes * (end - t) / (end - start)
    return left
