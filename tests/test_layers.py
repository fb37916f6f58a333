"""The architecture, checked: imports point down the layers, the engine and the model
import without MPI, and nothing outside the registry branches on an operation or
configuration name."""

import ast
import subprocess
import sys
from pathlib import Path

import pytest

from emulator.app.catalog import registry

ROOT = Path(__file__).resolve().parent.parent

# package -> imports it must never make (prefixes)
FORBIDDEN = {
    "devices": ("emulator", "collectives"),
    "emulator/model": ("collectives", "emulator.app", "emulator.engine", "emulator.runtime"),
    "emulator/engine": ("collectives", "emulator.app"),
    "emulator/runtime": ("collectives", "emulator.app", "emulator.engine"),
    "collectives": ("emulator.app",),
}


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            out.append((node.lineno, node.module))
            out += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return out


def test_imports_point_down_the_layers():
    wrong = []
    for package, banned in FORBIDDEN.items():
        for path in sorted((ROOT / package).rglob("*.py")):
            for line, name in _imports(path):
                if any(name == b or name.startswith(b + ".") for b in banned):
                    wrong.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_walker_sees_a_wrong_arrow(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from collectives.registry import REGISTRY\nimport emulator.app.cli\n")
    assert [n for _, n in _imports(bad)][:1] == ["collectives.registry"]


def test_collectives_and_the_model_import_without_mpi():
    code = ("import sys; import collectives.registry, emulator.model.transfers, "
            "emulator.engine.plan, emulator.engine.registry, emulator.app.catalog; "
            "print('mpi4py.MPI' in sys.modules, 'numba' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=ROOT, check=True).stdout.split()
    assert out == ["False", "False"]


def _names() -> set[str]:
    reg = registry()
    return ({n for op in reg.operations.values() for n in (op.name, *op.aliases)}
            | set(reg.configurations))


def _branches(path: Path, names: set[str]) -> list[str]:
    """Comparisons (==, !=, in) and startswith/endswith tests against a registered name."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        consts = []
        if isinstance(node, ast.Compare):
            for side in [node.left, *node.comparators]:
                if isinstance(side, ast.Constant):
                    consts.append(side.value)
                elif isinstance(side, (ast.Tuple, ast.List, ast.Set)):
                    consts += [e.value for e in side.elts if isinstance(e, ast.Constant)]
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr in ("startswith", "endswith")):
            consts = [a.value for a in node.args if isinstance(a, ast.Constant)]
            consts = [c for c in consts if isinstance(c, str)
                      and any(n.startswith(c) or n.endswith(c) for n in names)]
            found += [f"{path.relative_to(ROOT)}:{node.lineno} tests a name by {c!r}"
                      for c in consts]
            continue
        found += [f"{path.relative_to(ROOT)}:{node.lineno} compares with {c!r}" for c in consts
                  if isinstance(c, str) and c in names]
    return found


def test_no_module_outside_the_registry_branches_on_a_name():
    names = _names()
    allowed = {ROOT / "collectives" / "registry.py"}
    found = []
    for package in ("emulator", "collectives", "devices"):
        for path in sorted((ROOT / package).rglob("*.py")):
            if path not in allowed:
                found += _branches(path, names)
    assert not found, "branches on operation/configuration names:\n" + "\n".join(found)


@pytest.mark.parametrize("src", ['if mode == "t3": pass', 'x = c in ("ag", "ag-gemm")',
                                 'y = mode.startswith("ideal")'])
def test_the_branch_finder_sees_a_switchboard(tmp_path, src):
    f = ROOT / "tests" / f"_tmp_switch_{abs(hash(src))}.py"
    f.write_text(src + "\n")
    try:
        assert _branches(f, _names())
    finally:
        f.unlink()
