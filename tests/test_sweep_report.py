"""Scenarios, sweeps (atomic results, resume after SIGKILL), reports, figures, traces."""

import csv
import json
import math
import re
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from emulator.app.scenario import ScenarioError, gemm_shape, load_scenario
from emulator.app.sweep import CSV_COLUMNS
from tests import conftest
from tests.conftest import ROOT, run_cli, run_pooled

TINY = ROOT / "tests" / "data" / "tiny.toml"


def test_t3_paper_scenario_shapes_follow_the_rules():
    sc = load_scenario("t3-paper")
    pts = {p.key: p for p in sc.points}
    # Mega-GPT-2 and T-NLG: 4 sub-layers x TP 8, 16; GPT-3, PALM, MT-NLG: 2 x TP 32
    assert len(pts) == 2 * 4 * 2 + 3 * 2
    assert set(sc.modes) == {"sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc"}
    tnlg = pts["T-NLG/FC-2/tp8/t3-sim"]
    assert (tnlg.m, tnlg.n, tnlg.k, tnlg.direction) == (8192, 4256, 4 * 4256 // 8, "fwd")
    ip = pts["Mega-GPT-2/IP/tp16/t3-sim"]
    assert (ip.m, ip.n, ip.k, ip.direction) == (16384, 3072, 3 * 3072 // 16, "bwd")
    op = pts["GPT-3/OP/tp32/t3-sim"]
    assert (op.m, op.n, op.k) == (2048, 12288, 12288 // 32)
    big = load_scenario("t3-2x-cu")
    # GPU-2X-CU: the t3-sim GPU with twice its CUs, one line of the scenario
    assert {p.device for p in big.points} == {"t3-sim"}
    assert {p.overrides for p in big.points} == {(("gpu.cus", 160),)}
    assert sorted((p.model, p.sublayer, p.tp) for p in big.points) == sorted(
        (p.model, p.sublayer, p.tp) for p in sc.points if p.tp == 32)


def test_gemm_shape_rules():
    sc = load_scenario(str(TINY))
    model = sc.models[0]
    assert gemm_shape(model, "OP", 2) == (512, 512, 256)
    assert gemm_shape(model, "FC-1", 4) == (512, 512, 512)


@pytest.mark.parametrize("text, message", [
    ("name = \"x\"\nmodels = [", "malformed TOML"),
    ("name = 1", "name must be a str"),
    ("name = \"x\"\ncolour = \"red\"", "unknown key(s) ['colour']"),
    ("name = \"x\"", "missing key 'dtype'"),
])
def test_bad_scenario_files_are_refused(tmp_path, text, message):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=re.escape(message)):
        load_scenario(str(path))
    proc = run_pooled(["sweep", str(path), "--out", str(tmp_path / "o")], timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_bad_model_values_are_refused(tmp_path):
    text = TINY.read_text().replace("hidden = 512", "hidden = 0")
    path = tmp_path / "zero.toml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"models\[0\] hidden = 0 must be >= 1"):
        load_scenario(str(path))
    with pytest.raises(ScenarioError, match="unknown scenario 'nope'"):
        load_scenario("nope")


def _rows(out: Path) -> list[dict]:
    with open(out / "results.csv") as fh:
        return list(csv.DictReader(fh))


def test_sweep_writes_results_and_report_draws_figures(tmp_path):
    out = tmp_path / "sweep"
    proc = run_pooled(["sweep", str(TINY), "--out", str(out), "--timing-only"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    sc = load_scenario(str(TINY))
    rows = _rows(out)
    assert len(rows) == len(sc.points) * len(sc.modes)
    assert tuple(rows[0]) == CSV_COLUMNS
    for key in ("model", "sublayer", "tp", "m", "n", "k", "device", "mode", "modelled_time_s",
                "speedup_vs_sequential", "dram_bytes_total", "numerics"):
        assert key in rows[0]
    assert {r["numerics"] for r in rows} == {"timing-only"}
    seq = {(r["model"], r["sublayer"], r["tp"]): float(r["modelled_time_s"])
           for r in rows if r["mode"] == "sequential"}
    for r in rows:  # the speedup column is the ratio of the time columns
        ratio = seq[(r["model"], r["sublayer"], r["tp"])] / float(r["modelled_time_s"])
        assert float(r["speedup_vs_sequential"]) == pytest.approx(ratio, rel=1e-12)
        cats = sum(int(r[c]) for c in CSV_COLUMNS if c.startswith("dram_") and c != "dram_bytes_total")
        assert int(r["dram_bytes_total"]) == cats > 0
    doc = json.loads((out / "results.json").read_text())
    assert [p["key"] for p in doc["points"]] == [p.key for p in sc.points]

    rep = run_pooled(["report", str(out)], timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = rep.stdout
    for needle in ("Speedup over sequential", "geomean", "max", "DRAM traffic by category",
                   "GEMM reads", "RS reads", "reduction of t3 vs sequential",
                   "End-to-end estimate", "Tiny-A", "upper bound"):
        assert needle in text, needle
    # the geomean row is the geometric mean of the t3 column
    t3 = [seq[(r["model"], r["sublayer"], r["tp"])] / float(r["modelled_time_s"])
          for r in rows if r["mode"] == "t3"]
    geo = float(next(line for line in text.splitlines() if line.startswith("geomean"))
                .split()[1].rstrip("x"))
    assert geo == pytest.approx(math.exp(sum(math.log(x) for x in t3) / len(t3)), abs=5e-4)
    for name in ("speedup.png", "dram_traffic.png", "timeline.png", "stages.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name
    # the stage profile: rank 0's HBM bandwidth over its GEMM run alone adds up to the
    # GEMM bytes its HBM counted (another record: the per-rank traffic counters)
    for p in doc["points"]:
        runs = {r["mode"]: r for r in p["runs"]}
        prof = runs["sequential"]["stage_profile"]
        served = sum(sum(v) for v in prof["hbm_gb_per_s"].values()) * 1e9 * prof["bin_s"]
        point = json.loads((out / "points" / f"{p['key'].replace('/', '__')}.json").read_text())
        seq = next(r for r in point["runs"] if r["mode"] == "sequential")
        counted = seq["dram_bytes_per_rank"][0]
        # the profile is printed to 1 MB/s (3 decimals of GB/s): each bin of each stream
        # may be off by half of that over the bin's time
        printed = len(prof["hbm_gb_per_s"]) * len(prof["hbm_gb_per_s"]["gemm reads"]) \
            * 0.5e6 * prof["bin_s"]
        assert served == pytest.approx(counted["gemm_read"] + counted["gemm_write"],
                                       rel=1e-9, abs=printed)
        assert len(runs["t3"]["stage_profile"]["stages_s"]) == len(prof["stages_s"]) >= 1
        # Flux's metrics from the per-rank phase windows: the GEMM alone is the longest
        # rank's GEMM phase of the sequential run
        alone = max(e - s for ph in runs["sequential"]["rank_phases_s"]
                    for name, (s, e) in ph.items() if name == "gemm")
        base = runs["sequential"]["modelled_time_s"] - alone
        for r in p["runs"]:
            ect = r["modelled_time_s"] - alone
            assert r["ect_s"] == pytest.approx(ect, rel=1e-9)
            assert r["overlap_efficiency"] == pytest.approx(1 - ect / base, rel=1e-9)
    assert "Overlap efficiency" in text
    assert {r["mode"]: r["overlap_efficiency"] for r in rows}["sequential"] == "0.0"


def test_numeric_sweep_checks_numerics(tmp_path):
    text = TINY.read_text().replace("tp = [2, 4]", "tp = [2]").replace(
        'sublayers = ["OP", "FC-2", "FC-1", "IP"]', 'sublayers = ["OP"]')
    text = text[: text.index("[[models]]\nname = \"Tiny-B\"")]
    path = tmp_path / "one.toml"
    path.write_text(text)
    proc = run_pooled(["sweep", str(path), "--out", str(tmp_path / "o")], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert {r["numerics"] for r in _rows(tmp_path / "o")} == {"pass"}
    # the same directory cannot mix numeric and timing-only results
    mixed = run_pooled(["sweep", str(path), "--out", str(tmp_path / "o"), "--timing-only"],
                       timeout=60)
    assert mixed.returncode == 2 and "timing_only" in mixed.stderr


def test_sweep_and_report_run_a_configuration_of_ones_own(tmp_path):
    """A scenario naming a configuration from a file of one's own: refused without
    ``--configs``, swept (numerically) and reported with it, resumed only with it."""
    text = TINY.read_text().replace('collective = "ar"', 'collective = "ag+gemm"').replace(
        'topology = "ring"', 'topology = "full-mesh"').replace(
        'modes = ["sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc"]',
        'modes = ["sequential", "pull-ag-gemm"]').replace("tp = [2, 4]", "tp = [2]").replace(
        'sublayers = ["OP", "FC-2", "FC-1", "IP"]', 'sublayers = ["OP"]')
    text = text[: text.index("[[models]]\nname = \"Tiny-B\"")]
    path = tmp_path / "mine.toml"
    path.write_text(text)
    plugin = str(ROOT / "run" / "configs" / "pull_ag_gemm.py")
    out = tmp_path / "o"
    refused = run_pooled(["sweep", str(path), "--out", str(out)], timeout=60)
    assert refused.returncode == 2 and "pull-ag-gemm" in refused.stderr, refused.stderr
    proc = run_pooled(["sweep", str(path), "--out", str(out), "--configs", plugin], timeout=300)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    assert [r["mode"] for r in rows] == ["sequential", "pull-ag-gemm"]
    assert {r["numerics"] for r in rows} == {"pass"}
    seq, mine = (float(r["modelled_time_s"]) for r in rows)
    assert float(rows[1]["speedup_vs_sequential"]) == pytest.approx(seq / mine, rel=1e-12)
    rep = run_pooled(["report", str(out), "--no-figures"], timeout=120)
    assert rep.returncode == 0 and "pull-ag-gemm" in rep.stdout, rep.stderr
    again = run_pooled(["sweep", str(path), "--out", str(out)], timeout=60)
    assert again.returncode == 2 and "configs" in again.stderr, again.stderr


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT], ids=["SIGKILL", "Ctrl-C"])
def test_killed_sweep_resumes_without_losing_or_redoing_points(tmp_path, sig):
    out = tmp_path / "sweep"
    argv = [sys.executable, "-m", "emulator.app.cli", "sweep", str(TINY), "--out", str(out),
            "--timing-only"]
    # a terminal's Ctrl-C: SIGINT handled by default in the sweep (a test run started in the
    # background, e.g. `nohup ... &`, would otherwise pass SIGINT on ignored)
    proc = subprocess.Popen(argv, env=conftest.test_env(), cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    results = out / "results.json"
    sc = load_scenario(str(TINY))
    deadline = time.monotonic() + 120
    finished = 0  # points in results.csv (rewritten after every point; results.json at
    try:  # most every 20 s and at the end)
        while time.monotonic() < deadline:
            if (out / "results.csv").exists():
                finished = len(_rows(out)) // len(sc.modes)
                if finished >= 3:
                    break
            time.sleep(0.05)
    finally:  # the sweep, mpiexec and every rank, as kill -9 or a terminal's Ctrl-C does
        os.killpg(proc.pid, sig)
        try:
            _, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    assert finished >= 3, "the sweep did not get going"
    listed = json.loads(results.read_text())["points"]  # still valid JSON after SIGKILL
    if sig == signal.SIGINT:  # (a Ctrl-C writes every finished point into it)
        assert proc.returncode == 130 and "rerun the same command to resume" in err, err
        assert len(listed) >= finished
    kept = sorted((out / "points").glob("*.json"))  # complete files (atomic writes)
    assert len(kept) >= finished
    assert {p["key"].replace("/", "__") for p in listed} <= {f.stem for f in kept}
    stamps = {f: f.stat().st_mtime_ns for f in kept}
    assert len(kept) < len(sc.points), "killed too late to test a resume"
    again = run_pooled(["sweep", str(TINY), "--out", str(out), "--timing-only"], timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(kept)} already done" in again.stderr, again.stderr
    doc = json.loads(results.read_text())
    assert [p["key"] for p in doc["points"]] == [p.key for p in sc.points]  # none lost or twice
    for path, stamp in stamps.items():  # finished points were not run again
        assert path.stat().st_mtime_ns == stamp, path
    assert len(_rows(out)) == len(sc.points) * len(sc.modes)


def test_trace_is_a_perfetto_json_with_tracks_per_rank(tmp_path):
    trace = tmp_path / "t.json"
    proc = run_pooled(["run", "-n", "3", "--m", "600", "--n", "512", "--k", "128", "--mode",
                       "sequential,t3", "--timing-only", "--trace", str(trace),
                       "--json", str(tmp_path / "r.json")], timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    procs = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert sorted(procs.values()) == sorted(f"rank {r} · {m}" for r in range(3)
                                            for m in ("sequential", "t3"))
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    t3_pid = next(p for p, n in procs.items() if n == "rank 0 · t3")
    names = {n for p, n in threads if p == t3_pid}
    assert {"GEMM stages", "DMA engine", "tracker triggers", "AG kernel (CUs)"} <= names
    assert any(n.startswith("link to rank") for n in names)
    result = json.loads((tmp_path / "r.json").read_text())
    end_us = max(r["modelled_time_s"] for r in result["runs"]) * 1e6
    for e in events:
        if e["ph"] == "X":
            assert e["dur"] > 0 and 0 <= e["ts"] and e["ts"] + e["dur"] <= end_us * (1 + 1e-9)
        elif e["ph"] == "i":  # zero-length events: tracker triggers, data already landed
            assert 0 <= e["ts"] <= end_us * (1 + 1e-9)
    stages = [e for e in events if e["pid"] == t3_pid and e.get("cat") == "gemm" and e["ph"] == "X"]
    assert stages and all(e["name"].startswith("stage ") for e in stages)
    triggers = [e for e in events if e["pid"] == t3_pid and e.get("cat") == "tracker"]
    assert triggers and all(e["name"].endswith("complete") for e in triggers)


def test_trace_of_a_persistent_kernel_has_a_track_per_wg(tmp_path):
    """The fused GEMV + AR's persistent kernel (fair-share rounds): one track per physical
    WG, in WG order after the GEMM's, each WG's tasks on it and inside the run."""
    trace = tmp_path / "t.json"
    proc = run_pooled(["run", "-n", "2", "--device", "mi210", "--topology", "full-mesh",
                       "--collective", "gemv+ar", "--m", "1024", "--n", "4", "--k", "256",
                       "--mode", "fused", "--timing-only", "--trace", str(trace)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    events = json.loads(trace.read_text())["traceEvents"]
    pid = next(e["pid"] for e in events if e["name"] == "process_name"
               and e["args"]["name"] == "rank 0 · fused")
    tids = {e["tid"]: e["args"]["name"] for e in events
            if e["name"] == "thread_name" and e["pid"] == pid}
    wgs = [n for _, n in sorted(tids.items()) if n.startswith("WG ")]
    assert len(wgs) > 1 and wgs == [f"WG {j} (persistent kernel)" for j in range(len(wgs))]
    order = [n for _, n in sorted(tids.items())]
    assert order.index("GEMM stages") < order.index("WG 0 (persistent kernel)")
    tasks = [e for e in events if e["pid"] == pid and e.get("cat", "").startswith("wg")
             and e["ph"] == "X"]
    assert tasks and all(e["name"].startswith("task ") for e in tasks)
    assert {e["cat"] for e in tasks} == {f"wg{j}" for j in range(len(wgs))}


CASES = ROOT / "tests" / "data" / "tiny-cases.toml"


def test_cases_scenario_shapes_and_modes_follow_the_systems():
    """Flux's way of stating workloads: global shapes split over each system's GPUs, each
    point running the modes its system's algorithm has."""
    sc = load_scenario(str(CASES))
    pts = {p.key: p for p in sc.points}
    assert len(pts) == 2 * 2 * 2  # 2 operations x 2 systems x 2 m
    ag = pts["Tiny MLP/AG-GEMM/m256/tp4/pcie-2s2"]
    assert (ag.collective, ag.topology, ag.m, ag.n, ag.k) == ("ag+gemm", "pcie", 256, 256, 256)
    rs = pts["Tiny MLP/GEMM-RS/m64/tp4/sxm-2x2"]
    assert (rs.collective, rs.topology, rs.m, rs.n, rs.k) == ("gemm+rs", "switch", 64, 256, 256)
    assert "flux-rs-ring" not in rs.modes and {"flux-rs-a", "flux-best"} <= set(rs.modes)
    assert "flux-ag-ring2d" in ag.modes and "flux-ag" not in ag.modes
    flux = load_scenario("flux-paper")
    assert len(flux.points) == 2 * 3 * 6 + 2 * 3
    big = {p.key: p for p in flux.points}["GPT-3 175B/GEMM-RS/m8192/tp16/h800-2x8"]
    assert (big.m, big.n, big.k) == (8192, 12288, 49152 // 16)
    # bf16 (as Flux ran): no RS-A (no native bf16 atomics); TransformerEngine within a node
    assert flux.dtype == "bf16" and "flux-rs-a" not in big.modes and "flux-rs-w" in big.modes
    assert not any(m.startswith("te-") for m in big.modes)
    one = {p.key: p for p in flux.points}["GPT-3 175B/GEMM-RS/m8192/tp8/h800-x8"]
    assert "te-best" in one.modes and "flux-rs-a" not in one.modes


@pytest.mark.parametrize("change, message", [
    (("shard = \"n\"", "shard = \"m\""), "shard = 'm'"),
    (("n = 1024", "n = 1023"), "does not split over the 4 GPUs"),
    (("operation = \"ag+gemm\"", "operation = \"gemv\""), "operation = 'gemv'"),
    (("m = [64, 256]", "m = [2, 256]"), "at least one row per rank"),
    (("\"flux-ag\", ", "\"flux-rs-a\", \"nope\", "), "modes ['nope']"),
])
def test_bad_cases_are_refused(tmp_path, change, message):
    text = CASES.read_text().replace(*change, 1)
    path = tmp_path / "bad.toml"
    for name in ("pcie-2s2.toml", "sxm-2x2.toml"):  # the systems next to the original
        text = text.replace(f'"{name}"', f'"{CASES.parent / name}"')
    path.write_text(text)
    with pytest.raises(ScenarioError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_scenario(str(path))


def test_cases_sweep_and_report_give_flux_views(tmp_path):
    out = tmp_path / "cases"
    proc = run_pooled(["sweep", str(CASES), "--out", str(out), "--timing-only"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = _rows(out)
    sc = load_scenario(str(CASES))
    assert len(rows) == sum(len(p.modes) for p in sc.points)
    assert {r["system"] for r in rows} == {"pcie-2s2", "sxm-2x2"}
    assert {r["collective"] for r in rows} == {"ag+gemm", "gemm+rs"}
    for r in rows:  # the speedups over every baseline are the ratios of the time columns
        if r["speedups_vs_baselines"]:
            for pair in r["speedups_vs_baselines"].split(";"):
                base, value = pair.split("=")
                t = next(float(q["modelled_time_s"]) for q in rows if q["mode"] == base
                         and (q["system"], q["sublayer"], q["m"]) == (r["system"], r["sublayer"],
                                                                    r["m"]))
                assert float(value) == pytest.approx(t / float(r["modelled_time_s"]), rel=1e-12)
    chosen = {r["search_chosen"] for r in rows if r["mode"] == "flux-best"}
    assert chosen and chosen <= {r["mode"] for r in rows}
    rep = run_pooled(["report", str(out)], timeout=300)
    assert rep.returncode == 0, rep.stderr
    text = rep.stdout
    for needle in ("Flux's views per cluster", "AG-GEMM on pcie-2s2 (TP 4)",
                   "GEMM-RS on sxm-2x2 (TP 4)", "flux-best vs te-best",
                   "flux-best vs sequential", "flux-best chose",
                   "Overlap efficiency of every configuration"):
        assert needle in text, needle
    for name in ("flux_ect.png", "flux_efficiency.png"):
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10_000, name


def test_a_failing_point_stays_failed_and_reports_leave_it_out(tmp_path):
    """A point whose numerics FAIL makes the sweep exit 1; rerunning the same command (the
    documented resume) runs that point again and still exits 1 while it fails; `t3emu
    report` counts the failing runs, names them, and puts none of them in its tables."""
    scenario = tmp_path / "wrong.toml"
    scenario.write_text(TINY.read_text().replace(
        'modes = ["sequential", "t3", "t3-mca", "ideal-overlap", "ideal-rs-nmc"]',
        'modes = ["sequential", "t3", "no-collective"]').replace('tp = [2, 4]', 'tp = [2]')
        .replace('sublayers = ["OP", "FC-2", "FC-1", "IP"]', 'sublayers = ["OP"]')
        .replace('tp = [3]\nsublayers = ["FC-2", "OP"]', 'tp = [3]\nsublayers = ["OP"]'))
    out = tmp_path / "sweep"
    argv = ["sweep", str(scenario), "--out", str(out), "--configs",
            str(ROOT / "tests" / "data" / "no_collective.py")]
    first = run_cli(argv, timeout=300)
    assert first.returncode == 1 and "numerics FAIL in no-collective" in first.stderr, first.stderr
    points = sorted((out / "points").glob("*.json"))
    stamps = {f: f.stat().st_mtime_ns for f in points}
    again = run_cli(argv, timeout=300)
    assert again.returncode == 1, again.stderr
    assert "0 already done" in again.stderr  # every point holds a failing run: run again
    assert all(f.stat().st_mtime_ns != s for f, s in stamps.items())
    rep = run_pooled(["report", str(out)], timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = rep.stdout
    assert f"{len(points)} run(s) FAILED the numerics check" in text
    body = text.split("FAILED the numerics check", 1)[1].split("\n", 1)[1]
    assert "no-collective" not in body  # in no table or geomean
    doc = json.loads((out / "results.json").read_text())
    assert all(r["numerics"] == "fail" for p in doc["points"] for r in p["runs"]
               if r["mode"] == "no-collective")


DAMAGES = {
    "truncated": lambda text: text[:300],
    "not JSON": lambda text: "xx",
    "a list": lambda text: "[1, 2]",
    "runs not a list": lambda text: json.dumps({**json.loads(text), "points": [
        {**json.loads(text)["points"][0], "runs": "x"}]}),
    "a run without mode": lambda text: json.dumps({**json.loads(text), "points": [
        {**json.loads(text)["points"][0],
         "runs": [{k: v for k, v in r.items() if k != "mode"}
                  for r in json.loads(text)["points"][0]["runs"]]}]}),
    "a non-numeric time": lambda text: json.dumps({**json.loads(text), "points": [
        {**json.loads(text)["points"][0],
         "runs": [{**r, "modelled_time_s": "fast"}
                  for r in json.loads(text)["points"][0]["runs"]]}]}),
    "a point without its shape": lambda text: json.dumps({**json.loads(text), "points": [
        {k: v for k, v in json.loads(text)["points"][0].items() if k != "m"}]}),
}


@pytest.fixture(scope="module")
def tiny_sweep(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny") / "sweep"
    proc = run_pooled(["sweep", str(TINY), "--out", str(out), "--timing-only"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_report_of_damaged_results_is_one_line(tiny_sweep, tmp_path, damage):
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(tiny_sweep, out)
    path = out / "results.json"
    path.write_text(DAMAGES[damage](path.read_text()))
    proc = run_pooled(["report", str(out), "--no-figures"], timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and "Traceback" not in proc.stderr, \
        proc.stderr


def test_resume_rebuilds_damaged_results_and_reruns_a_damaged_point(tiny_sweep, tmp_path):
    """A damaged results.json is rebuilt from the point files; a damaged point file runs
    again; the results are the first sweep's, field by field."""
    import shutil

    out = tmp_path / "copy"
    shutil.copytree(tiny_sweep, out)
    (out / "results.json").write_text("xx")
    point = sorted((out / "points").glob("*.json"))[3]
    point.write_text('{"config": 1')
    proc = run_pooled(["sweep", str(TINY), "--out", str(out), "--timing-only"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "is rebuilt from the point files" in proc.stderr
    assert f"{point} is damaged; its point runs again" in proc.stderr
    assert "1 run now" in proc.stderr and "Traceback" not in proc.stderr

    def runs(doc):
        return {(p["key"], r["mode"]): (r["modelled_time_s"], r["phases"])
                for p in doc["points"] for r in p["runs"]}
    assert runs(json.loads((out / "results.json").read_text())) == runs(
        json.loads((tiny_sweep / "results.json").read_text()))
