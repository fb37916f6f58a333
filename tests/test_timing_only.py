"""Timing-only mode: the same modelled model as a numeric run, without payloads."""

import pytest

from tests.ops import COLLECTIVES, TOPOLOGIES, modes_for, splits, supported
from tests.conftest import run_mpi_script


@pytest.mark.parametrize("ranks", [3, 4])
def test_timing_only_equals_numeric_for_every_combination(ranks, tmp_path):
    proc = run_mpi_script("timing_only.py", ranks, str(tmp_path), timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    runs = sum(len(modes_for(c, a, ranks, t)) for c in COLLECTIVES for t in TOPOLOGIES
               for a in ("ring", "direct") if supported(c, a, t))
    assert f"TIMING SAME {runs} runs on {ranks} ranks" in proc.stdout
    unsplit = sum(len(modes_for(c, a, ranks, "full-mesh")) for c in COLLECTIVES
                  for a in ("ring", "direct") if supported(c, a, "full-mesh") and splits(c))
    assert f"UNSPLIT PASS {unsplit} runs on {ranks} ranks" in proc.stdout


def test_timing_only_at_paper_scale_matches_numeric(emulate):
    """A T3-sized shape (8 ranks, fp16 AR) where the numeric run is still affordable."""
    args = ["-n", "8", "--m", "4096", "--n", "2048", "--k", "1024", "--mode", "sequential,t3"]
    numeric = emulate(args)
    timing = emulate(args + ["--timing-only"])
    for a, b in zip(numeric["runs"], timing["runs"], strict=True):
        assert a["numerics"] == "pass" and b["numerics"] == "timing-only"
        assert a["modelled_time_s"] == b["modelled_time_s"]
        assert a["rank_phases_s"] == b["rank_phases_s"]
        assert a["dram_bytes_per_rank"] == b["dram_bytes_per_rank"]
