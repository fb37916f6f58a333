"""The Python API (emulator/api.py) runs what the CLI runs and returns the same numbers."""

from __future__ import annotations

import json

import pytest

from emulator import api
from tests import conftest
from tests.conftest import ROOT, run_cli

SHAPE = {"m": 4096, "n": 2048, "k": 512}  # 512 output tiles: more CUs make the GEMM faster


@pytest.fixture
def api_env(monkeypatch):
    """The test environment the CLI tests use (PYTHONPATH, no inherited MPI variables)."""
    for key, value in conftest.test_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.chdir(ROOT)


def _fields(run: dict) -> dict:
    return {k: v for k, v in run.items() if k != "wall_time_s"}


def test_a_run_returns_the_clis_numbers(api_env, tmp_path):
    res = api.run("gemm+rs", system="mi210x4", modes=["sequential", "t3", "t3-mca"],
                  timing_only=True, set={"gpu.cus": 160}, **SHAPE)
    assert res.modes == ["sequential", "t3", "t3-mca"]
    assert "t3" in res and res["t3"].baseline == "sequential"
    assert res["t3"].speedup == pytest.approx(res["sequential"].modelled_time_s
                                              / res["t3"].modelled_time_s)
    assert res.config["overrides"] == [["gpu.cus", 160]]
    assert "--set gpu.cus=160" in res.header and res.summary().startswith(res.header)
    out = tmp_path / "cli.json"
    proc = run_cli(["run", "--collective", "gemm+rs", "--system", "mi210x4", "--mode",
                    "sequential,t3,t3-mca", "--timing-only", "--set", "gpu.cus=160",
                    "--m", "4096", "--n", "2048", "--k", "512", "--json", str(out)])
    assert proc.returncode == 0, proc.stderr
    cli = json.loads(out.read_text())
    assert [_fields(r) for r in cli["runs"]] == [_fields(r) for r in res.doc["runs"]]
    # --set gpu.cus=160 is the same device as a GPU file that says cus = 160
    presets = ROOT / "devices" / "presets"
    gpu = (presets / "mi210.toml").read_text()
    assert "\ncus = 104" in gpu
    (tmp_path / "mi210-160.toml").write_text(gpu.replace("\ncus = 104", "\ncus = 160"))
    system = (presets / "systems" / "mi210x4.toml").read_text()
    assert 'gpu = "mi210"' in system
    (tmp_path / "sys.toml").write_text(system.replace('gpu = "mi210"', 'gpu = "mi210-160.toml"'))
    edited = api.run("gemm+rs", system=str(tmp_path / "sys.toml"),
                     modes=["sequential", "t3", "t3-mca"], timing_only=True, **SHAPE)
    assert [r["modelled_time_s"] for r in edited.doc["runs"]] == \
        [r["modelled_time_s"] for r in res.doc["runs"]]
    plain = api.run("gemm+rs", system="mi210x4", modes=["sequential"], timing_only=True,
                    **SHAPE)
    assert plain["sequential"].modelled_time_s != res["sequential"].modelled_time_s


@pytest.mark.parametrize("options,option", [
    ({"ranks": 0}, "-n/--ranks"), ({"m": "abc"}, "--m"), ({"m": 1.5}, "--m"),
    ({"params": {"tables": "abc"}}, "--param"), ({"set": ["gpu.cus"]}, "--set"),
    ({"ablate": "launches,nope"}, "--ablate"), ({"timing_only": "yes"}, "--timing-only"),
    ({"watchdog_s": "x"}, "--watchdog-s"), ({"modes": 3}, "--mode"),
    ({"system": "mi210x4", "device": "mi210"}, "--device"),
])
def test_bad_arguments_name_their_option(options, option):
    with pytest.raises(api.ConfigError, match=f"invalid value for {option}"):
        api.config("gemm+rs", **options)


def test_list_options_take_lists_or_comma_separated_text(api_env):
    a = api.config("gemm+rs", system="mi210x4", modes="sequential,t3", ablate="launches",
                   set=["gpu.cus=160"], timing_only=True)
    b = api.config("gemm+rs", system="mi210x4", modes=["sequential", "t3"],
                   ablate=["launches"], set={"gpu.cus": 160}, timing_only=True)
    assert a == b and a.mode == "sequential,t3" and a.ablate == ("launches",)


def test_bad_input_raises_config_error(api_env):
    with pytest.raises(api.ConfigError, match="--set"):
        api.config("gemm+rs", system="mi210x4", set={"gpu.cuz": 1})
    with pytest.raises(api.ConfigError, match="cus = -1 is impossible"):
        api.config("gemm+rs", system="mi210x4", set={"gpu.cus": -1})
    with pytest.raises(api.ConfigError, match="--mode"):
        api.config("gemm+rs", modes=["nope"])


def test_a_sweep_returns_the_clis_numbers(api_env, tmp_path):
    sw = api.sweep("example", out=tmp_path / "api", timing_only=True)
    assert sw.exit_code == 0 and len(sw.points) == 4
    assert sw.points[0]["t3"].speedup > 1
    proc = run_cli(["sweep", "example", "--timing-only", "--out", str(tmp_path / "cli")])
    assert proc.returncode == 0, proc.stderr
    # without a terminal: a line per point
    assert proc.stderr.count("sweep example: [") == 4, proc.stderr
    cli = api.load_sweep(tmp_path / "cli")
    assert [p.key for p in cli.points] == [p.key for p in sw.points]
    for a, b in zip(cli.points, sw.points):
        assert [_fields(r) for r in a.doc["runs"]] == [_fields(r) for r in b.doc["runs"]]


def test_pooled_runs_give_a_plain_runs_numbers(api_env, monkeypatch):
    """Runs inside ``api.pooled()`` share one MPI job per size (two sizes here, the first
    again after the second) and give every field a job of its own gives."""
    shapes = [(4, 4096), (2, 2048), (4, 2048)]
    with api.pooled(keep=2):
        pooled = [api.run("gemm+rs", device="mi210", ranks=r, m=m, n=2048, k=512,
                          modes=["sequential", "t3"], timing_only=True) for r, m in shapes]
    monkeypatch.setenv("T3EMU_NO_POOL", "1")
    with api.pooled():  # turned off: a job per run
        plain = [api.run("gemm+rs", device="mi210", ranks=r, m=m, n=2048, k=512,
                         modes=["sequential", "t3"], timing_only=True) for r, m in shapes]
    for a, b in zip(pooled, plain, strict=True):
        assert [_fields(r) for r in a.doc["runs"]] == [_fields(r) for r in b.doc["runs"]]
        assert a.output.count("lower bounds") == 1  # the run's own output, whole
