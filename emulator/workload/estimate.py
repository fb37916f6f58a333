"""A whole-model estimate composed from emulated operations (``t3emu model``).

What is emulated and what is composed:

- Emulated (MPI jobs of the TP degree, timing-only): every distinct GEMM + collective
  of a layer (``layers.Gemm`` with an operation), once per distinct shape, in every
  configuration the compared designs run for it (``Registry.design_configuration``:
  T3 t3-mca on gemm+rs and gemm+ar, Flux flux-best and TransformerEngine te-best on
  gemm+rs and ag+gemm, FiCCO ficco-auto on ag+gemm, the fused operators fused on
  gemv+ar; the baseline ``sequential`` elsewhere and always, for the speedups); and
  every GEMM alone (its time in a ``sequential`` gemm+rs job of the same shape: the
  GEMM kernel's phase, launch included; ``alone_shape``: a GEMM of fewer rows than
  ranks runs as its transpose). Results are cached on disk by everything
  that decides them (system, overrides, dtype, operation, shape, configurations and
  a hash of the emulator's code), so a second estimate takes seconds.
- Composed: the other kernels (``layers.Kernel``) take a launch plus the longer of
  their matrix FLOPs at ``ATTENTION_EFFICIENCY`` of the peak and their bytes at the
  HBM's peak; a layer's items run one after another on one stream (their times add);
  the model's layers are equal (a layer's time x layers); training adds the
  vocabulary-parallel LM head and its cross-entropy and the optimizer step (Adam:
  ``ADAM_BYTES`` per parameter of the GPU's shard at the HBM's peak); prefill runs the
  forward of every layer and the LM head on the last token of each sequence; decode
  one step of the batch against a context of the run's sequence length.
- Per operation the table gives each design's time and its exposed communication: the
  time less the GEMM alone (Flux's ECT), and the baseline's communication share: its
  collective phases over the iteration (Flux's Figure 1 view).

ASSUMPTIONS (the same for every design): streaming kernels reach the HBM's peak;
FlashAttention's matrix products run at ``ATTENTION_EFFICIENCY`` of the matrix peak;
no two items of a layer overlap (one stream).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from emulator.workload.layers import Gemm, Item, Kernel, layer
from emulator.workload.spec import TransformerSpec

# FlashAttention-2 (Dao 2023, abstract and section 4.1): forward and backward reach 50-73%
# of the A100's matrix peak; ASSUMPTION: 0.6 on every GPU (no figure per GPU is modelled)
ATTENTION_EFFICIENCY = 0.6
# mixed-precision Adam per parameter: read fp32 master, m, v (12 B) and the 2 B gradient,
# write the three (12 B) and the 2 B working copy (Micikevicius et al. 2018's scheme)
ADAM_BYTES = 28
VOCAB_PAD = 128  # Megatron-LM pads the vocabulary to a multiple of 128 x TP
COLLECTIVE_PHASES = ("rs", "ag", "ar", "a2a")
ALONE = "gemm+rs"  # a GEMM alone is the GEMM phase of a sequential run of this operation


@dataclass(frozen=True)
class Setting:
    model: TransformerSpec
    system: str
    phase: str  # training, prefill or decode
    tp: int
    sp: bool  # Megatron's sequence parallelism (AG before, RS after) or all-reduce
    designs: tuple[str, ...]
    dtype: str = "fp16"
    overrides: tuple[str, ...] = ()  # --set KEY=VALUE

    @property
    def tokens(self) -> int:
        """T of a layer: sequence x batch (decode: the batch, one token each)."""
        return self.model.batch if self.phase == "decode" else self.model.tokens

    @property
    def e(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    @property
    def parsed_overrides(self) -> tuple:
        from devices.overrides import parse

        return tuple(parse(o) for o in self.overrides)


@dataclass
class Measured:
    """Modelled seconds of each distinct run: (operation, m, n, k) -> configuration ->
    time, the baseline's collective and GEMM-alone times; GEMMs alone by (m, n, k)."""

    ops: dict[tuple, dict[str, float]] = field(default_factory=dict)
    comm: dict[tuple, float] = field(default_factory=dict)  # the baseline's collective phases
    alone: dict[tuple, float] = field(default_factory=dict)  # GEMM alone (launch included)


def code_hash() -> str:
    """A hash of the code and presets that decide a modelled time (all of the emulator's
    but this package's, which composes the times)."""
    root = Path(__file__).resolve().parents[2]
    mine = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for pkg in ("emulator", "devices", "collectives"):
        for p in sorted((root / pkg).rglob("*")):
            if (p.suffix in (".py", ".toml") and "__pycache__" not in p.parts
                    and mine not in p.parents):
                h.update(str(p.relative_to(root)).encode())
                h.update(p.read_bytes())
    return h.hexdigest()[:16]


def default_cache() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "t3emu" / "ops"


class Runner:
    """Runs (or reads from the cache) one operation in some configurations."""

    def __init__(self, setting: Setting, cache: Path | None, progress=None):
        self.s, self.cache = setting, cache
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._code = code_hash()

    def __call__(self, op: str, m: int, n: int, k: int, modes: tuple[str, ...]) -> dict:
        from emulator import api

        key = {"system": self.s.system, "set": list(self.s.overrides), "dtype": self.s.dtype,
               "ranks": self.s.tp, "op": op, "m": m, "n": n, "k": k, "modes": list(modes),
               "code": self._code}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        path = self.cache / f"{digest}.json" if self.cache else None
        if path is not None and path.is_file():
            return json.loads(path.read_text())
        t0 = time.monotonic()
        res = api.run(op, system=self.s.system, ranks=self.s.tp, modes=list(modes), m=m, n=n,
                      k=k, dtype=self.s.dtype, timing_only=True,
                      set=dict(self.s.parsed_overrides))
        out = {"runs": {r: {"time": x.modelled_time_s, "phases": x.phases}
                        for r, x in res.runs.items()},
               "launch_s": res.doc["device"]["launch_s"]}
        self.progress(f"  {op} M={m} N={n} K={k} ({', '.join(modes)}): "
                      f"{time.monotonic() - t0:.0f} s")
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps(out))
            tmp.replace(path)
        return out


def items(s: Setting) -> tuple[list[Item], list[Item], list[Item]]:
    """(a layer's forward items, its backward items, the model's other items: LM head,
    cross-entropy, optimizer) on one GPU."""
    m, t, e = s.model, s.tp, s.e
    fwd, bwd = layer(m, t, s.phase, s.sp, s.tokens, m.seq, e)
    vocab = -(-m.vocab // (VOCAB_PAD * t)) * VOCAB_PAD  # this GPU's padded vocabulary slice
    head_rows = s.tokens if s.phase != "prefill" else m.batch  # prefill: last tokens only
    if s.sp and head_rows % t:
        head_rows = -(-head_rows // t) * t
    head = [Gemm("LM head fwd", "ag+gemm" if s.sp else None, head_rows, vocab, m.hidden),
            Kernel("cross-entropy fwd", 2 * head_rows * vocab * e)]
    if s.phase == "training":
        head += [Kernel("cross-entropy bwd", 2 * head_rows * vocab * e),
                 Gemm("LM head dgrad", "gemm+rs" if s.sp else "gemm+ar", head_rows,
                      m.hidden, vocab),
                 Gemm("LM head wgrad", None, m.hidden, vocab, head_rows),
                 Kernel("optimizer (Adam)", ADAM_BYTES * parameters(s))]
    return fwd, bwd, head


def parameters(s: Setting) -> float:
    """Parameters of the model on one GPU of the TP group (weights of the GEMMs and the
    vocabulary slice of the embedding and the LM head; norms are negligible)."""
    m, t = s.model, s.tp
    q, kv = m.heads * m.head_dim, m.kv_heads * m.head_dim
    up = 2 * m.ffn_hidden if m.ffn == "swiglu" else m.ffn_hidden
    per_layer = m.hidden * (q + 2 * kv) + q * m.hidden + m.hidden * up + m.ffn_hidden * m.hidden
    return (m.layers * per_layer + 2 * m.vocab * m.hidden) / t


def kernel_time(k: Kernel, spec, dtype: str) -> float:
    """A kernel that is not a GEMM: its launch, then the longer of its matrix FLOPs at
    ``ATTENTION_EFFICIENCY`` of the peak and its bytes at the HBM's peak."""
    compute = k.flops / (spec.peak_flops(dtype) * ATTENTION_EFFICIENCY) if k.flops else 0.0
    return spec.launch_s + max(compute, k.bytes / spec.hbm_bw)


def measure(s: Setting, all_items: list[Item], run: Runner) -> Measured:
    """Run every distinct operation and GEMM alone of ``all_items`` once."""
    from emulator.app.catalog import registry

    reg = registry()
    base = reg.baseline()
    out = Measured()
    shapes = list(dict.fromkeys((it.op, it.m, it.n, it.k) for it in all_items
                                if isinstance(it, Gemm)))
    for i, (op, m, n, k) in enumerate(shapes, 1):
        run.progress(f"[{i}/{len(shapes)}] {op or 'GEMM alone'} M={m} N={n} K={k}")
        if op is None:
            doc = run(ALONE, *alone_shape(m, n, k, s.tp), (base,))
            out.alone[(m, n, k)] = _alone(doc["runs"][base], doc["launch_s"])
            continue
        modes = tuple(dict.fromkeys([base, *(reg.design_configuration(d, op)
                                             for d in s.designs)]))
        doc = run(op, m, n, k, modes)
        out.ops[(op, m, n, k)] = {c: r["time"] for c, r in doc["runs"].items()}
        seq = doc["runs"][base]
        out.comm[(op, m, n, k)] = sum(v for p, v in seq["phases"].items()
                                      if p in COLLECTIVE_PHASES)
        out.alone[(op, m, n, k)] = _alone(seq, doc["launch_s"])
    return out


def alone_shape(m: int, n: int, k: int, tp: int) -> tuple[int, int, int]:
    """The shape a GEMM alone is run as: itself, or, where it has fewer rows M than the
    operation it runs in needs (one per rank), its transpose (C^T = B^T A^T: a GEMM
    library takes either layout), or at least tp rows where N is that small too (a GEMM
    of one tile either way)."""
    if m >= tp:
        return m, n, k
    return (n, m, k) if n >= tp else (tp, n, k)


def _alone(seq: dict, launch_s: float) -> float:
    """The GEMM alone in a sequential run: its compute phases and one launch."""
    return launch_s + sum(v for p, v in seq["phases"].items() if p not in COLLECTIVE_PHASES)


def item_time(it: Item, design: str, meas: Measured, spec, dtype: str) -> float:
    from emulator.app.catalog import registry

    if isinstance(it, Kernel):
        return kernel_time(it, spec, dtype)
    if it.op is None:
        return meas.alone[(it.m, it.n, it.k)]
    cfg = registry().design_configuration(design, it.op) if design != registry().baseline() \
        else design
    return meas.ops[(it.op, it.m, it.n, it.k)][cfg]


def compose(s: Setting, meas: Measured, spec) -> dict:
    """Per design: each item's time and exposed communication, the layer's forward and
    backward, the iteration (``layers`` equal layers plus the model's other items), its
    speedup over the baseline; the baseline's communication share."""
    from emulator.app.catalog import registry

    base = registry().baseline()
    fwd, bwd, head = items(s)
    out = {"designs": {}, "baseline": base}
    for design in (base, *s.designs):
        rows = []
        for part, its in (("forward", fwd), ("backward", bwd), ("model", head)):
            for it in its:
                t = item_time(it, design, meas, spec, s.dtype)
                gemm = isinstance(it, Gemm)
                exposed = 0.0
                if gemm and it.op is not None:
                    exposed = t - meas.alone[(it.op, it.m, it.n, it.k)]
                rows.append({"part": part, "item": it.name,
                             "op": (it.op or "GEMM") if gemm else "kernel",
                             "shape": [it.m, it.n, it.k] if gemm else None,
                             "time_s": t, "exposed_comm_s": exposed})
        layer_f = sum(r["time_s"] for r in rows if r["part"] == "forward")
        layer_b = sum(r["time_s"] for r in rows if r["part"] == "backward")
        other = sum(r["time_s"] for r in rows if r["part"] == "model")
        iteration = s.model.layers * (layer_f + layer_b) + other
        exposed = (s.model.layers * sum(r["exposed_comm_s"] for r in rows
                                        if r["part"] != "model")
                   + sum(r["exposed_comm_s"] for r in rows if r["part"] == "model"))
        out["designs"][design] = {"items": rows, "layer_forward_s": layer_f,
                                  "layer_backward_s": layer_b, "other_s": other,
                                  "iteration_s": iteration, "exposed_comm_s": exposed}
    b = out["designs"][base]
    for d in out["designs"].values():
        d["speedup"] = b["iteration_s"] / d["iteration_s"]
        d["layer_speedup"] = ((b["layer_forward_s"] + b["layer_backward_s"])
                              / (d["layer_forward_s"] + d["layer_backward_s"]))
    b = b["iteration_s"]
    comm = s.model.layers * sum(meas.comm[(it.op, it.m, it.n, it.k)] for it in fwd + bwd
                                if isinstance(it, Gemm) and it.op) + sum(
        meas.comm[(it.op, it.m, it.n, it.k)] for it in head if isinstance(it, Gemm) and it.op)
    out["comm_share"] = comm / b
    return out


def estimate(s: Setting, cache: Path | None = None, progress=None) -> dict:
    """Measure (or read from the cache) and compose; the result document."""
    from devices.system import load_system

    spec = load_system(s.system, s.parsed_overrides)
    fwd, bwd, head = items(s)
    run = Runner(s, cache, progress)
    meas = measure(s, fwd + bwd + head, run)
    doc = compose(s, meas, spec)
    doc["setting"] = {"model": s.model.name, "system": s.system, "phase": s.phase,
                      "tp": s.tp, "sp": s.sp, "designs": list(s.designs), "dtype": s.dtype,
                      "tokens": s.tokens, "seq": s.model.seq, "batch": s.model.batch,
                      "layers": s.model.layers, "set": list(s.overrides)}
    return doc
