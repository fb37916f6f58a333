"""run/slurm.sbatch, the Slurm batch script: submitted with sbatch to a one-node Slurm
brought up from Debian's packages (skipped, saying why, without root or apt), and its
own checks run inside a pretend allocation (SLURM_NTASKS, SLURM_SUBMIT_DIR) with the
MPICH wheel's mpiexec standing in for srun (T3EMU_SRUN): it must start the ranks, pass
the options and return t3emu's exit code."""

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


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node Slurm (slurmctld + slurmd + munged) from Debian's packages, in a temporary
    directory with its own slurm.conf (SLURM_CONF) and ports; torn down afterwards."""
    import os
    import shutil
    import socket
    import time

    if os.geteuid() != 0 or not shutil.which("apt-get"):
        pytest.skip("a one-node Slurm needs root and apt-get (Debian packages) here")
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
    if _sh("pgrep -x munged").returncode:
        _sh("mkdir -p /run/munge && chown munge:munge /run/munge; "
            "runuser -u munge -- /usr/sbin/munged || /usr/sbin/munged --force")
    for daemon in ("slurmctld", "slurmd"):
        got = _sh(f"/usr/sbin/{daemon} -f {conf}", env=env)
        assert got.returncode == 0, (daemon, got.stderr)
    try:
        for _ in range(60):
            if "idle" in _sh("sinfo -h -o %T", env=env).stdout:
                break
            time.sleep(0.5)
        else:
            pytest.fail("slurm did not come up: " + (d / "slurmctld.log").read_text()[-2000:])
        yield env
    finally:
        for pid in ("slurmd.pid", "slurmctld.pid"):
            if (d / pid).exists():
                _sh(f"kill {(d / pid).read_text().strip()}")


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
