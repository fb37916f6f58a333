"""The causes of a gain: each counterfactual removes exactly its cost (hand-derived toy
logs, tests/mpi/ablation_log.py), the split adds up, and the CLI and sweep carry it."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from emulator.model.ablation import ORDER, RUNS, AblationError, ablate, check, split, steps
from tests.conftest import run_cli, run_mpi_script, run_pooled

CHECKS = ["launches launch-wait", "launches cu-steps",
          "library-latency (unablated) cu-steps-library", "library-latency cu-steps-library",
          "executor-parity wg-stores", "executor-parity dma-push", "executor-parity nic",
          "gemm-efficiency (unablated) loaded-latency", "gemm-efficiency loaded-latency",
          "link-efficiency (unablated, fraction 0.5) cu-steps", "link-efficiency cu-steps",
          "contention (unablated) dma-push", "contention dma-push",
          "dram-traffic wg-stores", "dram-traffic cu-steps", "dram-traffic launch-wait"]


@pytest.fixture(scope="module")
def job():
    return run_mpi_script("ablation_log.py", 2, timeout=300)


def test_the_ablation_job_ran(job):
    assert "ABLATION DONE failed: -" in job.stdout, job.stdout[-4000:] + job.stderr[-2000:]
    assert job.returncode == 0


@pytest.mark.parametrize("check_", CHECKS)
def test_each_counterfactual_gives_the_hand_derived_log(job, check_):
    assert re.search(rf"^ABLATION OK {re.escape(check_)}$", job.stdout, re.M), \
        job.stdout[-4000:]


def test_split_telescopes_to_the_gain():
    base = [10.0, 9.0, 9.0, 8.5, 8.0, 8.0, 8.0, 7.0, 8.0]
    conf = [6.0, 6.0, 5.5, 5.75, 4.5, 4.25, 6.0, 4.0, 5.5]
    parts = split(base, conf, 1.5)
    # gaps 4, 3, 3.5, 2.75, 3.5, 3.75, 2, 3, 2.5: launches 1, library latency -0.5, DMA
    # set-up 0.75, GEMM efficiency -0.75, executor parity -0.25, link 1.75, ingress -1,
    # contention 0.5; the gap left (2.5) less the differing bytes' DRAM time (1.5):
    # overlap 1
    assert parts == {"launches": 1.0, "library-latency": -0.5, "dma-setup": 0.75,
                     "gemm-efficiency": -0.75, "executor-parity": -0.25,
                     "link-efficiency": 1.75, "ingress": -1.0, "contention": 0.5,
                     "dram-traffic": 1.5, "overlap": 1.0}
    assert sum(parts.values()) == base[0] - conf[0]
    assert steps()[-1] == RUNS == ORDER[:-1] and len(steps()) == len(ORDER) - 1


def test_dram_traffic_credits_only_the_bytes_that_differ():
    """Two runs moving the same bytes: none of the gap is DRAM traffic, however much DRAM
    time the configuration overlapped; 2 GB fewer at 1 TB/s: 2 ms of it."""
    from emulator.app.causes import causes_of

    times = {"b": [5e-3] * len(RUNS) + [5e-3], "c": [3e-3] * (len(RUNS) + 1)}
    same = causes_of("c", "b", times, {"b": 4e-3, "c": 4e-3})
    assert same["parts_s"]["dram-traffic"] == 0 and same["parts_s"]["overlap"] == 2e-3
    fewer = causes_of("c", "b", times, {"b": 4e9 / 1e12, "c": 2e9 / 1e12})
    assert fewer["parts_s"]["dram-traffic"] == pytest.approx(2e-3)
    assert fewer["parts_s"]["overlap"] == pytest.approx(0.0)
    assert sum(fewer["parts_s"].values()) == pytest.approx(fewer["gain_s"])


def test_dram_seconds_are_rank_mean_bytes_at_the_hbm_rate():
    """Each run's DRAM bytes (summed over ranks and categories) / ranks / rate; the
    dram-traffic part is the byte difference at that rate and the parts still add up."""
    from emulator.app.causes import causes_of, dram_seconds

    # 2 ranks at 1 TB/s: the baseline moves 6 GB in all (3 GB a rank), the
    # configuration 4 GB (2 GB a rank): 1 GB a rank fewer, 1 ms of DRAM time
    runs = [{"mode": "b", "dram_bytes": {"gemm_read": 4e9, "rs_write": 2e9}},
            {"mode": "c", "dram_bytes": {"gemm_read": 4e9, "rs_write": 0}}]
    secs = dram_seconds(runs, 2, 1e12)
    assert secs == {"b": pytest.approx(3e-3), "c": pytest.approx(2e-3)}
    # gaps 2 ms under every step; 0.5 ms of the gap goes with the launches
    times = {"b": [5e-3] + [4.5e-3] * len(RUNS), "c": [3e-3] * (len(RUNS) + 1)}
    c = causes_of("c", "b", times, secs)
    assert c["dram_traffic_s"] == c["parts_s"]["dram-traffic"] == pytest.approx(1e-3)
    assert c["parts_s"]["launches"] == pytest.approx(0.5e-3)
    assert c["parts_s"]["overlap"] == pytest.approx(1.5e-3 - 1e-3)
    assert sum(c["parts_s"].values()) == pytest.approx(c["gain_s"]) and c["gain_s"] == 2e-3


OLD_ORDER = ["launches", "dma-setup", "gemm-efficiency", "link-efficiency", "ingress",
             "contention", "dram-traffic"]  # the causes of sweeps before library-latency


def _causes(order: list[str], base: float, time: float) -> dict:
    """A ``causes`` record over ``order``: 1 us launches, the rest overlap."""
    parts = {k: 0.0 for k in order}
    parts["launches"] = 1e-6
    parts["overlap"] = base - time - 1e-6
    return {"baseline": "sequential", "order": order, "baseline_s": base, "time_s": time,
            "gain_s": base - time, "parts_s": parts}


def test_causes_of_an_older_sweep_read_as_absent():
    """A sweep written with the older causes (no library-latency, no executor-parity) beside
    one with today's: the report's table shows the missing causes as '-', the CSV leaves
    their columns empty, the validation pages' causes read what is there."""
    from emulator.app import report
    from emulator.app.sweep import CSV_COLUMNS, csv_text
    from emulator.app.validation.common import CauseGroup, causes_section, pooled_cause

    def point(sub, causes):
        run = lambda mode, t, **x: {  # noqa: E731
            "mode": mode, "modelled_time_s": t, "speedup_vs_sequential": 100e-6 / t,
            "dram_bytes": {"gemm_read": 1}, "numerics": "timing-only", "max_abs_error": None,
            "wall_time_s": 0.1, "rank_skew": [1.0, 1.0], "baseline": x.get("b"),
            "speedup": None, **x}
        return {"key": sub, "model": "Tiny", "sublayer": sub, "direction": "fwd", "tp": 2,
                "m": 8, "n": 8, "k": 8, "device": "t3-sim", "collective": "ar",
                "topology": "ring", "system": "", "params": {}, "algorithm": "ring",
                "runs": [run("sequential", 100e-6),
                         run("t3", 80e-6, b="sequential", causes=causes)]}

    old = point("OP", _causes(OLD_ORDER, 100e-6, 80e-6))
    new = point("FC-2", _causes(list(ORDER), 100e-6, 80e-6))
    doc = {"scenario": "t3-like", "timing_only": True, "device": "t3-sim",
           "collective": "ar", "topology": "ring", "dtype": "fp16",
           "modes": ["sequential", "t3"], "points": [old, new]}
    table = report.causes_table(doc).splitlines()
    head = table[0].split()
    # today's order, the older record's causes among them ("cut %": two words)
    assert head[6:] == [*ORDER, "overlap"]
    op = table[2].split()  # (its point's label is three words, "cut %" two: they even out)
    assert op[head.index("library-latency") + 1] == "-"
    assert op[head.index("executor-parity") + 1] == "-"
    assert "Causes of each gain" in report.text_report(doc)
    rows = [dict(zip(CSV_COLUMNS, line.split(",")))
            for line in csv_text(doc, doc["points"]).splitlines()[1:]]
    t3_old, t3_new = [r for r in rows if r["mode"] == "t3"]
    assert t3_old["cause_library-latency_s"] == "" and t3_old["cause_launches_s"] == "1e-06"
    assert t3_new["cause_library-latency_s"] == "0.0"
    assert pooled_cause([old, new], "t3") == "overlap"
    text = "\n".join(causes_section([CauseGroup("Tiny", [old, new], ["t3"])], ["t3-paper"]))
    row = next(x for x in text.splitlines() if x.startswith("| t3 |"))
    head = next(x for x in text.splitlines() if x.startswith("| configuration |"))
    cells = dict(zip((x.strip() for x in head.split("|")),
                     (x.strip() for x in row.split("|"))))
    assert cells["cases"] == "2" and cells["library-latency"] == "+0.0"
    # means over both cases (the older one's missing causes count 0): they add to the cut
    assert cells["launches"] == "+1.0" and cells["overlap"] == "+19.0" \
        and cells["mean cut"] == "20.0%"


def test_names_are_checked_and_ordered():
    assert check(("dram-traffic", "launches")) == ("launches", "dram-traffic")
    for bad in (("launch",), ("launches", "launches")):
        with pytest.raises(AblationError):
            check(bad)


def test_ablate_changes_only_its_fields():
    from devices.spec import load_device

    spec = load_device("a100-sxm")
    free = ablate(spec, ORDER)
    assert free.launch_s == 0 and spec.launch_s > 0
    assert free.interconnect.library_fraction == 1.0 and not free.dram.shared
    assert free.hbm_bw > 1e5 * spec.hbm_bw
    assert free.dram.channels_for(free.hbm_bw) == spec.dram.channels_for(spec.hbm_bw)
    assert (free.cus, free.clock_hz, free.interconnect.link_bw) == \
        (spec.cus, spec.clock_hz, spec.interconnect.link_bw)
    on = ablate(load_device("a100-sxm", (("gpu.gemm.enabled", True),)), ("gemm-efficiency",))
    assert on.gemm is not None and not on.gemm.enabled and on.gemm.tiles == spec.gemm.tiles
    # the fixed tile's matrix efficiency (T3's simulated GPU: a Volta GEMM's) goes to 1
    assert ablate(load_device("t3-sim"), ("gemm-efficiency",)) == dataclasses.replace(
        load_device("t3-sim"), matrix_efficiency=1.0)
    assert ablate(load_device("mi210"), ("gemm-efficiency",)).matrix_efficiency == 1.0
    # ingress: only a switch's (or PCIe's) down port; a ring has none to remove
    assert spec.interconnect.topology == "switch" and not free.interconnect.ingress_queue
    assert ablate(spec, ("ingress",)) == dataclasses.replace(spec, interconnect=(
        dataclasses.replace(spec.interconnect, ingress_queue=False)))
    assert ablate(load_device("t3-sim"), ("ingress",)) == load_device("t3-sim")
    # the library's latency: off where a library is modelled; T3's simulator has none
    assert not free.interconnect.library_latency
    assert ablate(load_device("t3-sim"), ("library-latency",)) == load_device("t3-sim")
    # executor parity: the GPU's own executors at the library's fractions
    par = ablate(spec, ("executor-parity",))
    assert (par.executors.store_fraction, par.executors.copy_fraction) == \
        (spec.interconnect.library_fraction,) * 2
    assert par.executors.put_fraction == spec.interconnect.library_fraction_network
    assert ablate(load_device("t3-sim"), ("executor-parity",)) == load_device("t3-sim")


def test_run_causes_add_up_and_the_json_carries_them(tmp_path):
    out = tmp_path / "r.json"
    proc = run_pooled(["run", "--system", "mi210x4", "--collective", "gemv+ar",
                       "--m", "1024", "--n", "1", "--k", "1024", "--timing-only", "--causes",
                       "--json", str(out)], timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    runs = {r["mode"]: r for r in doc["runs"]}
    fused = runs["fused"]["causes"]
    assert fused["baseline"] == "sequential" and fused["order"] == list(ORDER)
    gain = runs["sequential"]["modelled_time_s"] - runs["fused"]["modelled_time_s"]
    assert fused["gain_s"] == pytest.approx(gain, rel=1e-12)
    assert sum(fused["parts_s"].values()) == pytest.approx(gain, rel=1e-9)
    assert fused["parts_s"]["launches"] > 0  # the baseline launches more kernels
    assert "causes" not in runs["sequential"] or runs["sequential"]["causes"] is None
    assert "fused over sequential: cut" in proc.stdout
    # a GEMV has no GEMM alone to compare with: no ECT, no overlap efficiency
    assert all(r["ect_s"] is None and r["overlap_efficiency"] is None for r in doc["runs"])
    assert "ECT" not in proc.stdout


def test_ablate_is_a_usage_error_when_unknown():
    proc = run_pooled(["run", "--ablate", "launch", "--timing-only"], timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0 and "--ablate" in proc.stderr


def test_summary_says_when_a_configuration_has_no_baseline_for_its_causes():
    from emulator.app.worker import summary_table

    run = {"mode": "t3", "phases": {"gemm+rs": 1e-3}, "numerics": "timing-only",
           "modelled_time_s": 1e-3, "dram_bytes": {"gemm_read": 1}, "wall_time_s": 0.1,
           "rank_skew": [1.0, 1.0], "baseline": None, "speedup": None}
    doc = {"config": {"collective": "ar", "algorithm": "ring", "topology": "ring", "m": 8,
                      "n": 8, "k": 8, "dtype": "fp16", "split_k": 1, "causes": True},
           "device": {"name": "t3-sim"}, "world_size": 2, "runs": [run],
           "lower_bounds_s": {"gemm_compute": 1e-6, "collective_link": 1e-6}}
    text = summary_table(doc)
    assert "no causes for t3: its baseline sequential is not in --mode" in text


@pytest.mark.parametrize("args", [
    ["--collective", "gemm+rs", "--mode", "sequential,t3,t3-mca", "--m", "512", "--n", "256",
     "--k", "256"],
    ["-n", "4", "--device", "mi300x", "--topology", "full-mesh", "--collective", "a2a+gemm",
     "--mode", "ficco-serial,ficco-uniform-fused-1d,ficco-cu-uniform-fused-1d",
     "--m", "2048", "--n", "256", "--k", "256"],
], ids=["t3", "ficco"])
def test_causes_of_a_numeric_run_are_those_of_its_timing_only_run(args, tmp_path):
    """The counterfactual runs reuse the plans the job's own runs built: after a numeric
    run (HBM bound, tiles written) they give the causes a timing-only job gives."""
    docs = []
    for extra in ([], ["--timing-only"]):
        out = tmp_path / f"r{len(docs)}.json"
        proc = run_pooled(["run", *args, "--causes", *extra, "--json", str(out)], timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        docs.append({r["mode"]: r for r in json.loads(out.read_text())["runs"]})
    numeric, timing = docs
    assert set(numeric) == set(timing)
    with_causes = [m for m in numeric if numeric[m].get("causes")]
    assert with_causes and all(numeric[m]["numerics"] == "pass" for m in numeric)
    for m in with_causes:
        assert numeric[m]["causes"] == timing[m]["causes"], m


def test_a_step_whose_changes_the_run_before_never_read_is_alike():
    from emulator.app.causes import runs_alike
    from devices.system import load_system

    spec = load_system("mi300x-x8")
    before, parity = ablate(spec, steps()[3]), ablate(spec, steps()[4])  # executor-parity
    library = {("InterconnectSpec", "library_fraction"), ("DeviceSpec", "launch_s")}
    assert runs_alike(before, library, parity)  # a library collective's run
    assert not runs_alike(before, library | {("ExecutorSpec", "store_fraction")}, parity)
    assert not runs_alike(spec, library, ablate(spec, steps()[0]))  # launch_s was read


def test_the_causes_are_the_same_with_every_step_run(tmp_path):
    """Skipping a step whose changed fields the run before never read
    (``emulator/model/reads.py``) gives the causes of running every step, field by field."""
    from tests.conftest import test_env

    args = ["run", "-n", "4", "--device", "mi300x", "--topology", "full-mesh", "--collective",
            "a2a+gemm", "--mode", "ficco-serial,ficco-shard,ficco-uniform-fused-1d,"
            "ficco-cu-uniform-fused-1d,ficco-ideal", "--m", "2048", "--n", "256", "--k", "256",
            "--timing-only", "--causes"]
    docs = []
    for every in ("1", "0"):
        env = test_env()
        env["T3EMU_CAUSES_EVERY_STEP"] = every
        out = tmp_path / f"r{every}.json"
        proc = run_cli([*args, "--json", str(out)], timeout=300, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        docs.append({r["mode"]: r.get("causes") for r in json.loads(out.read_text())["runs"]})
    assert docs[0] == docs[1] and sum(c is not None for c in docs[0].values()) == 4
