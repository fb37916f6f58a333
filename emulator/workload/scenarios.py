"""The papers' whole-model settings as named scenarios (``t3emu model --scenario NAME``).

Each scenario is a list of estimates (``estimate.setting`` options); ``run`` makes them
one after another (every operation cached as any estimate's) and writes
``OUT/estimates.json``: the scenario's name and every estimate's document, which
``t3emu validate`` reads beside the sweeps for the pages' end-to-end sections.

- ``t3-models``: T3 Table 2's models and TP degrees on T3's simulated system (``t3-sim``
  GPUs on a ring), all-reduce after the row-parallel GEMMs (T3's sub-layers), training
  and prompt inference (prefill), T3 and T3-MCA, with unfused attention (the Megatron-LM
  breakdown T3 scaled; ``attention="unfused"``). T-NLG (28 heads) and PaLM (48) at TP 8,
  16 and 32 take ``split_heads``: T3 sized their GEMMs by H / TP, as Megatron-LM's rule
  (TP divides the heads) would not.
- ``flux-models``: Flux's whole-model runs, GPT-3 175B and Llama-2 70B in bf16 (the
  precision of ``flux-paper``): training on 128 GPUs (16 nodes of 8) at TP 8 x PP 8 x DP
  2 on the A100 NVLink and H800 clusters, prefill of 8 x 2048 tokens and decode at batch
  64 and 512 on one node of each and of the A100 PCIe cluster (TP 8 across both sockets),
  with sequence parallelism (AG + GEMM, GEMM + RS: Flux's operators), Flux and
  TransformerEngine; and each inference step again in vLLM's form (no sequence
  parallelism: every row-parallel GEMM followed by the library's all-reduce, the baseline
  alone), which Flux's inference comparison is against. ASSUMPTION: training
  micro-batches of one 2048-token sequence (the prefill's length; Flux states no training
  sequence here), 32 per iteration (4 x PP); decode steps attend to a 2048-token context.
  Training on the PCIe cluster is not run (``t3emu model ... --system a100-pcie-2x8
  --set nodes=16`` runs it).
- ``fused-models``: the fused operators' 128-node DLRM training estimate on the 2D torus
  (``mi210-torus128``) and their decode case, GEMV + all-reduce on the 4 fully connected
  MI210s (Llama-2 70B decode at batch 1, TP 4, all-reduce), the fused design.
- ``ficco-models``: FiCCO's MI300X node: Mixtral 8x7B training (expert parallelism:
  the dispatch all-to-all feeding the experts, ``a2a+gemm``) and Llama-2 70B prefill
  (sequence parallelism: ``ag+gemm``), FiCCO's heuristic and the fused operators.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Scenario:
    name: str
    paper: str  # the validation page its estimates feed
    help: str
    runs: tuple[dict, ...] = field(default_factory=tuple)  # estimate.setting's options


def _t3() -> tuple[dict, ...]:
    out = []
    for model, tps, split in (("mega-gpt2", (8, 16), False), ("t-nlg", (8, 16), True),
                              ("gpt3-175b", (32,), False), ("palm-540b", (32,), True),
                              ("mt-nlg-530b", (32,), False)):
        for tp in tps:
            for phase in ("training", "prefill"):
                out.append(dict(spec=model, device="t3-sim", topology="ring", tp=tp,
                                phase=phase, sp=False, split_heads=split,
                                attention="unfused", designs=("t3-plain", "t3")))
    return tuple(out)


FLUX_DTYPE = "bf16"  # flux-paper's precision (fp16 would let RS-A use atomics it does not)


def _flux() -> tuple[dict, ...]:
    out = []
    for model in ("gpt3-175b", "llama2-70b"):
        for cluster in ("a100-sxm", "h800", "a100-pcie"):
            if cluster != "a100-pcie":
                out.append(dict(spec=model, system=f"{cluster}-2x8", tp=8, pp=8, dp=2,
                                overrides=(("nodes", 16),), seq=2048, batch=1,
                                dtype=FLUX_DTYPE, designs=("flux", "te")))
            inference = [dict(phase="prefill", seq=2048, batch=8)] + [
                dict(phase="decode", seq=2048, batch=b) for b in (64, 512)]
            for opts in inference:
                out.append(dict(spec=model, system=f"{cluster}-x8", dtype=FLUX_DTYPE,
                                designs=("flux", "te"), **opts))
                # vLLM's form of the same step: no sequence parallelism, every row-parallel
                # GEMM then the library's all-reduce (the baseline alone)
                out.append(dict(spec=model, system=f"{cluster}-x8", dtype=FLUX_DTYPE,
                                sp=False, designs=(), **opts))
    return tuple(out)


SCENARIOS = {s.name: s for s in (
    Scenario("t3-models", "t3", "T3 Table 2's models on T3's simulated ring: training and "
             "prompt inference with unfused attention, T3 and T3-MCA", _t3()),
    Scenario("flux-models", "flux", "GPT-3 175B and Llama-2 70B in bf16: training on 128 "
             "GPUs (TP 8 x PP 8 x DP 2; A100 NVLink, H800), prefill 8 x 2048 and decode at 64 "
             "and 512 on 8 GPUs (also A100 PCIe); Flux and TransformerEngine, and each "
             "inference step in vLLM's form (all-reduce, no SP)", _flux()),
    Scenario("fused-models", "fused-ops", "the 128-node DLRM on the torus and Llama-2 70B "
             "decode (GEMV + all-reduce) on 4 MI210s; the fused operators", (
                 dict(spec="dlrm-128node", system="mi210-torus128", designs=("fused",)),
                 dict(spec="llama2-70b", system="mi210x4", phase="decode", batch=1,
                      seq=2048, sp=False, designs=("fused",)))),
    Scenario("ficco-models", "ficco", "Mixtral 8x7B training (EP) and Llama-2 70B prefill "
             "(SP) on 8 MI300X; FiCCO and the fused operators", (
                 dict(spec="mixtral-8x7b", system="mi300x-x8", seq=4096, batch=2,
                      designs=("ficco", "fused")),
                 dict(spec="llama2-70b", system="mi300x-x8", phase="prefill",
                      designs=("ficco",)))),
)}


def command(name: str) -> str:
    """The command that makes a scenario's estimates, as a user types it."""
    return f"t3emu model --scenario {name} --out results/{name}"


def get(name: str) -> Scenario:
    if name not in SCENARIOS:
        raise ValueError(f"--scenario {name!r}; allowed: {', '.join(SCENARIOS)}")
    return SCENARIOS[name]


def settings(name: str, precheck: bool = True) -> list:
    """Every estimate's checked ``Setting`` (raises before anything runs; ``precheck``:
    every job too, as ``t3emu run`` checks it)."""
    from emulator.workload import estimate as est

    out = []
    for opts in get(name).runs:
        s = est.setting(**opts)
        if precheck:
            est.precheck(s)
        out.append(s)
    return out


def run(name: str, out_dir: Path | None, cache: Path | None, progress=None,
        checked: list | None = None, watchdog_s: float = 60.0) -> dict:
    """Make every estimate of a scenario (``checked``: its ``settings``, if already made);
    write ``out_dir/estimates.json``; the document."""
    from emulator.workload import estimate as est

    from emulator.app.pool import pooled

    say = progress or (lambda msg: None)
    docs = []
    all_settings = checked if checked is not None else settings(name)
    with pooled():
        if cache is not None:
            prefill(all_settings, cache, progress, watchdog_s)
        for i, s in enumerate(all_settings, 1):
            t0 = time.monotonic()
            say(f"== [{i}/{len(all_settings)}] {s.model.name}, {s.phase}, {s.where}")
            doc = est.estimate(s, cache, progress, watchdog_s)
            doc["wall_s"] = time.monotonic() - t0
            docs.append(doc)
    out = {"scenario": name, "command": command(name), "estimates": docs}
    if out_dir is not None:
        from emulator.app.files import write_json_atomic

        write_json_atomic(out_dir / "estimates.json", out, indent=1)
    return out


def prefill(all_settings: list, cache: Path, progress=None, watchdog_s: float = 60.0) -> None:
    """Run every distinct operation the estimates need and the cache lacks, ordered by
    job size so that each size's pooled job starts once (the estimates then read them
    all from the cache)."""
    from emulator.workload import estimate as est

    jobs = {}
    for s in all_settings:
        run = est.Runner(s, cache, progress, watchdog_s)
        fwd, bwd, head = est.items(s)
        for _, job in est.runs(s, fwd + bwd + head):
            path = run.path(job)
            if path not in jobs and est.cache_entry(path, job.modes) is None:  # missing
                # or damaged (checksum, fields): run it
                jobs[path] = (run, job)
    todo = sorted(jobs.values(), key=lambda rj: rj[1].ranks)
    say = progress or (lambda msg: None)
    for i, (run, job) in enumerate(todo, 1):
        say(f"[{i}/{len(todo)}] {job.op} M={job.m} N={job.n} K={job.k} on {job.ranks} "
            f"ranks")
        run(job)


def summary(doc: dict) -> str:
    """One line per estimate: the setting and each design's iteration and layer speedups."""
    lines = []
    for e in doc["estimates"]:
        st = e["setting"]
        what = (f"{st['model']}, {st['phase']}, {st['system']}"
                + ("" if st.get("kind") == "dlrm" else
                   f", TP {st['tp']} x PP {st['pp']} x DP {st['dp']}, {st['tokens']} tokens"))
        cells = ", ".join(f"{d} {v['speedup']:.3f}x (layer {v['layer_speedup']:.3f}x)"
                          for d, v in e["designs"].items() if d != e["baseline"])
        lines.append(f"{what}: {cells}; {e['baseline']}'s communication share "
                     f"{e['comm_share'] * 100:.1f}%")
    return "\n".join(lines)
