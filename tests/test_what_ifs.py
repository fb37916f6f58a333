"""--set KEY=VALUE on run and sweep (devices/overrides.py), the defaults that follow the
operation, and the progress a run and a sweep print."""

from __future__ import annotations

import json

import pytest

from collectives.registry import REGISTRY as REG
from devices.overrides import parse, split
from devices.spec import SpecError, load_device
from devices.system import load_system
from tests import conftest
from tests.conftest import run_cli, run_pooled


def _refused(proc, *words: str) -> None:
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, (proc.returncode, proc.stderr)
    assert lines[0].startswith("t3emu: error: invalid value for"), lines[0]
    for w in words:
        assert w in lines[0], lines[0]


def test_values_are_toml_and_keys_name_their_file():
    assert parse("gpu.cus=160") == ("gpu.cus", 160)
    assert parse("intra.library_fraction=0.9") == ("intra.library_fraction", 0.9)
    assert parse("intra.topology=switch") == ("intra.topology", "switch")
    assert parse("gpu.atomic_dtypes=[\"fp32\"]") == ("gpu.atomic_dtypes", ["fp32"])
    assert split("gpu.cus", False) == ("gpu", "compute", "cus")
    assert split("gpu.memory.latency_ns", True) == ("gpu", "memory", "latency_ns")
    assert split("intra.links", True) == ("system", "intra", "links")
    assert split("intra.links", False) == ("gpu", "interconnect", "links")  # no system
    for key, system, why in (("gpu.latency_ns", True, "gpu.memory.latency_ns or "),
                             ("gpu.cuz", False, "unknown key gpu.cuz"),
                             ("nodes", False, "needs --system"),
                             ("network.kind", False, "needs --system"),
                             ("intra.topology", False, "use --topology")):
        with pytest.raises(SpecError, match=why):
            split(key, system)


def test_an_override_is_the_same_as_the_file_saying_it():
    base = load_device("t3-sim")
    spec = load_device("t3-sim", (("gpu.cus", 160), ("gpu.memory.hbm_gb_per_s", 2000),
                                  ("intra.link_gb_per_s_per_direction", 150)))
    assert (spec.cus, spec.hbm_bw, spec.interconnect.link_bw) == (160, 2000e9, 150e9)
    assert load_device("t3-sim-2x-cu").cus == spec.cus != base.cus
    sys2 = load_system("a100-sxm-2x8", (("nodes", 4), ("network.nic_gb_per_s_per_direction",
                                                         50), ("gpu.engines", 4)))
    assert (sys2.interconnect.nodes, sys2.dma_engines) == (4, 4)
    assert sys2.interconnect.nic_bw == 50e9
    with pytest.raises(SpecError, match=r"with --set gpu.cus=-1: \[compute\] cus = -1 is "
                                        r"impossible hardware"):
        load_device("t3-sim", (("gpu.cus", -1),))
    with pytest.raises(SpecError, match="nics_per_node = 3 must divide gpus_per_node = 8"):
        load_system("a100-sxm-2x8", (("network.nics_per_node", 3),))


@pytest.mark.parametrize("args,words", [
    (["--set", "gpu.cuz=1"], ["--set", "unknown key gpu.cuz"]),
    (["--set", "gpu.cus"], ["--set", "KEY=VALUE"]),
    (["--set", "gpu.cus=1", "--set", "gpu.cus=2"], ["--set", "given twice"]),
    (["--set", "nodes=2"], ["--set", "needs --system"]),
    (["--set", "gpu.cus=-1"], ["--device", "cus = -1 is impossible hardware"]),
    (["--set", "gpu.clock_ghz=fast"], ["--device", "clock_ghz must be a number"]),
    (["--system", "a100-sxm-2x8", "--set", "network.nics_per_node=3"],
     ["--system", "must divide gpus_per_node"]),
    (["--set", "gpu.topology=switch"], ["--set", "the topology is --topology's"]),
    (["--set", "gpu.cus=160", "--set", "gpu.compute.cus=170"],
     ["--set", "given twice: gpu.cus and gpu.compute.cus"]),
])
def test_bad_set_is_refused_before_launch(no_launch, args, words):
    env, marker = no_launch
    proc = run_cli(["run", *args], timeout=60, env=env)
    _refused(proc, *words)
    assert not marker.exists()


def _example(path, old: str, new: str):
    """The shipped example scenario with one edit, written to ``path``."""
    text = (conftest.ROOT / "run" / "example.toml").read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return path


def test_bad_set_in_a_sweep_or_a_scenario_is_refused(tmp_path, no_launch):
    env, marker = no_launch
    proc = run_cli(["sweep", "example", "--timing-only", "--out", str(tmp_path / "a"),
                    "--set", "gpu.cus=0"], timeout=60, env=env)
    assert proc.returncode == 2 and "cus = 0 is impossible hardware" in proc.stderr, proc.stderr
    scen = _example(tmp_path / "s.toml", 'dtype = "fp16"',
                    'dtype = "fp16"\nset = { "gpu.cuz" = 1 }')
    proc = run_cli(["sweep", str(scen), "--timing-only", "--out", str(tmp_path / "b")],
                   timeout=60, env=env)
    assert proc.returncode == 2 and "set: unknown key gpu.cuz" in proc.stderr, proc.stderr
    # a key the scenario's set gives, again on the command line: the points would be
    # labelled with the scenario's values and run with the command line's
    swept = _example(tmp_path / "swept.toml", 'dtype = "fp16"',
                     'dtype = "fp16"\nset = { gpu.cus = [80, 160] }')
    from emulator.app.scenario import load_scenario

    assert {p.overrides for p in load_scenario(str(swept)).points} == {
        (("gpu.cus", 80),), (("gpu.cus", 160),)}  # a dotted key is the --set key
    proc = run_cli(["sweep", str(swept), "--timing-only", "--out", str(tmp_path / "d"),
                    "--set", "gpu.compute.cus=200"], timeout=60, env=env)
    assert proc.returncode == 2 and "given twice: gpu.cus and gpu.compute.cus" in proc.stderr \
        and "the scenario's set gives gpu.cus=" in proc.stderr, proc.stderr
    anysize = _example(tmp_path / "any.toml", 'systems = ["mi210x4"]', 'systems = ["t3-sim"]')
    proc = run_cli(["sweep", str(anysize), "--timing-only", "--out", str(tmp_path / "c")],
                   timeout=60, env=env)
    assert proc.returncode == 2 and "holds any number of GPUs" in proc.stderr, proc.stderr
    assert not marker.exists()


def test_a_scenario_sweeps_a_set_list_and_records_it(tmp_path):
    scen = tmp_path / "links.toml"
    scen.write_text('''name = "links"
description = "GEMM + RS at two link rates"
dtype = "fp16"
set = { "intra.link_gb_per_s_per_direction" = [40, 160] }

[[cases]]
name = "FC-2"
sublayer = "FC-2"
operation = "gemm+rs"
systems = ["mi210x4"]
m = [2048]
n = 1024
k = 4096
shard = "k"
modes = ["sequential", "t3"]
''')
    out = tmp_path / "res"
    proc = run_pooled(["sweep", str(scen), "--timing-only", "--out", str(out),
                       "--set", "gpu.launch_us=2"], timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["set"] == [["gpu.launch_us", 2]]
    sets = [p["set"] for p in doc["points"]]
    assert sets == [{"intra.link_gb_per_s_per_direction": v, "gpu.launch_us": 2}
                    for v in (40, 160)]
    slow, fast = ({r["mode"]: r["modelled_time_s"] for r in p["runs"]} for p in doc["points"])
    assert fast["sequential"] < slow["sequential"]  # faster links, a shorter RS
    assert "intra.link_gb_per_s_per_direction=40;gpu.launch_us=2" in \
        (out / "results.csv").read_text()
    # the same point as one run with the same --set: the same numbers
    one = tmp_path / "one.json"
    proc = run_pooled(["run", "--system", "mi210x4", "--collective", "gemm+rs", "--m", "2048",
                       "--n", "1024", "--k", "1024", "--mode", "sequential,t3", "--timing-only",
                       "--set", "intra.link_gb_per_s_per_direction=40",
                       "--set", "gpu.launch_us=2", "--json", str(one)], timeout=300)
    assert proc.returncode == 0, proc.stderr
    run = json.loads(one.read_text())
    assert [r["modelled_time_s"] for r in run["runs"]] == \
        [r["modelled_time_s"] for r in doc["points"][0]["runs"]]
    # a resume with other --set values is refused
    proc = run_pooled(["sweep", str(scen), "--timing-only", "--out", str(out)], timeout=60)
    assert proc.returncode == 2 and "set" in proc.stderr, proc.stderr


@pytest.mark.parametrize("operation,options", [
    ("emb+a2a", []), ("gemv+ar", []),
    # its 18 configurations' numerics at the default shape (a 38 GFLOP GEMM per rank, about
    # 100 s here) are the whole-registry matrices' at small shapes; what this checks is that
    # the defaults follow the operation, which a timing-only run resolves the same way
    ("a2a+gemm", ["--timing-only"])])
def test_the_defaults_follow_the_operation(tmp_path, operation, options):
    """`t3emu run --collective OP` with no other option runs (numerically): the topology
    and the shape are the operation's; the header comes before the job's first word and a
    line per configuration as it finishes."""
    out = tmp_path / "r.json"
    proc = run_pooled(["run", "--collective", operation, *options, "--json", str(out)],
                      timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(out.read_text())
    assert doc["config"]["topology"] == "full-mesh"
    default = REG.operation(operation).shape
    assert (doc["config"]["m"], doc["config"]["n"], doc["config"]["k"]) == default
    numerics = "timing-only" if options else "pass"
    assert len(doc["runs"]) > 1 and all(r["numerics"] == numerics for r in doc["runs"])
    err = proc.stderr.splitlines()
    assert err[0] == doc["header"] and doc["header"].startswith(f"t3emu: {operation.upper()}")
    done = [line for line in err if line.startswith("t3emu: [")]
    assert [line.split("] ")[1].split(":")[0] for line in done] == \
        [r["mode"] for r in doc["runs"]]


def test_the_header_names_nodes_topology_and_network():
    proc = run_pooled(["run", "--system", "mi210-2node", "--collective", "emb+a2a",
                       "--timing-only", "--mode", "sequential"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.startswith(
        "t3emu: EMB+A2A (direct) on 2 nodes x 1 mi210 (full-mesh in a node) over a fabric of "
        "1 NIC x 20 GB/s/dir per node (system mi210-2node), M=1024 N=256 K=10 fp16"), \
        proc.stderr


def test_sweep_help_names_every_shipped_scenario():
    from emulator.app.packaged import scenario_dir

    proc = run_pooled(["sweep", "--help"], timeout=60)
    text = " ".join(proc.stdout.split())
    for path in scenario_dir().glob("*.toml"):
        assert path.stem in text, (path.stem, text)
