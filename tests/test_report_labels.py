"""What `t3emu report` and `t3emu model` name in their tables and figures: a what-if sweep's
points carry their --set values, an ambiguous --timeline is refused, FiCCO's legend stays
off the bars, the fused operators' suptitle off the panels, and a model figure names what
was estimated (a decode step is no forward + backward)."""

from __future__ import annotations

import json
import random
import shutil

import pytest

from tests.conftest import ROOT, run_cli, run_pooled

WHAT_IF = ROOT / "tests" / "data" / "tiny-what-if.toml"  # gpu.cus = [80, 152]


@pytest.fixture(scope="module")
def what_if(tmp_path_factory):
    out = tmp_path_factory.mktemp("what-if") / "sweep"
    proc = run_pooled(["sweep", str(WHAT_IF), "--timing-only", "--out", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    return out


def _capture(monkeypatch) -> list:
    """The figures the report functions save, kept (drawn) for the test to read."""
    from emulator.app import report

    figs, real = [], report._save

    def keep(plt, fig, path, tight=True):
        figs.append(fig)
        return real(plt, fig, path, tight)
    monkeypatch.setattr(report, "_save", keep)
    return figs


def _drawn(fig):
    """``fig`` drawn again as it was saved (a closed figure keeps no canvas): its renderer."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    return canvas.get_renderer()


def _texts(fig) -> list[str]:
    out = [fig._suptitle.get_text()] if fig._suptitle else []
    for ax in fig.axes:
        out += [ax.get_title()] + [t.get_text() for t in ax.get_xticklabels()]
    return out


def test_a_what_if_sweep_s_labels_carry_its_set_values(what_if, tmp_path, monkeypatch):
    from emulator.app import report

    doc = report.load(what_if)
    labels = [report._label(p) for p in doc["points"]]
    assert labels == ["Tiny OP TP2 [gpu.cus=80]", "Tiny OP TP2 [gpu.cus=152]"]
    text = report.text_report(doc)
    for label in labels:  # every table's rows (speedups, overlap, DRAM) name the values
        assert sum(line.startswith(label + " ") for line in text.splitlines()) >= 3, text
    figs = _capture(monkeypatch)
    report.figures(doc, tmp_path, "Tiny OP TP2 [gpu.cus=152]")
    speed, _, timeline, stages = figs
    assert set(labels) <= set(_texts(speed))
    assert "[gpu.cus=152]" in " ".join(_texts(timeline))
    assert "[gpu.cus=152]" in " ".join(_texts(stages))
    assert "[gpu.cus=80]" not in " ".join(_texts(timeline) + _texts(stages))
    # and from the command line: the timeline of the point named with its value
    proc = run_pooled(["report", str(what_if), "--timeline", "Tiny OP TP2 [gpu.cus=80]"],
                      timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "Tiny OP TP2 [gpu.cus=80]" in proc.stdout


def _one_line_refusal(proc, *words: str) -> str:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("t3emu: error: --timeline"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]
    assert proc.stdout == ""  # refused before the tables
    return lines[0]


def test_an_ambiguous_timeline_is_refused_naming_the_points(what_if, tmp_path):
    # the label without the set values fits both points
    proc = run_pooled(["report", str(what_if), "--timeline", "Tiny OP TP2"], timeout=120)
    _one_line_refusal(proc, "ambiguous", "Tiny OP TP2 [gpu.cus=80]",
                      "Tiny OP TP2 [gpu.cus=152]")
    # a results.json whose points lack their set (an older t3emu): the labels are the
    # same, so the refusal names the keys, which --timeline also takes
    old = tmp_path / "old"
    shutil.copytree(what_if, old)
    doc = json.loads((old / "results.json").read_text())
    for p in doc["points"]:
        del p["set"]
    (old / "results.json").write_text(json.dumps(doc))
    proc = run_pooled(["report", str(old), "--timeline", "Tiny OP TP2"], timeout=120)
    line = _one_line_refusal(proc, "ambiguous", *(p["key"] for p in doc["points"]))
    key = doc["points"][1]["key"]
    assert key in line
    proc = run_pooled(["report", str(old), "--timeline", key, "--no-figures"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    proc = run_pooled(["report", str(what_if), "--timeline", "Tiny OP TP9"], timeout=120)
    _one_line_refusal(proc, "no such point")


def _ficco_doc(n_paper: int = 16, n_synthetic: int = 8) -> dict:
    """A FiCCO sweep's document with made-up times (the figure's layout only)."""
    from emulator.app import report_ficco as rf

    rnd = random.Random(1)
    modes = [n for n, c in rf._REG.configurations.items() if c.design.startswith("FiCCO")
             and c.design != "FiCCO measure"]

    def point(name, sub):
        return {"key": name, "model": name, "sublayer": sub, "m": 8192, "n": 1024,
                "k": 4096, "tp": 8, "system": None, "set": {},
                "runs": [{"mode": m, "modelled_time_s": 1.0 if m == rf.SERIAL
                          else 1.0 / (1.0 + rnd.random())} for m in modes]}
    return {"scenario": "made-up", "points": [point(f"g{i}", "SP+TP")
                                              for i in range(1, n_paper + 1)]
            + [point(f"s{i}", "synthetic") for i in range(1, n_synthetic + 1)]}


def test_ficco_speedup_legend_is_beside_the_axes_off_every_bar(tmp_path, monkeypatch):
    from matplotlib.patches import Rectangle

    from emulator.app import report_ficco as rf

    figs = _capture(monkeypatch)
    written = rf.figures(_ficco_doc(), tmp_path)
    assert tmp_path / "ficco_speedup.png" in written
    fig = figs[0]
    renderer = _drawn(fig)
    legends = [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    bars = [p.get_window_extent(renderer) for ax in fig.axes for p in ax.patches
            if isinstance(p, Rectangle) and p.get_height() > 0]
    assert len(bars) > 16 * 10
    assert not any(box.overlaps(b) for b in bars)
    for ax in fig.axes:  # beside the axes, not on them
        assert not box.overlaps(ax.get_window_extent(renderer))


def test_fused_time_suptitle_is_above_every_panel(tmp_path, monkeypatch):
    from emulator.app import report_fused as rf

    base = rf._REG.baseline()
    fused = rf.designs_modes({"points": [{"runs": [{"mode": n}]} for n in
                                         rf._REG.configurations]})[0]
    pts = [{"key": f"c{c}/m{m}", "model": f"case {c}", "sublayer": "GEMV+AR", "m": m,
            "n": 1, "k": 4096, "tp": 4, "system": "mi210x4", "device": "mi210",
            "params": {}, "set": {},
            "runs": [{"mode": base, "modelled_time_s": 1.0},
                     {"mode": fused, "modelled_time_s": 0.6}]}
           for c in range(13) for m in (1024, 4096)]  # 13 panels: 5 rows
    figs = _capture(monkeypatch)
    rf.figures({"scenario": "a scenario with a long name to wrap " * 4, "points": pts},
               tmp_path)
    fig = figs[0]
    renderer = _drawn(fig)
    sup = fig._suptitle.get_window_extent(renderer)
    for ax in fig.axes:
        if ax.get_visible() and ax.axison:
            assert sup.y0 >= ax.title.get_window_extent(renderer).y1, ax.get_title()
            assert sup.y0 >= ax.get_window_extent(renderer).y1


def _estimate(phase: str, backward: bool, kind: str = "transformer") -> dict:
    d = {"layer_forward_s": 1e-3, "layer_backward_s": 2e-3 if backward else 0.0}
    return {"setting": {"phase": phase, "kind": kind}, "designs": {"sequential": d,
                                                                   "fused": dict(d)}}


def test_a_model_figure_names_what_was_estimated():
    from emulator.workload.report import estimated

    dec = estimated(_estimate("decode", False))
    assert "decode" in dec["step"] and "decode" in dec["layer"]
    assert "backward" not in dec["layer"] + dec["passes"] + dec["step"]
    pre = estimated(_estimate("prefill", False))
    assert "prefill" in pre["layer"] and "backward" not in pre["layer"] + pre["passes"]
    train = estimated(_estimate("training", True))
    assert "forward + backward" in train["layer"] and "training" in train["step"]
    assert train["passes"] == "forward and backward passes"
