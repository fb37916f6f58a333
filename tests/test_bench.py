"""``t3emu bench`` runs end to end (toy sizes: the figures are checked for shape and
sanity here; the real figures are measured by the bench itself, never asserted)."""

import json

from tests.conftest import run_cli


def test_bench_quick_parts_write_every_figure(tmp_path):
    out = tmp_path / "bench.json"
    proc = run_cli(["bench", "--quick", "--only", "gemm,overhead,startup,memory,size",
                    "--json", str(out)], timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    for key in ("gemm_vs_numpy_ratio", "gemm_vs_numpy_ratio_fp16", "overhead_vs_bare_ratio",
                "startup_s_2", "startup_s_4", "startup_timing_only_s_4", "rss_mb_per_rank"):
        assert doc[key] > 0, key
    assert set(doc["targets"]) == {"gemm_vs_numpy_ratio", "overhead_vs_bare_ratio"}
    over = doc["details"]["overhead"]
    assert over["ranks"] == 4 and len(over["wall_s"]["t3"]) == over["reps"] == 2
    assert doc["details"]["gemm"]["blas_threads"] == "1"
    assert doc["machine"]["cores"] >= 1 and "MPICH" in doc["machine"]["mpi"]
    assert [e["numerics"] for e in doc["details"]["size"].values()] == [["pass", "pass"]] * 2
    assert "gemm_vs_numpy_ratio" in proc.stdout and "startup_s_4" in proc.stdout


def test_bench_sweep_part_counts_points(tmp_path):
    proc = run_cli(["bench", "--quick", "--only", "sweep", "--scenario", "tests/data/tiny.toml",
                    "--json", str(tmp_path / "b.json")], timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "b.json").read_text())
    assert doc["details"]["sweep"]["points"] == 10  # Tiny-A: 4 sublayers x TP 2, 4; Tiny-B: 2
    assert doc["timing_only_points_per_min"] > 0
    assert doc["details"]["sweep"]["same_modelled_times"] is True  # pooled and separate
    assert doc["sweep_pooled_speedup"] > 0


def test_bench_refuses_bad_parts_before_running():
    proc = run_cli(["bench", "--only", "gemm,warp"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "--only" in proc.stderr
