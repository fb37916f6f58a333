"""Per-rank runtime services: fail-fast abort, environment pinning, numba warm-up.

Any uncaught exception on any rank, in any thread, prints that rank's message
(with traceback) to stderr and calls ``MPI_Abort`` on the world, so the job ends
at once instead of leaving peers waiting in a collective or an RMA epoch.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import traceback
from pathlib import Path

BLAS_ENV = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")


def pin_threads(env: dict | None = None) -> dict:
    """One BLAS/OpenMP thread per rank, so oversubscribed ranks do not fight for cores."""
    env = os.environ if env is None else env
    for key in BLAS_ENV:
        env.setdefault(key, "1")
    env.setdefault("NUMBA_CACHE_DIR", str(Path.home() / ".cache" / "t3emu" / "numba"))
    return env


def mark_rank(what: str, content: str | None = None) -> None:
    """For the launcher's watch of the ranks (``T3EMU_PID_DIR``): "pid" records this rank's
    PID at start-up; "end" and "abort" record that it exits through the emulator's own
    paths, so a rank that disappears without one died from outside (a signal, a crash).
    ``content``: what the marker holds (default this process's PID; "end": the rank's exit
    code; "abort": the message the rank printed). A rank of a pooled job marks its end
    only when the job ends, not at the end of each run."""
    pid_dir = os.environ.get("T3EMU_PID_DIR")
    if not pid_dir or not os.path.isdir(pid_dir):
        return
    from emulator.runtime.rank import RANK

    if what == "end" and RANK.pooled:  # a run of a pooled job ended, not the rank
        return
    from mpi4py import MPI

    rank = MPI.COMM_WORLD.rank
    if what == "pid":
        mark_rank("ppid", str(os.getppid()))  # its Hydra proxy, for the launcher's watch
    name = str(rank) if what == "pid" else f"{rank}.{what}"
    tmp = os.path.join(pid_dir, f".{name}.tmp")
    try:
        with open(tmp, "w") as fh:
            fh.write(str(os.getpid()) if content is None else content)
        os.replace(tmp, os.path.join(pid_dir, name))
    except OSError:
        pass


_SHM_NOTED: set[str] = set()  # the files of this rank's "shm" marker


def note_shm() -> None:
    """For the launcher's clean-up (``T3EMU_PID_DIR``): the shared-memory files this rank
    maps (MPI's windows and intra-node channels, ``/dev/shm/mpich_*``), added to its "shm"
    marker when there are new ones. MPI removes them when it frees a window and at
    ``MPI_Finalize``; a job that ends otherwise (``MPI_Abort``, a rank killed, the job
    stopped) leaves them, and the launcher removes the ones still there once the job is
    over (``remove_shm``)."""
    if not os.environ.get("T3EMU_PID_DIR"):
        return
    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split(None, 5)[5].strip() for line in fh if " /dev/shm/" in line}
    except (OSError, IndexError):
        return
    paths = {p for p in paths if p.startswith("/dev/shm/") and not p.endswith("(deleted)")}
    if paths <= _SHM_NOTED:
        return
    _SHM_NOTED.update(paths)
    mark_rank("shm", "\n".join(sorted(_SHM_NOTED)))


def remove_shm(pid_dir) -> int:
    """After a job: remove the shared-memory files its ranks noted (``note_shm``) that are
    still there; how many."""
    removed = 0
    for marker in Path(pid_dir).glob("*.shm"):
        try:
            names = marker.read_text().splitlines()
        except OSError:
            continue
        for name in names:
            path = Path(name)
            if path.parent != Path("/dev/shm"):
                continue
            try:
                path.unlink()
                removed += 1
            except OSError:
                pass
    return removed


def abort(exc: BaseException, where: str = "") -> None:
    """Print this rank's failure and abort the whole MPI job (never returns)."""
    from mpi4py import MPI

    from devices.tracker import WatchdogTimeout
    from emulator.model.clock import ProgramOrderTimeout

    rank = MPI.COMM_WORLD.rank
    if isinstance(exc, (WatchdogTimeout, ProgramOrderTimeout)):
        from emulator.runtime import watchdog

        try:
            board = watchdog.describe()
        except Exception as err:  # noqa: BLE001 - the abort must happen regardless
            board = f"(status board unreadable: {err})"
        msg = f"[t3emu rank {rank}] {where}{exc}\n{board}\n"
    else:
        tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        where = where.rstrip(": ")
        msg = (f"[t3emu rank {rank}] error{' in ' + where if where else ''}: "
               f"{type(exc).__name__}: {exc}\n{tb}")
    try:
        mark_rank("abort", msg)  # first: the launcher prints it if Hydra's relay loses it
        sys.stderr.write(msg)
        sys.stderr.flush()
    finally:
        MPI.COMM_WORLD.Abort(1)


def install_abort_handlers() -> None:
    def hook(exc_type, exc, tb):
        if issubclass(exc_type, (KeyboardInterrupt, SystemExit)):
            sys.__excepthook__(exc_type, exc, tb)
        abort(exc)

    def thread_hook(args: threading.ExceptHookArgs) -> None:
        abort(args.exc_value, f"thread {args.thread.name if args.thread else '?'}: ")

    sys.excepthook = hook
    threading.excepthook = thread_hook


def _say(line: str) -> None:
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


LOOP_PRODUCERS = ("gemv", "embedding")  # the producers whose kernels are numba's


def warm_kernels(comm, watchdog_s: float, producer: str) -> None:
    """Load numba's loop kernels (``devices.loop_kernels``) before a run whose producer
    uses them (``LOOP_PRODUCERS``; any other run returns at once and imports no numba):
    node-local rank 0 first, compiling them if numba's cache does not hold them yet
    (``runtime.numba_cache`` says so), then the others load the cache (they wait at
    least 15 minutes for the compile on a loaded host)."""
    if producer not in LOOP_PRODUCERS:
        return
    from mpi4py import MPI

    from emulator.runtime import watchdog

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    try:
        if node.rank == 0:
            from devices import loop_kernels
            from emulator.runtime import numba_cache

            watchdog.post("compute", "compiling the numba kernels")
            if not numba_cache.built():  # a first run after an install made without
                numba_cache.build(_say)  # run/_setup.sh: compiled once, with a line
            loop_kernels.warm_up()
        watchdog.wait_all(node, "the numba compile on the node's first rank",
                          max(watchdog_s, 900.0))
        if node.rank != 0:
            from devices import loop_kernels

            loop_kernels.warm_up()
    finally:
        node.Free()


class Interrupted(BaseException):
    """Ctrl-C (SIGINT) in the launching process: raised by ``on_interrupt``'s handler
    instead of ``KeyboardInterrupt`` so no library catches it on the way (click would
    print a blank line); the command line turns it into one line and exit 130."""


def on_interrupt(rank: bool) -> None:
    """SIGINT's handler for this process (main thread only): a rank of a job leaves at once
    and quietly (exit 130: its launcher, which the terminal interrupted too, says it once
    and stops the job; a rank's traceback or MPI_Abort would only repeat it per rank);
    the launching process raises ``Interrupted``."""
    import signal

    if threading.current_thread() is not threading.main_thread():
        return

    def leave(signum, frame):
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(130)

    def interrupted(signum, frame):
        raise Interrupted()

    signal.signal(signal.SIGINT, leave if rank else interrupted)
