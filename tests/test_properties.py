"""Property-based tests (hypothesis) over shapes, collectives, algorithms, topologies,
dtypes and split-K, under several rank counts; see tests/mpi/properties.py for the
properties. The cases are derandomized, so CI sees the same ones every run;
T3EMU_PROPERTY_EXAMPLES scales the count up for a longer search."""

import os

import pytest

from tests.conftest import run_mpi_script

EXAMPLES = int(os.environ.get("T3EMU_PROPERTY_EXAMPLES", "25"))


@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 5, 8])
def test_emulator_properties(ranks):
    examples = EXAMPLES if ranks <= 5 else max(1, EXAMPLES // 3)
    proc = run_mpi_script("properties.py", ranks, str(examples), timeout=600)
    assert proc.returncode == 0, f"{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    assert f"properties hold for {examples} cases on {ranks} ranks" in proc.stdout
