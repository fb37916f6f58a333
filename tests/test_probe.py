"""`t3emu probe`: the cases, the numpy backend end to end (the plumbing CI can run without a
GPU or PyTorch), the comparison and the preset writer on recorded measurements."""

from __future__ import annotations

import copy
import json
import math

import pytest

from devices.spec import load_device
from tests.conftest import run_cli

MECHANISMS = {"gemm", "hbm-copy-kernel", "hbm-copy-engine", "l2-reread", "latency",
              "loaded-latency", "interference", "atomics", "gemv", "embedding-bag"}


def test_the_cases_cover_every_mechanism_and_the_papers_shapes():
    from emulator.app.scenario import load_scenario
    from emulator.probe.cases import build

    cases = build(quick=False)
    assert {c["mechanism"] for c in cases} == MECHANISMS
    gemms = {(c["m"], c["n"], c["k"]) for c in cases if c["mechanism"] == "gemm"}
    for p in load_scenario("flux-paper").points:  # Flux's GPT-3 shapes, both sides
        assert (p.m, p.n, p.k) in gemms
    for p in load_scenario("ficco-paper").points:  # FiCCO's and their 8- and 64-way parts
        assert {(p.m, p.n, p.k), (p.m // 8, p.n, p.k), (p.m // 64, p.n, p.k)} <= gemms
    assert {(s, s, s) for s in (1024, 2048, 4096, 8192, 16384)} <= gemms
    copies = sorted(c["bytes"] for c in cases if c["mechanism"] == "hbm-copy-engine")
    assert copies[0] == 1 << 20 and copies[-1] == 4 << 30
    assert len({c["id"] for c in cases}) == len(cases)


@pytest.fixture(scope="module")
def numpy_probe(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe") / "probe.json"
    proc = run_cli(["probe", "--backend", "numpy", "--out", str(out), "--repeats", "3",
                    "--warmup", "1"], timeout=300)
    assert proc.returncode == 0, proc.stderr
    return json.loads(out.read_text()), out


def test_the_numpy_backend_runs_every_case(numpy_probe):
    from emulator.probe.cases import build

    doc, _ = numpy_probe
    assert doc["probe_version"] == 1 and doc["backend"] == "numpy"
    assert doc["gpu"]["vendor"] == "host" and doc["repeats"] == 3
    assert [c["id"] for c in doc["cases"]] == [c["id"] for c in build(quick=True)]
    for c in doc["cases"]:
        assert "error" not in c and "skipped" not in c, c
        assert len(c["times_s"]) == 3 and c["min_s"] <= c["median_s"] <= c["max_s"]
        assert c["median_s"] > 0
    beside = [c for c in doc["cases"] if c["mechanism"] == "interference"]
    assert beside and all("slowdown" in c and "copy_slowdown" in c for c in beside)


def test_compare_writes_the_page_and_figure(numpy_probe, tmp_path):
    doc, path = numpy_probe
    page = tmp_path / "hardware.md"
    proc = run_cli(["probe", "compare", str(path), "--device", "h100-sxm", "--out", str(page)],
                   timeout=300)
    assert proc.returncode == 0, proc.stderr
    text = page.read_text()
    assert "Preset standing in: `h100-sxm`" in text and "host CPU" in text
    assert "the probe ran on the host CPU" in text  # a host's probe says what it is
    for mech in MECHANISMS:
        assert f"| {mech} |" in text
    assert (tmp_path / "hardware.png").stat().st_size > 1000
    assert text.count("| `") == len(doc["cases"])


def _recorded():
    """Measurements made up from the model's own predictions (times known exactly)."""
    from devices.spec import load_device
    from emulator.model.gemm import choose

    spec = load_device("h100-sxm")
    gemm = choose(spec, 8192, 8192, 8192, 1, "bf16").predicted_s
    paper = choose(spec, 4096, 6144, 12288, 1, "bf16").predicted_s
    rate = 3.0e12  # bytes read + written per second, the largest copy
    big = 1 << 30
    cases = [
        {"id": "gemm/bf16/8192x8192x8192", "mechanism": "gemm", "dtype": "bf16", "m": 8192,
         "n": 8192, "k": 8192, "median_s": gemm * 1.25},  # 25% slower than the model
        {"id": "gemm/bf16/4096x6144x12288", "mechanism": "gemm", "dtype": "bf16", "m": 4096,
         "n": 6144, "k": 12288, "median_s": paper},  # exactly the model
        {"id": "hbm-copy-kernel/1073741824", "mechanism": "hbm-copy-kernel", "bytes": big,
         "median_s": 2 * big / rate},
        {"id": "hbm-copy-engine/1048576", "mechanism": "hbm-copy-engine", "bytes": 1 << 20,
         "median_s": 2 * (1 << 20) / rate + 3e-6},  # 3 us of set-up
        {"id": "l2-reread/16777216", "mechanism": "l2-reread", "bytes": 16 << 20,
         "rereads": 50, "median_s": 50 * (16 << 20) / 8.0e12},
        {"id": "latency/268435456", "mechanism": "latency", "bytes": 256 << 20,
         "hops": 1000, "median_s": 1000 * 600e-9},
        {"id": "loaded-latency/268435456/1", "mechanism": "loaded-latency",
         "bytes": 256 << 20, "hops": 1000, "load": 1.0, "stream_bytes": 1 << 30,
         "median_s": 1000 * 900e-9},
        {"id": "interference/engine/1", "mechanism": "interference", "median_s": 1e-3,
         "copy": "engine", "bytes": 1, "ctas": 0, "dtype": "bf16", "m": 8192, "n": 8192,
         "k": 8192, "slowdown": 1.2, "copy_slowdown": 1.5},
        {"id": "interference/engine-input/8192x512x4096", "mechanism": "interference",
         "median_s": 1e-4, "copy": "engine", "bytes": 8192 * 4096 * 2, "ctas": 0,
         "dtype": "bf16", "m": 8192, "n": 512, "k": 4096, "slowdown": 1.3,
         "copy_slowdown": 1.1},
        {"id": "embedding-bag/4096/8", "mechanism": "embedding-bag", "dtype": "fp32",
         "batch": 4096, "pooling": 10, "dim": 256, "rows": 1 << 20, "ctas_per_sm": 8,
         "median_s": 2e-5},
    ]
    for c in cases:
        c.setdefault("spread", 0.01)
    return {"probe_version": 1, "created": "2026-11-28T00:00:00+00:00", "backend": "torch",
            "repeats": 10, "warmup": 3,
            "gpu": {"name": "NVIDIA H100 80GB HBM3", "vendor": "NVIDIA", "sms": 132,
                    "l2_bytes": 50 << 20, "libraries": {"torch": "2.11"}},
            "cases": cases}, gemm


def test_compare_computes_errors_by_the_model_s_own_code():
    from emulator.probe.compare import by_mechanism, compare, page

    doc, _ = _recorded()
    rows = {r["id"]: r for r in compare(doc, "h100-sxm")}
    assert rows["gemm/bf16/4096x6144x12288"]["error"] == pytest.approx(0.0, abs=1e-12)
    assert rows["gemm/bf16/8192x8192x8192"]["error"] == pytest.approx(1 / 1.25 - 1)
    assert rows["interference/engine/1"]["modelled_s"] is None  # measured, not predicted
    # loaded latency, by hand: a streaming copy of 1 GiB keeps the DRAM queue full (C
    # channels x D requests x A bytes) for the whole chase, so each dependent load waits
    # for the queue to drain at the HBM's rate before its own latency
    spec = load_device("h100-sxm")
    q = spec.dram.channels_for(spec.hbm_bw) * spec.dram.queue_depth * spec.dram.access_bytes
    assert rows["loaded-latency/268435456/1"]["modelled_s"] == pytest.approx(
        1000 * (spec.mem_latency_s + q / spec.hbm_bw))
    # a GEMM beside a copy engine's copy of its own input: the one-rank ficco-cil run, its
    # GEMM's time together, and both sides' slowdowns against its runs of each alone
    from emulator import api

    ph = api.run("a2a+gemm", device="h100-sxm", ranks=1, m=8192, n=512, k=4096, dtype="bf16",
                 modes="ficco-cil", timing_only=True).runs["ficco-cil"].phases
    row = rows["interference/engine-input/8192x512x4096"]
    assert row["modelled_s"] == ph["cil-shard.kernel"]
    assert row["modelled_slowdown"] == ph["cil-shard.kernel"] / ph["shard-gemm"]
    assert row["modelled_copy_slowdown"] == ph["cil-shard.executors"] / ph["shard-comm"]
    # the GEMM of N = 512 reads as many HBM bytes per flop as the copy moves: the copy
    # engine's HBM traffic slows it in the model (by the share of the HBM it takes)
    assert row["modelled_slowdown"] > 1.2
    # 8 CTAs per SM on a preset that holds 2 persistent WGs per SM: modelled at 2, and said
    assert "at most 2 WGs per SM" in rows["embedding-bag/4096/8"]["note"]
    mech = by_mechanism(list(rows.values()))
    assert mech["gemm"]["error_factor"] == pytest.approx(math.exp(math.log(1.25) / 2))
    text = page(doc, "h800", list(rows.values()), "h100.json", None)
    assert "only NVLink differs" in text  # an H100 against the H800 preset says what differs
    assert "slowdown 1.200, copy 1.500" in text
    assert "slowdown 1.300, copy 1.100 (modelled " in text  # measured and modelled, side by side


def test_a_case_the_gpu_cannot_hold_is_sized_before_it_runs():
    from emulator.probe.cases import build, footprint_bytes

    gemm = {"mechanism": "gemm", "dtype": "bf16", "m": 1607680, "n": 57344, "k": 8192}
    assert footprint_bytes(gemm) == (1607680 * 8192 + 8192 * 57344 + 1607680 * 57344) * 2
    assert footprint_bytes(gemm) > 141e9  # beyond an H200: the backend skips it, saying so
    assert all(footprint_bytes(c) > 0 for c in build())


def test_a_preset_from_measurements_reproduces_its_calibration_cases(tmp_path):
    from devices.spec import load_device
    from emulator.model.gemm import choose
    from emulator.probe.preset import write

    doc, gemm = _recorded()
    out = tmp_path / "h100-probed.toml"
    values = write(doc, "h100-sxm", "h100.json", "h100-probed", out)
    spec = load_device(str(out))
    assert spec.name == "h100-probed"
    assert values["memory.sustained_fraction"] == pytest.approx(3.0e12 / 3.35e12, abs=1e-4)
    assert spec.hbm_bw == pytest.approx(3.0e12, rel=1e-3)
    assert spec.l2_bw == pytest.approx(8.0e12, rel=1e-3)
    assert spec.mem_latency_s == pytest.approx(600e-9)
    assert spec.dma_setup_s == pytest.approx(3e-6, rel=1e-3)
    # the GEMM's main loop scaled so that the model gives the measured square GEMM
    assert choose(spec, 8192, 8192, 8192, 1, "bf16").predicted_s == pytest.approx(
        gemm * 1.25, rel=0.02)
    text = out.read_text()
    assert "measured: t3emu probe h100.json, case gemm/bf16/8192x8192x8192" in text
    assert "case hbm-copy-kernel/1073741824" in text


@pytest.mark.parametrize("content", ["xx", "[1]", json.dumps({"cases": []})])
def test_a_file_that_is_not_a_probe_is_refused(tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content)
    for args in (["compare", str(bad), "--device", "h800", "--out", str(tmp_path / "p.md")],
                 ["preset", str(bad), "--base", "h800", "--out", str(tmp_path / "p.toml")]):
        proc = run_cli(["probe", *args], timeout=60)
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert str(bad) in proc.stderr


def test_the_preset_writer_keeps_what_it_does_not_measure(tmp_path):
    from devices.spec import load_device
    from emulator.probe.preset import write

    doc, _ = _recorded()
    doc = copy.deepcopy(doc)
    doc["cases"] = [c for c in doc["cases"] if c["mechanism"] == "latency"]
    out = tmp_path / "p.toml"
    assert write(doc, "h800", "x.json", "p", out) == {"memory.latency_ns": 600.0}
    base, new = load_device("h800"), load_device(str(out))
    assert (new.hbm_bw, new.l2_bw, new.dma_setup_s, new.gemm) == (
        base.hbm_bw, base.l2_bw, base.dma_setup_s, base.gemm)
