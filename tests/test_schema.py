"""One schema layer for every TOML file (``devices/schema.py``): the same one-line errors
for GPU and system presets, scenarios and model files, and the JSON Schema exported for
editors agrees with the loaders, checked by an independent validator (``jsonschema``)."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import jsonschema
import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from devices.schema import OMIT, Key, SpecError, Table, check, flat
from devices.spec import parse_spec
from devices.system import parse_system
from emulator.app import schemas
from emulator.app.scenario import ScenarioError, load_scenario
from emulator.workload.spec import parse_model
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parent.parent
SHIPPED = {
    "device": sorted((ROOT / "devices" / "presets").glob("*.toml")),
    "system": sorted((ROOT / "devices" / "presets" / "systems").glob("*.toml")),
    "scenario": sorted((ROOT / "run").glob("*.toml")),
    "model": sorted((ROOT / "emulator" / "workload" / "models").glob("*.toml")),
}


def _validator(kind: str) -> jsonschema.Draft202012Validator:
    doc = json.loads((ROOT / "docs" / "schemas" / f"{kind}.schema.json").read_text())
    jsonschema.Draft202012Validator.check_schema(doc)
    return jsonschema.Draft202012Validator(doc)


@pytest.mark.parametrize("kind", schemas.KINDS)
def test_the_shipped_schemas_are_the_exported_ones(kind):
    """docs/schemas is made by `t3emu schema --out docs/schemas`."""
    shipped = (ROOT / "docs" / "schemas" / f"{kind}.schema.json").read_text()
    assert shipped == schemas.text(kind), f"regenerate: t3emu schema --out docs/schemas"


@pytest.mark.parametrize("kind", schemas.KINDS)
def test_every_shipped_file_is_valid_under_its_exported_schema(kind):
    validator = _validator(kind)
    assert SHIPPED[kind]
    for path in SHIPPED[kind]:
        errors = [e.message for e in validator.iter_errors(tomllib.loads(path.read_text()))]
        assert not errors, f"{path.name}: {errors}"


def _set(doc: dict, path: str, value) -> dict:
    doc = copy.deepcopy(doc)
    *head, last = path.split(".")
    table = doc
    for part in head:
        table = table[int(part)] if part.isdigit() else table[part]
    if value is _DROP:
        del table[last]
    else:
        table[last] = value
    return doc


_DROP = object()
# (kind, a shipped file, key path, the value written (_DROP: the key removed), the text
# the loader's one-line refusal holds)
BAD = [
    ("device", "h100-sxm", "compute.warp_size", 32, "[compute] unknown key(s) ['warp_size']"),
    ("device", "h100-sxm", "colour", "red", "unknown key(s) ['colour']"),
    ("device", "h100-sxm", "dma.engines", _DROP, "[dma] missing key 'engines'"),
    ("device", "h100-sxm", "memory", _DROP, "missing section [memory]"),
    ("device", "h100-sxm", "compute.cus", "many", "[compute] cus must be an integer"),
    ("device", "h100-sxm", "compute.cus", 1.5, "[compute] cus must be an integer"),
    ("device", "h100-sxm", "memory.hbm_gb_per_s", -1, "hbm_gb_per_s = -1 is impossible hardware"),
    ("device", "h100-sxm", "dma.engines", 0, "engines = 0 is impossible hardware"),
    ("device", "h100-sxm", "memory.hbm_gb_per_s", 1e300, "is implausible hardware"),
    ("device", "h100-sxm", "interconnect.topology", "torus", "topology = 'torus'; allowed"),
    ("device", "h100-sxm", "executors.copy_fraction", 1.5, "copy_fraction = 1.5 must be in (0, 1]"),
    ("device", "h100-sxm", "memory.nmc_update_cost", 0.5, "nmc_update_cost = 0.5 must be >= 1"),
    ("device", "h100-sxm", "gemm.tiles.0.stages", 1, "[gemm] tiles[0] stages = 1 must be >= 2"),
    ("device", "h100-sxm", "gemm.tiles", [], "[gemm] tiles must be a non-empty list"),
    ("device", "h100-sxm", "gemm.enabled", "yes", "[gemm] enabled must be true or false"),
    ("device", "h100-sxm", "compute.atomic_dtypes", ["fp8"], "atomic_dtypes = ['fp8'] must be"),
    ("system", "a100-sxm-x8", "intra.topology", "cube", "[intra] topology = 'cube'; allowed"),
    ("system", "a100-sxm-x8", "nodes", _DROP, "missing key 'nodes'"),
    ("system", "a100-sxm-x8", "intra.links", -2, "[intra] links = -2 is impossible hardware"),
    ("system", "a100-sxm-x8", "intra.library_fraction", 2, "library_fraction = 2 must be in"),
    ("system", "a100-sxm-x8", "intra.cables", 2, "[intra] unknown key(s) ['cables']"),
    ("model", "gpt3-175b", "transformer.layers", 0, "[transformer] layers = 0 must be >= 1"),
    ("model", "gpt3-175b", "transformer.heads", _DROP, "[transformer] missing key 'heads'"),
    ("model", "gpt3-175b", "transformer.ffn", "relu2", "ffn = 'relu2'; allowed: gelu, swiglu"),
    ("model", "gpt3-175b", "run.seq", "long", "[run] seq must be an integer"),
    ("model", "dlrm-128node", "dlrm.top_mlp", [], "top_mlp must be a non-empty list"),
    ("model", "dlrm-128node", "dlrm.bottom_mlp", [64, -1], "bottom_mlp = [64, -1] must be a list"),
    ("scenario", "t3-paper", "colour", "red", "unknown key(s) ['colour']"),
    ("scenario", "t3-paper", "dtype", "fp8", "dtype = 'fp8'; allowed: fp16, bf16, fp32"),
    ("scenario", "t3-paper", "models.0.hidden", 0, "models[0] hidden = 0 must be >= 1"),
    ("scenario", "t3-paper", "models.0.tp", [], "models[0] tp must be a non-empty list"),
    ("scenario", "t3-paper", "models.0.sublayers", ["QK"], "sublayers = ['QK'] must be a list"),
    ("scenario", "t3-paper", "models.0.name", 3, "models[0] name must be a string"),
    ("scenario", "flux-paper", "cases.0.shard", "m", "cases[0] shard = 'm'; allowed: n, k, none"),
    ("scenario", "flux-paper", "cases.0.m", [0], "cases[0] m = [0] must be a list"),
    ("scenario", "flux-paper", "cases.0.k", _DROP, "cases[0] missing key 'k'"),
]


def _file(kind: str, name: str) -> Path:
    return next(p for p in SHIPPED[kind] if p.stem == name)


def _load(kind: str, doc: dict) -> None:
    if kind == "device":
        parse_spec(doc, "x.toml")
    elif kind == "system":
        parse_system(doc, "x.toml")
    else:
        parse_model(doc, "x.toml")


def _toml(value, key: str = "") -> str:
    """A TOML document (tables, arrays of tables, scalars) as text."""
    def scalar(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return json.dumps(v)
        if isinstance(v, list):
            return "[" + ", ".join(scalar(x) for x in v) + "]"
        if isinstance(v, dict):
            return "{" + ", ".join(f"{json.dumps(k)} = {scalar(x)}" for k, x in v.items()) + "}"
        return repr(v)

    lines, tables = [], []
    for k, v in value.items():
        if isinstance(v, dict):
            tables.append((k, v, False))
        elif isinstance(v, list) and v and all(isinstance(x, dict) for x in v):
            tables.append((k, v, True))
        else:
            lines.append(f"{json.dumps(k)} = {scalar(v)}")
    for k, v, many in tables:
        name = f"{key}.{json.dumps(k)}" if key else json.dumps(k)
        for item in (v if many else [v]):
            lines.append(f"[[{name}]]" if many else f"[{name}]")
            lines.append(_toml(item, name))
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("kind,name,path,value,needle", BAD,
                         ids=[f"{b[0]}-{b[2]}" for b in BAD])
def test_a_bad_file_is_refused_in_one_line_and_by_its_json_schema(tmp_path, kind, name, path,
                                                                  value, needle):
    doc = _set(tomllib.loads(_file(kind, name).read_text()), path, value)
    file = tmp_path / "x.toml"
    file.write_text(_toml(doc))
    assert tomllib.loads(file.read_text()) == doc
    errors = (ScenarioError, SpecError)
    with pytest.raises(errors) as exc:
        if kind == "scenario":
            load_scenario(str(file))
        else:
            _load(kind, doc)
    message = str(exc.value)
    assert needle in message and "\n" not in message, message
    assert message.startswith(f"{file if kind == 'scenario' else 'x.toml'}:"), message
    assert list(_validator(kind).iter_errors(doc)), f"the JSON Schema admits {path} = {value!r}"


def test_check_returns_values_by_attribute_in_si_with_defaults():
    table = Table({
        "name": Key(str),
        "mem": Table({"hbm_gb_per_s": Key(float, attr="hbm_bw", scale=1e9),
                      "latency_ns": Key(float, attr="lat", scale=1e-9, default=0.0, zero=True),
                      "banks": Key(int, default=OMIT)}),
        "nic": Table({"count": Key(int, default=0, zero=True)}, required=False, empty=True),
        "moe": Table({"experts": Key(int)}, required=False),
    }, hardware=True)
    values = check({"name": "g", "mem": {"hbm_gb_per_s": 2}}, table, "g.toml")
    assert values == {"name": "g", "mem": {"hbm_bw": 2e9, "lat": 0.0}, "nic": {"count": 0}}
    assert flat(values, table) == {"name": "g", "hbm_bw": 2e9, "lat": 0.0, "count": 0}
    with pytest.raises(SpecError, match=r"^g.toml: \[mem\] latency_ns = -1 is impossible "
                                        r"hardware; it must be >= 0$"):
        check({"name": "g", "mem": {"hbm_gb_per_s": 2, "latency_ns": -1}}, table, "g.toml")
    with pytest.raises(SpecError, match=r"^g.toml: \[moe\] missing key 'experts'$"):
        check({"name": "g", "mem": {"hbm_gb_per_s": 2}, "moe": {}}, table, "g.toml")


def test_t3emu_schema_prints_and_writes(tmp_path):
    proc = run_cli(["schema", "scenario"], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == schemas.document("scenario")
    proc = run_cli(["schema", "--out", str(tmp_path)], timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        f"{k}.schema.json" for k in schemas.KINDS)
    proc = run_cli(["schema"], timeout=60)
    assert proc.returncode == 2 and "give KIND" in proc.stderr
