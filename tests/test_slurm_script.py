"""run/slurm.sbatch, the Slurm batch script: submitted with sbatch to a one-node Slurm
brought up from Debian's packages (skipped, saying why, without root or apt), and its
own checks run inside a pretend allocation (SLURM_NTASKS, SLURM_SUBMIT_DIR) with the
MPICH wheel's mpiexec standing in for srun (T3EMU_SRUN): it must start the ranks, pass
the options and return t3emu's exit code.

The real-Slurm test changes the machine when run as root: it installs slurmctld, slurmd,
slurm-client and munge with apt-get if they are missing, and starts munged, slurmctld and
slurmd (all stopped afterwards, and checked gone). ``T3EMU_NO_SLURM_TEST=1`` skips it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, mpiexec
from tests.conftest import test_env as _env

SCRIPT = ROOT / "run" / "slurm.sbatch"


def _sbatch(args: list[str], **env_extra) -> subprocess.CompletedProcess:
    env = _env()
    env.update({"SLURM_SUBMIT_DIR": str(ROOT), "T3EMU_VENV": str(Path(sys.executable).parent.parent),
                "T3EMU_SRUN": mpiexec(), **env_extra})
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True,
                          text=True, timeout=300, cwd=ROOT)


def test_the_batch_script_runs_the_job_on_the_allocations_tasks(tmp_path):
    out = tmp_path / "r.json"
    proc = _sbatch(["--collective", "ar", "--m", "256", "--n", "128", "--k", "64", "--dtype",
                    "fp32", "--mode", "sequential,t3", "--json", str(out)], SLURM_NTASKS="4")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 4 and all(r["numerics"] == "pass" for r in doc["runs"])


def test_the_batch_script_passes_on_bad_usage_and_refuses_outside_an_allocation():
    proc = _sbatch(["--collective", "nope"], SLURM_NTASKS="2")
    assert proc.returncode == 2 and "--collective" in proc.stderr, proc.stderr
    env_without = {}
    proc = _sbatch(["--m", "64"], **env_without)
    assert proc.returncode != 0 and "not inside a Slurm allocation" in proc.stderr, proc.stderr


# ------------------------------------------------------------------ a real one-node Slurm

_CONF = """ClusterName=t3emu
SlurmctldHost={host}
AuthType=auth/munge
SlurmUser=root
SlurmdUser=root
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
SlurmctldPort={port}
SlurmdPort={port2}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SlurmdParameters=config_overrides
NodeName={host} CPUs=16 Sockets=1 CoresPerSocket=16 ThreadsPerCore=1 RealMemory=4000
PartitionName=debug Nodes={host} Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
"""


def _sh(cmd: str, timeout: float = 60, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, shell=True, capture_output=True, text=True, timeout=timeout, **kw)


NO_SLURM = "T3EMU_NO_SLURM_TEST"
_WHAT = ("as root it installs slurmctld, slurmd, slurm-client and munge with apt-get if "
         "missing and starts munged, slurmctld and slurmd (stopped afterwards)")
_DAEMONS = ("slurmctld", "slurmd", "slurmstepd", "munged")  # what it may leave running


def _pids(name: str) -> set[int]:
    """The processes named ``name`` that are running (an exited one not yet reaped is not)."""
    def running(pid: str) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except (OSError, IndexError):
            return False

    return {int(p) for p in _sh(f"pgrep -x {name}").stdout.split() if running(p)}


def _announce(request, text: str) -> None:
    """A line in the test run's output (shown at once, whatever -q or capturing)."""
    import contextlib
    import warnings

    plugins = request.config.pluginmanager
    reporter, capture = plugins.getplugin("terminalreporter"), plugins.getplugin(
        "capturemanager")
    if reporter is None:  # e.g. an xdist worker: the warnings summary says it
        warnings.warn(text, stacklevel=2)
        return
    with (capture.global_and_fixture_disabled() if capture is not None
          else contextlib.nullcontext()):  # as capsys.disabled() does
        reporter.write_line(text, yellow=True)


def _stop(before: dict[str, set[int]], env: dict) -> list[str]:
    """Cancel the private Slurm's jobs, then end every daemon the fixture started (the
    processes of _DAEMONS not running before it), Slurm's first and munged last: SIGTERM,
    then SIGKILL after 15 s. Returns those still running ("name pid")."""
    import os
    import signal
    import time

    try:  # every job of this private Slurm is the test's
        jobs = _sh("squeue -h -o %i", env=env, timeout=20).stdout.split()
        if jobs:
            _sh(f"scancel {' '.join(jobs)}", env=env, timeout=20)
    except subprocess.TimeoutExpired:  # no controller: no job either
        pass
    for names in (("slurmd", "slurmstepd", "slurmctld"), ("munged",)):
        mine = {(n, pid) for n in names for pid in _pids(n) - before[n]}
        for sig, wait in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            for _, pid in mine:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                mine = {(n, pid) for n, pid in mine if pid in _pids(n)}
                if not mine:
                    break
                time.sleep(0.2)
            if not mine:
                break
    return [f"{n} {pid}" for n in _DAEMONS for pid in sorted(_pids(n) - before[n])]


@pytest.fixture(scope="module")
def slurm(tmp_path_factory, request):
    """A one-node Slurm (slurmctld + slurmd + munged) from Debian's packages, in a temporary
    directory with its own slurm.conf (SLURM_CONF) and ports; torn down afterwards: every
    daemon it started is stopped (munged included) and checked gone."""
    import os
    import shutil
    import socket
    import time

    if os.environ.get(NO_SLURM, "") not in ("", "0"):
        pytest.skip(f"{NO_SLURM} is set: the real one-node Slurm test is skipped ({_WHAT})")
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip(f"a one-node Slurm needs root and apt-get (Debian packages) here; "
                    f"{_WHAT}; {NO_SLURM}=1 skips it")
    _announce(request, f"\n{__name__}: a real one-node Slurm: {_WHAT}; {NO_SLURM}=1 "
                       f"skips it")
    if not all(shutil.which(x) for x in ("slurmctld", "slurmd", "sbatch", "munged")):
        got = _sh("DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "
                  "slurmctld slurmd slurm-client munge", timeout=600)
        if got.returncode:
            pytest.skip(f"cannot install Slurm from Debian's packages: {got.stderr[-300:]}")
    d = tmp_path_factory.mktemp("slurm")
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    host = socket.gethostname().split(".")[0]
    conf = d / "slurm.conf"
    conf.write_text(_CONF.format(host=host, d=d, port=16817, port2=16818))
    env = {**os.environ, "SLURM_CONF": str(conf)}
    before = {name: _pids(name) for name in _DAEMONS}
    try:
        if not before["munged"]:
            _sh("mkdir -p /run/munge && chown munge:munge /run/munge; "
                "runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force")
        for daemon in ("slurmctld", "slurmd"):
            got = _sh(f"/usr/sbin/{daemon} -f {conf}", env=env)
            assert got.returncode == 0, (daemon, got.stderr)
        for _ in range(60):
            if "idle" in _sh("sinfo -h -o %T", env=env).stdout:
                break
            time.sleep(0.5)
        else:
            pytest.fail("slurm did not come up: " + (d / "slurmctld.log").read_text()[-2000:])
        yield env
    finally:
        left = _stop(before, env)
    assert not left, f"daemons the test started are still running: {', '.join(left)}"


def test_sbatch_runs_the_script_on_a_real_one_node_slurm(slurm, tmp_path):
    import time

    out, log = tmp_path / "r.json", tmp_path / "job.out"
    venv = str(Path(sys.executable).parent.parent)
    got = _sh(f"sbatch --parsable --ntasks-per-node=4 --output={log} "
              f"--export=ALL,T3EMU_VENV={venv} {SCRIPT} --collective ar --m 256 --n 128 "
              f"--k 64 --dtype fp32 --mode sequential,t3 --json {out}", env=slurm, cwd=ROOT)
    assert got.returncode == 0, got.stderr
    job = got.stdout.strip()
    for _ in range(240):
        if not _sh(f"squeue -h -j {job}", env=slurm).stdout.strip():
            break
        time.sleep(0.5)
    text = log.read_text() if log.exists() else "(no job output)"
    assert out.exists(), text[-3000:]
    doc = json.loads(out.read_text())
    assert doc["world_size"] == 4 and all(r["numerics"] == "pass" for r in doc["runs"]), text
