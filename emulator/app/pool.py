"""Pooled jobs: one MPI job runs many ``t3emu run`` configurations, one after another.

A sweep point or a model estimate's operation models its time in well under a second of
CPU per rank; starting its MPI job (Python, imports, ``MPI_Init``, windows) costs several
seconds on a laptop. Inside ``with pooled():`` every ``launcher.launch`` of a
configuration goes to a ``Pool``: an MPI job of that many ranks started once
(``emulator.app.pool_rank``) that takes the configurations one after another on its rank
0's stdin and runs each exactly as a job of its own would (the same command-line parsing,
checks, ``worker.main``, result files and output; only the start-up is shared).

Each run's output (every rank's stdout and stderr) goes to that run's ``stdout`` and
``stderr``, complete: every rank ends a run with a marker on both streams. A run that
fails inside the job (an exception, a watchdog, a numerics failure) returns its exit code
as a job of its own would; one that ends the job (``MPI_Abort``, a killed rank) is
reported in its output with the launcher's words and the next run starts a new job.
Ctrl-C and SIGTERM stop the job as they stop a job of its own.

By default one pooled job lives at a time (a configuration of another size closes it);
an idle one's ranks sleep. ``T3EMU_NO_POOL=1`` turns pooling off (every run its own job),
and so do ranks on other hosts (they could not write the run's output files here) and a
launcher that broadcasts stdin to every task (``srun``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import queue
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

from emulator.app.config import RunConfig

DONE = "@@t3emu-pool-done@@"  # rank 0's line after a run: DONE SEQ EXIT-CODE
_ACTIVE: list[dict] = []  # a stack of slots, one per ``pooled()``: its pools by job size


@contextlib.contextmanager
def pooled(keep: int = 1, timeout_s: float | None = None):
    """Within the block, ``launcher.launch`` runs configurations in pooled jobs. ``keep``:
    pooled jobs of different sizes left running at once (the least recently used beyond
    it is closed; idle ranks sleep); ``timeout_s``: a run taking longer stops its job and
    fails (exit 124), as a test's timeout does. Inside another ``pooled()`` block it uses
    that block's jobs (a model scenario's estimates share them)."""
    if _ACTIVE:
        yield
        return
    slot: dict = {"pools": {}, "keep": keep, "timeout_s": timeout_s}
    _ACTIVE.append(slot)
    try:
        yield
    finally:
        _ACTIVE.remove(slot)
        for pool in slot["pools"].values():
            pool.close()


@contextlib.contextmanager
def time_limit(seconds: float | None):
    """Within the block, the innermost ``pooled()`` block's runs have this time limit."""
    if not _ACTIVE:
        yield
        return
    slot = _ACTIVE[-1]
    before, slot["timeout_s"] = slot["timeout_s"], seconds
    try:
        yield
    finally:
        slot["timeout_s"] = before


def enabled(cfg: RunConfig) -> bool:
    """Pooling applies: not turned off, every rank on this host (they write the run's
    output files), and a launcher that gives stdin to rank 0 alone (not ``srun``)."""
    from emulator.app.launcher import find_mpiexec, ranks_on_this_host

    if os.environ.get("T3EMU_NO_POOL") == "1" or ranks_on_this_host(cfg) != cfg.ranks:
        return False
    try:
        launcher = shlex.split(find_mpiexec())
    except Exception:  # noqa: BLE001 - no launcher: the plain path says so
        return False
    return bool(launcher) and os.path.basename(launcher[0]) != "srun"


def current(cfg: RunConfig) -> Pool | None:
    """The pool that runs ``cfg`` in the innermost ``pooled()`` block (started on its
    first run), or None outside one."""
    if not _ACTIVE or not enabled(cfg):
        return None
    slot = _ACTIVE[-1]
    pools: dict = slot["pools"]
    key = Pool.key_of(cfg)
    pool = pools.pop(key, None) or Pool(cfg)
    pool.timeout_s = slot["timeout_s"]  # the block's (``time_limit`` may change it)
    pools[key] = pool  # the most recently used last
    while len(pools) > slot["keep"]:
        pools.pop(next(iter(pools))).close()
    return pool


class _Reader(threading.Thread):
    """One of the job's output streams, line by line: rank 0's done lines to the pool's
    queue, anything else (output outside a run, which is rare) to the pool's sink."""

    def __init__(self, pool: Pool, stream: str, source):
        super().__init__(name=f"t3emu-pool-{stream}", daemon=True)
        self.pool, self.stream, self.source = pool, stream, source
        self.events = pool.events  # this job's (a job started later has its own)

    def run(self) -> None:
        for line in self.source:
            if self.stream == "out" and line.startswith(DONE):
                _, seq, rc = line.split()
                self.events.put(("done", int(seq), int(rc)))
                continue
            if self.pool.quiet:  # stopped by the caller, who says why
                continue
            try:  # a run's stderr while one runs (a caller's stream may be closed since)
                sink = self.pool.sinks[1] if self.pool.sinks else sys.__stderr__
                sink.write(line)
                sink.flush()
            except (ValueError, OSError):
                pass
        self.events.put(("eof", 0, 0))


class Pool:
    """A pooled MPI job of one size (ranks, hosts), started on its first run."""

    def __init__(self, cfg: RunConfig, timeout_s: float | None = None):
        self.key = self.key_of(cfg)
        self.first = cfg
        self.timeout_s = timeout_s
        self.proc: subprocess.Popen | None = None
        self.seq = 0
        self.sinks: list | None = None  # the current run's stdout and stderr
        self.quiet = False  # the job's output dropped (Ctrl-C: the caller says it once)

    @staticmethod
    def key_of(cfg: RunConfig) -> tuple:
        return (cfg.ranks, tuple(cfg.hosts), cfg.same_machine)

    def _start(self) -> None:
        from emulator.app.launcher import (RankWatch, _wheel_mpiexec, find_mpiexec,
                                           host_args, ranks_on_this_host)
        from emulator.runtime.process import pin_threads

        cfg = self.first
        env = pin_threads(dict(os.environ))
        mpiexec = shlex.split(find_mpiexec())
        self.watched = (mpiexec == [_wheel_mpiexec()] and os.path.exists("/proc/self/stat")
                        and ranks_on_this_host(cfg) == cfg.ranks)
        if self.watched:
            mpiexec.append("-disable-auto-cleanup")
        argv = [*mpiexec, *host_args(cfg), "-n", str(cfg.ranks), sys.executable, "-m",
                "mpi4py", "-m", "emulator.app.pool_rank"]
        self.quiet = False
        self.pid_dir = tempfile.mkdtemp(prefix="t3emu-pool-")
        env["T3EMU_PID_DIR"] = self.pid_dir
        self.events: queue.Queue = queue.Queue()
        self.proc = subprocess.Popen(argv, env=env, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, errors="replace")
        self.readers = [_Reader(self, "out", self.proc.stdout),
                        _Reader(self, "err", self.proc.stderr)]
        for r in self.readers:
            r.start()
        self.watch = RankWatch(self.pid_dir, self.proc)
        if self.watched:
            self.watch.start()
        self.seq = 0  # the job's ranks count their runs from 1

    def run(self, cfg: RunConfig, stdout=None, stderr=None) -> int:
        """Run ``cfg`` (of this pool's size) in the job; its exit code, as ``launch``'s."""
        from emulator.app.launcher import _cfg_args, _stop_on_sigterm
        from emulator.app.worker import header

        if self.key_of(cfg) != self.key:
            raise ValueError(f"a pool of {self.key} cannot run a job of {self.key_of(cfg)}")
        out, err = stdout or sys.stdout, stderr or sys.stderr
        err.write(header(cfg, cfg.load_spec(), cfg.ranks) + "\n")  # as launch does
        err.flush()
        term = _stop_on_sigterm()
        try:
            if self.proc is None:
                self._start()
            self.seq += 1
            files = [os.path.join(self.pid_dir, f"run{self.seq}.out")]
            files.append(files[0] if out is err else
                         os.path.join(self.pid_dir, f"run{self.seq}.err"))
            self.sinks = [out, err]
            # the job's ranks keep the directory they started in: this run's files are
            # where the caller's directory puts them now
            cfg = dataclasses.replace(cfg, **{k: os.path.abspath(getattr(cfg, k))
                                               for k in ("json", "trace") if getattr(cfg, k)})
            task = {"args": _cfg_args(cfg), "out": files[0], "err": files[1]}
            try:
                self.proc.stdin.write(json.dumps(task) + "\n")
                self.proc.stdin.flush()
            except (BrokenPipeError, OSError):
                pass  # the job has ended: its end is read below
            rc = self._wait()
            said = self._deliver(files, out, err)
            if rc == "timeout":
                self.close(stop=True)
                err.write(f"t3emu: the run took more than {self.timeout_s:g} s; its pooled "
                          f"job was stopped\n")
                err.flush()
                return 124
            if rc is None:  # the job ended in the run
                rc = self._ended(said)
            self.sinks = None
            return rc
        except BaseException:  # Ctrl-C (it reached mpiexec too), SIGTERM: stop the job
            self.quiet = True
            self.close(stop=True)
            raise
        finally:
            if term is not None:
                import signal

                signal.signal(signal.SIGTERM, term)

    def _wait(self) -> int | str | None:
        """This run's exit code (the largest of its ranks'), None if the job ended,
        "timeout" past the pool's time limit."""
        import time

        ended = 0
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while True:
            try:
                kind, seq, rc = self.events.get(
                    timeout=None if deadline is None else max(deadline - time.monotonic(), 0))
            except queue.Empty:
                return "timeout"
            if kind == "eof":
                ended += 1
                if ended == 2:
                    return None
            elif seq == self.seq:
                return rc

    @staticmethod
    def _deliver(files: list[str], out, err) -> str:
        """The run's output files to its sinks (and gone); what they held."""
        said = []
        for path, sink in dict.fromkeys(zip(files, (out, err))):
            try:
                with open(path, errors="replace") as fh:
                    text = fh.read()
                os.unlink(path)
            except OSError:
                continue
            said.append(text)
            if text:
                sink.write(text)
                sink.flush()
        return "".join(said)

    def _ended(self, said: str) -> int:
        """The job ended during a run: its exit code, with what the launcher says of it."""
        from emulator.app.launcher import print_lost_aborts, report_dead

        rc = self.proc.wait()
        err = self.sinks[1]
        if self.watched:
            self.watch.join()
        # an abort the rank had no time to write where it prints
        print_lost_aborts(Path(self.pid_dir), lambda first: first in said, err)
        report_dead(self.watch, err)
        self._cleanup()
        return rc or 1

    def _cleanup(self) -> None:
        from emulator.runtime.process import remove_shm

        for r in getattr(self, "readers", ()):
            r.join(timeout=5)
        if getattr(self, "pid_dir", ""):  # (the job is over: what it left in /dev/shm)
            remove_shm(self.pid_dir)
        shutil.rmtree(getattr(self, "pid_dir", ""), ignore_errors=True)
        self.proc = None
        self.sinks = None

    def close(self, stop: bool = False) -> None:
        """End the job: an empty task line (``stop``: SIGTERM, as ``launch`` on Ctrl-C),
        then a kill of whatever is left after 10 s."""
        import signal

        proc = self.proc
        if proc is None:
            return
        try:
            if proc.poll() is None:
                if stop:
                    proc.send_signal(signal.SIGTERM)
                else:
                    try:
                        proc.stdin.write("\n")
                        proc.stdin.close()
                    except (BrokenPipeError, OSError):
                        pass
            proc.wait(timeout=10 if stop else 60)
        except subprocess.TimeoutExpired:
            from emulator.app.launcher import kill_job

            kill_job(proc, self.watch)
            proc.wait()
        if self.watched:
            self.watch.join(timeout=5)
        self._cleanup()
