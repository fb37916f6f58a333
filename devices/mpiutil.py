"""Helpers every MPI-facing part shares: is the job on one node, bounded waits with
back-off, and collectives that sleep while they wait."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable

import numpy as np

from mpi4py import MPI


def one_node(comm: MPI.Intracomm) -> bool:
    """True when every rank of ``comm`` shares this node's memory (collective call)."""
    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        return node.size == comm.size
    finally:
        node.Free()


class Backoff:
    """Sleep between polls, starting at ``first`` seconds and growing by ``factor`` up to
    ``longest``; ``expired`` once ``limit_s`` (None: never) has passed since creation.
    ``nap`` sleeps the current delay through ``sleeper`` (default ``time.sleep``; a
    doorbell's wait wakes sooner when rung)."""

    def __init__(self, first: float, longest: float, factor: float = 1.5,
                 limit_s: float | None = None):
        if not 0 < first <= longest or factor < 1:
            raise ValueError(f"back-off needs 0 < first <= longest and factor >= 1, got "
                             f"{first}, {longest}, {factor}")
        self.delay, self.longest, self.factor = first, longest, factor
        self.deadline = None if limit_s is None else time.monotonic() + limit_s

    @property
    def expired(self) -> bool:
        return self.deadline is not None and time.monotonic() > self.deadline

    def nap(self, sleeper: Callable[[float], None] = time.sleep) -> None:
        sleeper(self.delay)
        self.delay = min(self.delay * self.factor, self.longest)


@functools.lru_cache(maxsize=None)
def longest_nap(ranks: int) -> float:
    """The longest sleep between a napping wait's tests: 1 ms for up to two ranks per
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


def napping(comm: MPI.Comm, req: MPI.Request) -> None:
    """Wait for ``req`` (a non-blocking collective of ``comm``), sleeping between tests
    (20 us growing to ``longest_nap``). MPICH's blocking collectives poll with
    ``sched_yield``: with several ranks per core each waiting rank keeps taking turns on
    the cores the ranks it waits for need."""
    backoff = Backoff(2e-5, longest_nap(comm.size))
    while not req.Test():
        backoff.nap()


def barrier(comm: MPI.Intracomm) -> None:
    """``MPI_Barrier`` by ``napping``."""
    napping(comm, comm.Ibarrier())


def allreduce(comm: MPI.Intracomm, value, op: MPI.Op = MPI.SUM):
    """``comm.allreduce`` of one number or bool by ``napping``: a float (in float64), an
    int or a bool back (``MPI.LAND`` and ``MPI.LOR`` on bools)."""
    kind = np.asarray(value).dtype.kind
    send = np.array([value], np.float64 if kind == "f" else np.int64)
    recv = np.empty_like(send)
    napping(comm, comm.Iallreduce(send, recv, op=op))
    return float(recv[0]) if kind == "f" else bool(recv[0]) if kind == "b" else int(recv[0])


def Allreduce(comm: MPI.Intracomm, send: np.ndarray, recv: np.ndarray,
              op: MPI.Op = MPI.SUM) -> None:
    """``comm.Allreduce`` of arrays by ``napping``."""
    napping(comm, comm.Iallreduce(send, recv, op=op))


def progress(comm: MPI.Comm) -> None:
    """Let MPI make progress on this rank: passive-target operations that peers on other
    nodes direct at this rank's windows go through the network module, which (in MPICH's
    ch4, as in most implementations) completes them only while this rank is inside an MPI
    call. A wait that only reads its own memory and sleeps would hold those peers' flushes,
    and them, forever; every such wait calls this between polls. ``Iprobe`` enters the
    progress engine and takes no message."""
    comm.Iprobe(MPI.ANY_SOURCE, MPI.ANY_TAG)
