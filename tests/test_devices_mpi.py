"""HBM and tracker under real MPI jobs of several sizes."""

import pytest

from tests.conftest import run_mpi_script


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_hbm_updates_and_tracker_signals(ranks):
    proc = run_mpi_script("tracker_hbm.py", ranks)
    assert proc.returncode == 0, proc.stderr


def test_mpich_fp16_accumulate_probe():
    """Why fp16 updates take the locked path in devices/hbm.py: MPICH 5.0.2's shared-memory
    accumulate adds MPI_FLOAT16_T bit patterns as integers. If this starts printing
    native-fp16-sum, the native path can be enabled."""
    proc = run_mpi_script("fp16_accumulate.py", 3)
    assert proc.returncode == 0, proc.stderr
    print(proc.stdout)
    assert "fp16-sum" in proc.stdout
