"""``t3emu validate``: the bands and verdicts (hand-computed), the pages from small
synthetic sweep results, a paper without its sweep, the causes table, and the refusal of
a sweep that is not a paper scenario's (exit 2, one line)."""

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from emulator.app.cli import main
from emulator.app.scenario import load_scenario
from emulator.app.validation import (
    PAPERS, ValidationError, flux, paper_rows, read_sweep, read_sweeps, t3, write)
from emulator.app.validation.common import (
    CauseGroup, Claim, Direction, Measured, Published, causes_section, evaluate, verdict)

# ---------------------------------------------------------------- bands and verdicts


def test_bands_of_each_kind():
    # a speedup or time ratio by its gain: +-max(25% of |x - 1|, 2 points)
    assert Published.value(1.30, "speedup", "").band() == pytest.approx((1.225, 1.375))
    assert Published.value(0.80, "ratio", "").band() == pytest.approx((0.75, 0.85))
    assert Published.value(1.05, "speedup", "").band() == pytest.approx((1.03, 1.07))
    assert Published(0.41, 0.57, "share", "").band() == pytest.approx((0.31, 0.67))
    assert Published(0.41, 0.57, "share", "").edges(0.57) == pytest.approx((0.47, 0.67))
    lo, hi = Published.more_than(1.15, "ratio", "").band()
    assert lo == pytest.approx(1.1125) and hi == float("inf")
    assert Published(0.41, 0.57, "share", "").band_text() == (
        "low end 31% to 51%, high end 47% to 67%")


@pytest.mark.parametrize("pub, lo, hi, expected", [
    # speedup 1.30x: gain 0.30 +- 0.075: band 1.225x .. 1.375x
    (Published.value(1.30, "speedup", ""), 1.35, None, "within band"),
    (Published.value(1.30, "speedup", ""), 1.205, None, "outside band by 0.02x"),
    (Published.value(1.30, "speedup", ""), 1.475, None, "outside band by 0.10x"),
    # a 1.09x gain's band (1.0675x .. 1.1125x) holds no "no gain"
    (Published.value(1.09, "speedup", ""), 1.0, None, "outside band by 0.07x"),
    # efficiency range 41% .. 57%: each end within +-0.10 of its end
    (Published(0.41, 0.57, "share", ""), 0.35, 0.60, "within band"),
    (Published(0.41, 0.57, "share", ""), 0.49, 0.69, "outside band by 2 percentage points"),
    (Published(0.41, 0.57, "share", ""), 0.20, 0.69, "outside band by 11 percentage points"),
    # a range inside the published one that never approaches its low end
    (Published(0.41, 0.57, "share", ""), 0.52, 0.56, "outside band by 1 percentage points"),
    # time ratio 0.80: cut 0.20 +- 0.05: band 0.75 .. 0.85; distance in % of the edge
    (Published.value(0.80, "ratio", ""), 0.78, None, "within band"),
    (Published.value(0.80, "ratio", ""), 0.968, None, "outside band by 14%"),
    # more than 1.15: beyond 1.1125
    (Published.more_than(1.15, "ratio", ""), 1.12, None, "within band"),
    (Published.more_than(1.15, "ratio", ""), 1.0, None, "outside band by 10%"),
    # a range of speedups 1.20x .. 3.25x: ends 1.15 .. 1.25 and 2.6875 .. 3.8125
    (Published(1.20, 3.25, "speedup", ""), 1.2, 3.3, "within band"),
    (Published(1.20, 3.25, "speedup", ""), 0.88, 1.63, "outside band by 1.06x"),
])
def test_verdicts(pub, lo, hi, expected):
    assert verdict(pub, lo, hi) == expected


def test_a_distance_is_never_printed_as_zero():
    assert verdict(Published.value(1.0, "speedup", ""), 1.02000001) == "outside band by 1e-08x"


def test_evaluate_rows_and_never_matches():
    pub = Published.value(1.30, "speedup", "1.30x")
    row = evaluate(Claim("f", "w", pub, ("t3-paper",), lambda sw: Measured(1.10)), {"t3-paper": {}})
    assert (row.emulator, row.band, row.verdict, row.status) == (
        "1.10x", "1.23x to 1.38x", "outside band by 0.12x", "outside")
    row = evaluate(Claim("f", "w", None, ("t3-paper",), lambda sw: Direction(False, "x")),
                   {"t3-paper": {}})
    assert row.verdict == "direction only: does not hold" and row.status == "direction"
    row = evaluate(Claim("f", "w", pub, ("flux-paper",), lambda sw: Measured(1.3)), {})
    assert row.verdict == ("not computed (needs `t3emu sweep flux-paper --timing-only --out "
                           "results/flux-paper`)")
    assert "matches" not in row.verdict


# ---------------------------------------------------------------- synthetic sweeps


def _run(mode, time, phases, **extra):
    return {"mode": mode, "modelled_time_s": time, "phases": phases,
            "dram_bytes": {"gemm_read": 1.0, "gemm_write": 2.0,
                           "rs_read": 3.0 if mode == "sequential" else 1.0},
            **extra}


def _t3_point(model, sub, tp, times, key=None):
    """A t3-paper point: sequential = GEMM 1 + RS 1 + AG 1; the others' times given."""
    runs = [_run("sequential", 3.0, {"gemm": 1.0, "rs": 1.0, "ag": 1.0})]
    runs += [_run(m, t, {"rs": 0.9 if tp == 8 else 0.95}) for m, t in times.items()]
    return {"key": key or f"{model}/{sub}/tp{tp}/t3-sim", "model": model, "sublayer": sub,
            "tp": tp, "m": 1024, "n": 1024, "k": 256, "device": "t3-sim", "system": "",
            "runs": runs}


def _t3_doc(times_of):
    """Every point of the t3-paper scenario, the times ``times_of(point)`` gives."""
    pts = [_t3_point(p.model, p.sublayer, p.tp, times_of(p), p.key)
           for p in load_scenario("t3-paper").points]
    return {"scenario": "t3-paper", "timing_only": True, "points": pts}


def _times(ideal=3 / 1.35, t3_=2.5, mca=3 / 1.30, nmc=None):
    return {"t3": t3_, "t3-mca": mca, "ideal-overlap": ideal,
            "ideal-rs-nmc": nmc or ideal * 0.99}


def test_t3_rows_from_a_synthetic_sweep():
    """Every one of the 16 cases: ideal 1.35x (band 1.35 +- 0.0875: within), t3 3 / 2.5 =
    1.20x (1.20 +- 0.05: within), t3-mca 1.30x (within); T3-MCA over T3 1.30 / 1.20 =
    1.083x against 13%: band 1.13 +- 0.0325 = 1.0975 .. 1.1625, 0.014x below (it passed
    the old +-10% band); at most 29%: band 1.29 +- 0.0725 = 1.2175 .. 1.3625, 0.134x
    below."""
    rows = {r.figure: r for r in paper_rows(t3, {"t3-paper": _t3_doc(lambda p: _times())})}
    assert rows["Geomean speedup of Ideal-GEMM-RS-Overlap over Sequential"].verdict == \
        "within band"
    assert rows["Geomean speedup of T3 over Sequential"].emulator.startswith("1.200x")
    assert rows["T3-MCA over T3, geomean"].verdict == "outside band by 0.01x"
    assert rows["T3-MCA over T3, at most"].verdict == "outside band by 0.13x"
    # the same time on every case: OP is not closer to ideal than FC, and never beats it
    assert rows["On OP layers T3 beats Ideal in some cases"].verdict == \
        "direction only: does not hold"
    # RS phases: 1 / 0.9 at TP 8 > 1 / 0.95 at TP 16
    assert rows["NMC alone speeds the isolated RS more at TP 8 than at TP 16"].verdict == \
        ("direction only: holds, cause not checked (the paper's cause has no counterpart "
         "among the emulator's causes)")
    # no t3-2x-cu sweep: not computed, with the command that makes it
    twice = rows["GPU-2X-CU: T3's gains grow for FC layers and shrink for OP"]
    assert twice.verdict == ("not computed (needs `t3emu sweep t3-2x-cu --timing-only --out "
                             "results/t3-2x-cu`)")


def test_t3_rows_change_with_the_results():
    """T3 at 3 / 2.0 = 1.5x on every case: outside its band (1.15x .. 1.25x) by 0.25x; an
    OP case faster than ideal makes "beats Ideal in some cases" hold."""
    def times(p):
        if p.sublayer == "OP" and p.tp == 8 and p.model == "T-NLG":
            return _times(t3_=2.0, ideal=2.1)
        return _times(t3_=2.0)
    rows = {r.figure: r for r in paper_rows(t3, {"t3-paper": _t3_doc(times)})}
    assert rows["Geomean speedup of T3 over Sequential"].verdict == "outside band by 0.25x"
    assert rows["On OP layers T3 beats Ideal in some cases"].verdict == (
        "direction only: holds, cause not checked (needs the sweep with --causes)")


def _with_causes(pt: dict, parts: dict[str, dict[str, float]]) -> dict:
    """``pt`` with each named run's causes over sequential (``parts``: mode -> its parts)."""
    for r in pt["runs"]:
        if r["mode"] in parts:
            r["causes"] = {"baseline": "sequential", "parts_s": parts[r["mode"]]}
    return pt


@pytest.mark.parametrize("t3_parts, verdict_", [
    # t3's gain beyond ideal's is largest on dram-traffic: T3's reason
    ({"launches": 0.0, "dram-traffic": 0.5, "overlap": 0.3}, "direction only: holds"),
    # ... or on launches: it holds for another reason
    ({"launches": 0.6, "dram-traffic": 0.1, "overlap": 0.3},
     "direction only: holds for another reason (launches; the paper's: dram-traffic, "
     "contention)"),
])
def test_a_direction_holds_only_for_the_papers_reason(t3_parts, verdict_):
    """Every case: t3 at 3 / 2.0 = 1.5x beats ideal (1.35x); the causes of each gain over
    sequential on every OP case: ideal's {launches 0, dram-traffic 0.1, overlap 0.8}; t3's
    as given. The cause of t3's gain beyond the bound on the best OP case is the largest
    difference of their parts."""
    ideal = {"launches": 0.0, "dram-traffic": 0.1, "overlap": 0.8}
    doc = _t3_doc(lambda p: _times(t3_=2.0))
    for pt in doc["points"]:
        if pt["sublayer"] == "OP":
            _with_causes(pt, {"t3": dict(t3_parts), "ideal-overlap": ideal})
    rows = {r.figure: r for r in paper_rows(t3, {"t3-paper": doc})}
    row = rows["On OP layers T3 beats Ideal in some cases"]
    assert row.verdict == verdict_
    assert row.holds == (verdict_ == "direction only: holds")
    assert row.another_reason == ("another reason" in verdict_)


def test_the_t3_page_says_where_a_bound_is_beaten_and_why():
    """t3 (2.0) below ideal (3 / 1.35 = 2.22) on every case: the page lists each case with
    t3 and t3-mca (2.31: not below); with causes on the OP cases, their cause (the largest
    difference of parts against ideal's: dram-traffic), elsewhere 'not computed'."""
    doc = _t3_doc(lambda p: _times(t3_=2.0))
    ideal = {"launches": 0.0, "dram-traffic": 0.1, "overlap": 0.8}
    for pt in doc["points"]:
        if pt["sublayer"] == "OP":
            _with_causes(pt, {"t3": {"launches": 0.0, "dram-traffic": 0.5, "overlap": 0.3},
                              "ideal-overlap": ideal})
    lines = t3.beaten({"t3-paper": doc})
    body = [line for line in lines if line.startswith("| ") and "sub-layer" not in line]
    assert len(body) == 16 and all("| t3 |" in line for line in body)
    assert sum("dram-traffic" in line for line in body) == 4  # the four OP cases
    assert sum("not computed (no --causes)" in line for line in body) == 12
    assert t3.beaten({"t3-paper": _t3_doc(lambda p: _times())}) == []  # 2.5 > 2.22


def test_counts_split_the_direction_verdicts():
    from emulator.app.validation.common import Row, counts

    def row(v):
        return Row("f", "w", "p", "e", "b", v, "c")
    c = counts([row("direction only: holds"), row("direction only: holds for another reason "
                                                  "(x; the paper's: y)"),
                row("direction only: holds, cause not checked (z)"),
                row("direction only: does not hold"), row("within band")])
    assert (c["direction"], c["holds"], c["another reason"], c["unchecked"], c["within"]) == (
        4, 1, 1, 1, 1)


def test_pages_and_index_without_some_papers(tmp_path):
    sweeps = {"t3-paper": _t3_doc(lambda p: _times())}
    written = write(sweeps, tmp_path, "t3emu validate results/t3-paper --out docs/validation")
    assert [p.name for p in written] == ["index.md", "t3.md", "flux.md", "fused-ops.md",
                                         "ficco.md", "anchors.md"]
    index = (tmp_path / "index.md").read_text()
    n = len(flux.CLAIMS)
    assert f"| [Flux](flux.md) | {n} | 0 | 0 | 0 | 0 | 0 | 0 | {n} |" in index
    page = (tmp_path / "flux.md").read_text()
    assert page.count("not computed (needs `t3emu sweep flux-paper --timing-only --out "
                      "results/flux-paper`)") == n
    assert "arXiv:2406.06858" in page
    t3_page = (tmp_path / "t3.md").read_text()
    assert "ASPLOS 2024" in t3_page and "    t3emu sweep t3-paper --timing-only --out " \
        "results/t3-paper" in t3_page
    assert "matches" not in t3_page
    for mod in PAPERS:
        assert (tmp_path / f"{mod.PAPER.key}.md").read_text().count("| ") > 0


# ---------------------------------------------------------------- causes


def test_causes_table_from_a_synthetic_causes_record():
    """Baseline 10 s, run 7.5 s: a 25% cut = launches 15 + link-efficiency 0 + contention
    5 + dram-traffic 0 + overlap 5 points; geomean speedup 10 / 7.5 = 1.333x."""
    causes = {"baseline": "sequential", "order": ["launches", "link-efficiency", "contention",
                                                  "dram-traffic"],
              "baseline_s": 10.0, "time_s": 7.5, "gain_s": 2.5,
              "parts_s": {"launches": 1.5, "link-efficiency": 0.0, "contention": 0.5,
                          "dram-traffic": 0.0, "overlap": 0.5}}
    pt = {"runs": [{"mode": "fused", "modelled_time_s": 7.5, "causes": causes},
                   {"mode": "sequential", "modelled_time_s": 10.0}]}
    text = "\n".join(causes_section([CauseGroup("GEMV", [pt], ["fused"])], ["fused-ops-paper"]))
    assert "| fused | sequential | 1 | 1.333x | 25.0% | +15.0 | +0.0 | +5.0 | +0.0 | +5.0 |" \
        in text
    assert "of the 25.0% cut of sequential's time, +15.0 points come from launches" in text
    bare = {"runs": [{"mode": "fused", "modelled_time_s": 7.5}]}
    text = "\n".join(causes_section([CauseGroup("GEMV", [bare], ["fused"])],
                                    ["fused-ops-paper"]))
    assert "Causes were not computed" in text
    assert "`t3emu sweep fused-ops-paper --timing-only --causes --out " \
        "results/fused-ops-paper`" in text


# ---------------------------------------------------------------- refusals


def _sweep_dir(tmp_path: Path, doc: dict, name: str = "sweep") -> Path:
    d = tmp_path / name
    d.mkdir()
    (d / "results.json").write_text(json.dumps(doc))
    return d


def test_a_sweep_of_another_scenario_is_refused_with_one_line(tmp_path):
    d = _sweep_dir(tmp_path, {"scenario": "tiny", "points": [{"key": "M/OP/tp2/t3-sim",
                                                             "runs": []}]})
    r = CliRunner().invoke(main, ["validate", str(d), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2
    assert r.stdout == ""
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1
    assert str(d) in lines[0] and "scenario 'tiny' is not one of the papers'" in lines[0]
    assert not (tmp_path / "out").exists()


def test_a_sweep_with_other_points_is_refused(tmp_path):
    doc = _t3_doc(lambda p: _times())
    doc["points"] = doc["points"][:-1]  # unfinished
    d = _sweep_dir(tmp_path, doc)
    with pytest.raises(ValidationError, match="1 of the scenario's 22 points missing"):
        read_sweep(d)
    doc["points"].append(_t3_point("X", "OP", 8, _times(), key="X/OP/tp8/t3-sim"))
    d2 = _sweep_dir(tmp_path, doc, "other")
    r = CliRunner().invoke(main, ["validate", str(d2), "--out", str(tmp_path / "out")])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "not in scenario t3-paper" in r.stderr


def test_validate_writes_the_pages(tmp_path):
    d = _sweep_dir(tmp_path, _t3_doc(lambda p: _times()), "t3-paper")
    out = tmp_path / "validation"
    r = CliRunner().invoke(main, ["validate", str(d), "--out", str(out)])
    assert r.exit_code == 0, r.output
    page = (out / "t3.md").read_text()
    # the commands as a user types them, not the directory given
    assert f"t3emu validate results/t3-paper --out {out}" in page
    assert str(d) not in page


def test_validate_needs_a_directory():
    r = CliRunner().invoke(main, ["validate"])
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "give at least one sweep directory" in r.stderr


def test_the_rs_swizzle_s_gain_split_into_causes_from_the_runs_causes():
    """Two RS points: swizzled 8 s and unswizzled 10 s, each cut of sequential's 12 s split
    into causes. The swizzle's gain (2 s per point) is the swizzled run's parts less the
    unswizzled one's: ingress 1.5, overlap 0.5 per point; an AG point and a run without
    causes do not count."""
    def causes(time, parts):
        return {"baseline": "sequential", "baseline_s": 12.0, "time_s": time,
                "gain_s": 12.0 - time, "parts_s": parts}

    def point(m, sub="GEMM-RS", with_causes=True):
        on = causes(8.0, {"launches": 1.0, "ingress": 0.5, "overlap": 2.5})
        off = causes(10.0, {"launches": 1.0, "ingress": -1.0, "overlap": 2.0})
        return {"system": "h800-x8", "tp": 8, "m": m, "sublayer": sub, "runs": [
            {"mode": "sequential", "modelled_time_s": 12.0},
            {"mode": "flux-rs-w", "modelled_time_s": 8.0, "causes": on if with_causes else None},
            {"mode": "flux-rs-w-noswizzle", "modelled_time_s": 10.0, "causes": off}]}

    sw = {"flux-paper": {"points": [point(1024), point(2048), point(4096, "AG-GEMM"),
                                    point(8192, with_causes=False)]}}
    n, gain, parts = flux.swizzle_causes(sw)
    assert (n, gain) == (2, 4.0)
    assert parts == {"launches": 0.0, "ingress": 3.0, "overlap": 1.0}
    assert flux.swizzle_causes({"flux-paper": {"points": [point(1024, with_causes=False)]}}) \
        is None


# ---------------------------------------------------------------- whole-model estimates
def _t3_models_doc(drop: int = 0) -> dict:
    """A synthetic ``t3emu model --scenario t3-models`` result: estimate i (in the
    scenario's order) gives T3 1 + 0.01 (i + 1) and T3-MCA 0.02 more."""
    from emulator.workload import scenarios

    ests = []
    for i, s in enumerate(scenarios.settings("t3-models", precheck=False)[drop:]):
        x = 1.0 + 0.01 * (i + 1)
        ests.append({
            "setting": {"model": s.model.name, "phase": s.phase, "system": s.where,
                        "tp": s.tp, "pp": 1, "dp": 1, "sp": False, "ep": 1,
                        "split_heads": s.split_heads, "tokens": s.tokens,
                        "attention": s.attention, "dtype": s.dtype,
                        "batch": s.model.batch, "kind": "transformer",
                        "designs": list(s.designs)},
            "baseline": "sequential", "comm_share": 0.25,
            "designs": {d: {"speedup": v, "layer_speedup": v, "exposed_comm_s": 1e-3 / v}
                        for d, v in (("sequential", 1.0), ("t3-plain", x), ("t3", x + 0.02))}})
    return {"scenario": "t3-models", "estimates": ests}


def test_whole_model_estimates_give_t3_s_end_to_end_rows_and_section(tmp_path):
    """Training runs are the scenario's even estimates (i = 0, 2, ..., 12), the last MT-NLG
    at TP 32: T3-MCA's best training speedup 1 + 0.13 + 0.02 = 1.150x, within 12%'s band
    (1.01x to 1.23x); prefill's T3 geomean over i = 1, 3, ..., 13."""
    import math

    d = tmp_path / "t3-models"
    d.mkdir()
    (d / "estimates.json").write_text(json.dumps(_t3_models_doc()))
    sweeps = read_sweeps([d])
    rows = {r.figure: r for r in paper_rows(t3, sweeps)}
    best = rows["Training sped up by T3-MCA, at most (whole model)"]
    assert best.emulator == "1.150x (MT-NLG 530B TP32)" and best.verdict == "within band"
    geo = math.exp(sum(math.log(1 + 0.01 * (i + 1)) for i in range(1, 14, 2)) / 7)
    row = rows["Prompt inference sped up by T3, geomean (whole model)"]
    assert row.emulator == f"{geo:.3f}x over 7 models/TPs"
    write(sweeps, tmp_path / "pages", "t3emu validate results/t3-models --out pages")
    page = (tmp_path / "pages" / "t3.md").read_text()
    assert "## End to end: whole-model estimates" in page
    assert ("| MT-NLG 530B | training | 32 x t3-sim (ring) | TP 32 x PP 1 x DP 1, AR, "
            "unfused attention, fp16 | ") in page
    assert "    t3emu model --scenario t3-models --out results/t3-models" in page


def test_estimates_of_another_version_of_the_scenario_are_refused(tmp_path):
    """One estimate missing, or one of another phase: refused by name, not a traceback."""
    other = _t3_models_doc()
    other["estimates"][0]["setting"]["phase"] = "prefill"
    for i, doc in enumerate((_t3_models_doc(drop=1), other)):
        d = tmp_path / f"t3-models-{i}"
        d.mkdir()
        (d / "estimates.json").write_text(json.dumps(doc))
        with pytest.raises(ValidationError, match="not the estimates of t3-models"):
            read_sweeps([d])


def test_failing_runs_are_left_out_of_the_figures_and_named_on_the_page(tmp_path):
    """A run whose numerics failed is in no figure: here t3 fails at one point, whose 20x
    (3 / 0.15) would otherwise pull the geomean up; a figure that needs the run is not
    computed, the others are, and the page names the failing runs."""
    def times(p):
        return _times(t3_=0.15) if p.key == first else _times()
    first = load_scenario("t3-paper").points[0].key
    doc = _t3_doc(times)
    for pt in doc["points"]:
        for r in pt["runs"]:
            r["numerics"] = "fail" if (pt["key"] == first and r["mode"] == "t3") else "pass"
    d = _sweep_dir(tmp_path, doc)
    sweeps = read_sweeps([d])
    assert sweeps["t3-paper"]["excluded_failing"] == [(first, "t3")]
    rows = {r.figure: r for r in paper_rows(t3, sweeps)}
    row = rows["Geomean speedup of T3 over Sequential"]  # needs every point's t3 run
    assert row.verdict.startswith("not computed (a run it needs failed the numerics check")
    assert "20.000x" not in row.emulator
    assert rows["Geomean speedup of Ideal-GEMM-RS-Overlap over Sequential"].verdict == \
        "within band"  # a figure that needs no failing run is computed as before
    write(sweeps, tmp_path / "pages", "t3emu validate")
    page = (tmp_path / "pages" / "t3.md").read_text()
    assert f"1 run(s) of `t3-paper` failed the numerics check" in page and first in page


# ---------------------------------------------------------------- the contention anchors
def _c3_point(key: str, system: str, m: int, k: int, op: str, **phases) -> dict:
    return {"key": f"{key}/x/m{m}/tp8/{system}", "system": system, "m": m, "n": 128, "k": k,
            "collective": op, "runs": [{"mode": "c3", "phases": phases}]}


def test_the_anchors_rows_from_a_synthetic_sweep():
    """Hand arithmetic: a GEMM of 1.0 beside a collective of 0.5 (CU) / 0.4 (DMA): serial
    1.5 (1.4), ideal 1.0; plain at 1.45 realises (1.5/1.45 - 1) / (1.5 - 1) = 6.9%, DMA
    at 1.0 all of (1.4 - 1); the GEMM beside the prioritised collective 1.2 / 1.0."""
    from emulator.app.validation import anchors

    c3 = dict(gemm=1.0, **{"comm-cu": 0.5, "comm-dma": 0.4, "c3-plain": 1.45,
                           "c3-prioritised": 1.2, "c3-prioritised.kernel": 1.2,
                           "c3-plain.kernel": 1.0, "c3-partitioned": 1.25,
                           "c3-partitioned.kernel": 1.25, "c3-dma": 1.0,
                           "c3-dma.kernel": 1.0})
    small = dict(c3, **{"comm-cu": 1e-6, "comm-dma": 3e-6})
    sw = {"anchors": {"points": [
        _c3_point("c3-ag-256m-n2048", "mi300x-x8", 16384, 8192, "ag+gemm", **c3),
        _c3_point("slowdown-h5120", "h100-sxm-x4", 16384, 5120, "ag+gemm", **c3),
        _c3_point("dma-ag-1k", "mi300x-x8", 8, 64, "ag+gemm", **small),
        _c3_point("dma-ag-1g", "mi300x-x8", 65536, 8192, "ag+gemm", **c3)]}}
    rows = {r.figure: r for r in (evaluate(c, sw) for c in anchors.CLAIMS)}
    plain = rows[anchors.CLAIMS[0].figure]
    assert plain.emulator.startswith("7% (mean of 1") and plain.verdict.startswith("outside")
    assert rows[anchors.CLAIMS[1].figure].emulator.startswith("50%")  # (1.5/1.2 - 1) / 0.5
    assert rows[anchors.CLAIMS[3].figure].emulator.startswith("100%")
    assert rows[anchors.CLAIMS[5].figure].emulator.startswith("1.200")
    assert rows[anchors.CLAIMS[5].figure].verdict == "within band"  # 1.142 to 1.236
    assert rows[anchors.CLAIMS[7].figure].emulator.startswith("1.250")  # 0.5 / 0.4
    assert rows[anchors.CLAIMS[8].figure].emulator.startswith("3.00")  # 3 us / 1 us
    assert "not computed" in rows[anchors.CLAIMS[9].figure].verdict  # no dma-a2a-1k point
    text = "\n".join(anchors.details(sw))
    assert "| c3-ag-256m-n2048 (N = 128) | 1000000.0 | 500000.0 | 400000.0 | 7% |" in text


def test_the_ficco_notes_name_the_swept_gpus_own_launch_cost_library_fraction_and_cus():
    """The page's notes read the sweep's device, not figures typed into the page: a GPU
    launching in 2 us (an assumption), its library at 0.6 of the link and 128 CUs (of
    which FiCCO's CU transfers hold CU_SHARE)."""
    from collectives.ficco import CU_SHARE
    from emulator.app.validation import ficco

    dev = {"name": "mi300x", "launch_s": 2e-6, "launch_source": "ASSUMPTION: for the test",
           "cus": 128,
           "interconnect": {"library_fraction": 0.6}}
    pt = {"model": "g1", "sublayer": "SP+TP test", "m": 1024, "n": 256, "k": 4096,
          "device_spec": dev,
          "runs": [{"mode": "ficco-serial", "modelled_time_s": 1.0},
                   {"mode": "ficco-cil", "modelled_time_s": 1.0,
                    "phases": {"rows8": 1.0, "cil-dma.kernel": 1.02, "comm8": 1.0,
                               "cil-dma.executors": 1.03}}]}
    text = "\n".join(ficco._notes({"ficco-paper": {"points": [pt]}}))
    assert "the launch cost, 2.00 us on MI300X, an assumption)" in text
    assert "`library_fraction` of the links, 0.60 on MI300X)" in text
    assert f"({CU_SHARE.default * 128:.0f} of 128, an assumption;" in text
    dev["launch_source"] = "measured"
    assert "2.00 us on MI300X)" in "\n".join(ficco._notes({"ficco-paper": {"points": [pt]}}))
