"""The whole matrix of collectives, algorithms, topologies and modes; T3's orderings."""

import pytest

from tests.ops import COLLECTIVES, TOPOLOGIES, matrix_modes, splits, supported
from tests.conftest import run_cli, run_mpi_script


@pytest.mark.parametrize("ranks", [2, 8])
def test_every_supported_combination_passes_numerics(ranks):
    """On 3 and 4 ranks the same numeric runs (and more: every mode, each beside its
    timing-only twin) are tests/test_timing_only.py's."""
    proc = run_mpi_script("matrix.py", ranks, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    combos = [(c, a, t) for c in COLLECTIVES for t in TOPOLOGIES for a in ("ring", "direct")
              if supported(c, a, t)]
    twice = [(c, a, t) for c, a, t in combos if t == "full-mesh" and splits(c)]  # split 1, 2
    assert f"MATRIX OK {len(combos) + len(twice)} combinations on {ranks} ranks" in proc.stdout
    # every mode of every combination printed a PASS line, none a FAIL
    passes = [line for line in proc.stdout.splitlines() if "PASS (max err" in line]
    expected = sum(len(matrix_modes(c, a, ranks, t)) * (2 if (c, a, t) in twice else 1)
                   for c, a, t in combos)
    assert len(passes) == expected and "FAIL" not in proc.stdout


def test_t3_orderings_on_the_balanced_case(emulate):
    """Per device M=N=2048, K=512, 8 ranks on a ring (the issue's balanced case)."""
    doc = emulate(["-n", "8", "--collective", "ar", "--topology", "ring", "--mode", "all",
                   "--m", "2048", "--n", "2048", "--k", "512", "--dtype", "fp16"])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    assert all(r["numerics_pass"] for r in doc["runs"])
    assert t["ideal-rs-nmc"] <= t["ideal-overlap"] <= t["sequential"]
    assert t["t3-mca"] <= t["t3"] < t["sequential"]
    dram = {r["mode"]: sum(r["dram_bytes"].values()) for r in doc["runs"]}
    assert dram["t3"] < dram["sequential"]
    # the ideal configurations come from the isolated runs of the same model
    runs = {r["mode"]: r for r in doc["runs"]}
    iso = runs["ideal-overlap"]["phases"]
    assert t["ideal-overlap"] == pytest.approx(max(iso["gemm"], iso["rs"]) + iso["ag"],
                                               rel=1e-9, abs=1e-6)
    seq = runs["sequential"]["phases"]
    assert iso["gemm"] == pytest.approx(seq["gemm"]) and iso["rs"] == pytest.approx(seq["rs"])


@pytest.mark.parametrize("args, message", [
    (["--algorithm", "direct"], "direct needs --topology full-mesh or switch"),
    (["--collective", "a2a", "--topology", "ring"],
     "--collective a2a needs --topology full-mesh or switch"),
    (["--collective", "a2a", "--topology", "switch", "--algorithm", "ring"],
     "--collective a2a runs direct"),
    (["--collective", "ag", "--mode", "ideal-rs-nmc"], "reductions only"),
    (["--topology", "torus"], "allowed: ring, full-mesh, switch"),
    (["--split-k", "0"], "--split-k"),
    (["--algorithm", "tree"], "allowed: ring, direct"),
])
def test_unsupported_combinations_are_refused_before_launch(args, message):
    proc = run_cli(["run", "-n", "2", *args], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
