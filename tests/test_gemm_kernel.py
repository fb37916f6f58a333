"""The GEMM kernel model (``emulator/model/gemm.py``) against hand arithmetic on a toy
device (tests/data/gemm-kernel.toml): the heuristic's predicted times and its tile
choice, waves and tile quantisation, latency-bound K loops, the stage compute the
cost model charges, a whole run's stages; and ``[gemm]`` sections refused when
malformed."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.conftest import ROOT, run_cli, run_pooled

DEVICE = ROOT / "tests" / "data" / "gemm-kernel.toml"
P32 = 2 * 1e9 * 1024  # 2 CUs x 1 GHz x 1024 FLOP/cycle (fp32)
ETA = 0.5  # the toy main loop's efficiency
LAT = 500e-9  # the toy memory latency
BW = 1000e9


def _spec():
    from devices.spec import load_device

    return load_device(str(DEVICE))


def _close(a: float, b: float) -> bool:
    return abs(a - b) <= 1e-9 * max(abs(a), abs(b))


# hand arithmetic: a K step of 64 takes 2 tm tn 64 x S / (P eta); the pipeline hides the
# latency when a step is longer than L / (stages - 1) = 250 ns; a WG over K = 256 takes
# L (prologue) + 4 steps
STEP_128 = 2 * 128 * 128 * 64 * 2 / (P32 * ETA)  # S = 2 CUs x 1 per CU: 4.096 us
STEP_64 = 2 * 64 * 64 * 64 * 4 / (P32 * ETA)  # S = 2 x 2: 2.048 us
WG_128 = LAT + 4 * STEP_128  # 16.884 us
WG_64 = LAT + 4 * STEP_64  # 8.692 us


def test_the_heuristic_predicts_waves_of_whole_tiles_and_picks_the_least():
    from emulator.model.gemm import candidates, choose

    spec = _spec()
    # 256 x 256 x 256: 128-tiles: 4 tiles, 2 waves of 2; 64-tiles: 16 tiles, 4 waves of 4
    c = candidates(spec, 256, 256, 256, 1, "fp32")
    dp = [k for k in c if k.split_k == 1 and not k.stream_k]
    assert [(k.tile_m, k.tile_n) for k in dp] == [(128, 128), (64, 64)]
    assert _close(dp[0].predicted_s, 2 * WG_128) and _close(dp[1].predicted_s, 4 * WG_64)
    # no partial wave remains, so no stream-K; the tiles fill the waves, so no split-K
    assert all(k.split_k == 1 and not k.stream_k for k in c)
    assert choose(spec, 256, 256, 256, 1, "fp32") == c[0] == dp[0]
    # 128 x 128 x 256: one 128-tile on a wave of 2 slots: split-K 2 (one wave of 2 WGs over
    # 2 steps each: L + 2 STEP_128) is a candidate, and ties with the 64-tile's one wave of
    # 4 WGs over 4 half steps (ties go to the larger tile)
    one = candidates(spec, 128, 128, 256, 1, "fp32")
    s2 = next(k for k in one if (k.tile_m, k.split_k) == (128, 2))
    assert _close(s2.predicted_s, LAT + 2 * STEP_128) and one[0] == s2
    # 64 rows: a 128-row tile still computes all its rows (tile quantisation), so its 2
    # tiles take one wave of WG_128, while 4 64-tiles take one wave of WG_64
    thin = [k for k in candidates(spec, 64, 256, 256, 1, "fp32") if k.split_k == 1
            and not k.stream_k]
    assert (thin[0].tile_m, thin[0].tile_n) == (64, 64)
    assert _close(thin[0].predicted_s, WG_64) and _close(thin[1].predicted_s, WG_128)


def test_a_thin_gemm_over_a_long_k_is_split_over_the_idle_wgs():
    from emulator.model.gemm import candidates, choose

    spec = _spec()
    # 64 x 64 x 4096: one 64-tile, one WG of 64 steps on a wave of 4 slots: L + 64 STEP_64;
    # split-K 4: its 4 WGs each take 16 steps, one wave: L + 16 STEP_64 (the partials'
    # 2 x 4 x 64 x 64 x 4 B and the operands' 2.1 MB at the HBM take far less); stream-K
    # spreads the same 64 iterations over the same 4 WGs (a tie: split-K is preferred)
    c = candidates(spec, 64, 64, 4096, 1, "fp32")
    pick = choose(spec, 64, 64, 4096, 1, "fp32")
    assert (pick.tile_m, pick.split_k, pick.stream_k) == (64, 4, False)
    assert _close(pick.predicted_s, LAT + 16 * STEP_64)
    dp = next(k for k in c if (k.tile_m, k.split_k, k.stream_k) == (64, 1, False))
    sk = next(k for k in c if (k.tile_m, k.stream_k) == (64, True))
    assert _close(dp.predicted_s, LAT + 64 * STEP_64) and _close(sk.predicted_s,
                                                                 pick.predicted_s)
    assert pick.fixup_bytes(1, 4096, spec.cus) == 2 * 4 * 64 * 64 * 4
    # split-K only where it leaves every WG a K step and fits a wave: K = 128 (2 steps)
    assert {k.split_k for k in candidates(spec, 64, 64, 128, 1, "fp32")} == {1, 2}
    # a run that splits K itself gets data-parallel kernels only
    assert {(k.split_k, k.stream_k) for k in candidates(spec, 64, 64, 4096, 2, "fp32")} \
        == {(1, False)}


def test_stream_k_spreads_a_partial_waves_iterations_over_every_wg():
    from emulator.model.gemm import choose

    spec = _spec()
    # 64 x 192 x 4096: three 64-tiles on a wave of 4 slots. Data-parallel: L + 64 STEP_64;
    # split-K 4: a stage holds one tile, three stages of L + 16 STEP_64 (99.8 us); stream-K:
    # the 3 x 64 iterations over the 4 WGs, 48 each: L + 48 STEP_64 (98.8 us)
    pick = choose(spec, 64, 192, 4096, 1, "fp32")
    assert (pick.tile_m, pick.split_k, pick.stream_k) == (64, 1, True)
    assert _close(pick.predicted_s, LAT + 48 * STEP_64)
    assert pick.stage_wgs(3, 4096, spec.cus) == (4, 48)
    # a full wave runs data-parallel: 4 items, one WG each over all 64 steps
    assert pick.stage_wgs(4, 4096, spec.cus) == (4, 64)
    assert pick.fixup_bytes(4, 4096, spec.cus) == 0


def test_a_short_k_step_waits_for_memory_latency():
    from emulator.model.gemm import GemmKernel

    # a 16 x 16 tile with a 2-stage pipeline: a step's compute (64 ns at S = 2) is shorter
    # than the latency it must hide (500 ns / 1 step in flight), so each step takes 500 ns
    k = GemmKernel(16, 16, 1, 64, 2, ETA, LAT, modelled=True)
    step = 2 * 16 * 16 * 64 * 2 / (P32 * ETA)
    assert step < LAT
    assert _close(k.wg_seconds(256, 2, P32), LAT + 4 * LAT)
    # three stages: two steps in flight hide half each
    k3 = GemmKernel(16, 16, 1, 64, 3, ETA, LAT, modelled=True)
    assert _close(k3.wg_seconds(256, 2, P32), LAT + 4 * LAT / 2)


def test_a_k_step_waits_for_the_l2_when_its_panels_outrun_it():
    from emulator.model.gemm import GemmKernel

    # the 128 tile's step computes in 4.096 us; its 2 WGs load 2 x (128 + 128) x 64 x 4 B =
    # 128 KiB from an L2 of 10 GB/s in 13.1 us: the step takes that
    k = GemmKernel(128, 128, 1, 64, 3, ETA, LAT, l2_bw=10e9, elem_bytes=4, modelled=True)
    loads = 2 * 256 * 64 * 4 / 10e9
    assert loads > STEP_128 and _close(k.wg_seconds(256, 2, P32), LAT + 4 * loads)
    fast = GemmKernel(128, 128, 1, 64, 3, ETA, LAT, l2_bw=1e15, elem_bytes=4, modelled=True)
    assert _close(fast.wg_seconds(256, 2, P32), WG_128)


def test_the_cost_model_charges_a_stage_its_kernels_clock():
    from emulator.model.cost import CostModel
    from emulator.model.gemm import choose

    spec = _spec()
    kern = choose(spec, 256, 256, 256, 1, "fp32")
    cost = CostModel(spec, "fp32")
    full = np.array([[0, 128, 0, 128, 0, 256], [0, 128, 128, 256, 0, 256]], np.int64)
    thin = np.array([[0, 40, 0, 128, 0, 256]], np.int64)  # an edge tile of 40 rows
    flops, t, _ = cost.gemm_compute(full, kernel=kern)
    assert flops == 2 * 2 * 128 * 128 * 256 and _close(t, WG_128)
    flops, t, _ = cost.gemm_compute(thin, kernel=kern)  # useful FLOPs, the whole tile's time
    assert flops == 2 * 40 * 128 * 256 and _close(t, WG_128)
    # a wider tile of a thin chunk (16 x 1024: 1x the tile's area) is charged its area
    wide = np.array([[0, 16, 0, 1024, 0, 256]], np.int64)
    _, t, _ = cost.gemm_compute(wide, kernel=kern)
    assert _close(t, WG_128)
    # without a kernel (the device's fixed tile at the peak): the WG's own FLOPs x S / P
    _, t, _ = cost.gemm_compute(thin)
    assert _close(t, 2 * 40 * 128 * 256 * spec.wgs_per_stage / P32)


def test_without_a_gemm_section_the_fixed_tile_runs_at_the_peak():
    from devices.spec import load_device
    from emulator.model.gemm import GemmKernel, choose

    spec = load_device(str(ROOT / "tests" / "data" / "event-log.toml"))
    k = choose(spec, 256, 256, 256, 1, "fp32")
    assert k == GemmKernel(128, 128, 1) and not k.modelled


@pytest.mark.parametrize("ranks", [1, 2])
def test_a_run_times_its_gemm_in_waves_of_the_chosen_kernel(tmp_path, ranks):
    # the sequential GEMM + RS: each rank's GEMM is 256 x 256 x 256 (fp32); the heuristic
    # picks the 128 tile (2 waves of 2 tiles). Each stage:
    # its compute (WG_128; its reads, capped at their bytes / compute, end with it), then
    # its two tiles' writes (2 x 64 KiB at the HBM); the GEMM alone is the two stages
    out = tmp_path / "run.json"
    r = run_pooled(["run", "--device", str(DEVICE), "-n", str(ranks), "--collective", "gemm+rs",
                    "--mode", "sequential", "--m", "256", "--n", "256", "--k", "256",
                    "--dtype", "fp32", "--timing-only", "--json", str(out)], timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    kern = doc["gemm_kernel"]
    assert kern["tile"] == "128x128x64" and kern["wgs_per_cu"] == 1 and kern["modelled"]
    stage = WG_128 + 2 * 128 * 128 * 4 / BW  # (the run's first kernel pays no launch gap)
    assert _close(doc["runs"][0]["gemm_alone_s"], 2 * stage), doc["runs"][0]
    assert "GEMM kernel (the library's heuristic): tile 128x128x64" in r.stdout


@pytest.mark.parametrize("ranks,timing", [(1, True), (2, True), (2, False)])
def test_a_run_times_a_split_k_kernel_as_one_stage_of_its_wgs(tmp_path, ranks, timing):
    # each rank's GEMM is 64 x 64 x 4096 (fp32): the heuristic splits the one tile's K over
    # the wave's 4 WGs (test above); the GEMM is one stage: its compute L + 16 STEP_64 (its
    # reads, 2.2 MB with the partials, take 2.2 us at the HBM), then the tile's write; a
    # numeric run checks the whole tile computed as one item of the plan
    out = tmp_path / "run.json"
    r = run_pooled(["run", "--device", str(DEVICE), "-n", str(ranks), "--collective", "gemm+rs",
                    "--mode", "sequential", "--m", "64", "--n", "64", "--k", "4096",
                    "--dtype", "fp32", "--json", str(out)] + (["--timing-only"] if timing else []),
                   timeout=300)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(out.read_text())
    kern = doc["gemm_kernel"]
    assert (kern["tile"], kern["split_k"], kern["stream_k"]) == ("64x64x64", 4, False)
    stage = LAT + 16 * STEP_64 + 64 * 64 * 4 / BW
    assert _close(doc["runs"][0]["gemm_alone_s"], stage), doc["runs"][0]
    assert "tile 64x64x64 split-K 4," in r.stdout
    assert timing or "PASS" in r.stdout


def test_the_gemm_command_prints_the_candidates_and_the_pick():
    r = run_cli(["gemm", "--device", str(DEVICE), "--m", "256", "--n", "256", "--k", "256",
                 "--dtype", "fp32"], timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    rows = [ln.split() for ln in r.stdout.splitlines() if ln.strip().startswith(("128x", "64x"))]
    assert [x[0] for x in rows] == ["128x128x64", "64x64x64"]
    # tile, WGs/CU, WGs, waves, predicted us
    assert rows[0][1:4] == ["1", "4", "2.00"] and rows[1][1:4] == ["2", "16", "4.00"]
    assert abs(float(rows[0][4]) - 2 * WG_128 * 1e6) < 0.05
    assert abs(float(rows[1][4]) - 4 * WG_64 * 1e6) < 0.05
    assert "<- the heuristic's pick" in r.stdout.splitlines()[-2]
    bad = run_cli(["gemm", "--device", str(DEVICE), "--m", "0", "--n", "1", "--k", "1"])
    assert bad.returncode == 2 and "--m" in bad.stderr


@pytest.mark.parametrize("m,algorithm", [(256, "ring"), (512, "ring"), (256, "direct")])
def test_flux_ag_with_tiles_spanning_chunks_runs_and_checks(m, algorithm):
    # chunks of m / 4 rows under the 128-row tile: the GEMM's tiles span two chunks and it
    # reads them over several stages, so a rank's own push is gated by a later stage than
    # the forwards (ring) or the sinks of peers' rows (direct) that gate its first stage;
    # the push goes first (the program order deadlocked here before), numerics against
    # numpy + MPI
    mode = "flux-ag-ring" if algorithm == "ring" else "flux-ag"
    r = run_pooled(["run", "--device", str(DEVICE), "-n", "4", "--topology", "switch",
                    "--algorithm", algorithm, "--collective", "ag+gemm", "--mode",
                    f"{mode},sequential", "--m", str(m), "--n", "512", "--k", "128",
                    "--dtype", "fp32", "--watchdog-s", "30"], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("PASS") == 2


def _problem(world: int, m: int, n: int, k: int):
    from collectives.common import Problem

    return Problem(0, world, m, n, k, _spec(), np.dtype(np.float32))


def _launch_kernels(mode: str, collective: str, p) -> set:
    """The kernels the GEMM launches of configuration ``mode`` run."""
    from emulator.app.catalog import registry

    reg = registry(())
    plan = reg.configuration(mode).build(p, reg.operation(collective), "direct")
    return {ph.kernel.producer.kernel for ph in plan.phases
            if getattr(ph, "kernel", None) is not None and len(ph.kernel.wgs)}


def test_launches_with_kernels_of_their_own_compute_the_right_numbers():
    # the same shapes as below, run: TE's chunk GEMMs and FiCCO's decomposed launches tile
    # C with the kernels chosen for their shapes, the sequential GEMM with the 128 tile;
    # numerics against numpy + MPI's all-gather
    modes = ["sequential", "te-ring", "ficco-uniform-fused-1d", "ficco-hetero-unfused-1d",
             "ficco-uniform-fused-2d"]
    r = run_pooled(["run", "--device", str(DEVICE), "-n", "4", "--topology", "switch",
                    "--algorithm", "direct", "--collective", "ag+gemm", "--mode", ",".join(modes),
                    "--m", "512", "--n", "128", "--k", "256", "--dtype", "fp32",
                    "--watchdog-s", "60"], timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert r.stdout.count("PASS") == len(modes), r.stdout


def test_gemm_launches_run_the_kernel_chosen_for_their_shape():
    from emulator.model.gemm import choose

    # 4 ranks, m = 512: the whole GEMM (512 x 128 x 256) picks the 128 tile data-parallel
    # (4 tiles: 2 full waves), a chunk GEMM of 128 rows its one 128 tile split-K 2 (one wave
    # of 2 WGs over 2 steps each: L + 2 STEP_128, tied with the 64 tile's one wave of 4 WGs
    # over 4 half steps; ties go to the larger tile)
    p = _problem(4, 512, 128, 256)
    whole, chunk = choose(_spec(), 512, 128, 256, 1, "fp32"), choose(_spec(), 128, 128, 256,
                                                                     1, "fp32")
    assert (whole.tile_m, whole.split_k, chunk.tile_m, chunk.split_k) == (128, 1, 128, 2)
    assert p.kernel == whole
    assert _launch_kernels("sequential", "ag+gemm", p) == {whole}
    # TransformerEngine's ring exchange: one GEMM per chunk, each its own heuristic's pick
    assert _launch_kernels("te-ring", "ag+gemm", p) == {chunk}
    # FiCCO's decomposed schedules: launches of a gathered block (uniform fused 1D: m / 4
    # rows), of a piece (unfused: m / 16 rows) or over a K block (2D: all rows, K / 4)
    for mode, shape in [("ficco-uniform-fused-1d", (128, 128, 256)),
                        ("ficco-hetero-unfused-1d", (32, 128, 256)),
                        ("ficco-uniform-fused-2d", (512, 128, 64))]:
        assert _launch_kernels(mode, "ag+gemm", p) == {choose(_spec(), *shape, 1, "fp32")}, mode
    # gemm+ag: each rank computes only its own chunk
    from types import SimpleNamespace

    from emulator.app.catalog import registry
    from emulator.app.runs import problem

    cfg = SimpleNamespace(m=512, n=128, k=256, dtype="fp32", split_k=1, seed=0,
                          operation=registry(()).operation("gemm+ag"),
                          resolved_params=lambda: ())
    assert problem(SimpleNamespace(rank=0, size=4), cfg, _spec()).kernel == chunk

BAD = [
    ('tiles = []\nmainloop_efficiency = 0.5', "non-empty list"),
    ('tiles = [{m = 128, n = 128, k = 64, stages = 3}]\nmainloop_efficiency = 0.5',
     "tiles[0] missing key 'per_cu'"),
    ('tiles = [{m = 128, n = 128, k = 64, stages = 1, per_cu = 1}]\nmainloop_efficiency = 0.5',
     "must be >= 2"),
    ('tiles = [{m = 0, n = 128, k = 64, stages = 3, per_cu = 1}]\nmainloop_efficiency = 0.5',
     "impossible hardware"),
    ('tiles = [{m = 128, n = 128, k = 64, stages = 3, per_cu = 1}]\nmainloop_efficiency = 1.5',
     "mainloop_efficiency = 1.5 must be in (0, 1]"),
    ('tiles = [{m = 128, n = 128, k = 64, stages = 3, per_cu = 1}]', "mainloop_efficiency"),
    ('tiles = [{m = 128, n = 128, k = 64, stages = 3, per_cu = 1}]\n'
     'mainloop_efficiency = 0.5\nwarps = 4', "unknown key(s) ['warps']"),
]


@pytest.mark.parametrize("section,message", BAD)
def test_a_malformed_gemm_section_is_refused(tmp_path, section, message):
    from devices.spec import SpecError, load_device

    text = DEVICE.read_text().split("\n[gemm]\n")[0] + "\n[gemm]\n" + section + "\n"
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(SpecError) as exc:
        load_device(str(path))
    assert message in str(exc.value)
    r = run_pooled(["run", "--device", str(path), "--timing-only", "-n", "1"], timeout=120)
    assert r.returncode == 2 and message in r.stderr, r.stderr[-2000:]
