"""Flux's GEMM + reduce-scatter configurations (collectives/flux.py). Their numerics on
2, 3, 4 and 8 ranks, fp16 and fp32, split-K 1 and 2, uneven shapes, are in the whole
matrix (tests/test_collectives.py), and timing-only against numeric in
tests/test_timing_only.py: both run every configuration of every direct RS."""

import pytest

from tests.conftest import run_cli
from tests.ops import modes_for

FLUX = ("flux-rs-w", "flux-rs-a", "flux-rs-w-noswizzle", "flux-rs-a-noswizzle")
FLUX_AG = ("flux-ag", "flux-ag-tile2", "flux-ag-tile4", "flux-ag-noswizzle")


def test_flux_configurations_run_the_direct_rs_only():
    assert set(FLUX) | {"flux-best"} <= set(modes_for("rs", "direct"))
    assert not set(FLUX) & set(modes_for("rs", "ring"))
    assert not set(FLUX) & set(modes_for("ar", "direct"))
    assert set(FLUX_AG) <= set(modes_for("ag-gemm", "direct"))
    assert not set(FLUX_AG) & set(modes_for("ag-gemm", "ring"))
    proc = run_cli(["run", "-n", "2", "--collective", "rs", "--topology", "ring", "--mode",
                    "flux-rs-w"], timeout=60)
    assert proc.returncode == 2
    assert "it runs --algorithm direct" in proc.stderr


def test_flux_on_gpt3_rs_shape_swizzle_helps_and_rs_w_pays_its_reduction(emulate):
    """GPT-3 175B's GEMM-RS at TP 8 (m = 8192: 8192 x 12288 over k = 6144) on 8 A100s
    behind NVSwitch, timing-only."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", "rs", "--topology",
                   "switch", "--m", "8192", "--n", "12288", "--k", "6144", "--timing-only",
                   "--mode", "sequential,te-overlap," + ",".join(FLUX)])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    # TransformerEngine-style RS: each step adds the received partial before sending
    # on, so the chunk GEMMs and transfers serialise: slower than not overlapping
    assert t["te-overlap"] > t["sequential"]
    for mode in ("flux-rs-w", "flux-rs-a"):  # one writer per destination at a time
        assert t[mode] <= t[mode + "-noswizzle"]
        assert t[mode] < t["sequential"]
    rs_w = next(r for r in doc["runs"] if r["mode"] == "flux-rs-w")
    # the owner's reduction reads the N blocks of its chunk (M/8 x N each, fp16) and
    # writes the chunk once: 9 x 1024 x 12288 x 2 bytes on each of the 8 GPUs
    assert rs_w["phases"]["reduce"] > 0
    per_gpu = 1024 * 12288 * 2
    assert rs_w["dram_bytes"]["rs_read"] >= 8 * 8 * per_gpu


def test_flux_ag_gemm_on_gpt3_shape_swizzle_and_tiles(emulate):
    """GPT-3 175B's AG-GEMM at TP 8 (m = 8192: gather 8192 x 12288, then 8192 x 6144 x
    12288 per rank) on 8 A100s behind NVSwitch, timing-only."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", "ag-gemm", "--topology",
                   "switch", "--m", "8192", "--n", "6144", "--k", "12288", "--timing-only",
                   "--mode", "sequential,flux-best,te-overlap," + ",".join(FLUX_AG)])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    # flux-best: the fastest of the same configurations run on their own in this job
    best = min(FLUX_AG, key=lambda m: t[m])
    search = next(r["search"] for r in doc["runs"] if r["mode"] == "flux-best")
    assert search["chosen"] == best and t["flux-best"] == t[best]
    assert set(search["candidates_s"]) == set(FLUX_AG)  # not the TransformerEngine baseline
    assert t["flux-best"] < t["te-overlap"]
    assert t["flux-ag"] < t["sequential"]
    assert t["flux-ag"] < t["flux-ag-noswizzle"]  # own rows first: no wait for chunk 0
    # the exposed head is the first communication tile: smaller tiles start the GEMM
    # sooner on this shape (Flux: no size wins everywhere)
    assert t["flux-ag-tile4"] < t["flux-ag"]
    for r in doc["runs"]:
        assert r["overlap_efficiency"] is not None and r["overlap_efficiency"] < 1.0


def test_medium_grained_baseline_is_slower_than_not_overlapping_at_small_m(emulate):
    """Flux: TransformerEngine-style overlap can lose to no overlap at small m: m = 1024
    gives chunk GEMMs of 128 rows, each its own launch and a whole wave of WGs."""
    doc = emulate(["-n", "8", "--device", "a100-sxm", "--collective", "ag-gemm", "--topology",
                   "switch", "--m", "1024", "--n", "6144", "--k", "12288", "--timing-only",
                   "--mode", "sequential,te-overlap,flux-best"])
    t = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    assert t["te-overlap"] > t["sequential"] > t["flux-best"]
    te = next(r for r in doc["runs"] if r["mode"] == "te-overlap")
    assert len(te["phases"]) == 8 and te["overlap_efficiency"] < 0  # N steps, a loss
