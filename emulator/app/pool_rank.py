"""The MPI program of a pooled job (``emulator.app.pool``): every rank runs one ``t3emu run``
after another, as the controller sends them, without starting again.

Rank 0 reads one task per line on its stdin (JSON: the arguments of ``t3emu run`` and the
files its stdout and stderr go to; an empty line or end of file ends the job) and
broadcasts it; the others wait for it sleeping between tests (an idle pool takes no CPU
from a busy one). Each rank points its stdout and stderr (the file descriptors: C
libraries' output too) at the task's files, runs the task through the command line's own
``run`` (the same parsing, checks and ``worker.main`` as a job of its own), then points
them back. Once every rank is back, rank 0 writes one line, ``DONE SEQ EXIT-CODE``, on
its own stdout: the files then hold the run's whole output (no other rank writes
between runs, so the line is never cut by another rank's output).

A failure that ``worker.main`` turns into ``MPI_Abort`` (an exception, a watchdog) ends
the pooled job as it ends a job of its own; the controller reports the task and starts a
new job for the next one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys

from emulator.app.pool import DONE
from emulator.runtime.process import pin_threads

pin_threads()


def _receive(comm) -> dict | None:
    """The next task (None: no more), rank 0 reading stdin."""
    import numpy as np

    from devices.mpiutil import Backoff

    if comm.rank == 0:
        line = sys.stdin.readline()
        payload = line.strip().encode() if line else b""
    else:
        payload = b""
    size = np.array([len(payload)], np.int64)
    req = comm.Ibcast(size, root=0)
    backoff = Backoff(1e-4, 5e-3)  # between points: sleep, never spin (a point starts
    # on every rank within a nap of its arrival: 5 ms at most)
    while not req.Test():
        backoff.nap()
    if size[0] == 0:
        return None
    buf = np.frombuffer(bytearray(payload), np.uint8) if comm.rank == 0 \
        else np.empty(int(size[0]), np.uint8)
    comm.Bcast(buf, root=0)
    return json.loads(bytes(buf).decode())


@contextlib.contextmanager
def _output_to(out: str, err: str):
    """This process's stdout and stderr (descriptors 1 and 2) appended to ``out`` and
    ``err`` (one file when they are the same) for the block."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    fds = [os.open(out, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)]
    fds.append(fds[0] if err == out else
               os.open(err, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644))
    try:
        os.dup2(fds[0], 1)
        os.dup2(fds[1], 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in {*fds, *saved}:
            os.close(fd)


def _run(args: list[str]) -> int:
    """One ``t3emu run`` on this rank; its exit code."""
    from emulator.app.catalog import plugins_forgotten
    from emulator.app.cli import main
    from emulator.runtime.rank import RANK

    RANK.faults_fired.clear()  # per run: the "fault never fired" warning is per run
    RANK.first_stage_unix = None
    with plugins_forgotten():  # a run's --configs files are not the next run's
        try:
            main.main(args=["run", *args], prog_name="t3emu")
        except SystemExit as exc:
            code = exc.code
            return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def serve() -> int:
    from mpi4py import MPI

    from emulator.runtime.process import abort, install_abort_handlers, mark_rank
    from emulator.runtime.rank import RANK

    comm = MPI.COMM_WORLD
    RANK.pooled = True  # "end" markers: only when the pooled job itself ends
    install_abort_handlers()
    mark_rank("pid")
    seq = 0
    try:
        while True:
            task = _receive(comm)
            if task is None:
                break
            seq += 1
            with _output_to(task["out"], task["err"]):
                rc = _run(task["args"])
            codes = comm.gather(rc, root=0)
            if comm.rank == 0:
                sys.stdout.write(f"{DONE} {seq} {max(codes)}\n")
                sys.stdout.flush()
    except BaseException as exc:  # noqa: BLE001 - any failure ends the whole job
        abort(exc)
    RANK.pooled = False
    mark_rank("end", "0")
    return 0


if __name__ == "__main__":
    sys.exit(serve())
