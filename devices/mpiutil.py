"""Two helpers every MPI-facing part shares: is the job on one node, and bounded waits
with back-off."""

from __future__ import annotations

import time
from collections.abc import Callable

from mpi4py import MPI


def one_node(comm: MPI.Intracomm) -> bool:
    """True when every rank of ``comm`` shares this node's memory (collective call)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.size == comm.size
    finally:
        node.Free()


JOB_IDLE_S: Callable[[], float] | None = None  # the runtime's watchdog.idle_s, when a job runs


def still_progressing(limit_s: float) -> float:
    """For a wait bounded by ``limit_s`` that reached its deadline: the seconds it may
    wait more, because some rank of the job made progress less than ``limit_s`` ago
    (0.0: none did, the wait is a stall)."""
    if JOB_IDLE_S is None:
        return 0.0
    return max(limit_s - JOB_IDLE_S(), 0.0)


class Backoff:
    """Sleep between polls, starting at ``first`` seconds and growing by ``factor`` up to
    ``longest``; ``expired`` once ``limit_s`` (None: never) has passed since creation.
    ``nap`` sleeps the current delay through ``sleeper`` (default ``time.sleep``; a
    doorbell's wait wakes sooner when rung)."""

    def __init__(self, first: float, longest: float, factor: float = 1.5,
                 limit_s: float | None = None, watchdog: bool = False):
        if not 0 < first <= longest or factor < 1:
            raise ValueError(f"back-off needs 0 < first <= longest and factor >= 1, got "
                             f"{first}, {longest}, {factor}")
        self.delay, self.longest, self.factor = first, longest, factor
        self.limit_s = limit_s
        self.deadline = None if limit_s is None else time.monotonic() + limit_s
        self.watchdog = watchdog

    @property
    def expired(self) -> bool:
        """Past the deadline; a ``watchdog`` wait is past it only once ``limit_s`` has
        passed without progress anywhere in the job (``JOB_IDLE_S``)."""
        if self.deadline is None or time.monotonic() <= self.deadline:
            return False
        extra = still_progressing(self.limit_s) if self.watchdog else 0.0
        if extra > 0:
            self.deadline = time.monotonic() + extra
            return False
        return True

    def nap(self, sleeper: Callable[[float], None] = time.sleep) -> None:
        sleeper(self.delay)
        self.delay = min(self.delay * self.factor, self.longest)


def progress(comm: MPI.Comm) -> None:
    """Let MPI make progress on this rank: passive-target operations that peers on other
    nodes direct at this rank's windows go through the network module, which (in MPICH's
    ch4, as in most implementations) completes them only while this rank is inside an MPI
    call. A wait that only reads its own memory and sleeps would hold those peers' flushes,
    and them, forever; every such wait calls this between polls. ``Iprobe`` enters the
    progress engine and takes no message."""
    comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
