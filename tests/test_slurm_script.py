"""run/slurm.sbatch, the Slurm batch script. No Slurm runs here (no slurmctld/slurmd in
the sandbox or CI), so the script's own logic is run inside a pretend allocation
(SLURM_NTASKS, SLURM_SUBMIT_DIR) with the MPICH wheel's mpiexec standing in for srun
(T3EMU_SRUN): it must start the ranks, pass the options and return t3emu's exit code."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
