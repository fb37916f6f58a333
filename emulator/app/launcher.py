"""Launching a run as an MPI job, and everything checked before the launch.

``t3emu run`` (and each point of ``t3emu sweep``) starts ``mpiexec`` itself
unless it already runs under MPI. Before that, ``preflight`` checks every option,
the device, the host's memory and the output files, so bad input ends in one line
and exit code 2 without any MPI process. The launcher passes the job's stdout
through and watches the ranks' processes, so a rank that dies from a signal
(SIGKILL, the out-of-memory killer) is named by rank, not only by PID.
"""

from __future__ import annotations

import dataclasses

import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import click

from emulator.app.config import ConfigError, RunConfig

_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
            "MV2_COMM_WORLD_SIZE")


def under_mpi() -> bool:
    """Whether this process is one rank of an MPI job (its launcher's variables, or
    ``T3EMU_UNDER_MPI=1`` from a launcher that sets none of them, as ``srun`` without a
    PMI plugin; run/slurm.sbatch sets it)."""
    return os.environ.get("T3EMU_UNDER_MPI") == "1" or any(k in os.environ for k in _MPI_ENV)


def _wheel_mpiexec() -> str:
    """The mpich wheel's mpiexec (Hydra), next to this Python."""
    return os.path.join(os.path.dirname(sys.executable), "mpiexec")


def find_mpiexec() -> str:
    """``$T3EMU_MPIEXEC`` (a command, with arguments if any, e.g. ``mpiexec -bind-to core``),
    else the mpiexec next to this Python (the mpich wheel), else PATH."""
    override = os.environ.get("T3EMU_MPIEXEC")
    if override:
        try:
            first = shlex.split(override)[0]
        except (ValueError, IndexError):
            raise LauncherError(f"the MPI launcher T3EMU_MPIEXEC={override!r} is not a "
                                f"command") from None
        if not shutil.which(first):
            raise LauncherError(f"the MPI launcher T3EMU_MPIEXEC={override!r} names no "
                                f"command on this machine ({first!r} is not on PATH); unset "
                                f"it to use the mpich wheel's mpiexec, or name the launcher "
                                f"this machine has")
        return override
    local = _wheel_mpiexec()
    if os.path.exists(local):
        return local
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise LauncherError("no mpiexec found: install the 'mpich' wheel or set "
                            "T3EMU_MPIEXEC to your MPI launcher")
    return found


class LauncherError(click.ClickException):
    """No MPI launcher to start the job with: a setting to fix before launch (exit 2)."""

    exit_code = 2


def ranks_on_this_host(cfg: RunConfig) -> int:
    """Ranks this host will hold when the CLI launches mpiexec: all of them, unless
    ``--hosts`` (on other machines), a resource manager or a host file spreads them (then
    the per-node check runs in the job)."""
    if cfg.hosts:
        return cfg.ranks if cfg.same_machine else -(-cfg.ranks // len(cfg.hosts))
    spread = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "HYDRA_HOST_FILE", "PE_HOSTFILE")
    return 1 if any(k in os.environ for k in spread) else cfg.ranks


def host_args(cfg: RunConfig) -> list[str]:
    """Hydra's options placing the ranks on ``--hosts``: ``-hosts`` and ``-ppn`` (ranks
    per host, rounded up: block placement, the last host may hold fewer), and with
    ``--same-machine`` ``-launcher fork``: every host's ranks start here and MPICH treats
    each group as a node of its own (node-local communicators, RMA between groups)."""
    if not cfg.hosts:
        return []
    out = ["-hosts", ",".join(cfg.hosts), "-ppn", str(-(-cfg.ranks // len(cfg.hosts)))]
    return (["-launcher", "fork"] if cfg.same_machine else []) + out


def preflight(cfg: RunConfig, ranks_here: int) -> RunConfig:
    """Every check that needs no MPI: options, device, memory, output files. Raises
    ConfigError or OutputError with one line naming the option, the value and what is
    allowed."""
    from emulator.app.config import available_memory
    from emulator.app.files import check_output_file

    if cfg.system:  # the system's intra-node topology
        spec = cfg.load_spec()
        cfg = dataclasses.replace(cfg, topology=spec.interconnect.topology).validate()
    else:
        cfg = cfg.validate()
        spec = cfg.load_spec()
    cfg.check_device(spec)
    cfg = cfg.runnable(spec)
    if not os.environ.get("T3EMU_SKIP_MEMORY_CHECK"):
        cfg.check_memory(spec, ranks_here, available_memory())
    if not under_mpi():  # a launcher to start the job with (LauncherError: none)
        find_mpiexec()
    if cfg.json and cfg.json != "-":  # (-: standard output)
        check_output_file(cfg.json, "--json", 16 << 20)
    if cfg.trace:
        check_output_file(cfg.trace, "--trace", 64 << 20)
    return cfg


def _alive(pid: int) -> bool:
    """A process that has not exited (a zombie waiting for its parent counts as exited);
    Linux /proc only, the watch runs nowhere else."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


class RankWatch(threading.Thread):
    """Watches the job's ranks: each records its PID at start-up, and a marker when it
    exits through the emulator (normally or by its own abort). A rank gone without a
    marker died from outside (a signal, a crash): the watch names it and kills the other
    ranks (mpiexec runs with its auto-cleanup off; a pidfd per rank orders the deaths, so
    ranks that die as a consequence of the first are not named with it)."""

    def __init__(self, pid_dir: str, proc: subprocess.Popen, period_s: float = 0.05):
        super().__init__(name="t3emu-rank-watch", daemon=True)
        self.pid_dir, self.proc, self.period_s = Path(pid_dir), proc, period_s
        self.dead: list[tuple[int, int]] = []  # (rank, pid) of ranks that died from outside
        self.ended_mpiexec = False  # the watch killed mpiexec (it outlived its stopped ranks)

    def ranks(self) -> dict[int, int]:
        out = {}
        for f in self.pid_dir.iterdir():
            if f.name.isdigit():
                try:
                    out[int(f.name)] = int(f.read_text())
                except (ValueError, OSError):  # half written, or gone with the directory
                    continue
        return out

    def _unreported(self, ranks: dict[int, int]) -> list[tuple[int, int]]:
        return self._unexplained([(r, pid) for r, pid in ranks.items() if not _alive(pid)])

    def run(self) -> None:
        try:
            self._watch()
        except OSError:
            if self.pid_dir.exists():
                raise
            # the launcher removed the directory: the job is over (an interrupt ends the
            # launcher while the watch still looks): nothing left to watch

    def _watch(self) -> None:
        if hasattr(os, "pidfd_open"):
            self._run_pidfds()
            return
        while True:  # no pidfds (old kernel): poll /proc
            running = self.proc.poll() is None
            ranks = self.ranks()
            self.dead = self._unreported(ranks)
            if not running:  # a last look, in case the job ended between two polls
                return
            if self.dead:
                self._stop_others(ranks)
                return
            time.sleep(self.period_s)

    def _stop_others(self, ranks: dict[int, int]) -> None:
        for r, pid in ranks.items():
            if (r, pid) not in self.dead:
                try:
                    os.kill(pid, 9)
                except OSError:
                    pass

    GRACE_S = 2.0  # how long the watch goes on collecting exits after the first one
    ABORT_S = 15.0  # how long a rank's MPI_Abort may take to end the job before the watch does
    END_S = 5.0  # how long mpiexec may take to end once the watch stopped the ranks

    def _end_mpiexec(self) -> None:
        """mpiexec (and its proxies) once the ranks are stopped: it normally exits by
        itself; if it has not within ``END_S``, it is killed, so the launcher never waits
        on a job whose ranks are gone."""
        try:
            self.proc.wait(timeout=self.END_S)
        except subprocess.TimeoutExpired:
            self.ended_mpiexec = True
            self.proc.kill()

    def _run_pidfds(self) -> None:
        """Wait on a pidfd per rank: the kernel says which ranks exited, so when the first
        death takes the others with it (MPI noticing the lost peer, which then stops its
        rank without a marker) the watch names the ranks that died without a marker
        within ``GRACE_S`` of the first, not every rank it finds gone later. (A rank's
        peers can notice its closed connections before its own exit is complete, most
        often on a loaded host: the window keeps the rank killed from outside among
        those named.)"""
        import select

        fds: dict[int, tuple[int, int]] = {}  # fd -> (rank, pid)
        poller = select.poll()
        gone: list[tuple[int, int]] = []  # exited without a pidfd (before we opened one)
        found: list[tuple[int, int]] = []  # exited without a marker
        first: list[tuple[int, int]] = []  # the first of them, seen together
        deadline = math.inf
        aborted = None  # when a rank's abort marker was first seen
        try:
            while True:
                running = self.proc.poll() is None
                for r, pid in self.ranks().items():
                    if (r, pid) in fds.values() or (r, pid) in gone or (r, pid) in found:
                        continue
                    try:
                        fd = os.pidfd_open(pid)
                    except OSError:
                        gone.append((r, pid))
                        continue
                    fds[fd] = (r, pid)
                    poller.register(fd, select.POLLIN)
                ready = [fds[fd] for fd, _ in poller.poll(int(self.period_s * 1000))]
                for rp in self._unexplained(gone + ready):
                    if rp not in found:
                        found.append(rp)
                        deadline = min(deadline, time.monotonic() + self.GRACE_S)
                if found and not first:
                    first = list(found)
                gone.clear()
                for fd in [fd for fd, rp in fds.items() if rp in ready]:
                    poller.unregister(fd)
                    os.close(fd)
                    del fds[fd]
                if found and (time.monotonic() >= deadline or not fds or not running):
                    self.dead = self._culprits(first, found)
                    self._stop_others(dict(fds.values()))
                    self._end_mpiexec()
                    return
                if not running:
                    return
                if aborted is None and any(self.pid_dir.glob("*.abort")):
                    aborted = time.monotonic()
                if aborted is not None and time.monotonic() - aborted > self.ABORT_S:
                    self._stop_others(self.ranks())  # an abort that did not end the job
                    self._end_mpiexec()
                    return
        finally:
            for fd in fds:
                os.close(fd)

    def _culprits(self, first: list[tuple[int, int]],
                  found: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Of the ranks that exited without a marker, those that died from outside: the
        first seen, and the later ones under another Hydra proxy. A proxy whose rank died
        by a signal kills its other ranks (SIGUSR1, then SIGKILL, whatever the auto-cleanup
        setting): those are the consequence. A rank's peers on another host can notice its
        closed connections and die before its own exit is seen, so a later death under
        another proxy is kept."""
        def proxy(rp: tuple[int, int]) -> str:
            try:
                return (self.pid_dir / f"{rp[0]}.ppid").read_text()
            except OSError:
                return f"?{rp[0]}"  # unknown: its own
        seen = {proxy(rp) for rp in first}
        return sorted(rp for rp in found if rp in first or proxy(rp) not in seen)

    def _unexplained(self, exited: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Of ranks that exited, those that left no marker (an abort of the job ends the
        others legitimately: none then)."""
        if any(self.pid_dir.glob("*.abort")):
            return []
        return sorted((r, pid) for r, pid in exited
                      if not any((self.pid_dir / f"{r}.{m}").exists()
                                 for m in ("end", "abort")))


class StderrRelay(threading.Thread):
    """Passes the job's stderr through line by line and remembers the ranks' abort
    messages it saw. A rank writes its abort message to stderr and to its "abort" marker,
    then calls MPI_Abort; Hydra can end the job before its proxy relays what the rank
    wrote, so after the job ``print_lost_aborts`` prints the messages that never came."""

    def __init__(self, source, sink):
        super().__init__(name="t3emu-stderr-relay", daemon=True)
        self.source, self.sink, self.seen = source, sink, set()

    def run(self) -> None:
        for line in self.source:
            if line.startswith("[t3emu rank "):
                self.seen.add(line.rstrip("\n"))
            self.sink.write(line)
            self.sink.flush()

    def print_lost_aborts(self, pid_dir: Path) -> None:
        print_lost_aborts(pid_dir, lambda first: first in self.seen, self.sink)


def print_lost_aborts(pid_dir: Path, seen, sink) -> None:
    """The ranks' abort messages (their "abort" markers) whose first line ``seen`` says
    never reached the output, written to ``sink``."""
    for marker in sorted(pid_dir.glob("*.abort")):
        try:
            msg = marker.read_text()
        except OSError:
            continue
        if msg and not seen(msg.splitlines()[0]):
            sink.write(msg if msg.endswith("\n") else msg + "\n")
            sink.flush()


class _Discard:
    """A sink for a job's output once its end is the caller's to tell."""

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


def report_dead(watch: RankWatch, err) -> bool:
    """Name the ranks that died from outside (``watch.dead``) on ``err``; whether any did."""
    if not watch.dead:
        return False
    who = ", ".join(f"rank {r} (pid {p})" for r, p in watch.dead)
    err.write(f"t3emu: {who} died without reporting an error (killed by a signal, e.g. "
              f"kill -9 or the out-of-memory killer, crashed, or ended by os._exit); the "
              f"launcher stopped the other ranks\n")
    err.flush()
    return True


def kill_job(proc: subprocess.Popen, watch: RankWatch) -> None:
    """SIGKILL mpiexec and every rank the watch knows (Hydra's clean-up may be off)."""
    proc.kill()
    for pid in watch.ranks().values():
        try:
            os.kill(pid, 9)
        except OSError:
            pass


def launch(cfg: RunConfig, stdout=None, stderr=None) -> int:
    """Run ``cfg`` as an MPI job of ``cfg.ranks`` ranks; return mpiexec's exit code.

    The job's stdout passes through this process (to ``stdout``, default ours). With the
    mpich wheel's Hydra on Linux and every rank on this host, a ``RankWatch`` names a rank
    that dies without reporting (SIGKILL, a crash) and stops the others. Inside
    ``pool.pooled()`` the run goes to a pooled job of its size instead (``app.pool``)."""
    from emulator.app import pool
    from emulator.runtime.process import pin_threads, remove_shm

    pooled = pool.current(cfg)
    if pooled is not None:
        return pooled.run(cfg, stdout, stderr)

    env = pin_threads(dict(os.environ))  # numba compiles once per node (runtime.warm_kernels)
    mpiexec = shlex.split(find_mpiexec())
    # the watch of the ranks needs Hydra, /proc, and every rank on this host; it then stops
    # the job itself, so Hydra's clean-up (which kills everyone at once) is turned off
    watched = (mpiexec == [_wheel_mpiexec()] and os.path.exists("/proc/self/stat")
               and ranks_on_this_host(cfg) == cfg.ranks)
    if watched:
        mpiexec.append("-disable-auto-cleanup")
    argv = [*mpiexec, *host_args(cfg), "-n", str(cfg.ranks), sys.executable, "-m", "mpi4py",
            "-m", "emulator.app.cli", "run", *_cfg_args(cfg)]
    from emulator.app.worker import header

    out, err = stdout or sys.stdout, stderr or sys.stderr
    err.write(header(cfg, cfg.load_spec(), cfg.ranks) + "\n")  # before the job's first word
    err.flush()
    with tempfile.TemporaryDirectory(prefix="t3emu-ranks-") as pid_dir:
        env["T3EMU_PID_DIR"] = pid_dir
        proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, errors="replace")
        relay = StderrRelay(proc.stderr, err)
        relay.start()
        watch = RankWatch(pid_dir, proc)
        if watched:
            watch.start()
        term = _stop_on_sigterm()
        try:
            for line in proc.stdout:
                out.write(line)
                out.flush()
            rc = proc.wait()
        except BaseException:  # Ctrl-C reaches mpiexec too (a SIGTERM, e.g. from timeout or
            # a batch system, only this process): give it time to stop its ranks, and say
            # nothing of their ends (the caller says why the job ended, once)
            relay.sink = _Discard()
            try:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                kill_job(proc, watch)
            raise
        finally:
            if term is not None:
                signal.signal(signal.SIGTERM, term)
            remove_shm(pid_dir)  # what an abnormal end left in /dev/shm (a normal one: none)
        relay.join()
        relay.print_lost_aborts(Path(pid_dir))
        if watched:
            watch.join()
            rc = _ranks_rc(Path(pid_dir), rc, cfg.ranks)
        killed = proc.returncode < 0 and not watch.ended_mpiexec and not all(  # (a SIGPIPE
            (Path(pid_dir) / f"{r}.end").exists() for r in range(cfg.ranks))  # after the end)
        if killed:  # no rank of this host outlives it
            watch.dead = []
            watch._stop_others(watch.ranks())
    if killed:  # mpiexec itself was killed: its ranks went with it; they are not the cause
        sig = -proc.returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else f"signal {sig}"
        err.write(f"t3emu: mpiexec (pid {proc.pid}) was killed by {name} from outside (kill, "
                  f"the out-of-memory killer); the job ended with it\n")
        err.flush()
        return 1
    if report_dead(watch, err):
        return rc or 1
    return rc


def _stop_on_sigterm():
    """While a job runs, SIGTERM to this process (``timeout``, a batch system's stop)
    raises ``SystemExit`` here, so the job's ranks are stopped with it instead of running
    on without their launcher; returns the handler to restore (None off the main
    thread, where Python cannot take signals)."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def stop(signum, frame):
        raise SystemExit(128 + signum)

    return signal.signal(signal.SIGTERM, stop)


def _ranks_rc(pid_dir: Path, rc: int, ranks: int) -> int:
    """The job's exit code from its ranks when every rank finished through the emulator
    (an "end" marker holding its exit code): with several Hydra proxies (``--hosts``) and
    the clean-up off, mpiexec can fail to signal a proxy that has just exited (SIGPIPE, or
    exit 255) after every rank has finished; that is no failure of the run."""
    if rc == 0:
        return rc
    codes = []
    for r in range(ranks):
        try:
            codes.append(int((pid_dir / f"{r}.end").read_text()))
        except (OSError, ValueError):
            return rc  # a rank did not finish through the emulator: mpiexec's code stands
    return max(codes)


def _cfg_args(cfg: RunConfig) -> list[str]:
    args = ["-n", str(cfg.ranks), "--collective", cfg.collective,
            "--algorithm", cfg.algorithm, "--mode", cfg.mode, "--split-k", str(cfg.split_k),
            "--m", str(cfg.m), "--n", str(cfg.n), "--k", str(cfg.k),
            "--dtype", cfg.dtype, "--seed", str(cfg.seed),
            "--values", cfg.values, "--watchdog-s", str(cfg.watchdog_s)]
    if cfg.system:
        args += ["--system", str(Path(cfg.system).resolve()) if cfg.system.endswith(".toml")
                 else cfg.system]
    else:
        args += ["--topology", cfg.topology, "--device", cfg.device]
    if cfg.json:
        args += ["--json", cfg.json]
    if cfg.timing_only:
        args.append("--timing-only")
    if cfg.trace:
        args += ["--trace", cfg.trace]
    if cfg.record_wall:
        args.append("--record-wall")
    if cfg.inject_fault:
        args += ["--inject-fault", cfg.inject_fault]
    from emulator.app.packaged import configs_path

    for path in cfg.configs:
        args += ["--configs", str(Path(configs_path(path)).resolve())]
    for name, value in cfg.params:
        args += ["--param", f"{name}={value!r}"]
    if cfg.ablate:
        args += ["--ablate", ",".join(cfg.ablate)]
    from devices.overrides import format_value

    for key, value in cfg.overrides:
        args += ["--set", f"{key}={format_value(value)}"]
    if cfg.causes:
        args.append("--causes")
    return args
