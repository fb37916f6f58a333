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


def test_bench_papers_part_compares_with_the_recorded_points(tmp_path):
    """The papers part (toy sizes) runs each paper's point timing-only and with causes;
    run again against the first run's document, it gives the ratio of each wall time to
    the recorded one and finds the same modelled times."""
    first, second = tmp_path / "first.json", tmp_path / "second.json"
    proc = run_cli(["bench", "--quick", "--only", "papers", "--json", str(first),
                    "--against", str(tmp_path / "none.json")], timeout=60)
    assert proc.returncode == 2 and "--against" in proc.stderr  # no such file: refused
    proc = run_cli(["bench", "--only", "papers", "--papers", "t3,gpt"], timeout=60)
    assert proc.returncode == 2 and "--papers" in proc.stderr
    proc = run_cli(["bench", "--quick", "--only", "papers", "--json", str(first)], timeout=900)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(first.read_text())
    assert set(doc["papers"]) == {"t3", "flux", "fused", "ficco"}
    for paper, e in doc["papers"].items():
        assert e["timing_only_wall_s"] > 0 and e["causes_wall_s"] > 0, paper
        assert "timing_only_ratio" not in e, paper  # toy options: none recorded to compare
        only, causes = e["timing_only_modelled"], e["causes_modelled"]
        assert set(only) == set(causes) and len(only) >= 3, paper
        for mode, times in causes.items():  # the run itself, then its counterfactual steps
            assert times[0] == only[mode][0] > 0, (paper, mode)  # (the baseline: none)
        assert sum(len(t) > 1 for t in causes.values()) >= 2, paper
    proc = run_cli(["bench", "--quick", "--only", "papers", "--papers", "t3,fused", "--json",
                    str(second), "--against", str(first)], timeout=900)
    assert proc.returncode == 0, proc.stderr
    again = json.loads(second.read_text())["papers"]
    assert set(again) == {"t3", "fused"}
    for paper, e in again.items():
        for kind in ("timing_only", "causes"):
            assert e[f"{kind}_ratio"] == e[f"{kind}_wall_s"] / doc["papers"][paper][
                f"{kind}_wall_s"], (paper, kind)
            assert e[f"{kind}_same_modelled"] is True, (paper, kind)
    assert "x recorded" in proc.stdout and "modelled times equal the recorded" in proc.stdout
