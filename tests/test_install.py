"""`pip install .` (not editable) gives a complete tool usable from any directory: the
wheel is built from the tracked files, installed into a fresh virtual environment with its
dependencies, and used from a temporary directory outside the repository."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, run_group

TINY = """name = "tiny"
description = "two points of a GEMM + reduce-scatter on eight A100s (the install test)"
dtype = "fp16"

[[cases]]
name = "RS"
sublayer = "FC-2"
operation = "gemm+rs"
systems = ["a100-sxm-x8"]
m = [1024, 2048]
n = 512
k = 256
shard = "none"
modes = ["sequential", "flux-rs-w"]
"""


# pip's words when the package registry cannot be reached (an offline machine)
_OFFLINE = ("Failed to establish a new connection", "Temporary failure in name resolution",
            "Network is unreachable", "No matching distribution found", "ProxyError")


def _tracked_copy(dst: Path) -> Path:
    """The repository's tracked files (what a fresh clone holds), so a file that is only in
    this working tree cannot make the test pass."""
    files = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = ROOT / name
        if src.is_file():
            (dst / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / name)
    return dst


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("needs a git checkout (the wheel is built from the tracked files)")
    base = tmp_path_factory.mktemp("install")
    src = _tracked_copy(base / "src")
    venv = base / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    proc = run_group([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", str(src)],
                     timeout=1200, env=_clean_env(), cwd=base)
    if proc.returncode and any(w in proc.stderr for w in _OFFLINE):
        pytest.skip("needs the package registry (pip installs the dependencies into a fresh "
                    f"environment); pip says: {proc.stderr.strip().splitlines()[-1]}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    work = base / "elsewhere"
    work.mkdir()
    return venv / "bin", work


def _clean_env() -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PMI_RANK", "PMI_SIZE")}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if ".venv" not in p)
    return env


def _t3emu(installed, *args, timeout=600):
    bin_dir, work = installed
    proc = run_group([str(bin_dir / "t3emu"), *args], timeout=timeout, env=_clean_env(),
                     cwd=work)
    assert proc.returncode == 0, f"t3emu {' '.join(args)}: exit {proc.returncode}\n" \
                                 f"{proc.stdout}\n{proc.stderr}"
    return proc.stdout


def test_the_installed_tool_is_complete(installed):
    bin_dir, work = installed
    # the code really comes from the environment, not from the repository
    where = run_group([str(bin_dir / "python"), "-c", "import emulator; print(emulator.__file__)"],
                      timeout=60, env=_clean_env(), cwd=work).stdout
    assert str(bin_dir.parent) in where and str(ROOT) not in where, where
    assert "t3emu, version" in _t3emu(installed, "--version")
    devices = _t3emu(installed, "devices")
    for name in ("t3-sim", "a100-sxm", "mi300x", "a100-sxm-2x8", "mi210-torus128"):
        assert f"\n{name} " in devices, devices
    out = _t3emu(installed, "run", "--system", "a100-sxm-x8", "--collective", "gemm+rs",
                 "--m", "1024", "--n", "512", "--k", "256", "--mode", "sequential,flux-rs-w",
                 "--timing-only")
    assert "flux-rs-w" in out and "sequential" in out
    # the shipped model files (package data)
    models = _t3emu(installed, "model", "--list")
    assert "gpt3-175b" in models and "dlrm-128node" in models, models
    # the shipped example configuration file by name
    assert "pull-ag-gemm" in _t3emu(installed, "configs", "--configs", "pull_ag_gemm")
    # the paper scenarios by name
    scen = run_group([str(bin_dir / "python"), "-c",
                      "from emulator.app.scenario import load_scenario as l; "
                      "print([len(l(s).points) for s in ('t3-paper', 't3-2x-cu', 'flux-paper',"
                      " 'fused-ops-paper', 'ficco-paper')])"],
                     timeout=120, env=_clean_env(), cwd=work)
    assert scen.returncode == 0 and "[" in scen.stdout, scen.stderr
    # a tiny sweep of a user's own scenario file, from this directory
    (work / "tiny.toml").write_text(TINY)
    _t3emu(installed, "sweep", "tiny.toml", "--timing-only", "--out", "res")
    assert (work / "res" / "results.csv").read_text().count("\n") == 1 + 2 * 2
