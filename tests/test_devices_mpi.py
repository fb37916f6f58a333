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


def test_region_join_only_makes_regions():
    from devices.regions import join

    assert join((0, 4, 0, 8), (0, 4, 8, 12), 32) == (0, 4, 0, 12)  # continues the rows
    assert join((0, 4, 0, 32), (4, 6, 0, 32), 32) == (0, 6, 0, 32)  # whole rows below
    assert join((0, 4, 0, 8), (4, 8, 0, 8), 32) is None  # below, but not whole rows
    assert join((0, 4, 0, 8), (0, 4, 12, 16), 32) is None  # a gap
    assert join((0, 4, 0, 8), (1, 5, 8, 12), 32) is None  # other rows
    assert join((0, 4, 8, 12), (0, 4, 0, 8), 32) is None  # order matters
