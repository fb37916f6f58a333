"""Liveness: every rank posts what it is doing; every wait on a peer is bounded.

A hang in a distributed emulator is a wait on a peer that never comes: a
tracker region that never completes, a program-order turn, a barrier. Each is
bounded by ``--watchdog-s``; when one expires the rank raises ``WatchdogTimeout``
and ``runtime.abort`` ends the whole job, printing:

- the waiting rank's own view (the tracker's missing updates, region by region);
- the **status board**: for every rank, what its compute thread and its DMA
  engine were last doing, whether that is a wait on a peer, and for how long.
  A rank that is busy (not waiting) while everyone else waits is the one that
  stopped making progress; a rank whose slot cannot be read is named too.

The board is one small slot per rank in an MPI window. Posting is a local store
(no communication); reading is a load from the shared segment when the job fits
one node, else an ``MPI_Rget`` bounded by a short deadline (a peer that makes no
MPI progress then shows as "no answer" instead of hanging the reporter).
"""

from __future__ import annotations

import functools
import os
import struct
import threading
import time

import numpy as np
from mpi4py import MPI

from devices import mpiutil
from devices.mpiutil import Backoff, one_node
from devices.tracker import WatchdogTimeout
from emulator.runtime.rank import RANK

THREADS = ("compute", "dma")
_LABEL = 112  # bytes of text per thread
_THREAD = struct.Struct(f"dd{_LABEL}s")  # per thread: since, waiting, label (zero padded)
_HEAD = struct.Struct("dd")  # per rank: its heartbeat's last beat, its last progress
_OFFSET = {t: _HEAD.size + _THREAD.size * i for i, t in enumerate(THREADS)}
_SIZE = _HEAD.size + _THREAD.size * len(THREADS)
BEAT_S = 0.5  # the heartbeat's period
FROZEN_S = 2.0  # a rank whose heartbeat (every BEAT_S) is older is frozen (SIGSTOP, no CPU)
_TICK_S = 1.0 / (os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100)

__all__ = ["StatusBoard", "WatchdogTimeout", "close_board", "describe", "idle_s", "open_board",
           "post", "wait_all"]


def _thread_cpu_s(tid: int) -> float | None:
    """CPU seconds a thread of this process has used (Linux: /proc), or None."""
    try:
        with open(f"/proc/self/task/{tid}/stat", "rb") as fh:
            fields = fh.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) * _TICK_S  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


class StatusBoard:
    """One slot per rank: what its threads last posted (and whether it is a wait on a
    peer), and a heartbeat. The heartbeat thread beats every ``BEAT_S`` and records the
    rank's last *progress*: a post, or CPU time used by a thread that is not waiting (a
    GEMM stage, making inputs, a numba compile). A wait on a peer gives up only after
    ``--watchdog-s`` without progress on any rank (``idle_s``): start-up and long stages
    on a loaded host are not stalls; a rank that sleeps or is stopped makes none."""

    def __init__(self, comm: MPI.Intracomm):
        self.comm = comm
        self.shared = one_node(comm)
        if self.shared:
            self.win = MPI.Win.Allocate_shared(_SIZE, 1, comm=comm)
            self._peers = [np.frombuffer(self.win.Shared_query(r)[0], np.uint8, _SIZE)
                           for r in range(comm.size)]
            self._mine = self._peers[comm.rank]
        else:
            self.win = MPI.Win.Allocate(_SIZE, 1, comm=comm)
            self._peers = None
            self._mine = np.frombuffer(self.win.tomemory(), np.uint8, _SIZE)
        self._mine[:] = 0
        self._raw = memoryview(self._mine)
        self._tids: dict[str, tuple[int, bool]] = {}  # thread -> (native id, waiting)
        self._cpu: dict[int, float] = {}  # native id -> CPU seconds at the last beat
        self._progress = time.time()
        self._stop = threading.Event()
        self._beat()
        comm.Barrier()
        self.win.Lock_all()
        self._heart = threading.Thread(target=self._beating, name="t3emu heartbeat",
                                       daemon=True)
        self._heart.start()

    def post(self, thread: str, label: str, waiting: bool = False) -> None:
        """Record what ``thread`` of this rank does from now on (a local store)."""
        now = time.time()
        self._tids[thread] = (threading.get_native_id(), waiting)
        self._progress = now
        _THREAD.pack_into(self._raw, _OFFSET[thread], now, float(waiting),
                          label.encode()[:_LABEL])
        _HEAD.pack_into(self._raw, 0, now, now)

    def _beat(self) -> None:
        now = time.time()
        for tid, waiting in list(self._tids.values()):
            cpu = _thread_cpu_s(tid)
            if cpu is None:
                continue
            if not waiting and cpu > self._cpu.get(tid, cpu):
                self._progress = now  # a busy thread used CPU since the last beat
            self._cpu[tid] = cpu
        _HEAD.pack_into(self._raw, 0, now, self._progress)

    def _beating(self) -> None:
        while not self._stop.wait(BEAT_S):
            self._beat()

    def _read_all(self, deadline_s: float = 2.0) -> list[np.ndarray | None]:
        """Every rank's slot (None: a rank whose MPI gave no answer by the deadline)."""
        if self._peers is not None:
            return [p.copy() for p in self._peers]
        bufs = [np.empty(_SIZE, np.uint8) for _ in range(self.comm.size)]
        reqs = [self.win.Rget(b, r) for r, b in enumerate(bufs)]
        backoff = Backoff(1e-3, 1e-3, limit_s=deadline_s)
        while not all([r.Test() for r in reqs]):  # a completed request is null: True
            if backoff.expired:
                break
            backoff.nap()
        return [b if r.Test() else None for b, r in zip(bufs, reqs)]

    def idle_s(self) -> float:
        """Seconds since the last progress of any rank (a rank that gave no answer made
        none)."""
        now = time.time()
        last = max((_HEAD.unpack_from(raw, 0)[1] for raw in self._read_all() if raw is not None),
                   default=0.0)
        return max(now - last, 0.0)

    def describe(self) -> str:
        """Every rank's last post, and the ranks that are busy while others wait."""
        now = time.time()
        lines = ["status of every rank (what it was last doing, for how long):"]
        named = []
        for r, raw in enumerate(self._read_all()):
            if raw is None:
                named.append(r)
                lines.append(f"  rank {r}: no answer (its MPI makes no progress)")
                continue
            beat, progress = _HEAD.unpack_from(raw, 0)
            parts = []
            waits = True
            for thread in THREADS:
                since, waiting, label = _THREAD.unpack_from(raw, _OFFSET[thread])
                label = label.rstrip(b"\0").decode(errors="replace")
                if not label:
                    continue
                parts.append(f"{thread}: {label} ({'waiting, ' if waiting else ''}"
                             f"{max(now - since, 0.0):.1f} s)")
                waits = waits and bool(waiting)
            state = ""
            if beat and now - beat > FROZEN_S:
                state = (f"; FROZEN: no heartbeat for {now - beat:.1f} s (stopped, e.g. by "
                         f"SIGSTOP, or given no CPU)")
            elif parts and not waits:
                state = f"; busy, last progress (a post or CPU time) {now - progress:.1f} s ago"
            if state and (parts or beat):
                named.append(r)
            lines.append(f"  rank {r}: " + ("; ".join(parts) or "not started") + state)
        if named:
            who = ", ".join(str(r) for r in named)
            lines.insert(0, f"ranks not waiting on a peer or frozen (the likely stalled "
                            f"ones): {who}")
        lines.append("a run that is only slow (many ranks per core, large sizes) needs a larger "
                     "--watchdog-s")
        return "\n".join(lines)

    def free(self) -> None:
        self._stop.set()
        self._heart.join()
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
            self.win = MPI.WIN_NULL


def open_board(comm: MPI.Intracomm) -> StatusBoard:
    RANK.board = StatusBoard(comm)
    mpiutil.JOB_IDLE_S = idle_s  # the bounded waits ask it before they give up
    return RANK.board


def close_board() -> None:
    if RANK.board is not None:
        board, RANK.board = RANK.board, None
        mpiutil.JOB_IDLE_S = None
        board.free()


def post(thread: str, label: str, waiting: bool = False) -> None:
    if RANK.board is not None:
        RANK.board.post(thread, label, waiting)


def describe() -> str:
    return RANK.board.describe() if RANK.board is not None else ""


def idle_s() -> float:
    """Seconds since any rank of the job last made progress (0 without a board)."""
    return RANK.board.idle_s() if RANK.board is not None else 0.0


@functools.lru_cache(maxsize=None)
def _longest_nap(ranks: int) -> float:
    """The longest sleep between a bounded barrier's tests: 1 ms for up to two ranks per
    core, growing with the ranks per core to 5 ms. A barrier completes only as its ranks
    test it (each round of the barrier waits for the next test of a sleeping rank), so
    a kernel's or phase's barrier costs about its ranks' nap (an isolated run of 257
    embedding kernels on 4 ranks spent 4.4 s in 5 ms naps); each test costs its rank a
    wake-up, so with many ranks per core the naps grow and waiting ranks leave the
    cores to the working ones."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return min(5e-3, max(1e-3, 0.5e-3 * ranks / cores))


def wait_all(comm: MPI.Intracomm, what: str, limit_s: float, thread: str = "compute") -> None:
    """A barrier bounded by ``limit_s``: ``MPI_Ibarrier`` tested with back-off (from 20 us
    to ``_longest_nap``)."""
    post(thread, f"waiting at {what}", waiting=True)
    req = comm.Ibarrier()
    backoff = Backoff(2e-5, _longest_nap(comm.size), limit_s=limit_s, watchdog=True)
    while not req.Test():
        if backoff.expired:
            raise WatchdogTimeout(f"rank {comm.rank}: watchdog: waited at {what} for ranks "
                                  f"that never arrived, {limit_s:g} s without progress on "
                                  f"any rank")
        backoff.nap()
    post(thread, f"past {what}")
