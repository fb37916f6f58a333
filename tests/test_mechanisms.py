"""The engine's mechanisms beyond T3: new producers (GEMV, elementwise), per-WG gates,
every executor kind (the WG itself, DMA engines, pulls, flags, NIC, a CU kernel),
several DMA engines, persistent kernels, launch costs, and a configuration loaded
from a file of one's own. Data against numpy + MPI's collectives; events checked."""

import numpy as np
import pytest

from devices.spec import load_device
from tests.conftest import ROOT, run_cli, run_mpi_script

PLUGIN = str(ROOT / "run" / "configs" / "pull_ag_gemm.py")
DEVICE = str(ROOT / "tests" / "data" / "four-dma.toml")


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("ranks", [1, 2, 3, 4, 8])
def test_producers_and_executors_against_numpy_and_mpi(ranks, dtype):
    proc = run_mpi_script("mechanisms.py", ranks, dtype, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    cases = "gemv-allreduce persistent-nic cu-rs" if ranks > 1 else "gemv-allreduce cu-rs"
    assert f"MECHANISMS OK {cases} on {ranks} ranks {dtype}" in proc.stdout, proc.stdout


def test_gemv_and_sum_kernels_match_numpy():
    from devices import kernels

    rng = np.random.default_rng(3)
    for dt in (np.float16, np.float32):
        a = rng.integers(-3, 4, (37, 29)).astype(dt)
        x = rng.integers(-3, 4, (29, 2)).astype(dt)
        tiles = np.array([[0, 20, 0, 2, 0, 29], [20, 37, 0, 1, 0, 29], [20, 37, 1, 2, 0, 29]],
                         np.int64)
        out = np.full((37, 2), np.nan, np.float32)
        kernels.gemv_rows(kernels.widen(a), kernels.widen(x), tiles, out)
        assert np.array_equal(out, a.astype(np.float32) @ x.astype(np.float32))
        srcs = [rng.standard_normal((5, 7)).astype(dt) for _ in range(3)]
        acc = np.empty((5, 7), np.float32)
        for j, s in enumerate(srcs):
            kernels.sum_into(acc, s, first=j == 0)
        want = srcs[0].astype(np.float32) + srcs[1].astype(np.float32) + srcs[2].astype(np.float32)
        assert np.array_equal(acc, want)  # the same order: bit-exact
    with pytest.raises(ValueError, match="fp32 accumulator"):
        kernels.sum_into(np.empty((2, 2), np.float16), np.empty((2, 2), np.float16))


def test_elementwise_and_gemv_costs_are_memory_bound():
    from devices.spec import load_device
    from emulator.engine.producers import Elementwise, Gemv, Source
    from emulator.model.cost import CostModel

    spec = load_device("t3-sim")
    model = CostModel(spec, "fp16")
    items = np.array([[0, 128, 0, 128, 0, 1]], np.int64)
    flops, compute, reads = Elementwise(((Source("S"), Source("S", 128)),)).cost(model, items)
    assert reads == 2 * 128 * 128 * 2 and flops == 128 * 128
    assert compute == pytest.approx(flops * spec.wgs_per_stage / spec.vector_flops("fp16"))
    gemv = np.array([[0, 128, 0, 1, 0, 4096]], np.int64)
    flops, compute, reads = Gemv().cost(model, gemv)
    assert reads == (128 * 4096 + 4096) * 2  # the weights once, the vector once
    assert compute == pytest.approx(flops * spec.wgs_per_stage / spec.vector_flops("fp16"))


def test_the_fixed_tile_runs_at_its_matrix_efficiency_and_the_counterfactual_removes_it():
    """A fixed-tile stage's compute: max WG FLOPs x S / (P x matrix_efficiency), by hand,
    behind its pipeline's prologue (one load latency L; t3-sim gives L = 216 ns, and each
    of its 12 K steps of 64 computes longer than L, so the steps are not latency-bound);
    the gemm-efficiency counterfactual puts it back at the peak; vector work is not
    scaled. With L longer than a K step, the steps wait for the loads: L + 12 L."""
    import dataclasses

    from devices.spec import load_device
    from emulator.model.ablation import ablate
    from emulator.model.cost import CostModel

    spec = dataclasses.replace(load_device("t3-sim"), matrix_efficiency=0.8)
    wgs = np.array([[0, 128, 0, 128, 0, 768], [128, 256, 0, 64, 0, 768]], np.int64)
    slots, peak = spec.wgs_per_stage, spec.peak_flops("fp16")
    by_hand = 2 * 128 * 128 * 768 * slots / peak  # the largest WG's share of the peak
    lat = spec.mem_latency_s
    assert lat == pytest.approx(216e-9) and by_hand / 12 > lat
    _, compute, _ = CostModel(spec, "fp16").gemm_compute(wgs)
    assert compute == pytest.approx(lat + by_hand / 0.8)
    _, compute, _ = CostModel(ablate(spec, ("gemm-efficiency",)), "fp16").gemm_compute(wgs)
    assert compute == pytest.approx(lat + by_hand)
    slow = dataclasses.replace(spec, mem_latency_s=10e-6)  # a latency beyond a K step
    _, compute, _ = CostModel(slow, "fp16").gemm_compute(wgs)
    assert compute == pytest.approx(10e-6 + 12 * 10e-6)
    gemv = np.array([[0, 128, 0, 1, 0, 4096]], np.int64)
    _, v, _ = CostModel(spec, "fp16").gemm_compute(gemv, vector=True)
    _, v1, _ = CostModel(ablate(spec, ("gemm-efficiency",)), "fp16").gemm_compute(gemv,
                                                                                   vector=True)
    assert v == v1


@pytest.mark.parametrize("ranks", [2, 3, 4])
def test_a_plugin_configuration_pulls_with_per_wg_gates_on_several_engines(emulate, ranks):
    doc = emulate(["-n", str(ranks), "--configs", PLUGIN, "--collective", "ag+gemm",
                   "--topology", "full-mesh", "--device", DEVICE, "--m", "517", "--n", "300",
                   "--k", "129", "--mode", "t3,pull-ag-gemm", "--trace",
                   str(ROOT / ".pytest_cache" / f"pull-{ranks}.json")])
    runs = {r["mode"]: r for r in doc["runs"]}
    assert all(r["numerics_pass"] for r in doc["runs"])
    import json

    trace = json.loads((ROOT / ".pytest_cache" / f"pull-{ranks}.json").read_text())
    names = [e.get("name", "") for e in trace["traceEvents"]]
    pulls = [n for n in names if " <- " in n]  # DMA pulls, on the reader
    assert len(pulls) >= ranks * (ranks - 1), names[:50]
    groups = [n for n in names if " group " in n]  # stages split where WG gates differ
    assert groups, names[:50]
    launches = [e for e in trace["traceEvents"] if e.get("cat") == "launch"]
    assert launches and all(e["dur"] == pytest.approx(2.0) for e in launches)  # 2 us each
    assert runs["pull-ag-gemm"]["modelled_time_s"] > 0
    timing = emulate(["-n", str(ranks), "--configs", PLUGIN, "--collective", "ag+gemm",
                      "--topology", "full-mesh", "--device", DEVICE, "--m", "517", "--n", "300",
                      "--k", "129", "--mode", "t3,pull-ag-gemm", "--timing-only"])
    for a, b in zip(doc["runs"], timing["runs"], strict=True):  # the same model, no payload
        for key in ("modelled_time_s", "rank_phases_s", "dram_bytes_per_rank"):
            assert a[key] == b[key], (a["mode"], key)


def test_the_example_plugin_on_a_ring_is_refused_before_launch_naming_its_topologies(
        no_launch):
    """It pulls from every peer: on a ring of 4 (neighbours only) it is refused in one line
    before any process starts, naming the topologies it runs on; a ring of 3 links every
    pair, so it runs there."""
    env, marker = no_launch
    proc = run_cli(["run", "-n", "4", "--configs", PLUGIN, "--collective", "ag+gemm",
                    "--mode", "pull-ag-gemm", "--m", "256", "--n", "256", "--k", "64"],
                   timeout=120, env=env)
    assert proc.returncode == 2 and not marker.exists(), proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "full-mesh, switch or pcie" in lines[0] \
        and "ring of 4 GPUs does not" in lines[0], proc.stderr
    from emulator.app.catalog import plugins_forgotten, registry

    spec = load_device(DEVICE)
    with plugins_forgotten():  # (the test process's registry stays as it was)
        assert registry((PLUGIN,)).refusal("pull-ag-gemm", spec, "fp16", 3) == ""
    assert "pull-ag-gemm" not in registry().configurations
