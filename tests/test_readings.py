"""The workload readings that decide published results (issue 48, item 9): the unfused
attention of T3's breakdown, the papers' whole-model settings (Flux in bf16, vLLM's
all-reduce form, a PCIe node; T3 with unfused attention), FiCCO's EP GEMMs at both
readings of N kept apart from SP+TP, and the embedding's pooling-factor dependence."""

from __future__ import annotations

import pytest

from emulator.workload.layers import DROPOUT_MASK_BYTES, Kernel, layer
from emulator.workload.spec import TransformerSpec

# a toy: 4 heads of 16 (q = 64 on one GPU at TP 1), sequence 8, batch 2: T = 16 tokens
TOY = TransformerSpec("toy", "-", hidden=64, heads=4, kv_heads=4, head_dim=16, ffn="gelu",
                      ffn_hidden=256, layers=2, vocab=128, seq=8, batch=2)
E = 2  # fp16


def _core(items: list, which: str) -> list[Kernel]:
    return [it for it in items if isinstance(it, Kernel) and it.name.startswith("attention")
            and which in it.name]


def test_unfused_attention_by_hand():
    """T = 16, s = 8, 4 heads of 16: scores b h s^2 = 2 x 4 x 64 = 512 elements; each
    matrix product 2 T s q = 2 x 16 x 8 x 64 = 16384 FLOPs over the whole matrix."""
    fwd, bwd = layer(TOY, 1, "training", False, 16, 8, E, attention_form="unfused")
    f = _core(fwd, "fwd")
    assert [k.name for k in f] == ["attention scores fwd", "attention softmax fwd",
                                   "attention context fwd"]
    scores, mm, io = 512, 16384.0, 64 * 16 * E  # io: one of Q, K, V, O (T x 64)
    assert [k.flops for k in f] == [mm, 0.0, mm]
    assert f[0].bytes == 2 * io + scores * E  # Q, K in; S out
    assert f[1].bytes == 2 * scores * E + DROPOUT_MASK_BYTES * scores  # S in, P and mask out
    assert f[2].bytes == scores * E + 2 * io  # P, V in; O out
    b = _core(bwd, "bwd")
    assert [k.name for k in b] == ["attention context bwd", "attention softmax bwd",
                                   "attention scores bwd"]
    assert [k.flops for k in b] == [2 * mm, 0.0, 2 * mm]  # twice the forward's products
    assert b[0].bytes == 3 * io + 2 * scores * E  # dO, P, V in; dV, dP out
    assert b[1].bytes == 3 * scores * E + DROPOUT_MASK_BYTES * scores  # dP, mask, P -> dS
    assert b[2].bytes == scores * E + 4 * io  # dS, Q, K in; dQ, dK out
    # prefill: no dropout mask
    pre, _ = layer(TOY, 1, "prefill", False, 16, 8, E, attention_form="unfused")
    assert _core(pre, "softmax")[0].bytes == 2 * scores * E


def test_flash_attention_unchanged_and_decode_the_same_in_both_forms():
    fwd, bwd = layer(TOY, 1, "training", False, 16, 8, E)
    (f,), (b,) = _core(fwd, "fwd"), _core(bwd, "bwd")
    assert f.flops == 4.0 * 16 * 8 * 64 * 0.5 and f.bytes == 4 * 64 * 16 * E
    assert b.flops == f.flops * 2.5 and b.bytes == 2 * f.bytes
    a = layer(TOY, 1, "decode", False, 2, 8, E)[0]
    u = layer(TOY, 1, "decode", False, 2, 8, E, attention_form="unfused")[0]
    assert a == u
    with pytest.raises(ValueError, match="attention 'fused'; allowed: flash, unfused"):
        layer(TOY, 1, "prefill", False, 16, 8, E, attention_form="fused")


def test_the_papers_settings():
    from emulator.workload import scenarios

    t3 = scenarios.settings("t3-models", precheck=False)
    assert {s.attention for s in t3} == {"unfused"}
    flux = scenarios.settings("flux-models", precheck=False)
    assert {s.dtype for s in flux} == {"bf16"}
    assert {s.where for s in flux if s.phase != "training"} == {
        "a100-sxm-x8", "h800-x8", "a100-pcie-x8"}
    sp = [s for s in flux if s.sp and s.phase != "training"]
    ar = {(s.model.name, s.phase, s.where, s.tokens) for s in flux if not s.sp}
    assert sp and all((s.model.name, s.phase, s.where, s.tokens) in ar for s in sp)
    assert all(not s.designs for s in flux if not s.sp)  # vLLM's form: the baseline alone


def _pt(model: str, sublayer: str, times: dict[str, float], **kw) -> dict:
    runs = [{"mode": m, "modelled_time_s": t, "phases": {}} for m, t in times.items()]
    return {"model": model, "sublayer": sublayer, "runs": runs, "m": 1, "n": 1, "k": 1, **kw}


def test_ficco_keeps_sp_tp_and_both_ep_readings_apart():
    from emulator.app.validation import ficco

    t = {"ficco-serial": 2.0, "ficco-shard": 4.0, "ficco-auto": 1.5, "ficco-ideal": 1.0}
    pts = [_pt("g1", "SP+TP llama-3-405b", t), _pt("g14", "EP Mixtral", t),
           _pt("g14-n8", "EP Mixtral, N/8 per GPU", t), _pt("s1", "synthetic SP+TP", t)]
    sw = {"ficco-paper": {"points": pts}}
    assert [p["model"] for p in ficco.paper_points(sw)] == ["g1", "g14"]
    groups = ficco.groups(sw)
    assert [[p["model"] for p in g] for _, g in groups] == [["g1"], ["g14"], ["g14-n8"],
                                                            ["s1"]]
    assert groups[1][0].startswith("EP, g13-g16, one expert per GPU (full N")
    text = "\n".join(ficco._readings(sw))
    assert "## The EP GEMMs' two readings" in text
    # one row per reading: ideal 2.00x, ficco-auto 1.33x, shard-based 0.50x, slower 1 of 1
    assert text.count("| 2.00x | 1.33x | 0.50x | 1 of 1 |") == 2


def test_the_pooling_factor_dependence_and_the_headline_without_it():
    from emulator.app.validation import fused_ops

    def emb(k: int, system: str, sub: str, fused: float, bound: bool = False) -> dict:
        t = {"sequential": 1.0, "fused": fused, **({"ideal-overlap": 0.9} if bound else {})}
        return _pt("DLRM", sub, t, collective="emb+a2a", system=system, m=256, k=k,
                   params={"tables": 256})

    pts = [emb(10, "mi210x4", "embedding+A2A", 0.8, True),
           emb(10, "mi210-2node", "embedding+A2A", 0.7, True),
           emb(70, "mi210x4", "embedding+A2A pooling 70", 0.95),
           emb(70, "mi210-2node", "embedding+A2A pooling 70", 0.5)]
    sw = {"fused-ops-paper": {"points": pts}}
    assert [p["k"] for p in fused_ops.compared(sw, "emb+a2a")] == [10, 10]  # L = 70 apart
    assert fused_ops.pooling_rows(sw) == [(10, {"mi210x4": 0.8, "mi210-2node": 0.7}),
                                          (70, {"mi210x4": 0.95, "mi210-2node": 0.5})]
    text = "\n".join(fused_ops._pooling(sw))
    assert "| 10 | 0.800 | 0.700 |" in text and "| 70 | 0.950 | 0.500 |" in text


def test_flux_against_vllm_s_form():
    from emulator.app.validation import flux

    def est(sp: bool, designs: dict[str, float]) -> dict:
        return {"setting": {"model": "GPT-3 175B", "phase": "prefill", "system": "8 x h800",
                            "tokens": 16384, "dtype": "bf16", "sp": sp},
                "baseline": "sequential",
                "designs": {d: {"iteration_s": v} for d, v in designs.items()}}

    doc = {"estimates": [est(True, {"sequential": 0.010, "flux": 0.008, "te": 0.009}),
                         est(False, {"sequential": 0.012})]}
    assert len(flux.vllm_pairs(doc)) == 1
    text = "\n".join(flux._vllm({flux.MODELS: doc}))
    assert "| 12.00 | 10.00 | 8.00 | 9.00 | 1.500x |" in text


def test_a_pooled_cause_sums_the_parts_over_the_points():
    from emulator.app.validation.common import pooled_cause

    def pt(parts_a: dict, parts_b: dict) -> dict:
        return {"runs": [{"mode": "a", "causes": {"baseline": "s", "parts_s": parts_a}},
                         {"mode": "b", "causes": {"baseline": "s", "parts_s": parts_b}}]}

    pts = [pt({"launches": 3.0, "contention": 0.5, "overlap": -1.0},
              {"launches": 3.0, "contention": 0.0, "overlap": 0.5}),
           pt({"launches": 0.0, "contention": 2.0, "overlap": -2.0},
              {"launches": 1.0, "contention": 0.5, "overlap": 0.0})]
    assert pooled_cause(pts, "a") == "launches"  # 3.0 against contention's 2.5
    assert pooled_cause(pts, "a", against="b") == "contention"  # 2.0 beyond b's; launches -1
    assert pooled_cause(pts, "a", loss=True) == "overlap"
    assert pooled_cause(pts + [{"runs": [{"mode": "a"}]}], "a") is None  # no causes there
