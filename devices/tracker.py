"""The tracker at the memory controller: update counters per tracked slot.

Like T3's tracker, a counter counts element-updates (an update of a W-element
tile adds W), so a region is complete when its counter reaches
``elements x updates_expected_per_element``. Counters live in an MPI window so
a peer's put-with-signal increments them with an atomic ``MPI_Accumulate``;
next to each counter sit the modelled arrival times of the latest update and
(negated) of the earliest, merged with one ``MPI_MAX`` and written *before* the
count, so a reader that sees the count complete also sees the time it completed
at, and since when its data came in (``first_arrival``: the receiver's port and
memory take a region's incoming bytes in that window, ``RankClock.receive``).
A second counter per slot adds the updates that crossed the network (``far``: the
signaller's peers on other nodes), also before the count, so the receiver knows how
many of a region's bytes came in through its NIC (``network_updates``).
"""

from __future__ import annotations

import os
import select
import socket
import sys
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np
from mpi4py import MPI

from devices.hbm import Segment, is_shared
from devices.mpiutil import Backoff, one_node, progress
from devices.signals import TrackedRegion


class WatchdogTimeout(RuntimeError):
    """A wait saw no completion within the watchdog limit; the message lists what is missing."""


class Doorbell:
    """Wakes a rank's threads that wait on its tracker when a peer signals it, so waiters
    sleep instead of polling (with many ranks per core, polling alone would fill the
    cores). A bell is a datagram on a Linux abstract-namespace socket, one per rank and
    waiting thread kind (compute, DMA), named after a token of this tracker. A bell is
    only a hint: a waiter still checks its counters, and on its own at least every
    50 ms (a full socket buffer rings no bell, but then the waiter has bells to read).
    Jobs spread over several hosts use no bells: their waiters poll every 2 ms at most."""

    KINDS = ("c", "d")

    def __init__(self, comm: MPI.Intracomm):
        self.rank = comm.rank
        self.socks: dict[str, socket.socket] = {}
        self._out: socket.socket | None = None
        token = comm.bcast(os.urandom(8).hex() if comm.rank == 0 else None, root=0)
        self._name = f"\0t3emu-{token}-{{}}-{{}}"
        if not one_node(comm) or sys.platform != "linux":
            return  # abstract sockets reach this host only (and are Linux's): waiters poll
        try:
            for kind in self.KINDS:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self.socks[kind] = sock
                sock.setblocking(False)
                sock.bind(self._name.format(self.rank, kind))
            self._out = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._out.setblocking(False)
        except OSError:  # no sockets here (a sandbox)
            self.close()
        if not comm.allreduce(bool(self.socks), op=MPI.LAND):
            self.close()  # bells on every rank or on none: else some waiters wait for none

    @property
    def works(self) -> bool:
        return bool(self.socks)

    def ring(self, target: int) -> None:
        if not self.socks:
            return
        for kind in self.KINDS:
            try:
                self._out.sendto(b"!", self._name.format(target, kind))
            except OSError:  # no such bell (another host), or its buffer is full
                pass

    def wait(self, timeout: float) -> None:
        """Sleep until this thread's bell rings or ``timeout`` passes; clear the bell."""
        kind = "d" if threading.current_thread().name.startswith("dma") else "c"
        sock = self.socks.get(kind)
        if sock is None:
            time.sleep(timeout)
            return
        if select.select([sock], [], [], timeout)[0]:
            try:
                while sock.recv(64):
                    pass
            except OSError:
                pass

    def close(self) -> None:
        for sock in self.socks.values():
            sock.close()
        if self._out is not None:
            self._out.close()
            self._out = None
        self.socks.clear()


# The arrival times as the tracker keeps them, two 64-bit words per slot that one integer
# MAX merges (``MPI_Accumulate``) and that all read zero before any arrival, so a tracker
# bound on new or reused memory writes nothing to start: the latest arrival as its own bits
# (a non-negative double's bits order as the double does, and 0 is 0.0), the earliest one
# e as INF_BITS - bits(e) (the larger, the earlier; 0: none, e = inf). Exact: a time read
# back is the time signalled, bit for bit.
INF_BITS = int(np.array(np.inf).view(np.int64))  # not a parameter: inf's bit pattern


def _arrivals(n: int, t_arrival) -> np.ndarray:
    """The (latest, earliest) words of ``n`` slots signalled at ``t_arrival`` (one time or
    one per slot; a time <= 0, a local write's, counts as no earliest arrival)."""
    t = np.empty(n, np.float64)
    t[:] = t_arrival
    out = np.empty((n, 2), np.int64)
    out[:, 0] = t.view(np.int64)
    out[:, 1] = np.where(t > 0, INF_BITS - t.view(np.int64), 0)
    return out


def _earliest(word) -> np.ndarray:
    """The earliest arrival an earliest word (or words) stands for (inf: none yet)."""
    return (INF_BITS - np.asarray(word, np.int64)).view(np.float64)


def _times_of(words: np.ndarray) -> np.ndarray:
    """Per slot (latest, earliest) as doubles, from the words ``_arrivals`` writes."""
    out = words.view(np.float64).copy()
    out[1::2] = _earliest(words[1::2])
    return out


class Tracker:
    """A rank's tracker: per-slot counts of element-updates (all, and those that crossed
    the network) and the latest and earliest modelled arrival times, in a window peers
    accumulate into. ``segment`` and ``bell``: the job's memory and doorbell, reused by
    every run (without, the tracker allocates its own and frees them with itself).
    ``far``: per target rank, whether this rank's updates to it cross the network (the
    emulated topology's nodes, not the host's; None: no rank does)."""

    def __init__(self, comm: MPI.Intracomm, nslots: int, slot_names: Callable[[int], str],
                 segment: Segment | None = None, bell: Doorbell | None = None,
                 far: Sequence[bool] | None = None):
        self.comm = comm
        self.rank = comm.rank
        self.nslots = int(nslots)
        self.slot_name = slot_names
        self.far = tuple(bool(f) for f in far) if far is not None else (False,) * comm.size
        self._own_bell = bell is None
        self.bell = bell or Doorbell(comm)
        size = max(self.nslots, 1) * 32
        self._own = segment is None
        self._segment = segment or Segment(comm)
        self.win, mem = self._segment.bind(size)
        stale = self._segment.claim(size)
        self._remote = not is_shared(self.win)  # peers on other nodes need our progress
        self.win.Sync()
        raw = np.frombuffer(mem, dtype=np.uint8, count=size)
        n = max(self.nslots, 1)
        raw[:stale] = 0  # every counter and time starts at zero: what an earlier run wrote
        # (``Segment.claim``: a new window counts as written whole; a segment bound again
        # smaller than before is zeroed only as far as this tracker reaches)
        self._counts = raw[: 8 * n].view(np.int64)  # per slot: all updates
        self._network = raw[8 * n : 16 * n].view(np.int64)  # those over the network
        # per slot: the latest arrival and the earliest one, as ``_arrivals`` encodes them
        self._times = raw[16 * n :].view(np.int64)
        self.win.Sync()
        self._time_base = 16 * n
        self._network_base = 8 * n
        comm.Barrier()  # no peer signals before the counters are zeroed

    def signal(self, target: int, slots: Sequence[int], elems: Sequence[int],
               t_arrival: float | Sequence[float]) -> None:
        """The signal half of put-with-signal: merge the arrival time (MAX), then add counts.

        One ``MPI_Accumulate`` per half, whatever the number of slots: an indexed
        target datatype addresses them all (a DMA entry or a GEMM stage signals
        many slots of one destination at once). ``t_arrival`` is one time for all the
        slots or one per slot; ``slots`` must not repeat."""
        n = len(slots)
        if n == 0:
            return
        # time 0 for every slot: a local write's signal (its writer keeps its time), no
        # data coming in: MAX with (0, -inf) leaves the times as they are, so only the
        # counts are sent
        timed = not (np.isscalar(t_arrival) and t_arrival == 0)
        if timed:
            times = _arrivals(n, t_arrival)  # (latest, earliest) per slot: one MAX
        counts = np.ascontiguousarray(elems, dtype=np.int64)  # (origin buffers stay
        # referenced until the flush: RMA to another node reads them only then)
        far = self.far[target]  # the network count first, so a reader that sees the count
        disp = np.asarray(slots, np.int64)  # complete sees it too
        if n == 1 or (disp[-1] - disp[0] == n - 1 and (np.diff(disp) == 1).all()):
            s = int(disp[0])  # a run of slots (local buffers: the GEMM and DMA threads
            # both signal): plain contiguous accumulates (no indexed datatype)
            if timed:
                self.win.Accumulate([times, MPI.INT64_T], target,
                                    target=(self._time_base + 16 * s, 2 * n, MPI.INT64_T),
                                    op=MPI.MAX)
                self.win.Flush(target)
            for base in ((self._network_base, 0) if far else (0,)):
                self.win.Accumulate([counts, MPI.INT64_T], target,
                                    target=(base + 8 * s, n, MPI.INT64_T), op=MPI.SUM)
                self.win.Flush(target)
            self.bell.ring(target)
            return
        t_type = MPI.INT64_T.Create_indexed_block(
            2, (2 * disp + self._time_base // 8).tolist()).Commit() if timed else None
        c_types = [MPI.INT64_T.Create_indexed_block(1, (disp + base // 8).tolist()).Commit()
                   for base in ((self._network_base, 0) if far else (0,))]
        try:
            if timed:
                self.win.Accumulate([times, MPI.INT64_T], target, target=(0, 1, t_type),
                                    op=MPI.MAX)
                self.win.Flush(target)
            for c_type in c_types:
                self.win.Accumulate([counts, MPI.INT64_T], target, target=(0, 1, c_type),
                                    op=MPI.SUM)
                self.win.Flush(target)
        finally:
            if t_type is not None:
                t_type.Free()
            for c_type in c_types:
                c_type.Free()
        self.bell.ring(target)

    def snapshot(self) -> tuple[np.ndarray, np.ndarray]:
        """(each slot's count, each slot's latest and earliest arrival: inf before any)."""
        self.win.Sync()
        return self._counts.copy(), _times_of(self._times.copy())

    def complete(self, region: TrackedRegion) -> bool:
        self.win.Sync()
        slots = region.slots
        if len(slots) == 1:  # most regions are one tile: no fancy indexing
            return bool(self._counts[slots[0]] >= region.thresholds[0])
        return bool((self._counts[slots] >= region.thresholds).all())

    def arrival(self, region: TrackedRegion) -> float:
        """The modelled arrival of the region's latest update (0 with no slots)."""
        self.win.Sync()
        slots = region.slots
        latest = self._times.view(np.float64)  # (the latest's bits are its own: ``_arrivals``)
        if len(slots) == 1:
            return float(latest[2 * slots[0]])
        return float(latest[2 * slots].max()) if len(slots) else 0.0

    def first_arrival(self, region: TrackedRegion) -> float:
        """The modelled arrival of the region's earliest update that came in with a time
        (a peer's; inf before any: local writes signal at time 0 and do not count)."""
        self.win.Sync()
        slots = region.slots
        if not len(slots):
            return 0.0
        return float(_earliest(self._times[2 * np.asarray(slots) + 1].max()))

    def network_updates(self, region: TrackedRegion) -> tuple[int, int]:
        """(element-updates that came in over the network, all element-updates) of the
        region's slots so far."""
        self.win.Sync()
        slots = np.asarray(region.slots)
        if not len(slots):
            return 0, 0
        return int(self._network[slots].sum()), int(self._counts[slots].sum())

    def wait(self, region: TrackedRegion, watchdog_s: float,
             pending: Callable[[], Sequence[TrackedRegion]] | None = None) -> float:
        """Block until ``region`` is complete; return its modelled completion time.

        On no completion within ``watchdog_s`` without progress on any rank (``Backoff``'s
        ``watchdog``) raise ``WatchdogTimeout`` listing
        which slots miss which updates (for ``pending()`` regions if given).
        """
        backoff = Backoff(2e-5, 0.05 if self.bell.works else 2e-3,  # a bell wakes it sooner
                          limit_s=watchdog_s, watchdog=True)
        while not self.complete(region):
            if backoff.expired:
                raise WatchdogTimeout(self.describe_missing(
                    list(pending()) if pending else [region], watchdog_s, region))
            if self._remote:
                progress(self.comm)
            backoff.nap(self.bell.wait)
        return self.arrival(region)

    def describe_missing(self, regions: Sequence[TrackedRegion], watchdog_s: float,
                         waiting_on: TrackedRegion) -> str:
        counts, _ = self.snapshot()  # (times: latest and earliest per slot)
        lines = [f"rank {self.rank}: watchdog: no completion of {waiting_on.name} "
                 f"({waiting_on.label}) within {watchdog_s:g} s without progress on any rank; "
                 f"incomplete regions:"]
        shown = 0
        for reg in regions:
            missing = [(int(s), int(counts[s]), int(t)) for s, t in zip(reg.slots, reg.thresholds)
                       if counts[s] < t]
            if not missing:
                continue
            shown += 1
            if shown > 20:
                lines.append("  ...")
                break
            desc = ", ".join(f"{self.slot_name(s)} has {c}/{t} element-updates"
                             for s, c, t in missing[:4])
            lines.append(f"  {reg.name} [{reg.label}]: {desc}"
                         + (f" (+{len(missing) - 4} slots)" if len(missing) > 4 else ""))
        return "\n".join(lines)

    def free(self) -> None:
        if self._own_bell:
            self.bell.close()
        if self.win == MPI.WIN_NULL:
            return
        if self._own:
            self._segment.free()
        self.win = MPI.WIN_NULL
