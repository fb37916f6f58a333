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
import time

import numpy as np
from mpi4py import MPI

from devices.mpiutil import Backoff, one_node
from devices.tracker import WatchdogTimeout
from emulator.runtime.rank import RANK

THREADS = ("compute", "dma")
_LABEL = 112  # bytes of text per thread
_SLOT = 16 + _LABEL  # per thread: (since, waiting) float64, label
_SIZE = _SLOT * len(THREADS)
_PACK = struct.Struct(f"dd{_LABEL}s")  # since, waiting, label (zero padded)
_OFFSET = {t: _SLOT * i for i, t in enumerate(THREADS)}

__all__ = ["StatusBoard", "WatchdogTimeout", "close_board", "describe", "open_board", "post", "wait_all"]


class StatusBoard:
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
        comm.Barrier()
        self.win.Lock_all()

    def post(self, thread: str, label: str, waiting: bool = False) -> None:
        """Record what ``thread`` of this rank does from now on (a local store)."""
        _PACK.pack_into(self._raw, _OFFSET[thread], time.time(), float(waiting),
                        label.encode()[:_LABEL])

    def _read(self, rank: int, deadline_s: float = 2.0) -> np.ndarray | None:
        if self._peers is not None:
            return self._peers[rank].copy()
        buf = np.empty(_SIZE, np.uint8)
        req = self.win.Rget(buf, rank)
        backoff = Backoff(1e-3, 1e-3, limit_s=deadline_s)
        while not req.Test():
            if backoff.expired:
                return None
            backoff.nap()
        return buf

    def describe(self) -> str:
        """Every rank's last post, and the ranks that are busy while others wait."""
        now = time.time()
        lines = ["status of every rank (what it was last doing, for how long):"]
        busy, silent = [], []
        for r in range(self.comm.size):
            raw = self._read(r)
            if raw is None:
                silent.append(r)
                lines.append(f"  rank {r}: no answer (its MPI makes no progress)")
                continue
            parts = []
            waits = True
            for i, thread in enumerate(THREADS):
                slot = raw[_SLOT * i : _SLOT * (i + 1)]
                since, waiting = slot[:16].view(np.float64)
                label = bytes(slot[16:]).rstrip(b"\0").decode(errors="replace")
                if not label:
                    continue
                parts.append(f"{thread}: {label} ({'waiting, ' if waiting else ''}"
                             f"{max(now - since, 0.0):.1f} s)")
                waits = waits and bool(waiting)
            if parts and not waits:
                busy.append(r)
            lines.append(f"  rank {r}: " + ("; ".join(parts) or "not started"))
        if busy or silent:
            who = ", ".join(str(r) for r in busy + silent)
            lines.insert(0, f"ranks not waiting on a peer (the likely stalled ones): {who}")
        return "\n".join(lines)

    def free(self) -> None:
        if self.win != MPI.WIN_NULL:
            self.win.Unlock_all()
            self.win.Free()
            self.win = MPI.WIN_NULL


def open_board(comm: MPI.Intracomm) -> StatusBoard:
    RANK.board = StatusBoard(comm)
    return RANK.board


def close_board() -> None:
    if RANK.board is not None:
        board, RANK.board = RANK.board, None
        board.free()


def post(thread: str, label: str, waiting: bool = False) -> None:
    if RANK.board is not None:
        RANK.board.post(thread, label, waiting)


def describe() -> str:
    return RANK.board.describe() if RANK.board is not None else ""


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
    backoff = Backoff(2e-5, _longest_nap(comm.size), limit_s=limit_s)
    while not req.Test():
        if backoff.expired:
            raise WatchdogTimeout(f"rank {comm.rank}: watchdog: waited {limit_s:g} s at {what} "
                                  f"for ranks that never arrived")
        backoff.nap()
    post(thread, f"past {what}")
