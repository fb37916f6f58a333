"""The fused computation-collective operators (Punniyamurthy et al., SC 2024;
collectives/embedding.py, collectives/fused_ops.py): numerics against numpy + MPI's
collectives on 2, 3, 4 and 8 ranks (fp32 bit-exact with integer inputs, fp16 within
the reference's tolerance), timing-only equal to numeric, the scale-out form across two
emulated hosts, the skew of the two task orders, and the occupancy trade-off."""

import json

import numpy as np
import pytest

from tests.conftest import ROOT, run_cli, run_pooled
from tests.ops import SAME_AS_NUMERIC, check_numerics_and_timing_only

SHAPES = {
    "emb+a2a": ["--m", "203", "--n", "24", "--k", "5", "--param", "tables=3",
                "--param", "rows=50", "--param", "slice=8"],
    "gemv+ar": ["--m", "1001", "--n", "3", "--k", "77"],
    "gemm+a2a": ["--m", "517", "--n", "96", "--k", "129"],
}
MODES = {"emb+a2a": "sequential,ideal-overlap,fused,fused-oblivious",
         "gemv+ar": "sequential,ideal-overlap,fused", "gemm+a2a": "sequential,fused"}
TWO_BY_TWO = str(ROOT / "tests" / "data" / "mi210-2x2.toml")


def _where(ranks: int) -> list[str]:
    """MI210s fully connected (its 3 links reach 4 GPUs), behind a switch at 8."""
    return ["-n", str(ranks), "--device", "mi210",
            "--topology", "full-mesh" if ranks <= 4 else "switch"]


@pytest.mark.parametrize("operation", list(SHAPES))
@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_numerics_and_timing_only_on_2_3_4_8_ranks(emulate, operation, ranks):
    base = [*_where(ranks), "--collective", operation, *SHAPES[operation],
            "--mode", MODES[operation]]
    check_numerics_and_timing_only(emulate, base)


def test_normal_values_pass_within_the_stated_tolerance(emulate):
    doc = emulate([*_where(3), "--collective", "emb+a2a", *SHAPES["emb+a2a"], "--values",
                   "normal", "--mode", "sequential,fused"])
    assert {r["numerics"] for r in doc["runs"]} == {"pass"}


@pytest.mark.parametrize("system,hosts", [("mi210-2node", "n0,n1"), (TWO_BY_TWO, "n0,n1")])
def test_scale_out_embedding_across_two_emulated_hosts(tmp_path, system, hosts):
    """Slices put through the NIC (and, on 2 x 2, stored straight into the node peer):
    the same data and modelled times on two emulated hosts as on one."""
    args = ["--system", system, "--collective", "emb+a2a", *SHAPES["emb+a2a"],
            "--dtype", "fp32", "--mode", "sequential,fused,fused-oblivious"]
    docs = []
    for where in ([], ["--hosts", hosts, "--same-machine"]):
        out = tmp_path / f"{len(where)}.json"
        proc = run_pooled(["run", *args, *where, "--json", str(out)], timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        docs.append(json.loads(out.read_text())["runs"])
    for a, b in zip(*docs, strict=True):
        assert a["numerics"] == b["numerics"] == "pass" and a["max_abs_error"] == 0.0
        for key in SAME_AS_NUMERIC:
            assert a[key] == b[key], (system, a["mode"], key)


@pytest.mark.parametrize("operation", ["gemv+ar", "gemm+a2a"])
def test_the_zero_copy_operators_are_refused_across_nodes(operation):
    """Their WGs store into peers' memory, which no GPU can do across the network: refused
    before launch (exit 2, one line naming why); --mode all leaves them out and runs the
    rest; on 2 nodes x 2 GPUs too (a peer on the other node), not on one node of 4."""
    proc = run_pooled(["run", "--system", "mi210-2node", "--collective", operation,
                       *SHAPES[operation], "--mode", "fused", "--timing-only"], timeout=60)
    assert proc.returncode == 2 and "no GPU can issue to another node" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_pooled(["run", "--system", "mi210-2node", "--collective", operation,
                       *SHAPES[operation], "--mode", "all", "--timing-only"], timeout=120)
    assert proc.returncode == 0 and "fused" not in proc.stderr.split("sequential", 1)[1]
    for system, rc in ((TWO_BY_TWO, 2), ("mi210x4", 0)):
        proc = run_pooled(["run", "--system", system, "--collective", operation,
                           *SHAPES[operation], "--mode", "fused", "--timing-only"], timeout=60)
        assert proc.returncode == rc, proc.stderr


def test_communication_aware_order_cuts_the_skew_between_nodes(emulate):
    """Two nodes: in index order rank 0 pools its own samples first and sends its remote
    slices last, so rank 1 waits for them at the end; remote slices first removes it."""
    doc = emulate(["--system", "mi210-2node", "--collective", "emb+a2a", "--m", "1024",
                   "--n", "256", "--k", "70", "--param", "tables=16", "--timing-only",
                   "--mode", "sequential,fused,fused-oblivious"])
    skew = {r["mode"]: max(r["rank_skew"]) for r in doc["runs"]}
    assert skew["fused-oblivious"] > 1.005 > skew["fused"], skew
    times = {r["mode"]: r["modelled_time_s"] for r in doc["runs"]}
    assert times["fused"] < times["fused-oblivious"] < times["sequential"], times


def test_time_falls_then_rises_with_occupancy(emulate):
    """The model's occupancy trade-off: few WGs leave the HBM idle (latency), many lose
    DRAM row locality (memory contention)."""
    times = {}
    for occ in (0.05, 0.3, 1.0):
        doc = emulate(["--system", "mi210x4", "--collective", "emb+a2a", "--m", "512",
                       "--n", "256", "--k", "70", "--param", "tables=8", "--param",
                       "fixed_lookups=1", "--param",
                       f"occupancy={occ}", "--mode", "fused", "--timing-only"])
        times[occ] = doc["runs"][0]["modelled_time_s"]
    assert times[0.3] < times[0.05] and times[0.3] < times[1.0], times


def test_row_locality_and_latency_model():
    from devices.spec import load_device
    from emulator.model.cost import CostModel

    spec = load_device("mi210")
    cost = CostModel(spec, "fp16")
    eff = [cost.row_efficiency(p, 512) for p in (1, 100, 400, 800)]
    assert eff[0] > eff[1] > eff[2] > eff[3] > 0.5  # R = 8 accesses per row, miss = 2 hits
    assert eff[0] == pytest.approx(8 / (2 + 7 * (1 / (1 + 1 / 512) + (1 - 1 / (1 + 1 / 512)) * 2)))
    assert cost.latency_time(4096) == pytest.approx(345e-9)  # 4 KB in flight per 345 ns
    items = np.array([[0, 2, 0, 256, 0, 70]], np.int64)  # 2 bags of 70 rows of D = 256
    flops, compute, reads = cost.gather_compute(items, 256, 8)
    assert reads == 2 * 70 * (256 * 2 + 8) and flops == 2 * 70 * 256
    assert compute == pytest.approx(cost.latency_time(reads))


def test_embedding_bag_kernel_matches_numpy():
    from devices import kernels

    rng = np.random.default_rng(5)
    T, rows, D, L, B = 3, 11, 7, 4, 9
    table = rng.standard_normal((T * rows, D)).astype(np.float32)
    ids = rng.integers(0, rows, (B, T * L)).astype(np.int64)
    items = np.array([[s, s + 1, t * D, (t + 1) * D, t * L, (t + 1) * L]
                      for s in range(B) for t in range(T)], np.int64)
    out = np.full((B, T * D), np.nan, np.float32)
    kernels.embedding_bags(table, ids, rows, items, out)
    for t in range(T):
        want = np.zeros((B, D), np.float32)
        for j in range(L):  # ascending j, as the kernel adds
            want += table[t * rows + ids[:, t * L + j]]
        assert np.array_equal(out[:, t * D:(t + 1) * D], want)
    with pytest.raises(ValueError, match="row ids outside"):
        kernels.embedding_bags(table, ids + rows, rows, items, out)


@pytest.mark.parametrize("param,message", [
    ("tabels=3", "takes"), ("tables=0", "tables must be from 1"),
    ("occupancy=1.5", "occupancy must be from"), ("slice=2.5", "slice must be an integer"),
    ("tables", "NAME=VALUE"), ("tables=inf", "must be a finite number")])
def test_bad_parameters_are_refused_before_launch(param, message):
    proc = run_pooled(["run", "-n", "2", "--device", "mi210", "--topology", "full-mesh",
                       "--collective", "emb+a2a", "--param", param], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr and "--param" in proc.stderr, proc.stderr


FUSED_CASES = ROOT / "tests" / "data" / "tiny-fused.toml"


def test_fused_scenario_sweeps_params_and_reports_the_designs_views(tmp_path):
    from emulator.app.scenario import load_scenario

    sc = load_scenario(str(FUSED_CASES))
    keys = [p.key for p in sc.points]
    assert len(keys) == 2 + 2 + 1  # two batches, two occupancies, one GEMV shape
    assert "Tiny DLRM/occupancy/m128/tp2/mi210-2node/occupancy=0.1,tables=4" in keys
    gemv = {p.key: p for p in sc.points}["Tiny decoder/GEMV+AR/m512/tp4/mi210x4"]
    assert (gemv.m, gemv.n, gemv.k) == (512, 1, 256)  # k split over the 4 GPUs
    out = tmp_path / "sweep"
    proc = run_pooled(["sweep", str(FUSED_CASES), "--timing-only", "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    csv = (out / "results.csv").read_text().splitlines()
    assert "params" in csv[0] and "max_rank_skew" in csv[0]
    assert any("occupancy=0.1" in line for line in csv[1:])
    proc = run_pooled(["report", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "time against occupancy" in proc.stdout and "cut %" in proc.stdout
    for fig in ("fused_time.png", "fused_skew.png", "fused_occupancy.png"):
        assert (out / fig).is_file(), fig
    # interrupted before results.json was written: the points' own JSONs (system points,
    # whose jobs run without --device) are taken as done, not run again
    before = (out / "results.csv").read_text()
    (out / "results.json").unlink()
    proc = run_pooled(["sweep", str(FUSED_CASES), "--timing-only", "--out", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"{len(keys)} already done" in proc.stderr and "(0 run now" in proc.stderr
    assert (out / "results.csv").read_text() == before


def test_bad_scenario_params_are_refused(tmp_path):
    from emulator.app.scenario import ScenarioError, load_scenario

    for change, message in ((("tables = 4, slice", "tablez = 4, slice"), "params.tablez"),
                            (("occupancy = [0.1, 1.0]", "occupancy = [0.1, 2.0]"),
                             "occupancy must be from")):
        path = tmp_path / "bad.toml"
        path.write_text(FUSED_CASES.read_text().replace(*change, 1))
        with pytest.raises(ScenarioError, match=message):
            load_scenario(str(path))


def test_split_k_is_refused_where_the_producer_does_not_split():
    proc = run_pooled(["run", "-n", "2", "--device", "mi210", "--topology", "full-mesh",
                       "--collective", "gemv+ar", "--split-k", "2"], timeout=60)
    assert proc.returncode == 2 and "does not split K" in proc.stderr, proc.stderr


def test_a_batch_smaller_than_a_slice_across_nodes(emulate):
    """Each GPU's 10 samples are one short slice per table (S = 32 by default)."""
    doc = emulate(["--system", "mi210-2node", "--collective", "emb+a2a", "--m", "20",
                   "--n", "16", "--k", "3", "--param", "tables=2", "--dtype", "fp32",
                   "--mode", "sequential,fused,fused-oblivious"])
    for run in doc["runs"]:
        assert run["numerics"] == "pass" and run["max_abs_error"] == 0.0, run["mode"]


def test_bag_lengths_follow_dlrm_s_random_data_generator(emulate):
    """Each lookup pools round(max(1, r min(rows, L))) rows (DLRM's dlrm_data_pytorch.py),
    drawn from the seed and the rank; fixed_lookups=1 pools exactly L. The pooled rows
    are what the kernels read: fewer DRAM bytes than L per bag."""
    from collectives.embedding import bag_lengths

    got = bag_lengths(1, 0, 20000, 4, 1000, 10, False)
    assert got.min() == 1 and got.max() == 10
    # r L uniform on [0, 10): P(1) = P(r L < 1.5) = 0.15, P(k) = 0.1 for k = 2..9,
    # P(10) = P(r L >= 9.5) = 0.05: mean 0.15 + 0.1 x 44 + 0.05 x 10 = 5.05
    assert abs((got == 1).mean() - 0.15) < 0.01 and abs((got == 10).mean() - 0.05) < 0.01
    assert abs(got.mean() - 5.05) < 0.05
    assert (bag_lengths(1, 0, 5, 2, 1000, 10, True) == 10).all()
    assert not np.array_equal(got, bag_lengths(1, 1, 20000, 4, 1000, 10, False))  # per rank
    assert not np.array_equal(got, bag_lengths(2, 0, 20000, 4, 1000, 10, False))  # per seed
    assert (bag_lengths(1, 0, 100, 2, 3, 10, False) <= 3).all()  # min(rows, L)
    base = [*_where(2), "--collective", "emb+a2a", *SHAPES["emb+a2a"], "--mode",
            "sequential,fused", "--timing-only"]
    random = emulate(base)["runs"][0]["dram_bytes_per_rank"]
    fixed = emulate(base + ["--param", "fixed_lookups=1"])["runs"][0]["dram_bytes_per_rank"]
    assert all(r["gemm_read"] < f["gemm_read"] for r, f in zip(random, fixed)), (random, fixed)
