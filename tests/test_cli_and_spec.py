"""CLI usage errors, --help without MPI, device presets and device-file validation."""

import subprocess
import sys

import pytest

from devices.spec import SpecError, list_presets, load_device, parse_spec
from tests.conftest import ROOT, run_cli


def test_help_does_not_import_mpi_or_numba():
    code = ("import sys; from click.testing import CliRunner; from emulator.app.cli import main; "
            "r = CliRunner().invoke(main, ['run', '--help']); assert r.exit_code == 0, r.output; "
            "assert '--collective' in r.output; "
            "assert 'mpi4py' not in sys.modules and 'numba' not in sys.modules, 'imported'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, timeout=60)


@pytest.mark.parametrize("args,option", [
    (["--collective", "bogus"], "--collective"),
    (["--mode", "fast"], "--mode"),
    (["--topology", "torus"], "--topology"),
    (["--dtype", "fp8"], "--dtype"),
    (["--m", "0"], "--m"),
    (["--k", "-5"], "--k"),
    (["-n", "0"], "--ranks"),
    (["--device", "no-such-gpu"], "--device"),
])
def test_bad_usage_exits_2_with_one_line(args, option):
    proc = run_cli(["run", *args], timeout=60)
    assert proc.returncode == 2, proc.stderr
    assert option in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_devices_lists_presets():
    proc = run_cli(["devices"], timeout=60)
    assert proc.returncode == 0 and "t3-sim" in proc.stdout and "t3-sim-2x-cu" in proc.stdout
    # --details: every GPU's four data movers with their fraction and source (a100-sxm's
    # copy engine), its GEMM kernels and launch
    import json

    proc = run_cli(["devices", "--details", "--json"], timeout=60)
    doc = json.loads(proc.stdout)
    movers = {(m["gpu"], m["part"]): m for m in doc["movers"]}
    for name in list_presets():
        for part in ("SM stores", "copy engine", "NIC put", "library", "GEMM", "launch"):
            assert (name, part) in movers, (name, part)
    copy = movers[("a100-sxm", "copy engine")]
    assert copy["what"] == "0.9 of the link's peak; 2 us set-up per copy or flag write"
    assert copy["source"].startswith("p2pBandwidthLatency")
    launch = movers[("a100-sxm", "launch")]
    assert launch["what"] == "3.55 us per kernel, before it starts on the GPU"
    assert launch["source"].startswith("Accel-Sim SM80_A100")


def test_tables_fit_the_terminal_and_give_the_same_rows_in_every_form():
    """devices and configs: the table fits $COLUMNS (no word cut); CSV, JSON and Markdown
    hold the same rows."""
    import csv
    import io
    import json

    from tests.conftest import test_env

    env = {**test_env(), "COLUMNS": "100"}
    table = run_cli(["devices"], timeout=60, env=env).stdout
    assert max(len(line) for line in table.splitlines()) <= 100, table
    doc = json.loads(run_cli(["devices", "--format", "json"], timeout=60, env=env).stdout)
    names = [g["name"] for g in doc["gpus"]]
    assert names == list_presets()
    rows = run_cli(["devices", "--format", "csv"], timeout=60, env=env).stdout
    first = rows.split("\n# systems")[0].split("\n", 1)[1]
    assert [r["name"] for r in csv.DictReader(io.StringIO(first))] == names
    md = run_cli(["devices", "--format", "markdown"], timeout=60, env=env).stdout
    assert all(f"| {n} " in md for n in names)
    cfg = json.loads(run_cli(["configs", "--json"], timeout=60, env=env).stdout)
    assert {"operations", "configurations", "params"} <= set(cfg)
    assert any(c["name"] == "t3" and "gemm+rs" in c["operations"]
               for c in cfg["configurations"])
    text = run_cli(["configs"], timeout=60, env=env).stdout
    assert max(len(line) for line in text.splitlines()) <= 100


def test_every_preset_states_its_launch_cost_with_a_source():
    for name in list_presets():
        spec = load_device(name)
        assert len(spec.launch_source) > 20, name
    # the vendors' GPUs: a GPU-side gap of 1 to 4 us, never the zero of T3's simulator
    for name in ("a100-sxm", "a100-pcie", "h800", "mi210", "mi300x"):
        assert 1e-6 <= load_device(name).launch_s <= 4e-6, name


def test_every_preset_states_each_executor_with_a_source():
    for name in list_presets():
        spec = load_device(name)
        ex = spec.executors
        for f in (ex.store_fraction, ex.copy_fraction, ex.put_fraction,
                  spec.interconnect.library_fraction):
            assert 0 < f <= 1, name
        assert set(ex.sources) == {"store", "copy", "put", "library"}, name
        assert all(len(v) > 20 for v in ex.sources.values()), (name, ex.sources)
    # the NVIDIA and AMD GPUs: no executor at the link's peak
    for name in ("a100-sxm", "a100-pcie", "h800", "mi210", "mi300x"):
        ex = load_device(name).executors
        assert max(ex.store_fraction, ex.copy_fraction, ex.put_fraction) < 1, name


@pytest.mark.parametrize("key,value,match", [
    ("copy_fraction", None, "missing key 'copy_fraction'"),
    ("store_fraction", 1.5, r"store_fraction = 1.5 must be in \(0, 1\]"),
    ("put_fraction", 0, "put_fraction = 0 is impossible"),
    ("store_source", 3, "must be a string"),
])
def test_an_executor_without_its_figure_is_refused(key, value, match):
    doc = _doc()
    if value is None:
        del doc["executors"][key]
    else:
        doc["executors"][key] = value
    with pytest.raises(SpecError, match=match):
        parse_spec(doc, "x.toml")


def test_default_preset_is_the_t3_system():
    spec = load_device("t3-sim")
    assert (spec.cus, spec.clock_hz, spec.l2_bytes, spec.hbm_bw) == (80, 1.4e9, 16 << 20, 1e12)
    assert spec.interconnect.link_bw == 75e9 and spec.interconnect.link_latency_s == pytest.approx(500e-9)
    assert load_device("t3-sim-2x-cu").cus == 160
    assert set(list_presets()) >= {"t3-sim", "t3-sim-2x-cu"}


def _doc():
    import tomllib

    return tomllib.loads((ROOT / "devices/presets/t3-sim.toml").read_text())


def test_device_file_errors_name_the_key(tmp_path):
    doc = _doc()
    doc["memory"]["hbm_gb_per_s"] = 0
    with pytest.raises(SpecError, match="hbm_gb_per_s.*impossible"):
        parse_spec(doc, "x.toml")
    doc = _doc()
    doc["compute"]["warp_size"] = 64
    with pytest.raises(SpecError, match="unknown key.*warp_size"):
        parse_spec(doc, "x.toml")
    doc = _doc()
    del doc["dma"]["engines"]
    with pytest.raises(SpecError, match="missing key 'engines'"):
        parse_spec(doc, "x.toml")
    doc = _doc()
    doc["compute"]["cus"] = "eighty"
    with pytest.raises(SpecError, match="must be an integer"):
        parse_spec(doc, "x.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("name = [")
    with pytest.raises(SpecError, match="malformed TOML"):
        load_device(str(bad))


def test_gemm_table_fits_the_terminal_and_gives_the_same_rows_in_every_form():
    import csv
    import io
    import json

    from tests.conftest import test_env

    args = ["gemm", "--device", "a100-sxm", "--m", "8192", "--n", "6144", "--k", "12288"]
    for cols in (80, 100):
        env = {**test_env(), "COLUMNS": str(cols)}
        text = run_cli(args, timeout=60, env=env).stdout.splitlines()
        assert max(len(line) for line in text[1:]) <= cols, "\n".join(text)
    rows = json.loads(run_cli(args + ["--format", "json"], timeout=60).stdout)
    assert rows[0]["pick"] == "<- the heuristic's pick" and len(rows) > 1
    got = list(csv.DictReader(io.StringIO(run_cli(args + ["--format", "csv"], timeout=60).stdout)))
    assert [r["kernel"] for r in got] == [r["kernel"] for r in rows]
    assert [r["predicted_us"] for r in got] == [r["predicted_us"] for r in rows]
    md = run_cli(args + ["--format", "markdown"], timeout=60).stdout
    assert all(f"| {r['kernel']} " in md for r in rows)


def test_run_summary_and_report_tables_fit_the_terminal(tmp_path, monkeypatch):
    """The run's summary table (tables.render): as wide as $COLUMNS where the words
    allow; the report's grids in the same layout, their headers whole (never wrapped),
    the numbers as printed before (e.g. 1.143x)."""
    import json

    from emulator.app.report import _grid
    from emulator.app.worker import summary_table

    out = tmp_path / "run.json"
    proc = run_cli(["run", "-n", "2", "--collective", "ar", "--m", "256", "--n", "256", "--k",
                    "64", "--timing-only", "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    modes = [r["mode"] for r in doc["runs"]]
    rows = [{"name": f"point {i}", "speedup": f"{1 + i / 7:.3f}x",
             "note": ("a long note of many words " * 3)[:66].strip()} for i in range(3)]
    for cols in (80, 100):
        monkeypatch.setenv("COLUMNS", str(cols))
        lines = summary_table(doc).splitlines()
        table = [ln for ln in lines if ln.startswith(("mode ", "---", *modes))
                 and not ln.startswith(tuple(f"{m} beats" for m in modes))]
        assert len(table) >= len(modes) + 2
        assert max(len(ln) for ln in table) <= cols, "\n".join(lines)
        grid = _grid([("name", "speedup", "note")] + [tuple(r.values()) for r in rows], 3)
        assert max(len(ln) for ln in grid.splitlines()) <= cols, grid
        # too wide for 80 columns: two tables, each led by the row names, no blank line
        # between them (a blank line ends a report's section)
        heads = [ln.split() for ln in grid.splitlines() if ln.startswith("name")]
        assert heads == ([["name", "speedup"], ["name", "note"]] if cols == 80
                         else [["name", "speedup", "note"]]), grid
        assert "1.143x" in grid and "" not in grid.splitlines()
        assert grid.count("\n--") == 2 * len(heads)  # each table's header rule and rule


def test_a_table_too_wide_for_the_terminal_is_split_into_column_groups(monkeypatch):
    from emulator.app.tables import column_groups, fill, render

    assert column_groups([10, 5, 5, 30, 40], 30) == [[0, 1, 2], [0, 3], [0, 4]]
    assert column_groups([10, 5], 30) == [[0, 1]]
    rows = [{"n": f"row {i}", **{f"c{j}": f"{i * j:>6}" for j in range(8)}} for i in range(3)]
    cols = ["n", *(f"c{j}" for j in range(8))]
    whole = render(rows, cols, split=True, limit=200)
    assert len(whole.splitlines()) == 5  # header, rule, 3 rows
    parts = render(rows, cols, split=True, limit=30)
    assert max(len(ln) for ln in parts.splitlines()) <= 30, parts
    assert [ln.split()[0] for ln in parts.splitlines() if not ln.startswith("-")].count(
        "row") == 3 * parts.count("\n--")  # every row in every group
    assert sorted(w for ln in parts.splitlines() if ln.startswith("n ")
                  for w in ln.split()[1:]) == sorted(cols[1:])
    monkeypatch.delenv("COLUMNS", raising=False)  # output no terminal: whole, as piped
    assert render(rows, cols, split=True) == render(rows, cols)
    assert fill("word " * 40) == ("word " * 40)
    monkeypatch.setenv("COLUMNS", "30")
    assert render(rows, cols, split=True) == parts
    assert max(len(ln) for ln in fill("word " * 40).splitlines()) <= 30


def test_tables_render_aligns_rules_and_keeps_every_form_to_the_rows():
    import json

    from emulator.app.tables import render

    rows = [{"a": "x", "b": "1,090", "c": "one two three four"}, None,
            {"a": "yy", "b": "10.0 us", "c": "z"}]
    table = render(rows, ["a", "b", "c"], limit=20, align={"b": "right"}, wrap=["c"])
    assert max(len(ln) for ln in table.splitlines()) <= 20, table
    assert "x     1,090" in table and table.count("\n--  ") == 2
    assert json.loads(render(rows, ["a", "b"], "json")) == [{"a": "x", "b": "1,090"},
                                                            {"a": "yy", "b": "10.0 us"}]
    assert render(rows, ["a", "b"], "csv").splitlines() == ["a,b", 'x,"1,090"', "yy,10.0 us"]
    assert "|   1,090 |" in render(rows, ["a", "b"], "markdown", align={"b": "right"})
