"""Every parameter the clock reads has a provenance (``t3emu params``), every assumption a
range, and no numeric literal in the model's code decides a time without being a named
parameter. The rule for literals is ``emulator/model/params.py``'s docstring, applied by
``literals`` below."""

from __future__ import annotations

import ast
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from devices.sources import Source, parse
from devices.spec import SpecError, list_presets
from devices.system import list_systems
from emulator.app.params import device_params, model_rows, system_params
from emulator.model import params

ROOT = Path(__file__).resolve().parents[1]
MODEL_DIRS = ("emulator/model", "emulator/engine", "collectives")
SHAPES = {"reshape", "empty", "zeros", "ones", "full", "tile", "repeat", "default_rng",
          "integers", "stack"}
REGISTERING = {"define", "table", "Param"}


def _power_of_ten(v: float) -> bool:
    return v > 0 and abs(math.log10(v) - round(math.log10(v))) < 1e-9


def _exempt(node: ast.Constant, parents: dict, line: str) -> bool:
    v = node.value
    if v in (0, 1, 2, -1, 0.5) or "# not a parameter:" in line:
        return True
    if isinstance(v, float) and _power_of_ten(v):
        return True  # a unit conversion or a tolerance
    if isinstance(v, int) and v >= 1000 and _power_of_ten(v):
        return True
    p = parents.get(node)
    while p is not None:
        if isinstance(p, ast.Subscript) and isinstance(v, int):
            return True  # an index or a slice
        if isinstance(p, ast.BinOp) and isinstance(p.op, (ast.LShift, ast.Pow)) \
                and isinstance(v, int):
            return True  # 1 << 20, 2 ** -11
        if isinstance(p, ast.Call):
            f = p.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in REGISTERING or (name in SHAPES and isinstance(v, int)):
                return True
        p = parents.get(p)
    return False


def literals(root: Path = ROOT) -> list[str]:
    """'file:line: value' of every literal the rule does not exempt."""
    out = []
    for d in MODEL_DIRS:
        for f in sorted((root / d).glob("*.py")):
            text = f.read_text()
            tree, lines = ast.parse(text), text.splitlines()
            parents = {c: n for n in ast.walk(tree) for c in ast.iter_child_nodes(n)}
            for n in ast.walk(tree):
                if isinstance(n, ast.Constant) and type(n.value) in (int, float) \
                        and not _exempt(n, parents, lines[n.lineno - 1]):
                    out.append(f"{f.relative_to(root)}:{n.lineno}: {n.value!r}")
    return out


def test_no_unnamed_literal_decides_a_time():
    bad = literals()
    assert not bad, ("numeric literals that are no named parameter (define one in "
                     "emulator/model/params.py, or mark the line '# not a parameter: "
                     "REASON'):\n" + "\n".join(bad))


def test_the_rule_catches_a_literal(tmp_path):
    (tmp_path / "emulator" / "model").mkdir(parents=True)
    for d in MODEL_DIRS[1:]:
        (tmp_path / d).mkdir(parents=True, exist_ok=True)
    (tmp_path / "emulator/model/toy.py").write_text(
        "SETUP_S = 1e-9 * 3\n"  # a time from an unnamed 3 ns: caught (1e-9 a unit)
        "X = a[4] + (1 << 20) + b.reshape(-1, 6).sum()\n"  # index, shift, shape: exempt
        "Y = 7  # not a parameter: a test's marker\n"
        "Z = define('z', 12.5, 'us', 'doc', 'paper: x')\n")
    assert literals(tmp_path) == ["emulator/model/toy.py:1: 3"]


@pytest.mark.parametrize("name", list_presets())
def test_every_gpu_preset_key_has_a_source(name):
    for p in device_params(name, strict=True):
        assert p.source.kind != "missing", p.key


@pytest.mark.parametrize("name", list_systems())
def test_every_system_key_has_a_source(name):
    own, gpu = system_params(name, strict=True)
    assert own and gpu


def test_every_model_parameter_has_a_source_and_is_read():
    rows = model_rows()
    for r in rows:
        assert r.source.kind in ("datasheet", "measured", "library", "paper", "derived",
                                 "assumption", "off"), (r.key, r.source)
        if r.source.kind == "assumption":
            assert r.source.low < r.source.high, r.key
        if r.scope == "model":
            assert r.where != "(not read)", f"model parameter {r.key} is read nowhere"


def test_an_assumption_needs_a_range():
    with pytest.raises(SpecError, match="assumption"):
        parse({"assumption": "a guess"}, "x")
    with pytest.raises(SpecError, match="low < high"):
        parse({"assumption": "a guess", "low": 2, "high": 1}, "x")
    with pytest.raises(SpecError, match="KIND"):
        parse("a guess", "x")
    assert parse("paper: T3 Table 1", "x") == Source("paper", "T3 Table 1")


def test_a_preset_without_a_source_is_refused(tmp_path):
    text = (ROOT / "devices/presets/t3-sim.toml").read_text()
    f = tmp_path / "g.toml"
    lines = [ln for ln in text.splitlines() if not ln.startswith('"dma.setup_ns"')]
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(SpecError, match="no source for dma.setup_ns"):
        device_params(str(f), strict=True)
    f.write_text(text.replace('"dma.setup_ns" =', '"dma.setup_ns" = "guess: 50"\n#'))
    with pytest.raises(SpecError, match="KIND"):
        device_params(str(f), strict=True)


def test_set_model_parameter_changes_what_the_code_reads():
    params.activate((("model.shmem_occupancy_loss", 0.25),))
    try:
        assert params.value("shmem_occupancy_loss") == 0.25
        assert "shmem_occupancy_loss" in params.reads()
    finally:
        params.activate(())
    assert params.value("shmem_occupancy_loss") == 0.125
    with pytest.raises(params.ParamError, match="unknown model parameter"):
        params.check("model.nope", 1.0)


def test_params_command_lists_and_exports():
    cmd = [sys.executable, "-m", "emulator.app.cli", "params"]
    out = subprocess.run(cmd + ["--device", "t3-sim", "--json"], capture_output=True,
                         text=True, cwd=ROOT, check=True).stdout
    rows = json.loads(out)
    setup = next(r for r in rows if r["key"] == "dma.setup_ns")
    assert setup["set"] == "gpu.dma.setup_ns" and setup["source"]["kind"]
    text = subprocess.run(cmd + ["--system", "a100-pcie-x8"], capture_output=True,
                          text=True, cwd=ROOT, check=True, env={"COLUMNS": "200",
                                                                "PATH": ""}).stdout
    assert "intra.socket_gb_per_s_per_direction" in text and "parameters:" in text
    bad = subprocess.run(cmd + ["--device", "t3-sim", "--system", "t3-sim"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2
