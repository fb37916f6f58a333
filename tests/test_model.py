"""Whole-model estimates (``t3emu model``, ``emulator/workload``): model files refused as
the presets are, and a toy model's layer and iteration times equal to the hand-composed
sum of its operations' modelled times (each operation run here, on its own)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

SYSTEM = "a100-sxm-x8"
TOY = """\
name = "toy"
kind = "transformer"
[transformer]
hidden = 512
heads = 8
ffn = "gelu"
ffn_hidden = 2048
layers = 3
vocab = 1000
[run]
seq = 64
batch = 2
"""


def _t3emu(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "emulator.app.cli", *args], cwd=cwd or ROOT,
                          capture_output=True, text=True, timeout=1200, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    (d / "toy.toml").write_text(TOY)
    return d


# ---------------------------------------------------------------- model files
def test_every_shipped_model_loads():
    from emulator.workload.spec import list_models, load_model

    names = list_models()
    assert {"gpt3-175b", "llama2-70b", "mega-gpt2", "t-nlg", "palm-540b", "mt-nlg-530b",
            "mixtral-8x7b", "dlrm-128node"} <= set(names)
    gpt3 = load_model("gpt3-175b")
    assert (gpt3.hidden, gpt3.heads, gpt3.head_dim, gpt3.layers) == (12288, 96, 128, 96)
    llama = load_model("llama2-70b")
    assert (llama.kv_heads, llama.ffn, llama.ffn_hidden) == (8, "swiglu", 28672)
    assert load_model("mixtral-8x7b").moe.top_k == 2
    assert load_model("dlrm-128node").bottom_mlp[-1] == 92


@pytest.mark.parametrize("text,needle", [
    ("kind = 'transformer'\n[transformer]\nhidden = 512\n", "missing key 'heads'"),
    (TOY.replace('ffn = "gelu"', 'ffn = "relu2"'), "ffn = 'relu2'"),
    (TOY.replace("heads = 8", "heads = 8\nkv_heads = 3"), "kv_heads = 3 must divide"),
    (TOY.replace("layers = 3", "layers = 0"), "layers = 0 must be >= 1"),
    (TOY.replace("layers = 3", "layers = 3\nlayer = 4"), "unknown key(s) ['layer']"),
    (TOY.replace('kind = "transformer"', 'kind = "cnn"'), "kind = 'cnn'"),
    (TOY + "[dlrm]\ndim = 4\n", "section [dlrm] does not apply"),
    ("kind = [", "malformed TOML"),
])
def test_a_bad_model_file_is_refused_with_one_line_and_exit_2(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    proc = _t3emu("model", str(path), "--system", SYSTEM)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and proc.stderr.count("\n") == 1, proc.stderr


@pytest.mark.parametrize("args,needle", [
    (["--tp", "16"], "TP 16 x PP 1 x DP 1 = 16 GPUs; system a100-sxm-x8 has 8"),
    (["--pp", "2"], "PP 2 does not divide the 3 layers"),
    (["--tp", "4", "--dp", "2"], "a tensor-parallel group of part of a node is not emulated"),
    (["--system", "a100-sxm-2x8", "--dp", "2", "--phase", "decode"], "--dp 2: data "),
    (["--device", "t3-sim"], "--device runs one tensor-parallel group: give --tp"),
    (["--device", "t3-sim", "--tp", "4", "--pp", "2"], "no --pp or --dp"),
    (["--device", "t3-sim", "--tp", "8", "--topology", "torus"], "--topology 'torus'"),
    (["--system", "mi210x4"], "TP 4 does not divide the 6 attention heads"),
    (["--designs", "flux,nvls"], "unknown design 'nvls'"),
    (["--batch", "0"], "--batch 0"),
    (["--ep", "8"], "--ep 8: toy has no experts"),
])
def test_impossible_degrees_and_unknown_designs_are_refused_before_launch(toy, args, needle):
    model = toy / "toy.toml"
    if "mi210x4" in args:  # 6 heads on the 4 GPUs of mi210x4
        model = toy / "six.toml"
        model.write_text(TOY.replace("heads = 8", "heads = 6").replace("hidden = 512",
                                                                       "hidden = 384"))
    system = [] if "--system" in args or "--device" in args else ["--system", SYSTEM]
    proc = _t3emu("model", str(model), *system, *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stdout + proc.stderr


# ---------------------------------------------------------------- composition
def _run(op, m, n, k, mode):
    """One operation's modelled time and its sequential phases, run on its own."""
    from emulator import api

    res = api.run(op, system=SYSTEM, modes=[mode], m=m, n=n, k=k, timing_only=True)
    run = res.runs[mode]
    return run.modelled_time_s, run.phases, res.doc["device"]


def _kernel(spec, nbytes, flops=0.0):
    """A kernel that is not a GEMM (docs/models.md): launch + max(FLOPs at 0.6 of the peak,
    bytes at the HBM's peak)."""
    peak = spec["cus"] * spec["clock_hz"] * spec["flops_per_cycle_per_cu"]["fp16"]
    return spec["launch_s"] + max(flops / (0.6 * peak), nbytes / spec["hbm_bw"])


def test_a_toy_model_s_training_iteration_is_the_hand_composed_sum(toy):
    """TP 8 with sequence parallelism, training, the flux design. Per GPU: T = 64 x 2 =
    128 tokens, 16 rows per GPU in the norms; q = kv = 64 (one head of 64), F/8 = 256,
    the vocabulary slice 128. Every GEMM + collective run alone here (sequential and
    flux-best), every GEMM alone as the GEMM phase of a sequential gemm+rs plus its launch;
    kernels by their bytes (fp16) and attention by its FLOPs."""
    out = toy / "train.json"
    proc = _t3emu("model", str(toy / "toy.toml"), "--system", SYSTEM, "--designs", "flux",
                  "--json", str(out), "--cache", str(toy / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    # what made it: the code, the model file by its own name, the system by its package path
    from emulator.app import provenance

    pv = doc["provenance"]
    assert pv["code"] == provenance.code_hash()
    assert {(f["role"], f["name"]) for f in pv["files"]} == {
        ("model", "toy.toml"), ("system", "devices/presets/systems/a100-sxm-x8.toml"),
        ("device", "devices/presets/a100-sxm.toml")}
    assert str(toy) not in json.dumps(doc)
    T, rows, H, e = 128, 16, 512, 2
    fwd_ops = [("ag+gemm", 128, 192, 512), ("gemm+rs", 128, 512, 64),
               ("ag+gemm", 128, 256, 512), ("gemm+rs", 128, 512, 256)]
    bwd_ops = [("ag+gemm", 128, 256, 512), ("gemm+rs", 128, 512, 256),
               ("ag+gemm", 128, 64, 512), ("gemm+rs", 128, 512, 192)]
    wgrads = [(256, 512, 128), (512, 256, 128), (64, 512, 128), (512, 192, 128)]
    head_ops = [("ag+gemm", 128, 128, 512), ("gemm+rs", 128, 512, 128)]
    times, alone = {}, {}
    spec = None
    for key in dict.fromkeys(fwd_ops + bwd_ops + head_ops):
        for mode in ("sequential", "flux-best"):
            times[key, mode], phases, spec = _run(*key, mode)
    for shape in wgrads + [(512, 128, 128)]:
        _, phases, spec = _run("gemm+rs", *shape, "sequential")
        alone[shape] = spec["launch_s"] + phases["gemm"]
    flops_attn = 4.0 * T * 64 * 64 * 1 * 0.5  # T x seq x d x heads, causal
    io = (2 + 2) * T * 64 * e
    kernels_f = [_kernel(spec, 2 * rows * H * e), _kernel(spec, io, flops_attn),
                 _kernel(spec, 5 * rows * H * e), _kernel(spec, 2 * 256 * T * e),
                 _kernel(spec, 3 * rows * H * e)]
    kernels_b = [_kernel(spec, 3 * rows * H * e), _kernel(spec, 3 * 256 * T * e),
                 _kernel(spec, 6 * rows * H * e), _kernel(spec, 2 * io, 2.5 * flops_attn),
                 _kernel(spec, 3 * rows * H * e)]
    # the GPU's shard of the weights: QKV 512 x 1536, OP 512 x 512, FC-1 512 x 2048, FC-2
    # 2048 x 512 per layer over 8 GPUs, the embedding's and the LM head's vocabulary slices
    # 128 x 512 each (1000 padded to a multiple of 128 x 8)
    params = 3 * (512 * 1536 + 512 * 512 + 512 * 2048 + 2048 * 512) / 8 + 2 * 128 * 512
    head_k = [_kernel(spec, 2 * T * 128 * e)] * 2 + [_kernel(spec, 28 * params)]
    for design, mode in (("sequential", "sequential"), ("flux", "flux-best")):
        got = doc["designs"][design]
        fwd = sum(times[o, mode] for o in fwd_ops) + sum(kernels_f)
        bwd = (sum(times[o, mode] for o in bwd_ops) + sum(alone[s] for s in wgrads)
               + sum(kernels_b))
        other = sum(times[o, mode] for o in head_ops) + alone[(512, 128, 128)] + sum(head_k)
        assert got["layer_forward_s"] == pytest.approx(fwd, rel=1e-12), design
        assert got["layer_backward_s"] == pytest.approx(bwd, rel=1e-12), design
        assert got["iteration_s"] == pytest.approx(3 * (fwd + bwd) + other, rel=1e-12)
    assert doc["designs"]["flux"]["speedup"] == pytest.approx(
        doc["designs"]["sequential"]["iteration_s"] / doc["designs"]["flux"]["iteration_s"])
    # a second estimate reads every operation from the cache: nothing runs
    again = _t3emu("model", str(toy / "toy.toml"), "--system", SYSTEM, "--designs", "flux",
                   "--cache", str(toy / "cache"))
    assert again.returncode == 0 and " s\n" not in again.stderr, again.stderr


def test_a_toy_model_s_prefill_with_all_reduce_is_the_hand_composed_sum(toy):
    """TP 8 without sequence parallelism, prefill, the t3 design: QKV and FC-1 are GEMMs
    alone, OP and FC-2 GEMM + all-reduce (sequential and t3-mca); the LM head runs on the
    last token of each of the 2 sequences (M = 2)."""
    out = toy / "prefill.json"
    proc = _t3emu("model", str(toy / "toy.toml"), "--system", SYSTEM, "--designs", "t3",
                  "--phase", "prefill", "--no-sp", "--json", str(out), "--cache",
                  str(toy / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    T, H, e = 128, 512, 2
    ar = [("gemm+ar", 128, 512, 64), ("gemm+ar", 128, 512, 256)]
    times, alone = {}, {}
    spec = None
    for key in ar:
        for mode in ("sequential", "t3-mca"):
            times[key, mode], _, spec = _run(*key, mode)
    for shape, run_as in [((128, 192, 512),) * 2, ((128, 256, 512),) * 2,
                          ((2, 128, 512), (128, 2, 512))]:  # 2 rows < 8 ranks: transposed
        _, phases, spec = _run("gemm+rs", *run_as, "sequential")
        alone[shape] = spec["launch_s"] + phases["gemm"]
    io = 4 * T * 64 * e
    kernels = [_kernel(spec, 2 * T * H * e), _kernel(spec, io, 4.0 * T * 64 * 64 * 0.5),
               _kernel(spec, 5 * T * H * e), _kernel(spec, 2 * 256 * T * e),
               _kernel(spec, 3 * T * H * e)]
    for design, mode in (("sequential", "sequential"), ("t3", "t3-mca")):
        got = doc["designs"][design]
        fwd = (sum(times[o, mode] for o in ar) + alone[(128, 192, 512)]
               + alone[(128, 256, 512)] + sum(kernels))
        other = alone[(2, 128, 512)] + _kernel(spec, 2 * 2 * 128 * e)
        assert got["layer_forward_s"] == pytest.approx(fwd, rel=1e-12), design
        assert got["layer_backward_s"] == 0
        assert got["iteration_s"] == pytest.approx(3 * fwd + other, rel=1e-12)


def _head(doc, design):
    items = [r for r in doc["designs"][design]["items"] if r["part"] == "head"]
    return (sum(r["time_s"] for r in items if "fwd" in r["item"]),
            sum(r["time_s"] for r in items if "fwd" not in r["item"]))


@pytest.mark.parametrize("pp,dp", [(2, 1), (1, 2)])
def test_pipeline_and_data_parallel_iterations_are_composed_as_documented(toy, pp, dp):
    """Two nodes of 8 A100s (a100-sxm-2x8: 4 NICs of 25 GB/s per node, 2 GPUs per NIC,
    3 us, the library at 0.9 of the network's peak), TP 8 on one node, training with SP.
    PP 2 x 2 micro-batches (1F1B): stage i holds 2 of the 4 layers, the last also the LM
    head; a micro-batch's 16 x 512 fp16 activations cross to the other node in
    3 us + 16384 B / (25 GB/s / 2 x 0.9). DP 2: the GPU's 1.70M gradient parameters
    (one bucket: under 40M) all-reduced over 2 replicas, a ring of 2 steps of half the
    bytes each over the same route, none of it hidden (one bucket is the last)."""
    model = toy / "four.toml"
    model.write_text(TOY.replace("layers = 3", "layers = 4"))
    out = toy / f"pp{pp}dp{dp}.json"
    proc = _t3emu("model", str(model), "--system", "a100-sxm-2x8", "--tp", "8", "--pp",
                  str(pp), "--dp", str(dp), "--microbatches", str(pp), "--designs", "flux",
                  "--json", str(out), "--cache", str(toy / "cache"), "--figure",
                  str(toy / "fig.png"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (toy / "fig.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    doc = json.loads(out.read_text())
    assert doc["setting"]["tp_group_set"] == ["nodes=1"]
    link = 3e-6, 25e9 / 2 * 0.9
    p2p = link[0] + 16 * 512 * 2 / link[1]
    per_layer = 512 * 1536 + 512 * 512 + 512 * 2048 + 2048 * 512
    for design in ("sequential", "flux"):
        got = doc["designs"][design]
        f, b = got["layer_forward_s"], got["layer_backward_s"]
        hf, hb = _head(doc, design)
        L = 4 // pp
        F = [L * f] * pp
        B = [L * b] * pp
        F[-1] += hf
        B[-1] += hb
        stages = [L * per_layer / 8 + 128 * 512 * (2 if pp == 1 else 1)] * pp
        if pp > 1:
            per = max(x + y + 2 * p2p for x, y in zip(F, B))
            pipeline = (pp - 1) * per + sum(F) + sum(B) + 2 * (pp - 1) * p2p
            assert doc["p2p_s"] == pytest.approx(p2p, rel=1e-12)
        else:
            pipeline = F[0] + B[0]
        assert got["pipeline_s"] == pytest.approx(pipeline, rel=1e-12), design
        ring = 2 * (dp - 1) * (link[0] + stages[0] * 2 / dp / link[1]) if dp > 1 else 0.0
        assert got["dp_allreduce_s"] == pytest.approx(ring, rel=1e-12)
        assert got["dp_exposed_s"] == pytest.approx(ring, rel=1e-12)
        # Adam: a launch (a100-sxm: launch_us = 3.55) and 28 B per parameter of the
        # largest stage at the HBM's measured sustained 1776 GB/s (0.871 of 2039)
        opt = 3.55e-6 + 28 * max(stages) / (2039e9 * 0.871)
        assert got["optimizer_s"] == pytest.approx(opt, rel=1e-12)
        assert got["iteration_s"] == pytest.approx(pipeline + ring + opt, rel=1e-12)


def test_a_gqa_swiglu_model_s_decode_step_is_the_hand_composed_sum(toy):
    """One decode step of batch 1 (TP 8, all-reduce, the fused design) of a toy with
    grouped-query attention (8 query heads, 2 key/value heads: fewer than the GPUs, so each
    GPU keeps one) and SwiGLU: QKV (N = 64 + 2 x 64) and FC-1 (gate and up, N = 2 x 1024/8)
    are GEMMs alone of one row (run as their transposes: 1 row < 8 ranks), OP and FC-2
    GEMV + all-reduce (M = 512 output rows, N = 1, K = 64 and 128), sequential and fused;
    attention reads a 64-token key/value cache."""
    model = toy / "gqa.toml"
    model.write_text(TOY.replace("heads = 8", "heads = 8\nkv_heads = 2").replace(
        'ffn = "gelu"', 'ffn = "swiglu"').replace("ffn_hidden = 2048", "ffn_hidden = 1024")
        .replace("batch = 2", "batch = 1"))
    out = toy / "decode.json"
    proc = _t3emu("model", str(model), "--system", SYSTEM, "--designs", "fused", "--phase",
                  "decode", "--no-sp", "--json", str(out), "--cache", str(toy / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    e, H = 2, 512
    gemv = [("gemv+ar", 512, 1, 64), ("gemv+ar", 512, 1, 128)]
    times, alone = {}, {}
    spec = None
    for key in gemv:
        for mode in ("sequential", "fused"):
            times[key, mode], _, spec = _run(*key, mode)
    for shape in [(192, 1, 512), (256, 1, 512), (128, 1, 512)]:  # QKV, FC-1, LM head
        _, phases, spec = _run("gemm+rs", *shape, "sequential")
        alone[shape] = spec["launch_s"] + phases["gemm"]
    attention = _kernel(spec, 2 * 64 * 64 * e + 2 * 64 * e, 4.0 * 64 * 64)
    kernels = [_kernel(spec, 2 * H * e), attention, _kernel(spec, 5 * H * e),
               _kernel(spec, (256 + 128) * e), _kernel(spec, 3 * H * e)]
    for design, mode in (("sequential", "sequential"), ("fused", "fused")):
        got = doc["designs"][design]
        fwd = (sum(times[o, mode] for o in gemv) + alone[(192, 1, 512)]
               + alone[(256, 1, 512)] + sum(kernels))
        head = alone[(128, 1, 512)] + _kernel(spec, 2 * 128 * e)
        assert got["layer_forward_s"] == pytest.approx(fwd, rel=1e-12), design
        assert got["iteration_s"] == pytest.approx(3 * fwd + head, rel=1e-12), design


def test_a_mixture_of_experts_layer_s_training_is_the_hand_composed_sum(toy):
    """A toy with 8 experts (top 2, expert width 256) on TP 8 = EP 8, sequence parallel,
    training, FiCCO and the fused operators: T = 128 x 2 = 256 tokens, 32 per GPU, R = 64
    rows dispatched from and (balanced) received by each GPU's one expert. The dispatch
    feeding FC-1 and the combine after FC-2 run as a2a+gemm (ficco-auto) and gemm+a2a
    (fused), and in backward the other way round (FC-2's input gradient dispatched, FC-1's
    returned); the router's GEMMs and the experts' weight gradients are GEMMs alone."""
    model = toy / "moe.toml"
    model.write_text(TOY.replace("seq = 64", "seq = 128") + "[moe]\nexperts = 8\ntop_k = 2\n"
                     "expert_ffn_hidden = 256\n")
    out = toy / "moe.json"
    proc = _t3emu("model", str(model), "--system", SYSTEM, "--designs", "ficco,fused",
                  "--json", str(out), "--cache", str(toy / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    T, rows, R, H, F, e = 256, 32, 64, 512, 256, 2
    runs = {("ag+gemm", T, 192, H): "ficco-auto", ("gemm+rs", T, H, 64): None,
            ("a2a+gemm", R, F, H): "ficco-auto", ("gemm+a2a", R, H, F): "fused",
            ("ag+gemm", T, 64, H): "ficco-auto", ("gemm+rs", T, H, 192): None}
    times, alone = {}, {}
    spec = None
    for key, mode in runs.items():
        for m in ("sequential", mode or "sequential"):
            times[key, m], _, spec = _run(*key, m)
    for shape in [(rows, 8, H), (F, H, R), (H, F, R), (rows, H, 8), (H, 8, rows),
                  (64, H, T), (H, 192, T)]:
        _, phases, spec = _run("gemm+rs", *shape, "sequential")
        alone[shape] = spec["launch_s"] + phases["gemm"]
    flops_attn = 4.0 * T * 128 * 64 * 0.5
    io = 4 * T * 64 * e
    route = 2 * rows * 8 * e + 2 * R * H * e
    kernels_f = [_kernel(spec, 2 * rows * H * e), _kernel(spec, io, flops_attn),
                 _kernel(spec, 5 * rows * H * e), _kernel(spec, route),
                 _kernel(spec, 2 * F * R * e), _kernel(spec, (R + rows) * H * e),
                 _kernel(spec, 3 * rows * H * e)]
    kernels_b = [_kernel(spec, 3 * rows * H * e), _kernel(spec, (rows + R) * H * e),
                 _kernel(spec, 3 * F * R * e), _kernel(spec, route),
                 _kernel(spec, 6 * rows * H * e), _kernel(spec, 2 * io, 2.5 * flops_attn),
                 _kernel(spec, 3 * rows * H * e)]
    fwd_ops = [("ag+gemm", T, 192, H), ("gemm+rs", T, H, 64), ("a2a+gemm", R, F, H),
               ("gemm+a2a", R, H, F)]
    bwd_ops = [("a2a+gemm", R, F, H), ("gemm+a2a", R, H, F), ("ag+gemm", T, 64, H),
               ("gemm+rs", T, H, 192)]
    wgrads = [(F, H, R), (H, F, R), (rows, H, 8), (H, 8, rows), (64, H, T), (H, 192, T)]
    # the GPU's weights per layer: QKV 512 x 192, OP 64 x 512, its one expert 512 x 256 and
    # 256 x 512, the router 512 x 8; the vocabulary slices 128 x 512 twice
    params = 3 * (512 * 192 + 64 * 512 + 2 * 512 * 256 + 512 * 8) + 2 * 128 * 512
    for design in ("sequential", "ficco", "fused"):
        def mode(key):
            return runs[key] if runs[key] and design != "sequential" and (
                (design == "ficco") == runs[key].startswith("ficco")) else "sequential"
        got = doc["designs"][design]
        fwd = (sum(times[o, mode(o)] for o in fwd_ops) + alone[(rows, 8, H)]
               + sum(kernels_f))
        bwd = (sum(times[o, mode(o)] for o in bwd_ops) + sum(alone[s] for s in wgrads)
               + sum(kernels_b))
        assert got["layer_forward_s"] == pytest.approx(fwd, rel=1e-12), design
        assert got["layer_backward_s"] == pytest.approx(bwd, rel=1e-12), design
        assert got["optimizer_s"] == pytest.approx(
            spec["launch_s"] + 28 * params / spec["hbm_bw"], rel=1e-12)
    assert doc["setting"]["ep"] == 8


@pytest.mark.parametrize("args,needle", [
    (["--ep", "4"], "expert parallelism runs over the tensor-parallel group's GPUs"),
    (["--no-sp"], "Megatron-LM requires sequence parallelism"),
])
def test_expert_parallel_degrees_the_estimate_cannot_place_are_refused(toy, args, needle):
    model = toy / "moe-refused.toml"
    model.write_text(TOY + "[moe]\nexperts = 8\ntop_k = 2\n")
    proc = _t3emu("model", str(model), "--system", SYSTEM, *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stdout + proc.stderr


DLRM = """\
name = "toy-dlrm"
kind = "dlrm"
[dlrm]
tables_per_gpu = 2
rows_per_table = 1000
dim = 16
pooling = 4
dense_features = 8
bottom_mlp = [32, 32, 16]
top_mlp = [32, 1]
interaction = "dot"
[run]
batch = 64
"""


def test_a_toy_dlrm_s_training_iteration_is_the_hand_composed_sum(toy):
    """A DLRM on the 4 MI210s of mi210x4 (80 GB/s links, 1 us, the library at 0.75 of the
    peak; 1.36 us launches; HBM sustained 0.853 x 1638 GB/s), the fused design: local
    batch 64 / 4 = 16; the
    interaction over n = 4 x 2 + 1 = 9 vectors feeds the top MLP 16 + 36 = 52 features.
    The embedding + all-to-all runs on all 4 GPUs (sequential and fused); its backward
    all-to-all is the sequential run's a2a phase and a launch; every MLP GEMM is a GEMM
    alone; the MLPs' 3488 weights are all-reduced in one bucket (a ring of 6 steps of a
    quarter of them) and updated by SGD (3 x 2 B per weight)."""
    model = toy / "dlrm.toml"
    model.write_text(DLRM)
    out = toy / "dlrm.json"
    proc = _t3emu("model", str(model), "--system", "mi210x4", "--json", str(out), "--cache",
                  str(toy / "cache"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    doc = json.loads(out.read_text())
    from emulator import api

    res = api.run("emb+a2a", system="mi210x4", modes=["sequential", "fused"], m=64, n=16,
                  k=4, params={"tables": 2, "fixed_lookups": 1}, timing_only=True)
    emb = {m: res.runs[m].modelled_time_s for m in ("sequential", "fused")}
    spec = res.doc["device"]
    a2a_bwd = spec["launch_s"] + res.runs["sequential"].phases["a2a"]
    alone = {}
    shapes = [(16, 32, 8), (16, 32, 32), (16, 16, 32), (16, 32, 52), (16, 1, 32),
              (16, 32, 1), (32, 1, 16), (16, 52, 32), (52, 32, 16), (16, 32, 16),
              (32, 16, 16), (32, 32, 16), (8, 32, 16)]
    for shape in shapes:
        r = api.run("gemm+rs", system="mi210x4", modes=["sequential"], m=shape[0],
                    n=shape[1], k=shape[2], timing_only=True)
        alone[shape] = spec["launch_s"] + r.runs["sequential"].phases["gemm"]
    e, b, n, width = 2, 16, 9, 52
    flops = 2.0 * b * n * n * 16
    kernels = ([_kernel(spec, 2 * b * w * e) for w in (32, 32, 16, 32, 1)]  # activations
               + [_kernel(spec, (b * n * 16 + b * width) * e, flops),
                  _kernel(spec, 3 * b * e)])
    fwd_gemms = [(16, 32, 8), (16, 32, 32), (16, 16, 32), (16, 32, 52), (16, 1, 32)]
    bwd_gemms = [(16, 32, 1), (32, 1, 16), (16, 52, 32), (52, 32, 16), (16, 32, 16),
                 (32, 16, 16), (16, 32, 32), (32, 32, 16), (8, 32, 16)]
    bwd_kernels = ([_kernel(spec, 3 * b * w * e) for w in (1, 32, 16, 32, 32)]
                   + [_kernel(spec, (b * width + 2 * b * n * 16) * e, flops)]
                   + [_kernel(spec, 64 * (16 + 2 * 4 * 16) * e)] * 2)
    params = 8 * 32 + 32 * 32 + 32 * 16 + 52 * 32 + 32 * 1
    ring = 6 * (1e-6 + params * e / 4 / (80e9 * 0.75))
    opt = 1.36e-6 + 3 * e * params / (1638e9 * 0.853)
    for design, mode in (("sequential", "sequential"), ("fused", "fused")):
        got = doc["designs"][design]
        f = emb[mode] + sum(alone[s] for s in fwd_gemms) + sum(kernels)
        bw = a2a_bwd + sum(alone[s] for s in bwd_gemms) + sum(bwd_kernels)
        assert got["layer_forward_s"] == pytest.approx(f, rel=1e-12), design
        assert got["layer_backward_s"] == pytest.approx(bw, rel=1e-12), design
        assert got["dp_allreduce_s"] == pytest.approx(ring, rel=1e-12), design
        assert got["optimizer_s"] == pytest.approx(opt, rel=1e-12), design
        assert got["iteration_s"] == pytest.approx(f + bw + ring + opt, rel=1e-12), design
    assert doc["setting"]["dp"] == 4 and doc["setting"]["designs"] == ["fused"]


def test_a_dlrm_s_all_reduce_steps_at_its_ring_s_slowest_hop(toy):
    """On two nodes of 8 A100s (a100-sxm-2x8) the DLRM's ring over 16 GPUs crosses the
    network twice (7 -> 8 and 15 -> 0): every step waits for a NIC hop (3 us, 25 GB/s per
    direction at the library's 0.9: one GPU of the node sends across at a time), not an
    NVLink one. 2 x 15 steps of 1/16 of the 3488 weights' bytes."""
    from devices.system import load_system
    from emulator.workload import estimate as est

    model = toy / "dlrm-2x8.toml"
    model.write_text(DLRM)
    s = est.setting(str(model), system="a100-sxm-2x8")
    total, last = est.dp_allreduce(s, load_system("a100-sxm-2x8"), 3488, 1e9, "ring")
    step = 3e-6 + 3488 * 2 / 16 / (25e9 * 0.9)
    assert total == last == pytest.approx(30 * step, rel=1e-12)
    assert s.alone_job == (8, ("nodes=1",))


@pytest.mark.parametrize("args,needle", [
    (["--system", "t3-sim"], "t3-sim has no fixed number of GPUs"),
    (["--system", "mi210x4", "--split-heads"], "a DLRM has no attention heads"),
    (["--system", "mi210x4", "--phase", "prefill"], "a DLRM estimate is a training"),
    (["--system", "mi210x4", "--tp", "2"], "--tp 2: a DLRM's GPUs are data-parallel"),
    (["--device", "mi210", "--tp", "4"], "a DLRM runs on every GPU of a --system"),
    (["--system", "mi210x4", "--batch", "66"], "global batch 66 of toy-dlrm is not "),
])
def test_dlrm_settings_the_estimate_cannot_run_are_refused(toy, args, needle):
    model = toy / "dlrm-refused.toml"
    model.write_text(DLRM)
    proc = _t3emu("model", str(model), *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stdout + proc.stderr


def test_split_heads_sizes_the_attention_by_width(toy):
    """6 heads of 64 on TP 4: refused by Megatron-LM's rule, and with --split-heads each GPU
    takes 6 x 64 / 4 = 96 query (and key/value) columns: QKV's N = 3 x 96, OP's K = 96, the
    attention core's bytes (2 q + 2 kv) T e."""
    from emulator.workload import estimate as est

    model = toy / "six-split.toml"
    model.write_text(TOY.replace("heads = 8", "heads = 6").replace("hidden = 512",
                                                                   "hidden = 384"))
    with pytest.raises(ValueError, match="--split-heads sizes them by width"):
        est.setting(str(model), system="mi210x4")
    s = est.setting(str(model), system="mi210x4", split_heads=True, designs=("t3",))
    fwd, _, _ = est.items(s)
    by = {it.name: it for it in fwd}
    assert (by["QKV fwd"].n, by["OP fwd"].k) == (288, 96)
    assert by["attention fwd"].bytes == 4 * 96 * 128 * 2
    per_layer = 384 * 288 + 96 * 384 + 2 * 384 * 512  # QKV, OP, FC-1 and FC-2 shards
    assert est.stage_parameters(s)[0] == 3 * per_layer + 2 * 256 * 384


@pytest.mark.parametrize("args,needle", [
    (["--scenario", "nope"], "--scenario 'nope'; allowed: t3-models, flux-models"),
    (["--scenario", "t3-models", "--tp", "8"], "sets its own models and options; drop --tp"),
    (["gpt3-175b", "--scenario", "flux-models"], "drop gpt3-175b"),
    (["gpt3-175b", "--system", SYSTEM, "--out", "x"], "--out goes with --scenario"),
])
def test_a_scenario_is_refused_with_the_options_it_sets_itself(args, needle):
    proc = _t3emu("model", *args)
    assert proc.returncode == 2 and needle in proc.stderr, proc.stdout + proc.stderr


def test_every_scenario_s_estimates_are_checked_settings():
    """Every estimate of every paper's setting passes the checks a run makes before
    launching (degrees, designs, every job as `t3emu run` checks it)."""
    from emulator.workload import scenarios

    sizes = {name: len(scenarios.settings(name)) for name in scenarios.SCENARIOS}
    assert sizes == {"t3-models": 14, "flux-models": 40, "fused-models": 2,
                     "ficco-models": 2}


@pytest.mark.parametrize("opt", ["--json", "--figure", "--cache"])
def test_unwritable_outputs_are_refused_before_any_job(toy, opt, no_launch):
    """A path under a regular file (unwritable even for root): one line, exit 2, and no
    job started (the fake mpiexec never ran)."""
    env, marker = no_launch
    blocker = toy / "a-file"
    blocker.write_text("x")
    target = blocker / ("out.json" if opt == "--json" else "f.png" if opt == "--figure"
                        else "cache")
    args = ["model", str(toy / "toy.toml"), "--system", "mi210x4", opt, str(target)]
    if opt != "--cache":
        args += ["--cache", str(toy / "cache-unused")]
    proc = subprocess.run([sys.executable, "-m", "emulator.app.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env,
                          stdin=subprocess.DEVNULL)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and opt in lines[0], proc.stderr
    assert not marker.exists()


def test_a_failed_figure_or_json_write_keeps_the_previous_file(tmp_path):
    from emulator.app.files import save_atomic, write_json_atomic

    path = tmp_path / "f.png"
    path.write_bytes(b"old")

    def broken(tmp):
        with open(tmp, "wb") as fh:
            fh.write(b"half")
        raise OSError(28, "No space left on device")
    with pytest.raises(OSError):
        save_atomic(path, broken)
    assert path.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["f.png"]
    doc = tmp_path / "e.json"
    write_json_atomic(doc, {"a": 1})
    with pytest.raises(TypeError):
        write_json_atomic(doc, {"a": object()})
    assert json.loads(doc.read_text()) == {"a": 1}


def test_a_tampered_or_damaged_cache_entry_is_run_again(toy):
    """Entries carry a checksum of their times: halving a stored time, an empty entry or
    one missing a configuration is detected and the job runs again, giving the first
    run's estimate exactly."""
    cache = toy / "tamper-cache"
    out = toy / "tamper.json"
    args = ("model", str(toy / "toy.toml"), "--system", "mi210x4", "--json", str(out),
            "--cache", str(cache))
    proc = _t3emu(*args)
    assert proc.returncode == 0, proc.stderr
    first = json.loads(out.read_text())
    entries = sorted(cache.glob("*.json"))
    assert entries
    doc = json.loads(entries[0].read_text())
    mode = next(iter(doc["runs"]))
    doc["runs"][mode]["time"] /= 2  # tampered, checksum kept
    entries[0].write_text(json.dumps(doc))
    if len(entries) > 1:
        entries[1].write_text("{}")
    if len(entries) > 2:
        d2 = json.loads(entries[2].read_text())
        d2["runs"].pop(next(iter(d2["runs"])))
        entries[2].write_text(json.dumps(d2))
    proc = _t3emu(*args)
    assert proc.returncode == 0, proc.stderr
    assert "damaged or tampered with: run again" in proc.stderr
    again = json.loads(out.read_text())
    assert again["designs"] == first["designs"]


@pytest.fixture
def small_tmpfs(tmp_path):
    """A 1 MiB tmpfs (a file system that really fills); skipped where mount is not
    allowed (not root)."""
    d = tmp_path / "tmpfs"
    d.mkdir()
    got = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(d)],
                         capture_output=True, text=True)
    if got.returncode:
        pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")
    try:
        yield d
    finally:
        subprocess.run(["umount", "-l", str(d)], capture_output=True)


def _fill(d: Path, leave: int) -> None:
    """Fill ``d``'s file system, then free ``leave`` bytes again."""
    import shutil

    fd = os.open(d / "filler", os.O_WRONLY | os.O_CREAT)
    try:
        while os.write(fd, b"\0" * 4096):
            pass
    except OSError:
        pass
    finally:
        os.close(fd)
    free = shutil.disk_usage(d).free
    with open(d / "filler", "r+b") as fh:
        fh.truncate(max(os.path.getsize(d / "filler") - (leave - free), 0))


def test_a_full_disk_refuses_model_outputs_before_any_job(toy, small_tmpfs, no_launch):
    """`t3emu model --json` into a full file system: one line, exit 2, no job, and the
    previous estimate untouched."""
    env, marker = no_launch
    out = small_tmpfs / "estimate.json"
    out.write_text('{"previous": true}')
    _fill(small_tmpfs, 0)
    for opt, path in (("--json", out), ("--figure", small_tmpfs / "f.png")):
        proc = subprocess.run([sys.executable, "-m", "emulator.app.cli", "model",
                               str(toy / "toy.toml"), "--system", "mi210x4", opt, str(path),
                               "--cache", str(toy / "cache-unused")], cwd=ROOT,
                              capture_output=True, text=True, timeout=300, env=env,
                              stdin=subprocess.DEVNULL)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and opt in lines[0] and "free" in lines[0], proc.stderr
    assert not marker.exists()
    assert json.loads(out.read_text()) == {"previous": True}


def test_a_disk_that_fills_during_the_write_keeps_the_previous_file(small_tmpfs):
    """The writes of every results file (JSON: estimates, scenario estimates, sweeps, runs;
    the figures) on a file system that fills midway: the write fails, the previous file is
    intact and no temporary file is left."""
    from emulator.app.files import save_atomic, write_json_atomic

    out, fig = small_tmpfs / "estimates.json", small_tmpfs / "model.png"
    out.write_text('{"previous": true}')
    fig.write_bytes(b"old figure")
    _fill(small_tmpfs, 64 << 10)
    with pytest.raises(OSError):
        write_json_atomic(out, {"rows": ["x" * 1000] * 500})  # about 500 KB

    def draw(tmp):
        with open(tmp, "wb") as fh:
            for _ in range(200):
                fh.write(b"\1" * 4096)  # 800 KB of picture
    with pytest.raises(OSError):
        save_atomic(fig, draw)
    assert json.loads(out.read_text()) == {"previous": True}
    assert fig.read_bytes() == b"old figure"
    assert sorted(p.name for p in small_tmpfs.iterdir()) == ["estimates.json", "filler",
                                                            "model.png"]
