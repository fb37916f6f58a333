"""FiCCO (Pal et al., FiCCO, arXiv:2512.10236; collectives/ficco.py): every schedule and baseline for
the all-gather (SP+TP, ``ag+gemm``) and all-to-all dispatch (EP, ``a2a+gemm``) feeding a
GEMM, against numpy + MPI's ``Allgatherv`` / ``Alltoallv`` on 2, 3, 4 and 8 ranks with
uneven chunks (fp32 bit-exact with integer inputs, fp16 within tolerance), timing-only
equal to numeric, the 2D copy knob, the heuristic's rule and the engine's multi-launch
kernels and local copies."""

import numpy as np
import pytest

from collectives import ficco
from collectives.common import Problem
from devices.spec import load_device
from tests.ops import SAME_AS_NUMERIC, check_numerics_and_timing_only

MODES = ("ficco-uniform-fused-1d,ficco-hetero-fused-1d,ficco-hetero-unfused-1d,"
         "ficco-uniform-fused-2d,ficco-shard,ficco-ideal,ficco-auto,ficco-cu,sequential,"
         "ficco-serial,ficco-dil,ficco-cil,c3," + ",".join(f"ficco-cu-{s}" for s in ficco.SCHEDULES))
# uneven: M = 203 rows over W ranks, pieces of M / W^2 rows, K not a multiple of W
SHAPE = ["--m", "203", "--n", "40", "--k", "37"]


def _where(ranks: int) -> list[str]:
    return ["-n", str(ranks), "--device", "mi300x", "--topology", "full-mesh"]


@pytest.mark.parametrize("operation", ["ag+gemm", "a2a+gemm"])
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_numerics_and_timing_only_on_2_3_4_8_ranks(emulate, operation, ranks):
    base = [*_where(ranks), "--collective", operation, *SHAPE, "--mode", MODES]
    exact = check_numerics_and_timing_only(emulate, base)
    assert [r["mode"] for r in exact["runs"]] == MODES.split(",")


@pytest.mark.parametrize("operation", ["ag+gemm", "a2a+gemm"])
def test_the_coalesced_path_times_as_the_tile_level_path(emulate, operation):
    """Timing-only runs compute tiles and work items when a stage asks and route plain
    stages in bulk; with ``tile_level=1`` every tile and item is an array and a numeric
    run routes tile by tile: the same modelled times, phases and DRAM bytes."""
    base = [*_where(4), "--collective", operation, "--m", "1000", "--n", "300",
            "--k", "200", "--mode", MODES]
    coalesced = emulate(base + ["--timing-only"])
    tiles = emulate(base + ["--timing-only", "--param", "tile_level=1"])
    numeric = emulate(base + ["--param", "tile_level=1"])
    for a, b, c in zip(coalesced["runs"], tiles["runs"], numeric["runs"], strict=True):
        assert c["numerics"] == "pass", c["mode"]
        for key in SAME_AS_NUMERIC:
            assert a[key] == b[key] == c[key], (a["mode"], key)


def test_every_schedule_runs_with_cu_driven_transfers_and_ficco_cu_is_the_picked_one(emulate):
    """FiCCO-CU for all four schedules: each moves its pieces by CU-driven transfers on a
    share of the CUs instead of DMA engines (another time than the DMA form's); ficco-cu
    is the heuristic's schedule run so, to the picosecond, whether it reuses the job's run
    of its pick or runs alone."""
    modes = [f"ficco-{s}" for s in ficco.SCHEDULES] + [f"ficco-cu-{s}" for s in ficco.SCHEDULES]
    where = ["--system", "mi300x-x8", "--collective", "ag+gemm", "--m", "8192", "--n", "1024",
             "--k", "8192", "--timing-only", "--mode"]
    doc = emulate(where + [",".join(modes + ["ficco-cu", "ficco-auto"])])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    for s in ficco.SCHEDULES:
        assert t[f"ficco-cu-{s}"] != t[f"ficco-{s}"], s
    runs = {r["mode"]: r for r in doc["runs"]}
    picked = runs["ficco-cu"]["search"]["chosen"]
    # the heuristics took the job's runs of their picks; run alone, they build and run
    # their own plans, and give the same results field by field
    assert runs["ficco-cu"]["same_as"] == picked.replace("ficco-", "ficco-cu-")
    assert runs["ficco-auto"]["same_as"] == picked
    alone = {r["mode"]: r for r in emulate(where + ["ficco-cu,ficco-auto"])["runs"]}
    for m in ("ficco-cu", "ficco-auto"):
        assert alone[m]["same_as"] is None and alone[m]["wall_time_s"] > 0
        for key in SAME_AS_NUMERIC:
            assert alone[m][key] == runs[m][key], (m, key)
    assert t["ficco-cu"] == t[picked.replace("ficco-", "ficco-cu-")]


def test_normal_values_and_strided_2d_copies(emulate):
    """Normal values within the stated tolerance; strided 2D copies (a DMA command per
    band of tile rows) move the same data as the emulated 1D copies, later."""
    base = [*_where(4), "--collective", "a2a+gemm", "--m", "600", "--n", "64", "--k", "96",
            "--mode", "ficco-uniform-fused-2d"]
    one = emulate(base + ["--values", "normal"])
    strided = emulate(base + ["--values", "normal", "--param", "copy2d=0"])
    assert one["runs"][0]["numerics"] == strided["runs"][0]["numerics"] == "pass"
    assert strided["runs"][0]["modelled_time_s"] > one["runs"][0]["modelled_time_s"]


def test_shard_overlap_is_slower_than_ficco_on_a_full_mesh_and_ideal_bounds_all(emulate):
    """The design's finding at a shape where communication matters: shard-based overlap
    uses one link per step, FiCCO every link; the ideal is below every schedule."""
    doc = emulate(["--system", "mi300x-x8", "--collective", "ag+gemm", "--m", "8192",
                   "--n", "1024", "--k", "8192", "--timing-only", "--mode", MODES])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    assert t["ficco-shard"] > t["sequential"] and t["ficco-shard"] > t["ficco-serial"]
    assert min(t[f"ficco-{s}"] for s in ficco.SCHEDULES) < t["ficco-shard"]
    assert t["ficco-ideal"] <= min(v for m, v in t.items() if m not in ("ficco-ideal",
                                                                        "ficco-dil", "ficco-cil"))
    # FiCCO's gains are over its serial baseline; ficco-auto says what it picked and why
    runs = {r["mode"]: r for r in doc["runs"]}
    for m in ("ficco-auto", "ficco-cu", "ficco-shard", "ficco-ideal"):
        assert runs[m]["baseline"] == "ficco-serial"
        assert runs[m]["speedup"] == pytest.approx(t["ficco-serial"] / t[m], rel=1e-12)
        assert runs[m]["overlap_efficiency"] == pytest.approx(
            (t["ficco-serial"] - t[m]) / (t["ficco-serial"] - runs["ficco-serial"]
                                          ["gemm_alone_s"]), rel=1e-9)
    assert runs["ficco-dil"]["speedup"] is None and runs["ficco-dil"]["ect_s"] is None
    pick = ficco.pick(_problem(8192, 1024, 8192))
    assert runs["ficco-auto"]["search"]["chosen"] == f"ficco-{pick}"
    assert "M = 8192 <= K = 8192" in runs["ficco-auto"]["search"]["why"]


def _problem(m, n, k, **params):
    spec = load_device("mi300x")
    return Problem(0, 8, m, n, k, spec, np.dtype(np.float16),
                   params=tuple(params.items()))


def test_the_heuristic_follows_the_stated_rule():
    spec = load_device("mi300x")
    balance = spec.peak_flops("fp16") / spec.hbm_bw
    assert ficco.pick(_problem(16384, 2048, 131072)) == "uniform-fused-2d"  # M <= K

    def otb(m, n, k):
        return 2 * m * n * k / (2 * (m * k + n * k + m * n))
    for m, n, k in [(131072, 2048, 16384), (262144, 1024, 8192), (1 << 20, 7168, 8192),
                    (147456, 28672, 4096), (8192, 64, 4096)]:
        x = otb(m, n, k) / balance
        want = ("uniform-fused-1d" if x < 1 else "hetero-unfused-1d" if x > 5
                else "hetero-fused-1d")
        assert ficco.pick(_problem(m, n, k)) == want, (m, n, k, x)
    # the thresholds are parameters
    assert ficco.pick(_problem(8192, 64, 4096, otb_low=0.0, otb_high=0.0)) == \
        "hetero-unfused-1d"


def test_a_ficco_scenario_sweeps_and_reports_speedups_the_heuristic_and_the_losses(tmp_path):
    """A sweep of every FiCCO configuration and its report: speedups over serial, the
    heuristic's pick against the oracle with the agreement rate per set, DIL and CIL (with
    shard-based overlap's), and the four figures."""
    import json

    from tests.conftest import ROOT, run_pooled

    out = tmp_path / "sweep"
    proc = run_pooled(["sweep", str(ROOT / "tests" / "data" / "tiny-ficco.toml"),
                       "--timing-only", "--out", str(out)], timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    t1 = {r["mode"]: r for r in doc["points"][0]["runs"]}
    phases = t1["ficco-dil"]["phases"]
    assert {"comm", "comm8", "gemm", "rows8-512", "k8-1024", "rows64-64", "k64-128"} <= \
        set(phases)
    cil = t1["ficco-cil"]["phases"]
    assert {"cil-dma.kernel", "cil-dma.executors", "cil-cu.kernel", "rows8", "shard-comm",
            "shard-gemm", "cil-shard.kernel", "cil-shard.executors"} <= set(cil)
    # shard-based overlap's transfers alone: one peer after another, slower than FiCCO's
    # pieces on every link at once
    assert cil["shard-comm"] > cil["comm8"]
    # 64-way decomposition by K loses more than 8-way (the design's finding)
    assert 64 * phases["k64-128"] > 8 * phases["k8-1024"] > phases["gemm"]
    proc = run_pooled(["report", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout
    assert "Speedup over the serial baseline" in text and "oracle" in text
    assert "agreement on the paper set: " in text and "agreement on the synthetic set: " in text
    assert "DIL rows x64" in text and "CIL comm cu" in text and "CIL gemm shard" in text
    for fig in ("ficco_speedup.png", "ficco_losses.png", "ficco_losses_vs_shape.png",
                "ficco_heuristic.png"):
        assert (out / fig).is_file(), fig
