"""The modelled clock: resources with timelines, reserved in program order.

Modelled time never reads the wall clock. Every operation has a ready time
(from its inputs' timestamps, local or carried by signals) and reserves the
resources it uses; its start is when they can serve it, its end follows from
the cost model. Reservations of one rank are made in a fixed *program order*
(``ProgramOrder``), whatever order the compute and DMA threads reach them in on
the host, so the same configuration always gives the same times.

Resources:
- ``BandwidthTimeline`` (each outgoing link direction; the HBM's service inside
  its memory controller, ``dram.py``): a rate in bytes/s
  shared by overlapping transfers. A reservation of B bytes from time t with a
  rate cap c takes, in each interval, min(c, rate - already reserved) until B
  bytes are served ("water filling"); earlier reservations keep their share, except
  on the HBM, where communication may take its arbitration policy's share from compute
  reserved before it (``preempt``). A transfer crosses the ports of its route
  together (``reserve_together``).
- ``SerialResource`` (the CUs running one kernel, each DMA engine): busy until
  its current operation ends.
"""

from __future__ import annotations

import bisect
import math
import threading
import time
from dataclasses import dataclass, field

from emulator.model.topology import Route, Topology


class BandwidthTimeline:
    def __init__(self, name: str, rate: float, kinds: bool = False):
        if not rate > 0:
            raise ValueError(f"{name}: rate must be > 0, got {rate}")
        self.name = name
        self.rate = float(rate)
        self._t: list[float] = [0.0]  # breakpoints
        self._u: list[float] = [0.0]  # reserved rate in [t[i], t[i+1]); the last runs to infinity
        # ``kinds`` (the HBM): the part of ``_u`` compute reserved (``preempt``)
        self._c: list[float] | None = [0.0] if kinds else None
        self.busy_bytes = 0.0
        # ``kinds``: the latest time any reservation but compute's holds (after it every
        # interval's rate is compute's alone, ``u == c`` bit for bit: ``others_after``)
        self.others_end = 0.0

    def _split(self, x: float) -> int:
        i = bisect.bisect_right(self._t, x) - 1
        if self._t[i] == x:
            return i
        self._t.insert(i + 1, x)
        self._u.insert(i + 1, self._u[i])
        if self._c is not None:
            self._c.insert(i + 1, self._c[i])
        return i + 1

    def _merge(self, lo: int, hi: int) -> None:
        """Drop the breakpoints between neighbouring intervals of [lo, hi] that no
        reservation can use any more: at most a quarter of ``fill``'s and ``preempt``'s
        threshold (rate x 1e-12) left free and held by compute. Every reservation passes
        such an interval without arithmetic (``avail`` stays under the threshold), so
        merging them changes no result, bit for bit; it keeps a busy timeline short (a
        chain of communication bursts at the full rate)."""
        t, u, c = self._t, self._u, self._c
        lo, hi = max(lo, 1), min(hi, len(t) - 1)
        dead = self.rate - self.rate * 0.25e-12  # not a parameter: a numerical tolerance
        tiny = self.rate * 0.25e-12  # not a parameter: c under this, nothing to take

        if c is None:  # (the test inlined: this runs on every reservation)
            drop = [j for j in range(lo, hi + 1) if u[j] >= dead and u[j - 1] >= dead]
        else:
            drop = [j for j in range(lo, hi + 1) if u[j] >= dead and c[j] <= tiny
                    and u[j - 1] >= dead and c[j - 1] <= tiny]
        if not drop:
            return
        gone = set(drop)
        keep = [j for j in range(lo, hi + 1) if j not in gone]
        t[lo : hi + 1] = [t[j] for j in keep]
        u[lo : hi + 1] = [u[j] for j in keep]
        if c is not None:
            c[lo : hi + 1] = [c[j] for j in keep]

    def reserve(self, ready: float, nbytes: float, cap: float | None = None,
                ceiling: float | None = None) -> tuple[float, float]:
        """Serve ``nbytes`` from ``ready`` at most at ``cap`` bytes/s; return (start, end)."""
        start, end, _ = self.fill(ready, nbytes, cap, ceiling)
        return start, end

    def fill(self, ready: float, nbytes: float, cap: float | None = None,
             ceiling: float | None = None, until: float = math.inf,
             compute: bool = False) -> tuple[float, float, float]:
        """Serve up to ``nbytes`` in [ready, until): at most ``cap`` bytes/s for this
        reservation, and only while the total reserved rate stays under ``ceiling``
        (``compute``: a compute stream's, which later communication may ``preempt``).
        Returns (start, end, bytes left unserved at ``until``)."""
        if ready < 0 or nbytes < 0:
            raise ValueError(f"{self.name}: negative ready {ready} or bytes {nbytes}")
        if nbytes == 0 or until <= ready:
            return ready, ready, float(nbytes)
        cap = self.rate if cap is None else min(cap, self.rate)
        ceiling = self.rate if ceiling is None else min(ceiling, self.rate)
        if not cap > 0:
            raise ValueError(f"{self.name}: rate cap must be > 0, got {cap}")
        t, u = self._t, self._u  # the hot loop of the modelled clock: locals, no calls
        c = self._c if compute else None
        other = c is None and self._c is not None  # another stream's, on a ``kinds`` line
        if other and until < math.inf:
            self.others_end = max(self.others_end, until)
        eps = self.rate * 1e-12
        if until == math.inf and ready >= t[-1]:  # from the last interval on (a stage
            got = self._fill_tail(ready, float(nbytes), cap, ceiling, eps, c)  # after
            if got is not None:  # the ones before, mostly): the loop below, unrolled
                if other:
                    self.others_end = max(self.others_end, got[1])
                return got
        i = self._split(ready)
        if until < math.inf:
            self._split(until)
            i = bisect.bisect_right(self._t, ready) - 1
        remaining = float(nbytes)
        start = None
        n = len(t)
        first = i
        while True:
            t0 = t[i]
            if t0 >= until:
                self.busy_bytes += nbytes - remaining
                return (ready if start is None else start), until, remaining
            room = ceiling - u[i]
            avail = cap if cap <= room else room
            if avail > eps:
                t1 = t[i + 1] if i + 1 < n else math.inf
                if start is None:
                    start = t0
                if avail * (t1 - t0) >= remaining:
                    end = t0 + remaining / avail
                    if end <= t0:  # less than one ulp of t0: nothing left to reserve
                        self.busy_bytes += nbytes
                        return start, t0, 0.0
                    if end < t1:
                        self._split(end)
                    u[i] += avail
                    if c is not None:
                        c[i] += avail
                    self.busy_bytes += nbytes
                    self._merge(first, i + 2)
                    if other:
                        self.others_end = max(self.others_end, end)
                    return start, end, 0.0
                u[i] += avail
                if c is not None:
                    c[i] += avail
                remaining -= avail * (t1 - t0)
            i += 1

    def _fill_tail(self, ready: float, remaining: float, cap: float, ceiling: float,
                   eps: float, c: list[float] | None) -> tuple[float, float, float] | None:
        """``fill`` from ``ready`` at or after the last breakpoint, with no ``until``: the
        same steps on the same lists (the split at ``ready``, the one interval that runs to
        infinity, the split at the end, the merge where it could drop anything); None
        where that interval has no room (``fill``'s loop then says so)."""
        t, u, kinds = self._t, self._u, self._c
        if ready > t[-1]:  # ``_split(ready)`` at the end
            t.append(ready)
            u.append(u[-1])
            if kinds is not None:
                kinds.append(kinds[-1])
        i = len(t) - 1
        room = ceiling - u[i]
        avail = cap if cap <= room else room
        if not avail > eps:
            return None
        end = ready + remaining / avail
        if end <= ready:  # less than one ulp of ready: nothing left to reserve
            self.busy_bytes += remaining
            return ready, ready, 0.0
        if end < math.inf:  # ``_split(end)`` at the end
            t.append(end)
            u.append(u[i])
            if kinds is not None:
                kinds.append(kinds[i])
        u[i] += avail
        if c is not None:
            c[i] += avail
        self.busy_bytes += remaining
        # not a parameter: ``_merge``'s own tolerance (below it the merge drops nothing)
        if u[i] >= self.rate - self.rate * 0.25e-12:  # not a parameter: as above
            self._merge(i, i + 2)
        return ready, end, 0.0

    def others_after(self, t: float) -> bool:
        """Whether a reservation other than compute's holds any rate at or after ``t``
        (``kinds`` timelines; else every reservation is another's)."""
        return self._c is None or t < self.others_end

    def rates(self, t0: float, t1: float):
        """(seconds, reserved rate, compute's part of it) of each interval of [t0, t1)
        (``kinds`` timelines; compute's part 0 otherwise)."""
        t, u, c = self._t, self._u, self._c
        i = max(0, bisect.bisect_right(t, t0) - 1)
        n = len(t)
        while i < n and t[i] < t1:
            lo, hi = max(t[i], t0), min(t[i + 1] if i + 1 < n else math.inf, t1)
            if hi > lo:
                yield hi - lo, u[i], (c[i] if c is not None else 0.0)
            i += 1

    def preempt(self, ready: float, nbytes: float, cap: float | None,
                share: float) -> tuple[float, float, float]:
        """Serve ``nbytes`` of communication from ``ready`` at most at ``cap``: the free rate
        first, then, where compute reservations made earlier in program order hold the
        rest, as much of theirs as brings communication (this and the communication
        already served there) up to ``share`` of the rate: what the arbitration policy
        gives communication against compute whichever was reserved first. Returns
        (start, end, compute bytes displaced): the compute stream's owner serves those
        later (``Dram.settle``)."""
        if share <= 0 or self._c is None or nbytes <= 0:
            start, end = self.reserve(ready, nbytes, cap)
            return start, end, 0.0
        if ready < 0:
            raise ValueError(f"{self.name}: negative ready {ready}")
        cap = self.rate if cap is None else min(cap, self.rate)
        if not cap > 0:
            raise ValueError(f"{self.name}: rate cap must be > 0, got {cap}")
        target = min(share, 1.0) * self.rate
        i = first = self._split(ready)
        t, u, c = self._t, self._u, self._c
        remaining, displaced, start = float(nbytes), 0.0, None
        eps = self.rate * 1e-12
        while True:
            n = len(t)
            t0 = t[i]
            t1 = t[i + 1] if i + 1 < n else math.inf
            room = max(0.0, self.rate - u[i])
            want = max(room, min(target - (u[i] - c[i]), room + c[i]))
            avail = cap if cap <= want else want
            if avail > eps:
                if start is None:
                    start = t0
                steal = avail - room if avail > room else 0.0
                last = avail * (t1 - t0) >= remaining
                if last:
                    end = t0 + remaining / avail
                    if end <= t0:
                        self.busy_bytes += nbytes - displaced
                        return start, t0, displaced
                    if end < t1:
                        self._split(end)
                    t1 = end
                u[i] += avail - steal
                c[i] = max(0.0, c[i] - steal)
                displaced += steal * (t1 - t0)
                if last:
                    self.busy_bytes += nbytes - displaced
                    self._merge(first, i + 2)
                    self.others_end = max(self.others_end, t1)
                    return start, t1, displaced
                remaining -= avail * (t1 - t0)
            i += 1


def reserve_together(lines: list[BandwidthTimeline], ready: float, nbytes: float,
                     cap: float) -> tuple[float, float]:
    """Serve ``nbytes`` from ``ready`` through every timeline of ``lines`` at once (the ports
    of one route, cut-through): in each interval the transfer takes the same rate on all
    of them, at most ``cap`` and what the busiest leaves free, so every hop carries the
    bytes in the bottleneck's window and no hop is held while another stalls them.
    Returns (start, end)."""
    if ready < 0 or nbytes < 0:
        raise ValueError(f"negative ready {ready} or bytes {nbytes}")
    if nbytes == 0:
        return ready, ready
    cap = min(cap, *(ln.rate for ln in lines))
    if not cap > 0:
        raise ValueError(f"rate cap must be > 0, got {cap}")
    remaining, start, t0, end = float(nbytes), None, ready, ready
    while True:
        avail, t1 = cap, math.inf
        for ln in lines:
            i = bisect.bisect_right(ln._t, t0) - 1
            room = ln.rate - ln._u[i]
            if room <= ln.rate * 1e-12:  # ``fill``'s threshold, per port: full
                room = 0.0
            if room < avail:
                avail = room
            if i + 1 < len(ln._t) and ln._t[i + 1] < t1:
                t1 = ln._t[i + 1]
        if avail > 0:
            if start is None:  # (set before the loop can end: it ends only here)
                start = t0
            last = avail * (t1 - t0) >= remaining  # ``fill``'s test
            if last:
                end = t0 + remaining / avail
                if end <= t0:  # less than one ulp of t0 left
                    end = t0
                    break
                t1 = end
            for ln in lines:  # [t0, t1) is inside one interval of each: book it there
                j = ln._split(t0)
                if t1 < math.inf:
                    ln._split(t1)
                ln._u[j] += avail
            if last:
                break
            remaining -= avail * (t1 - t0)
        elif t1 == math.inf:
            raise RuntimeError("reserve_together: the ports are never free")
        t0 = t1
    for ln in lines:
        ln.busy_bytes += nbytes
    return start, end


class SerialResource:
    """A resource that serves one operation at a time (CUs of one kernel, a DMA engine)."""

    def __init__(self, name: str):
        self.name = name
        self.free_at = 0.0
        self.issued_at = 0.0  # a DMA engine: when it issued its last command's reads
        self.fetched_at = 0.0  # a DMA engine: when its front end set up its last command

    def setup(self, queued: float, setup_s: float) -> float:
        """A DMA engine's command queue: a command queued at ``queued`` is set up (fetched,
        decoded, scheduled: ``setup_s``) by the engine's front end in queue order while
        earlier commands' transfers run, and its transfer starts when both its set-up and
        the engine's data path (``free_at``) are done. Returns when its transfer may start."""
        self.fetched_at = max(queued, self.fetched_at) + setup_s
        return max(self.fetched_at, self.free_at)

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
        self._wanted: dict[int, int] = {}  # index -> threads waiting for its turn

    def enter(self, index: int, what: str) -> None:
        """Wait for operation ``index``'s turn (the operations before it have reserved);
        ``leave(index)`` ends it."""
        with self._cv:
            if self._next == index:
                return
            deadline = time.monotonic() + self.watchdog_s
            self._wanted[index] = self._wanted.get(index, 0) + 1
            try:
                while self._next != index:
                    if self._next > index:
                        raise RuntimeError(f"{self.name}: operation {index} ({what}) "
                                           f"reserved twice")
                    left = deadline - time.monotonic()
                    if left <= 0:  # past it: only a stall if no rank made progress
                        from devices.mpiutil import still_progressing  # (in a rank: loaded)

                        if (more := still_progressing(self.watchdog_s)) > 0:
                            deadline, left = time.monotonic() + more, more
                    if left <= 0:
                        raise ProgramOrderTimeout(
                            f"{self.name}: {what} (program-order op {index}) waited "
                            f"{self.watchdog_s:g} s (without progress on any rank) for op "
                            f"{self._next} to reserve its resources")
                    self._cv.wait(min(left, 0.5))
            finally:
                self._wanted[index] -= 1
                if not self._wanted[index]:
                    del self._wanted[index]

    def leave(self, index: int) -> None:
        """Operation ``index`` has reserved: the next one's turn."""
        with self._cv:
            self._next = index + 1
            if self._next in self._wanted:  # wake only the thread whose turn it is
                self._cv.notify_all()

    def ready(self, index: int) -> bool:
        """Whether it is operation ``index``'s turn now (no wait)."""
        return self._next == index

    def turn(self, index: int, what: str) -> _Turn:
        """``with order.turn(index, what):`` the block reserves in operation ``index``'s turn."""
        return _Turn(self, index, what)


class _Turn:
    """``ProgramOrder.turn``'s context (a class: no generator per operation)."""

    __slots__ = ("order", "index", "what")

    def __init__(self, order: ProgramOrder, index: int, what: str):
        self.order, self.index, self.what = order, index, what

    def __enter__(self) -> None:
        self.order.enter(self.index, self.what)

    def __exit__(self, *exc) -> None:
        self.order.leave(self.index)


@dataclass
class Event:
    """One modelled interval, for traces and timeline tests."""

    track: str
    name: str
    start: float
    end: float
    args: dict = field(default_factory=dict)


class RankClock:
    """One rank's modelled resources and its log of modelled events.

    Transfers follow the topology's routes (``emulator/model/topology.py``): the
    ports a route crosses on the sender's side are this rank's timelines, one per
    port direction, at the rate this GPU gets of the port (a ring or full-mesh link
    towards one peer; behind a switch the up port every outgoing transfer shares;
    an inter-socket link or a NIC share). Behind a switch (or PCIe) the rank's
    down port (``ingress``) is shared by everything it receives; across a fabric its
    NIC's receive side by everything it receives from other nodes (``receive``).
    """

    def __init__(self, rank: int, hbm_bw: float, topology: Topology, dma_engines: int,
                 watchdog_s: float, record: bool = True, nics: int = 0,
                 dram=None, log_dram: bool = False):
        from devices.spec import DramSpec
        from emulator.model.dram import Dram

        self.rank = rank
        self.record = record  # keep the log of modelled events (traces, tests)
        self.topology = topology
        # the DRAM's log by stream: traces, and the stage profile (``log_dram``)
        self.hbm = Dram(f"hbm[{rank}]", hbm_bw, dram or DramSpec(), record or log_dram)
        self.link_bw = topology.ic.link_bw  # the intra-node link (or port) rate
        self.ports: dict[str, BandwidthTimeline] = {}
        self.ingress = (BandwidthTimeline(f"port-down[{rank}]", self.link_bw)
                        if topology.switched and topology.ic.ingress_queue else None)
        self.cu = SerialResource(f"cu[{rank}]")
        self.dma = [SerialResource(f"dma{e}[{rank}]") for e in range(dma_engines)]
        self.nics = nics  # the device's NICs (a put books its route's ports, ``send``)
        self.links_in: dict[int, BandwidthTimeline] = {}  # peer -> me, driven by my pulls
        self.cu_side: dict[tuple, SerialResource] = {}  # concurrent CU kernels' thread-block
        # groups, by (index, CU share): each serial, the groups run side by side
        self.order = ProgramOrder(f"rank {rank} program order", watchdog_s)
        self.watchdog_s = watchdog_s
        self.events: list[Event] = []
        self._lock = threading.Lock()

    def new_program(self) -> None:
        """Start a new program order (one per fused kernel)."""
        self.order = ProgramOrder(f"rank {self.rank} program order", self.watchdog_s)

    def route(self, dst: int) -> Route:
        return self.topology.route(self.rank, dst)

    def latency(self, dst: int) -> float:
        """Time from a byte leaving this rank towards ``dst`` to its arrival."""
        return self.route(dst).latency

    def send(self, dst: int, ready: float, nbytes: float, fraction: float = 1.0,
             channels: bool = False) -> float:
        """Reserve every port of the route to ``dst`` for ``nbytes`` from ``ready``, at most at
        the route's rate (its slowest port), all of them in the same intervals
        (``reserve_together``); return when the last byte has left (latency not
        included). ``fraction`` < 1: a sender that achieves only that share of the ports'
        peak (a library collective) holds them for ``nbytes / fraction`` bytes' time, so
        its transfers together never exceed ``fraction`` of the peak. ``channels``: a library
        collective's send (``Topology.route``)."""
        route = self.topology.route(self.rank, dst, channels)
        cap = route.rate
        if fraction != 1.0:
            nbytes = nbytes / fraction
        lines = [self._port(hop) for hop in route.hops]
        if len(lines) == 1:
            return max(ready, lines[0].reserve(ready, nbytes, cap)[1])
        return max(ready, reserve_together(lines, ready, nbytes, cap)[1])

    def link_in(self, src: int) -> BandwidthTimeline:
        """The route ``src`` -> this rank, as this rank's pulls use it (a pull's data crosses
        the peer's outgoing direction, driven by the reader; ASSUMPTION: a configuration
        does not also push over that direction at the same time)."""
        if src not in self.links_in:
            route = self.topology.route(src, self.rank)
            self.links_in[src] = BandwidthTimeline(f"route[{src}->{self.rank}]", route.rate)
        return self.links_in[src]

    def executor(self, kind: str, index: int, share: float = 0.0):
        """The resource an executor occupies: DMA engine ``index`` (serial), none for NIC
        ``index`` (checked to exist: its puts book the route's ports, ``transfers.nic_put``),
        or group ``index`` of the CU kernel's thread blocks, holding ``share`` of the CUs
        (serial)."""
        if kind == "dma":
            if not 0 <= index < len(self.dma):
                raise ValueError(f"rank {self.rank}: DMA engine {index} does not exist "
                                 f"(the device has {len(self.dma)})")
            return self.dma[index]
        if kind == "nic":
            if not 0 <= index < self.nics:
                raise ValueError(f"rank {self.rank}: NIC {index} does not exist "
                                 f"(the device has {self.nics})")
            return None
        key = (index, share)
        if key not in self.cu_side:
            self.cu_side[key] = SerialResource(f"cu-kernel[{self.rank}]" +
                                               (f".{index}" if index else ""))
        return self.cu_side[key]

    def receive(self, t_arrival: float, nbytes: float, since: float | None = None,
                network: float = 0.0, channels: bool = False) -> float:
        """When ``nbytes`` whose last byte left the sender's port at ``t_arrival`` (less
        latency) have passed this rank's receiving ports: the ``network`` bytes of them that
        came from other nodes first pass its NIC's receive side (across a fabric,
        ``Topology.receive_hop``; ``channels``: a library collective's, over all the
        node's NICs), then all pass its down port (behind a switch or PCIe); incoming
        transfers share each, in modelled time. The bytes pass a port from
        ``t_arrival - B / rate`` on (a burst at the end), or from ``since`` if earlier:
        the first arrival of the region they complete (its writers' stores or transfers
        came in from then on, and take the port's free time in that span). Writers that
        all send one region at once (an unswizzled reduce-scatter: every rank's stage
        writes the same owner) arrive together, so their bytes queue at the port one after
        another; a region written over a whole kernel (swizzled: one writer per owner at a
        time) trickles in."""
        if network > 0 and self.topology.ic.ingress_queue:
            hop = self.topology.receive_hop(self.rank, channels)
            if hop is not None:
                t_arrival = self._pass(self._port(hop), t_arrival, network, since)
        if self.ingress is None or nbytes <= 0:
            return t_arrival
        return self._pass(self.ingress, t_arrival, nbytes, since)

    @staticmethod
    def _pass(port: BandwidthTimeline, t_arrival: float, nbytes: float,
              since: float | None) -> float:
        start = t_arrival - nbytes / port.rate
        if since is not None and since < start:
            start = since
        return max(t_arrival, port.reserve(max(0.0, start), nbytes)[1])

    def _port(self, hop) -> BandwidthTimeline:
        """This rank's timeline of a port (one direction), at the rate it gets of it."""
        port = self.ports.get(hop.port)
        if port is None:
            port = self.ports[hop.port] = BandwidthTimeline(hop.port, hop.rate)
        return port

    def streamed_from(self, t_arrival: float, nbytes: float, writers: int = 1) -> float:
        """When data whose last byte arrived at ``t_arrival`` began to arrive: it streams in
        at the rate of the links it came over (``writers`` peers sending at once: one link
        each on a full mesh or a ring, at most the links a GPU has; behind a switch or
        PCIe the one down port), and lands in the HBM as it comes."""
        ic = self.topology.ic
        links = 1
        if ic.topology == "full-mesh":
            links = max(1, min(writers, self.topology.per_node - 1))
        elif ic.topology == "ring":
            links = max(1, min(writers, 2))
        return max(0.0, t_arrival - nbytes / (links * self.link_bw))

    def dma_engine(self) -> SerialResource:
        """The engine that frees first (lowest index on ties): deterministic."""
        return min(self.dma, key=lambda e: e.free_at)

    def log(self, track: str, name: str, start: float, end: float, **args) -> None:
        if self.record:
            with self._lock:
                self.events.append(Event(track, name, start, end, args))
