"""Test helpers: launch the emulator (or an MPI test script) as a real multi-rank job.

Every multi-rank test runs ``mpiexec -n N`` in a subprocess with a timeout, so
a hang becomes a failed test, never a stuck CI (the dask-mpi pattern).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MPI_SCRIPTS = Path(__file__).resolve().parent / "mpi"


def mpiexec() -> str:
    local = Path(sys.executable).parent / "mpiexec"
    return str(local) if local.exists() else "mpiexec"


def test_env() -> dict:
    env = dict(os.environ)
    for key in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        env.setdefault(key, "1")
    # MPI scripts under tests/mpi import test helpers (tests.ops) as well as the packages
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT)] + [p for p in env.get("PYTHONPATH", "")
                                                       .split(os.pathsep) if p])
    # a run launched from a test must not think it is already under MPI
    for key in ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID"):
        env.pop(key, None)
    return env


def run_group(argv: list[str], timeout: float, env: dict | None = None, cwd: Path = ROOT,
              **popen) -> subprocess.CompletedProcess:
    """Run ``argv`` in a session of its own; on timeout kill the whole group (mpiexec and
    every rank), so a hang fails the test and leaves no process behind."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env or test_env(), cwd=cwd, start_new_session=True, **popen)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise AssertionError(f"timed out after {timeout} s: {argv}\n{out}\n{err}") from None
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def run_cli(args: list[str], timeout: float = 300, env: dict | None = None,
            **popen) -> subprocess.CompletedProcess:
    """`t3emu ARGS` as a user runs it (the CLI launches mpiexec itself)."""
    return run_group([sys.executable, "-m", "emulator.app.cli", *args], timeout, env, **popen)


_POOLS: list = []  # the session's pooled() block, entered on the first pooled run


def run_pooled(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """`t3emu ARGS` through the command line's own code in this process, its MPI job
    pooled with the session's other runs of that size (``emulator.app.pool``: the ranks
    run the same ``t3emu run``; only their start-up is shared). For the runs whose
    results a test checks; a test of the launcher, its signals or its environment uses
    ``run_cli``. ``T3EMU_TEST_POOL=0``: every run a process and job of its own."""
    if os.environ.get("T3EMU_TEST_POOL") == "0":
        return run_cli(args, timeout)
    from click.testing import CliRunner

    from emulator.app.cli import main
    from emulator.app.pool import pooled, time_limit

    if not _POOLS:
        for key, value in test_env().items():  # the ranks' environment, as run_cli's
            if key.endswith("_NUM_THREADS"):
                os.environ.setdefault(key, value)
        _POOLS.append(pooled(keep=4))
        _POOLS[0].__enter__()
    from emulator.app.catalog import plugins_forgotten

    # as a process of its own: its --configs files stay its own, its time is limited
    with plugins_forgotten(), time_limit(timeout):
        res = CliRunner().invoke(main, args, prog_name="t3emu", catch_exceptions=False)
    return subprocess.CompletedProcess(["t3emu", *args], res.exit_code, res.stdout, res.stderr)


@pytest.fixture(scope="session", autouse=True)
def _close_pools():
    yield
    while _POOLS:
        _POOLS.pop().__exit__(None, None, None)


def run_emulator(tmp_path: Path, args: list[str], timeout: float = 300) -> dict:
    """Run `t3emu run ARGS --json ...` (a pooled job), assert success, return the JSON
    document."""
    out = tmp_path / f"result-{len(list(tmp_path.iterdir()))}.json"
    proc = run_pooled(["run", *args, "--json", str(out)], timeout)
    assert proc.returncode == 0, f"exit {proc.returncode}\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr}"
    return json.loads(out.read_text())


def run_mpi_script(script: str, n: int, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`mpiexec -n N python -m mpi4py tests/mpi/SCRIPT ARGS`."""
    return run_group([mpiexec(), "-n", str(n), sys.executable, "-m", "mpi4py",
                      str(MPI_SCRIPTS / script), *args], timeout)


@pytest.fixture
def emulate(tmp_path):
    return lambda args, timeout=300: run_emulator(tmp_path, args, timeout)


@pytest.fixture
def no_launch(tmp_path):
    """An environment whose 'mpiexec' only records that it was started."""
    marker = tmp_path / "launched"
    fake = tmp_path / "fake-mpiexec"
    fake.write_text(f"#!/bin/sh\ntouch {marker}\nexit 99\n")
    fake.chmod(0o755)
    env = test_env()
    env["T3EMU_MPIEXEC"] = str(fake)
    return env, marker
