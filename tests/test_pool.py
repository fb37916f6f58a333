"""Pooled jobs (``emulator.app.pool``): a sweep's points and a model's operations run in one
MPI job per job size, with results identical to a job per run, and a point that crashes,
is killed or hangs inside a pooled job is reported with its label while the rest go on."""

from __future__ import annotations

import json
import textwrap

from tests import conftest
from tests.conftest import ROOT, run_cli

PLUGIN = textwrap.dedent('''
    """Test plugin: the sequential baseline, except that rank 1 fails at some M."""
    import os
    import signal
    import time

    from emulator.engine.registry import REGISTRY, Configuration

    def build(p, op, algorithm):
        if p.rank == 1 and p.m == 512:
            raise RuntimeError("the plugin's injected crash")
        if p.rank == 1 and p.m == 768:
            os.kill(os.getpid(), signal.SIGKILL)
        if p.rank == 1 and p.m == 1024:
            while True:  # a hang: only the peers' watchdogs end it
                time.sleep(1.0)
        return REGISTRY.configurations["sequential"].build(p, op, algorithm)

    REGISTRY.add_configuration(Configuration(
        "flaky", "sequential, failing on rank 1 at some M (test plugin)", "example", build))
''')

SCENARIO = textwrap.dedent('''
    name = "flaky"
    description = "points that crash, are killed or hang in the middle of a sweep"
    dtype = "fp16"

    [[cases]]
    name = "Flaky"
    sublayer = "GEMM-AR"
    operation = "gemm+ar"
    systems = ["mi210x4"]
    m = [256, 512, 768, 1024, 1280]
    n = 512
    k = 1024
    shard = "k"
    modes = ["sequential", "flaky"]
''')


def test_a_failing_point_is_reported_and_the_pooled_sweep_goes_on(tmp_path):
    plugin, scenario = tmp_path / "flaky.py", tmp_path / "flaky.toml"
    plugin.write_text(PLUGIN)
    scenario.write_text(SCENARIO)
    out = tmp_path / "o"
    proc = run_cli(["sweep", str(scenario), "--out", str(out), "--timing-only",
                    "--configs", str(plugin), "--watchdog-s", "5"], timeout=300)
    assert proc.returncode == 1, proc.stderr
    doc = json.loads((out / "results.json").read_text())
    assert [p["m"] for p in doc["points"]] == [256, 1280]  # before and after the failures
    lines = [x for x in proc.stderr.splitlines() if x.startswith("t3emu: Flaky")]
    assert len(lines) == 3 and all("the job failed" in x for x in lines), proc.stderr
    for m, why in ((512, "the plugin's injected crash"), (768, "died without reporting"),
                   (1024, "watchdog")):
        line = next(x for x in lines if f"m={m} " in x)
        log = out / "logs" / line.rsplit("see ", 1)[1].rsplit("/", 1)[1]
        assert why in log.read_text(), (m, log.read_text())
    # the finished points' output is whole: the summary table of both configurations
    log = next((out / "logs").glob("*m1280*"))
    assert "flaky " in log.read_text() and "lower bounds" in log.read_text()


def test_pooled_and_separate_jobs_give_identical_results(tmp_path):
    """The tiny scenario (three job sizes) in pooled jobs and in a job per point: every
    field of every point but the wall times is the same, and so is each point's log."""
    docs = {}
    for name, pool in (("pooled", "0"), ("separate", "1")):
        env = {**conftest.test_env(), "T3EMU_NO_POOL": pool}
        proc = run_cli(["sweep", str(ROOT / "tests" / "data" / "tiny.toml"), "--out",
                        str(tmp_path / name), "--timing-only"], timeout=600, env=env)
        assert proc.returncode == 0, proc.stderr
        docs[name] = json.loads((tmp_path / name / "results.json").read_text())

    def strip(doc):
        for p in doc["points"]:
            for r in p["runs"]:
                r.pop("wall_time_s")
        return doc["points"]

    assert strip(docs["pooled"]) == strip(docs["separate"])
    for log in (tmp_path / "pooled" / "logs").iterdir():
        def text(path):
            return [line.rsplit(" ", 1)[0] if line.endswith("s") else line
                    for line in path.read_text().splitlines() if "s wall" not in line]
        assert text(log) == text(tmp_path / "separate" / "logs" / log.name), log.name


def test_a_runs_configuration_files_are_not_the_next_runs(monkeypatch, tmp_path):
    """A pooled job's ranks, and the test process's in-process command line, forget the
    configurations a run's --configs file registered once the run ends, as a process per
    run would: a second file registering the same name then loads (a rank that kept the
    first would refuse the duplicate), and the test process's registry is as before."""
    from emulator import api
    from emulator.app.catalog import plugins_forgotten, registry
    from tests.conftest import run_pooled

    for key, value in conftest.test_env().items():
        monkeypatch.setenv(key, value)
    before = set(registry().configurations)
    plugin = ROOT / "run" / "configs" / "pull_ag_gemm.py"
    other = tmp_path / "same_name.py"
    other.write_text(plugin.read_text())
    base = ["run", "-n", "2", "--collective", "ag+gemm", "--topology", "full-mesh",
            "--m", "256", "--n", "256", "--k", "128", "--timing-only",
            "--mode", "sequential,pull-ag-gemm"]
    for path in (plugin, other):  # the session's pooled job of 2 ranks, in turn
        proc = run_pooled([*base, "--configs", str(path)])
        assert proc.returncode == 0 and "pull-ag-gemm" in proc.stdout, proc.stderr
    assert set(registry().configurations) == before  # this process: as before
    with api.pooled(), plugins_forgotten():  # the API in a pooled job of its own
        for path in (plugin, other):
            with plugins_forgotten():
                res = api.run("ag+gemm", ranks=3, topology="full-mesh", m=256, n=256, k=128,
                              timing_only=True, modes="sequential,pull-ag-gemm",
                              configs=str(path))
            assert "pull-ag-gemm" in res.modes
    assert set(registry().configurations) == before


def test_a_pooled_run_writes_where_the_callers_directory_is_now(tmp_path, monkeypatch):
    """The job's ranks keep the directory they started in; a run's relative --json path is
    the caller's at the time of the run (a notebook that changes directory between runs)."""
    from emulator import api

    for key, value in conftest.test_env().items():
        monkeypatch.setenv(key, value)
    first, second = tmp_path / "a", tmp_path / "b"
    first.mkdir()
    second.mkdir()
    opts = dict(ranks=2, m=128, n=128, k=64, timing_only=True, modes="sequential")
    with api.pooled():
        monkeypatch.chdir(first)
        api.run("ar", json_path="run.json", **opts)
        monkeypatch.chdir(second)  # the pooled job started in the first
        api.run("ar", json_path="run.json", **opts)
    assert (first / "run.json").exists() and (second / "run.json").exists()
