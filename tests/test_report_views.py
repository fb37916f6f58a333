"""`t3emu report` fitted to each design, from synthetic results documents (no MPI): which
sections appear, speedups over each configuration's own baseline, DRAM traffic of every
configuration, the causes table, the timeline's kinds of kernel and the figures."""

from __future__ import annotations

import math
import re

import pytest

from emulator.app import report
from emulator.app.report import phase_kind, text_report
from emulator.app.scenario import ScenarioError

CATS = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write", "a2a_read",
        "a2a_write")


def _run(mode: str, us: float, phases: dict[str, tuple[float, float]], tp: int, *,
         dram: dict | None = None, **extra) -> dict:
    """A run as a sweep stores it: ``phases`` are one rank's windows (us), every rank the
    same."""
    windows = {n: [s * 1e-6, e * 1e-6] for n, (s, e) in phases.items()}
    traffic = {c: 0 for c in CATS}
    traffic.update(dram or {"gemm_read": int(us * 1e6), "gemm_write": int(us * 1e5)})
    run = {"mode": mode, "modelled_time_s": us * 1e-6, "numerics": "timing-only",
           "max_abs_error": None, "phases": {n: w[1] - w[0] for n, w in windows.items()},
           "phase_windows_s": windows, "rank_phases_s": [windows] * tp, "dram_bytes": traffic,
           "stage_profile": None, "gemm_alone_s": None, "ect_s": None,
           "overlap_efficiency": None, "search": {}, "rank_skew": [1.0] * tp}
    run.update(extra)
    return run


def _point(model: str, sublayer: str, collective: str, runs: list[dict], *, tp: int = 8,
           m: int = 1024, n: int = 1024, k: int = 1024, system: str = "",
           device: str = "t3-sim", params: dict | None = None) -> dict:
    key = f"{model}/{sublayer}/m{m}/tp{tp}/{system or device}"
    return {"key": key, "model": model, "sublayer": sublayer, "direction": "fwd", "tp": tp,
            "m": m, "n": n, "k": k, "device": device, "collective": collective,
            "topology": "full-mesh", "system": system, "params": params or {},
            "algorithm": "direct", "runs": runs}


def _doc(name: str, points: list[dict]) -> dict:
    modes = list(dict.fromkeys(r["mode"] for p in points for r in p["runs"]))
    return {"scenario": name, "timing_only": True, "device": "t3-sim",
            "collective": ",".join(dict.fromkeys(p["collective"] for p in points)),
            "topology": "full-mesh", "dtype": "fp16", "modes": modes, "points": points}


def _titles(doc: dict) -> list[str]:
    return [title for title, _ in report.sections(doc)]


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The body rows (split on 2+ spaces) of the table under the line starting ``header``."""
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[i + 2:]:
        if not line.strip() or line.startswith("MB per GPU"):
            break
        if set(line) <= {"-", " "}:  # a rule
            continue
        rows.append(re.split(r"\s{2,}", line.strip()))
    return rows


# ------------------------------------------------------------------------ the sweeps
def _ect(us: float, alone: float, base: float) -> dict:
    return {"gemm_alone_s": alone * 1e-6, "ect_s": (us - alone) * 1e-6,
            "overlap_efficiency": 1 - (us - alone) / (base - alone)}


def flux_doc() -> dict:
    """Two Flux points (AG-GEMM, GEMM-RS) on a system: the baselines, four Flux
    configurations and the tuner that picked one."""
    pts = []
    for sub, op, fused, kinds in (
            ("AG-GEMM", "ag+gemm", "ag+gemm", ("flux-ag", "flux-ag-tile2", "flux-ag-tile4",
                                                 "flux-ag-pull")),
            ("GEMM-RS", "gemm+rs", "gemm+rs-a", ("flux-rs-w", "flux-rs-a"))):
        seq = 100.0
        runs = [_run("sequential", seq, {"ag" if op == "ag+gemm" else "gemm": (0, 40),
                                         "gemm" if op == "ag+gemm" else "rs": (40, 100)}, 8,
                     **_ect(seq, 60, seq)),
                _run("te-best", 90.0, {"step 0": (0, 45), "step 1": (45, 90)} if
                     op == "ag+gemm" else {"gemm 0": (0, 45), "rs 0": (20, 70),
                                           "gemm 1": (45, 90), "rs 1": (70, 90)}, 8,
                     **_ect(90.0, 60, seq))]
        for i, mode in enumerate(kinds):
            us = 70.0 + 5 * i
            ph = {fused: (0, us)} if mode != "flux-rs-w" else {"gemm+rs-w": (0, us - 10),
                                                               "reduce": (us - 10, us)}
            runs.append(_run(mode, us, ph, 8, **_ect(us, 60, seq)))
        runs.append(_run("flux-best", 70.0, {fused: (0, 70)}, 8, **_ect(70.0, 60, seq),
                         search={"chosen": kinds[0]}))
        pts.append(_point("GPT-3", sub, op, runs, system="h800-x8", device="h800"))
    return _doc("flux-like", pts)


def ficco_doc() -> dict:
    """Two FiCCO points: the serial baseline, the schedules, the heuristic, shard, ideal and
    the measurement runs (which also carry Flux's metrics over ficco-serial: a new
    sweep's GEMM producers do)."""
    pts = []
    for model, sub, op in (("g1", "SP+TP g1", "ag+gemm"), ("s1", "synthetic EP", "a2a+gemm")):
        serial = 300.0
        runs = [_run("ficco-serial", serial, {"ag" if op == "ag+gemm" else "a2a": (0, 200),
                                              "gemm": (200, 300)}, 8)]
        times = {"ficco-uniform-fused-1d": 250.0, "ficco-hetero-fused-1d": 200.0,
                 "ficco-hetero-unfused-1d": 400.0, "ficco-uniform-fused-2d": 240.0,
                 "ficco-auto": 200.0, "ficco-cu": 260.0, "ficco-shard": 280.0,
                 "ficco-ideal": 150.0}
        for mode, us in times.items():
            pick = {"chosen": "ficco-hetero-fused-1d", "why": "OTB"} if mode == "ficco-auto" \
                else {}
            runs.append(_run(mode, us, {"ficco": (0, us)}, 8, search=pick))
        runs.append(_run("ficco-dil", 900.0, {"gemm": (0, 100), "comm": (100, 200),
                                              "comm8": (200, 300), "rows8-128": (300, 900)}, 8))
        runs.append(_run("ficco-cil", 500.0, {"comm8": (0, 100), "rows8": (100, 200),
                                              "cil-dma.kernel": (200, 300),
                                              "cil-dma.executors": (200, 320),
                                              "cil-dma": (200, 320)}, 8))
        pts.append(_point(model, sub, op, runs, system="mi300x-x8", device="mi300x",
                          m=8192, n=1024, k=4096))
    return _doc("ficco-like", pts)


def fused_doc() -> dict:
    """The fused operators: embedding + A2A and GEMV + AR (no GEMM producer) and a GEMM +
    A2A point."""
    pts = []
    for sub, op, comp, coll, fused in (("embedding+A2A", "emb+a2a", "embedding", "a2a",
                                        "embedding+a2a"),
                                       ("GEMV+AR", "gemv+ar", "gemv", "rs", "gemv"),
                                       ("MoE", "gemm+a2a", "gemm", "a2a", "gemm+a2a")):
        runs = [_run("sequential", 100.0, {comp: (0, 60), coll: (60, 100)}, 4,
                     **(_ect(100.0, 60, 100.0) if op == "gemm+a2a" else
                        {"ect_s": 40e-6, "overlap_efficiency": 0.0})),
                _run("ideal-overlap", 60.0, {comp: (0, 60), coll: (0, 40)}, 4,
                     **(_ect(60.0, 60, 100.0) if op == "gemm+a2a" else {})),
                _run("fused", 55.0, {fused: (0, 50)} | ({"reduce+store": (50, 55)}
                                                       if op == "gemv+ar" else {}), 4,
                     **(_ect(55.0, 50, 100.0) if op == "gemm+a2a" else {})),
                _run("fused-oblivious", 58.0, {f"{fused} (oblivious)": (0, 58)}, 4)]
        pts.append(_point("Model", sub, op, runs, tp=4, system="mi210x4", device="mi210"))
    return _doc("fused-like", pts)


def t3_doc(sublayers=("OP", "FC-2", "FC-1", "IP"), causes: bool = False) -> dict:
    pts = []
    for i, sub in enumerate(sublayers):
        seq, t3 = 100.0 + 10 * i, 80.0 + 5 * i
        gain = seq - t3
        extra = {}
        if causes:  # parts in % of the baseline: launches 18, contention -1, dram 2, rest
            parts = {"launches": 0.18 * seq, "link-efficiency": 0.0, "contention": -0.01 * seq,
                     "dram-traffic": 0.02 * seq}
            parts["overlap"] = gain - sum(parts.values())
            extra["causes"] = {"baseline": "sequential", "order": ["launches",
                               "link-efficiency", "contention", "dram-traffic"],
                               "baseline_s": seq * 1e-6, "time_s": t3 * 1e-6,
                               "gain_s": gain * 1e-6,
                               "parts_s": {k: v * 1e-6 for k, v in parts.items()}}
        runs = [_run("sequential", seq, {"gemm": (0, 50), "rs": (50, 75), "ag": (75, seq)}, 2,
                     dram={"gemm_read": 1000, "gemm_write": 100, "rs_read": 300,
                           "rs_write": 100, "ag_read": 100, "ag_write": 100}),
                _run("t3", t3, {"gemm+rs": (0, 55), "ag": (55, t3)}, 2,
                     dram={"gemm_read": 1000, "gemm_write": 100, "rs_read": 100,
                           "rs_write": 100, "ag_read": 100, "ag_write": 100}, **extra),
                _run("t3-mca", t3 - 1, {"gemm+rs": (0, 54), "ag": (54, t3 - 1)}, 2,
                     dram={"gemm_read": 900, "gemm_write": 100, "rs_read": 100,
                           "rs_write": 100, "ag_read": 100, "ag_write": 100})]
        pts.append(_point("Tiny", sub, "ar", runs, tp=2, m=512, n=512, k=256))
    return _doc("t3-like", pts)


# ------------------------------------------------------------------------ sections
def test_flux_sweep_shows_flux_views_and_every_configuration():
    doc = flux_doc()
    text = text_report(doc)
    titles = _titles(doc)
    assert titles[0] == "Speedup over sequential (modelled time, per point)"
    assert any(t.startswith("Overlap efficiency") for t in titles)
    assert any(t.startswith("Flux's views per cluster") for t in titles)
    for absent in ("FiCCO's views", "fused computation-collective", "End-to-end",
                   "Causes of each gain"):
        assert not any(absent in t for t in titles), absent
    assert "none: needs OP" not in text and "t3-mca" not in text
    # the DRAM table: every configuration of every point, against sequential
    rows = _table_rows(text, "point ")  # the first table whose header starts with "point"
    dram = _table_rows(text.split("DRAM traffic by category")[1], "point ")
    listed = [r[-3] if len(r) > 4 and r[0].startswith("GPT-3") else r[0] for r in dram]
    assert rows and len(dram) == sum(len(p["runs"]) for p in doc["points"])
    for p in doc["points"]:
        for r in p["runs"]:
            assert any(r["mode"] in line for line in listed) or r["mode"] in text
    assert "vs sequential" in text and "DRAM traffic reduction of flux-best vs sequential" in text


def test_dram_table_lists_every_configuration_run():
    for doc in (flux_doc(), ficco_doc(), fused_doc(), t3_doc()):
        table = report.dram_table(doc)
        assert "configuration" in table.splitlines()[0]
        # a point's first row starts with its label, the others with blanks
        lines = table.splitlines()
        body = lines[next(i for i, ln in enumerate(lines) if ln.startswith("--")) + 1:]
        configs = [re.split(r"\s{2,}", line.strip())[0 if line.startswith(" ") else 1]
                   for line in body if not line.startswith(("MB per GPU", "DRAM traffic"))]
        want = [r["mode"] for p in doc["points"] for r in p["runs"]]
        assert sorted(configs) == sorted(want), doc["scenario"]


def test_ficco_speedups_are_over_ficco_serial():
    doc = ficco_doc()
    text = text_report(doc)
    titles = _titles(doc)
    assert titles[0] == "Speedup over ficco-serial (modelled time, per point)"
    assert "FiCCO's views" in titles
    for absent in ("Flux's views", "fused computation-collective", "End-to-end"):
        assert not any(absent in t for t in titles), absent
    table, per_mode = report.speedup_table(doc)
    assert "ficco-serial us" in table and "ficco-dil" not in table.splitlines()[0]
    # hand-computed: serial 300 us, hetero-fused-1d 200 us -> 1.500x; ideal 150 us -> 2.000x
    assert per_mode["ficco-hetero-fused-1d"] == [pytest.approx(1.5)] * 2
    assert per_mode["ficco-ideal"] == [pytest.approx(2.0)] * 2
    assert "ficco-dil" not in per_mode and "ficco-serial" not in per_mode
    row = next(line for line in table.splitlines() if line.startswith("g1 "))
    assert "300.0" in row and "1.500x" in row and "2.000x" in row
    # measurement runs: listed in the DRAM table without a comparison
    dram = report.dram_table(doc)
    assert "(measurement)" in dram and "vs ficco-serial" in dram


def test_recorded_baseline_and_speedup_are_used():
    doc = ficco_doc()
    for p in doc["points"]:
        for r in p["runs"]:
            if r["mode"] == "ficco-cu":
                r["baseline"], r["speedup"] = "ficco-serial", 1.234
    table, per_mode = report.speedup_table(doc)
    assert per_mode["ficco-cu"] == [1.234, 1.234]


def test_mixed_baselines_name_each_column_s_baseline():
    t3, ficco = t3_doc(), ficco_doc()
    doc = _doc("mixed", t3["points"] + ficco["points"])
    assert report.speedup_title(doc).startswith("Speedup over each configuration's baseline")
    table, _ = report.speedup_table(doc)
    assert "over sequential" in table and "over ficco-serial" in table
    assert "vs its baseline" in report.dram_table(doc)


def test_fused_sweep_has_no_overlap_efficiency_without_a_gemm_producer():
    doc = fused_doc()
    titles = _titles(doc)
    assert "The fused computation-collective operators' views" in titles
    for absent in ("Flux's views", "FiCCO's views", "End-to-end"):
        assert not any(absent in t for t in titles), absent
    overlap = report.overlap_table(doc)  # only the GEMM + A2A point has a GEMM alone
    assert "MoE" in overlap and "embedding" not in overlap and "GEMV" not in overlap


def test_t3_sweep_end_to_end_only_with_the_four_sublayers():
    doc = t3_doc()
    titles = _titles(doc)
    assert titles[0] == "Speedup over sequential (modelled time, per sub-layer)"
    assert any(t.startswith("End-to-end") for t in titles)
    for absent in ("Flux's views", "FiCCO's views", "fused computation-collective",
                   "Causes of each gain"):
        assert not any(absent in t for t in titles), absent
    two = t3_doc(("OP", "FC-2"))
    assert not any(t.startswith("End-to-end") for t in _titles(two))
    assert "End-to-end" not in text_report(two) and "none: needs" not in text_report(two)


def test_causes_table_numbers():
    doc = t3_doc(causes=True)
    text = text_report(doc)
    assert "Causes of each gain" in text
    rows = _table_rows(report.causes_table(doc), "point")
    assert rows[0][:5] == ["Tiny OP TP2", "t3", "sequential", "1.250x", "20.0"]
    # OP: seq 100, t3 80: cut 20.0 = launches 18.0 + link 0.0 + contention -1.0 + dram 2.0
    # + overlap 1.0
    assert rows[0][5:] == ["+18.0", "+0.0", "-1.0", "+2.0", "+1.0"]
    head = report.causes_table(doc).splitlines()[0].split()
    assert head[-5:] == ["launches", "link-efficiency", "contention", "dram-traffic", "overlap"]
    # FC-2: seq 110, t3 85: cut 22.7 = 18 + 0 - 1 + 2 + 3.7
    assert rows[1][3:] == ["1.294x", "22.7", "+18.0", "+0.0", "-1.0", "+2.0", "+3.7"]
    mean = rows[-1]
    cuts = [20 / 100, 25 / 110, 30 / 120, 35 / 130]
    assert mean[0].startswith("geomean / mean of 4") and mean[1] == "t3"
    assert float(mean[4]) == pytest.approx(100 * sum(cuts) / 4, abs=0.05)
    over = [c * 100 - 19 for c in cuts]  # what the overlap keeps of each cut
    assert float(mean[-1]) == pytest.approx(sum(over) / 4, abs=0.05)
    sp = [100 / 80, 110 / 85, 120 / 90, 130 / 95]
    assert float(mean[3].rstrip("x")) == pytest.approx(
        math.exp(sum(map(math.log, sp)) / 4), abs=5e-4)
    for r in rows[:-1]:  # the parts add up to the cut
        assert sum(float(x) for x in r[5:]) == pytest.approx(float(r[4]), abs=0.06)


# ------------------------------------------------------------------------ the timeline
@pytest.mark.parametrize("name, op, want", [
    ("gemm", "ar", ("compute", None)), ("gemm 3", "gemm+rs", ("compute", None)),
    ("embedding", "emb+a2a", ("compute", None)), ("gemv", "gemv+ar", ("compute", None)),
    ("rows8-512", "ag+gemm", ("compute", None)), ("k64-128", "ag+gemm", ("compute", None)),
    ("cil-dma.kernel", "ag+gemm", ("compute", None)),
    ("rs", "ar", ("reduce", None)), ("rs 2", "gemm+rs", ("reduce", None)),
    ("reduce", "gemm+rs", ("reduce", None)), ("reduce+store", "gemv+ar", ("reduce", None)),
    ("ag", "ar", ("gather", None)), ("a2a", "emb+a2a", ("gather", None)),
    ("comm8", "ag+gemm", ("transfer", None)), ("cil-cu.executors", "ag+gemm", ("transfer", None)),
    ("gemm+rs", "ar", ("compute", "reduce")), ("gemm+rs-ring", "gemm+rs", ("compute", "reduce")),
    ("ag+gemm", "ag+gemm", ("compute", "gather")), ("gemm+a2a", "gemm+a2a", ("compute", "gather")),
    ("embedding+a2a (oblivious)", "emb+a2a", ("compute", "gather")),
    ("ficco", "a2a+gemm", ("compute", "gather")), ("step 1", "ag+gemm", ("compute", "gather")),
    ("cil-dma", "ag+gemm", ("compute", "transfer")), ("barrier", "ar", ("other", None)),
])
def test_phase_kinds(name, op, want):
    assert phase_kind(name, op) == want


def test_phase_names_of_every_doc_have_a_kind_and_few_kinds():
    for doc in (flux_doc(), ficco_doc(), fused_doc(), t3_doc()):
        kinds = {phase_kind(n, p["collective"]) for p in doc["points"] for r in p["runs"]
                 for n in r["rank_phases_s"][0]}
        assert ("other", None) not in kinds and len(kinds) <= 7, doc["scenario"]


def test_timeline_draws_the_configurations_that_matter():
    flux = flux_doc()
    ag = flux["points"][0]
    # 8 configurations ran: the baselines, the tuner and the fastest of the rest
    assert [r["mode"] for r in report.timeline_runs(ag)] == [
        "sequential", "te-best", "flux-ag", "flux-best"]
    assert [r["mode"] for r in report.timeline_runs(ag, ["flux-ag-pull", "sequential"])] == [
        "flux-ag-pull", "sequential"]
    with pytest.raises(ScenarioError, match="flux-rs-w did not run"):
        report.timeline_runs(ag, ["flux-rs-w"])
    ficco = ficco_doc()["points"][0]  # the serial baseline, the fastest schedule, the pick
    assert [r["mode"] for r in report.timeline_runs(ficco)] == [
        "ficco-serial", "ficco-hetero-fused-1d", "ficco-auto"]
    t3 = t3_doc()["points"][0]  # few: every configuration
    assert [r["mode"] for r in report.timeline_runs(t3)] == ["sequential", "t3", "t3-mca"]


def test_search_configuration_stands_for_its_candidates_in_the_speedup_figure():
    doc = flux_doc()
    assert report.drawn_modes(doc, doc["points"]) == ["flux-best", "te-best"]
    doc = ficco_doc()
    assert "ficco-dil" not in report.drawn_modes(doc, doc["points"])


# ------------------------------------------------------------------------ figures
@pytest.mark.parametrize("make, want", [
    (flux_doc, {"speedup.png", "dram_traffic.png", "timeline.png", "flux_ect.png",
                "flux_efficiency.png"}),
    (ficco_doc, {"speedup.png", "dram_traffic.png", "timeline.png", "ficco_speedup.png",
                 "ficco_heuristic.png"}),
    (fused_doc, {"speedup.png", "dram_traffic.png", "timeline.png", "fused_time.png",
                 "fused_skew.png"}),
    (t3_doc, {"speedup.png", "dram_traffic.png", "timeline.png"}),
], ids=["flux", "ficco", "fused", "t3"])
def test_figures_of_each_design(tmp_path, make, want):
    pytest.importorskip("matplotlib")
    doc = make()
    written = report.figures(doc, tmp_path)
    names = {p.name for p in written}
    assert want <= names, names - want
    assert not {"flux_ect.png", "ficco_speedup.png", "fused_time.png"} - want & names
    for p in written:
        assert p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", p
