"""A whole-model estimate composed from emulated operations (``t3emu model``).

What is emulated and what is composed:

- Emulated (MPI jobs of the TP degree, timing-only; a DLRM's embedding + all-to-all on
  every GPU of the system, ``dlrm.py``): every distinct GEMM + collective of a layer
  (``layers.Gemm`` with an operation; with experts the dispatch ``a2a+gemm`` and the
  combine ``gemm+a2a``), once per distinct shape, in every configuration the compared
  designs run for it (``Registry.design_configuration``: T3 t3-mca and T3 without the
  arbitration (t3-plain) t3 on gemm+rs and gemm+ar, Flux flux-best and TransformerEngine
  te-best on gemm+rs and ag+gemm, FiCCO ficco-auto on ag+gemm and a2a+gemm, the fused
  operators fused on gemv+ar, gemm+a2a and emb+a2a; the baseline ``sequential``
  elsewhere and always, for the speedups); and
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

from emulator.workload.layers import (ATTENTION_FORMS, PHASES, Gemm, Item, Kernel,
                                      attention_widths, check_ep, check_tp, expert_width,
                                      layer)
from emulator.workload.spec import TransformerSpec

# FlashAttention-2 (Dao 2023, abstract and section 4.1): forward and backward reach 50-73%
# of the A100's matrix peak; ASSUMPTION: 0.6 on every GPU (no figure per GPU is modelled)
ATTENTION_EFFICIENCY = 0.6
# mixed-precision Adam per parameter: read fp32 master, m, v (12 B) and the 2 B gradient,
# write the three (12 B) and the 2 B working copy (Micikevicius et al. 2018's scheme)
ADAM_BYTES = 28
VOCAB_PAD = 128  # Megatron-LM pads the vocabulary to a multiple of 128 x TP
# Megatron-LM's DistributedDataParallel bucket (megatron/core/distributed,
# overlap_grad_reduce): max(40M, 1M x dp) parameters
DDP_BUCKET, DDP_BUCKET_PER_RANK = 40_000_000, 1_000_000
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
    pp: int = 1  # pipeline stages
    dp: int = 1  # data-parallel replicas
    microbatches: int = 1  # per iteration and replica (the pipeline's m)
    group: tuple[str, ...] = ()  # --set items that shrink the system to one TP group
    device: str = ""  # instead of a system: a GPU preset on ``topology`` (T3's simulated
    topology: str = ""  # ring), one TP group, no pipeline or data parallelism
    ep: int = 1  # expert parallelism (a [moe] model: over the TP group's GPUs)
    alone: tuple = ()  # (ranks, --set items) GEMMs alone run on, if not the TP group's
    split_heads: bool = False  # TP need not divide the heads (T3's sizing: H / TP wide)
    attention: str = "flash"  # the attention core's form (``layers.ATTENTION_FORMS``)

    @property
    def dlrm(self) -> bool:
        """A DLRM (``dlrm.py``): every GPU one data-parallel replica of the MLPs and the
        owner of its tables; its embedding + all-to-all runs on all of them."""
        return self.model.kind == "dlrm"

    @property
    def op_ranks(self) -> int:
        """Ranks of a job of an operation with a collective: the TP group's (a DLRM's:
        every GPU's)."""
        return self.dp if self.dlrm else self.tp

    @property
    def alone_job(self) -> tuple[int, tuple[str, ...]]:
        """(ranks, --set items) of a job timing a GEMM alone."""
        return self.alone or (self.tp, self.group)

    @property
    def platform(self) -> dict:
        """The ``api.run`` options that name the hardware."""
        if self.device:
            return {"device": self.device, "topology": self.topology or "ring"}
        return {"system": self.system}

    @property
    def where(self) -> str:
        return (f"{self.tp} x {self.device} ({self.topology or 'ring'})" if self.device
                else self.system)

    @property
    def tokens(self) -> int:
        """T of a layer: sequence x batch (decode: the batch, one token each; a DLRM: the
        global batch of samples)."""
        return self.model.batch if self.phase == "decode" or self.dlrm else self.model.tokens

    @property
    def e(self) -> int:
        return 4 if self.dtype == "fp32" else 2

    @property
    def parsed_overrides(self) -> tuple:
        from devices.overrides import parse

        return tuple(parse(o) for o in self.overrides)

    @property
    def group_overrides(self) -> tuple:
        """The overrides the TP group's operations run under (the system cut to the group's
        nodes)."""
        return self.cut(self.group)

    def cut(self, group: tuple[str, ...]) -> tuple:
        """The parsed overrides with ``group``'s --set items after them."""
        from devices.overrides import parse

        return self.parsed_overrides + tuple(parse(o) for o in group)


def setting(spec: str, *, system: str | None = None, device: str | None = None,
            topology: str | None = None, phase: str = "training", tp: int | None = None,
            pp: int = 1, dp: int = 1, microbatches: int | None = None, sp: bool = True,
            designs=None, seq: int | None = None, batch: int | None = None,
            dtype: str = "fp16", overrides: tuple = (), ep: int | None = None,
            split_heads: bool = False, attention: str = "flash") -> Setting:
    """A checked ``Setting`` (the options of ``t3emu model``; ``overrides``: parsed ``--set``
    pairs). Raises SpecError (or RegistryError, ValueError) naming what is wrong, before
    anything runs: a bad model file, impossible degrees (TP not dividing the heads, the
    key/value heads or the FFN; PP not dividing the layers; TP x PP x DP other than the
    system's GPUs; a TP group of part of a node; EP other than the TP group of a model
    with experts, or EP on one without), an unknown design."""
    import dataclasses

    from devices.spec import TOPOLOGIES, SpecError, load_device
    from devices.system import load_system, system_size
    from emulator.workload.spec import load_model

    if bool(system) == bool(device):
        raise SpecError("give --system (a preset of `t3emu devices` or a file) or --device "
                        "with --tp")
    if topology and not device:
        raise SpecError("--topology goes with --device (a system gives its own)")
    m = load_model(spec)
    if designs is None:  # the designs whose operations the model runs
        designs = ("fused",) if m.kind == "dlrm" else ("t3", "flux", "te")
    if attention not in ATTENTION_FORMS:
        raise SpecError(f"--attention {attention!r}; allowed: {', '.join(ATTENTION_FORMS)}")
    if m.kind == "dlrm":
        if attention != "flash":
            raise SpecError("--attention: a DLRM has no attention")
        return _dlrm_setting(m, system, device, phase, tp, pp, dp, microbatches, designs,
                             seq, batch, dtype, overrides, ep, split_heads)
    for opt, val in (("--seq", seq), ("--batch", batch), ("--pp", pp), ("--dp", dp),
                     ("--microbatches", microbatches), ("--tp", tp), ("--ep", ep)):
        if val is not None and val < 1:
            raise SpecError(f"{opt} {val}: must be at least 1")
    if phase not in PHASES:
        raise SpecError(f"--phase {phase!r}; allowed: {', '.join(PHASES)}")
    if device:
        if tp is None or pp > 1 or dp > 1:
            raise SpecError("--device runs one tensor-parallel group: give --tp, no --pp "
                            "or --dp (a --system places pipeline and data parallelism)")
        if topology and topology not in TOPOLOGIES:
            raise SpecError(f"--topology {topology!r}; allowed: {', '.join(TOPOLOGIES)}")
        full = load_device(device, overrides)
        size = 0
    else:
        full = load_system(system, overrides)
        size = system_size(full)
    tp = (size // (pp * dp) if size else 1) if tp is None else tp
    if size and tp * pp * dp != size:
        raise SpecError(f"TP {tp} x PP {pp} x DP {dp} = {tp * pp * dp} GPUs; system "
                        f"{system} has {size} (--set nodes=N resizes it)")
    check_tp(m, tp, split_heads)
    ep = ep or (tp if m.moe is not None else 1)
    check_ep(m, tp, ep, sp)
    if m.layers % pp:
        raise SpecError(f"PP {pp} does not divide the {m.layers} layers of {m.name}")
    if phase != "training" and dp > 1:
        raise SpecError(f"--dp {dp}: data parallelism is a training split (inference "
                        f"replicas run apart: give one replica's GPUs)")
    m = dataclasses.replace(m, seq=seq or m.seq, batch=batch or m.batch)
    out = Setting(m, system or "", phase, tp, sp, _names(designs), dtype,
                  tuple(f"{k}={v}" for k, v in overrides), pp, dp,
                  microbatches or (4 * pp if pp > 1 else 1),
                  tp_group(tp, size, full), device or "",
                  topology or "", ep, (), split_heads, attention)
    layer(m, tp, phase, sp, out.tokens, m.seq, out.e, ep, split_heads,  # the shapes' checks
          attention)
    return out


def _names(designs) -> tuple[str, ...]:
    """The designs, each checked against the registry (RegistryError names an unknown one)."""
    from emulator.app.catalog import registry

    names = tuple(d.strip() for d in designs if d.strip())
    for d in names:
        registry().design(d)
    return names


def _dlrm_setting(m, system, device, phase, tp, pp, dp, microbatches, designs, seq, batch,
                  dtype, overrides, ep, split_heads) -> Setting:
    """A DLRM's checked setting: a training iteration on every GPU of a system."""
    import dataclasses

    from devices.spec import SpecError
    from devices.system import load_system, system_size
    from emulator.workload.dlrm import items as dlrm_items

    if device or not system:
        raise SpecError(f"{m.name}: a DLRM runs on every GPU of a --system (its all-to-all "
                        f"spans them), not --device")
    if phase != "training":
        raise SpecError(f"--phase {phase}: a DLRM estimate is a training iteration")
    for opt, val, allowed in (("--tp", tp, None), ("--pp", pp, 1), ("--ep", ep, None),
                              ("--microbatches", microbatches, None), ("--seq", seq, None)):
        if val is not None and val != allowed:
            raise SpecError(f"{opt} {val}: a DLRM's GPUs are data-parallel replicas of its "
                            f"MLPs, each owning its tables (give --dp or nothing)")
    if batch is not None and batch < 1:
        raise SpecError(f"--batch {batch}: must be at least 1")
    if split_heads:
        raise SpecError("--split-heads: a DLRM has no attention heads")
    full = load_system(system, overrides)
    size = system_size(full)
    if not size:
        raise SpecError(f"{system} has no fixed number of GPUs (a DLRM runs on all of a "
                        f"system's: give one with nodes and GPUs per node)")
    if dp not in (1, size):
        raise SpecError(f"--dp {dp}: a DLRM runs on all {size} GPUs of {system}")
    m = dataclasses.replace(m, batch=batch or m.batch)
    ranks = max(2, full.interconnect.gpus_per_node)  # GEMMs alone: one node's GPUs, or two
    out = Setting(m, system, "training", 1, False, _names(designs), dtype,  # of one GPU
                  tuple(f"{k}={v}" for k, v in overrides), 1, size, 1, (), "", "", 1,
                  (ranks, tp_group(ranks, size, full)))
    dlrm_items(m, size, out.e)  # the local batch's check
    return out


def tp_group(tp: int, size: int, full) -> tuple[str, ...]:
    """The ``--set`` items that cut a system of ``size`` GPUs (``full``, as loaded) to one
    group of ``tp`` GPUs (a tensor-parallel group; a DLRM's GEMMs alone): TP runs on
    consecutive GPUs, so a group of whole nodes (Megatron-LM keeps TP within a node where
    it fits), a torus cut to a row of them; raises ValueError for a group that is part of
    a node of a larger system or not whole nodes."""
    if not size or tp == size:
        return ()
    per_node = full.interconnect.gpus_per_node
    if tp % per_node:
        raise ValueError(f"TP {tp} on a system of {per_node} GPUs per node: a tensor-parallel "
                         f"group of part of a node is not emulated (give TP a multiple of "
                         f"{per_node}, or a system of {tp} GPUs)")
    nodes = tp // per_node
    torus = full.interconnect.network == "torus2d"
    return (f"nodes={nodes}",) + ((f"network.torus_x={nodes}", "network.torus_y=1")
                                  if torus else ())


@dataclass
class Measured:
    """Modelled seconds of each distinct run by ``key``: configuration -> time, the
    baseline's collective phases and its GEMM (or other computation) alone; a GEMM alone's
    (its operation None)."""

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


@dataclass(frozen=True)
class Job:
    """One emulator run of the estimate: an operation, its shape and configurations, its
    --param pairs, on ``ranks`` of the system cut by the ``group`` --set items."""

    op: str
    m: int
    n: int
    k: int
    modes: tuple[str, ...]
    params: tuple = ()
    ranks: int = 1
    group: tuple[str, ...] = ()


class Runner:
    """Runs (or reads from the cache) one operation in some configurations."""

    def __init__(self, setting: Setting, cache: Path | None, progress=None,
                 watchdog_s: float = 60.0):
        from devices.spec import load_device
        from devices.system import load_system

        self.s, self.cache = setting, cache
        self.watchdog_s = watchdog_s  # each job's --watchdog-s (wall time: no result depends on it)
        self.progress = progress or (lambda msg: print(msg, file=sys.stderr, flush=True))
        self._code = code_hash()
        s = setting  # the hardware the operations run on, as loaded (a user's file's
        # content, not its name, decides the cache key)
        self._spec = repr(load_device(s.device, s.parsed_overrides) if s.device
                          else load_system(s.system, s.parsed_overrides))

    def options(self, job: Job) -> dict:
        """``api.run``'s options for one job of the model."""
        return dict(operation=job.op, **self.s.platform, ranks=job.ranks,
                    modes=list(job.modes), m=job.m, n=job.n, k=job.k, dtype=self.s.dtype,
                    timing_only=True, set=dict(self.s.cut(job.group)),
                    params=dict(job.params), watchdog_s=self.watchdog_s)

    def path(self, job: Job) -> Path | None:
        """The cache entry of ``job`` (None without a cache)."""
        key = {**self.s.platform, "set": [*self.s.overrides, *job.group],
               "dtype": self.s.dtype, "spec": self._spec, "ranks": job.ranks, "op": job.op,
               "m": job.m, "n": job.n, "k": job.k, "modes": list(job.modes),
               "params": list(job.params), "code": self._code}
        digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:24]
        return self.cache / f"{digest}.json" if self.cache else None

    def __call__(self, job: Job) -> dict:
        from emulator import api

        op, m, n, k, modes = job.op, job.m, job.n, job.k, job.modes
        path = self.path(job)
        if path is not None and path.is_file():
            got = cache_entry(path, modes)
            if got is not None:
                return got
            self.progress(f"  cache entry {path.name} damaged or tampered with: run again")
        t0 = time.monotonic()
        res = api.run(**self.options(job))
        out = {"runs": {r: {"time": x.modelled_time_s, "phases": x.phases}
                        for r, x in res.runs.items()},
               "launch_s": res.doc["device"]["launch_s"]}
        self.progress(f"  {op} M={m} N={n} K={k} on {job.ranks} ranks ({', '.join(modes)}): "
                      f"{time.monotonic() - t0:.0f} s")
        if path is not None:
            import tempfile

            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")  # (estimates at once)
            with os.fdopen(fd, "w") as f:
                f.write(json.dumps({**out, "sha256": _checksum(out)}))
            os.replace(tmp, path)
        return out


def _checksum(out: dict) -> str:
    return hashlib.sha256(json.dumps(out, sort_keys=True).encode()).hexdigest()


def cache_entry(path: Path, modes) -> dict | None:
    """A cache entry, if whole and untouched: valid JSON carrying every configuration's
    time and phases and a checksum that matches them; else None (run the job again)."""
    try:
        doc = json.loads(path.read_text())
        digest = doc.pop("sha256")
        runs = doc["runs"]
        ok = (digest == _checksum(doc) and isinstance(doc["launch_s"], (int, float))
              and all(isinstance(runs[m]["time"], (int, float))
                      and isinstance(runs[m]["phases"], dict) for m in modes))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return doc if ok else None


def items(s: Setting) -> tuple[list[Item], list[Item], list[Item]]:
    """(a layer's forward items, its backward items, the last pipeline stage's LM head and
    loss: forward, then backward in training) on one GPU; a DLRM's: (its forward pass, its
    backward pass, nothing)."""
    if s.dlrm:
        from emulator.workload.dlrm import items as dlrm_items

        fwd, bwd, _ = dlrm_items(s.model, s.dp, s.e)
        return fwd, bwd, []
    m, t, e = s.model, s.tp, s.e
    fwd, bwd = layer(m, t, s.phase, s.sp, s.tokens, m.seq, e, s.ep, s.split_heads,
                     s.attention)
    vocab = padded_vocab(s)
    head_rows = s.tokens if s.phase != "prefill" else m.batch  # prefill: last tokens only
    if s.sp and head_rows % t:
        head_rows = -(-head_rows // t) * t
    head = [Gemm("LM head fwd", "ag+gemm" if s.sp else None, head_rows, vocab, m.hidden),
            Kernel("cross-entropy fwd", 2 * head_rows * vocab * e)]
    if s.phase == "training":
        head += [Kernel("cross-entropy bwd", 2 * head_rows * vocab * e),
                 Gemm("LM head dgrad", "gemm+rs" if s.sp else "gemm+ar", head_rows,
                      m.hidden, vocab),
                 Gemm("LM head wgrad", None, m.hidden, vocab, head_rows)]
    return fwd, bwd, head


def stage_parameters(s: Setting) -> list[float]:
    """Parameters of each pipeline stage on one GPU of its TP group: its layers' GEMM
    weights (a mixture of experts: the GPU's E / ep experts whole and the router), the
    first stage's embedding and the last's LM head (vocabulary slices; norms are
    negligible)."""
    m, t = s.model, s.tp
    q, kv = attention_widths(m, t)  # the GPU's shards, as ``layers.layer``
    up = (2 if m.ffn == "swiglu" else 1) * m.ffn_hidden // t
    ffn = m.hidden * up + m.ffn_hidden // t * m.hidden
    if m.moe is not None:
        f, up_e = expert_width(m)
        ffn = m.moe.experts // s.ep * (m.hidden * up_e + f * m.hidden) + m.hidden * m.moe.experts
    per_layer = m.hidden * (q + 2 * kv) + q * m.hidden + ffn
    vocab = padded_vocab(s) * m.hidden
    out = [m.layers // s.pp * per_layer for _ in range(s.pp)]
    out[0] += vocab
    out[-1] += vocab
    return out


def padded_vocab(s: Setting) -> int:
    """This GPU's slice of the vocabulary, padded to a multiple of 128 x TP (Megatron-LM)."""
    return -(-s.model.vocab // (VOCAB_PAD * s.tp)) * VOCAB_PAD


def p2p_time(s: Setting, spec) -> float:
    """One micro-batch's activations (or their gradients) from a GPU of stage i to its
    counterpart in stage i + 1: rows x H x e bytes (with SP the GPU's T/t rows; without,
    the same 1/t share: Megatron-LM's scatter-gather optimisation, whose all-gather on the
    next stage is left out), on the system's route between them at the library's share
    of its peak (NCCL's send/receive), the route's ports split among the GPUs of the node
    that send at once (``Topology``, direct pattern)."""
    (latency, rate), = _links(s, spec, [(0, s.tp * s.dp)])
    return latency + s.tokens // s.tp * s.model.hidden * s.e / rate


def _links(s: Setting, spec, pairs: list[tuple[int, int]],
           pattern: str = "direct") -> list[tuple[float, float]]:
    """(latency, bytes per second) of the library's transfer from GPU a to GPU b, for each
    pair: the system's route between them, at the library's share of its peak, its ports
    split as ``pattern`` loads them."""
    from emulator.model.topology import Topology

    topo = Topology.of(spec, s.tp * s.pp * s.dp, pattern)
    ic = spec.interconnect
    out = []
    for a, b in pairs:
        route = topo.route(a, b)
        frac = spec.executors.fraction("library", ic.library_fraction,
                                       topo.crosses_network(a, b), ic.library_fraction_network)
        out.append((route.latency, route.rate * frac))
    return out


def dp_allreduce(s: Setting, spec, params: float, bucket: float | None = None,
                 pattern: str = "direct") -> tuple[float, float]:
    """(the whole gradient all-reduce of ``params`` on one GPU over its ``dp`` replicas, its
    last bucket's): a ring of 2 (d - 1) steps of 1/d of the bytes each, a step as long as
    the ring's slowest hop (``_links`` from GPU 0's counterpart in replica i to the
    one in replica i + 1, the last back to the first; the ports split as ``pattern``
    loads them: ``direct``, the TP group's GPUs each running its own ring at once;
    ``ring``, one ring over consecutive GPUs), in buckets of ``bucket`` parameters
    (default ``max(40M, 1M x dp)``: Megatron-LM's DistributedDataParallel with
    overlap_grad_reduce)."""
    d = s.dp
    if d == 1:
        return 0.0, 0.0
    bucket = bucket or max(DDP_BUCKET, DDP_BUCKET_PER_RANK * d)
    hops = _links(s, spec, [(i * s.tp, (i + 1) % d * s.tp) for i in range(d)], pattern)

    def ring(nparams: float) -> float:
        return 2 * (d - 1) * max(lat + nparams * s.e / d / rate for lat, rate in hops)

    buckets = -(-int(params) // int(bucket))
    last = params - (buckets - 1) * bucket
    return (buckets - 1) * ring(bucket) + ring(last), ring(last)


def kernel_time(k: Kernel, spec, dtype: str) -> float:
    """A kernel that is not a GEMM: its launch, then the longer of its matrix FLOPs at
    ``ATTENTION_EFFICIENCY`` of the peak and its bytes at the HBM's peak."""
    compute = k.flops / (spec.peak_flops(dtype) * ATTENTION_EFFICIENCY) if k.flops else 0.0
    return spec.launch_s + max(compute, k.bytes / spec.hbm_bw)


def key(it: Gemm) -> tuple:
    """What decides an item's emulated time: (operation or None, m, n, k, --param pairs)."""
    return it.op, it.m, it.n, it.k, it.params


def runs(s: Setting, all_items: list[Item]) -> list[tuple[tuple, Job]]:
    """The distinct jobs ``all_items`` need: (``key`` of the item, the ``Job`` that times
    it)."""
    from emulator.app.catalog import registry

    reg = registry()
    base = reg.baseline()
    out = []
    for op, m, n, k, params in dict.fromkeys(key(it) for it in all_items
                                             if isinstance(it, Gemm)):
        if op is None:
            ranks, group = s.alone_job
            out.append(((None, m, n, k, params),
                        Job(ALONE, *alone_shape(m, n, k, ranks), (base,), (), ranks, group)))
        else:
            modes = tuple(dict.fromkeys([base, *(reg.design_configuration(d, op)
                                                 for d in s.designs)]))
            out.append(((op, m, n, k, params),
                        Job(op, m, n, k, modes, params, s.op_ranks, s.group)))
    return out


def precheck(s: Setting) -> None:
    """Check every job of the estimate as ``t3emu run`` would before launching it; raises
    ValueError naming the item whose job the emulator refuses (a configuration a design
    names that cannot run there, a shape an operation cannot take), before any runs."""
    from emulator import api
    from emulator.app.config import ConfigError

    fwd, bwd, head = items(s)
    run = Runner(s, None, lambda msg: None)
    for (op, m, n, k, _), job in runs(s, fwd + bwd + head):
        try:
            api.config(**run.options(job))
        except ConfigError as exc:
            what = f"{op} M={m} N={n} K={k}" if op else f"a GEMM alone M={m} N={n} K={k}"
            raise ValueError(f"the model's {what}: {exc}") from None


def measure(s: Setting, all_items: list[Item], run: Runner) -> Measured:
    """Run every distinct operation and GEMM alone of ``all_items`` once."""
    from emulator.app.catalog import registry

    from emulator.app.pool import pooled

    base = registry().baseline()
    out = Measured()
    jobs = runs(s, all_items)
    docs = {}
    with pooled():  # by job size: each size's pooled job starts once
        for i, (k, job) in sorted(enumerate(jobs, 1), key=lambda ij: ij[1][1].ranks):
            run.progress(f"[{i}/{len(jobs)}] {k[0] or 'GEMM alone'} M={k[1]} N={k[2]} "
                         f"K={k[3]}")
            docs[k] = run(job)
    for k, job in jobs:
        doc = docs[k]
        seq = doc["runs"][base]
        out.alone[k] = _alone(seq, doc["launch_s"])
        if k[0] is None:
            continue
        out.ops[k] = {c: r["time"] for c, r in doc["runs"].items()}
        out.comm[k] = sum(v for p, v in seq["phases"].items() if p in COLLECTIVE_PHASES)
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
    """One item's modelled seconds in ``design`` (all its repeats)."""
    from emulator.app.catalog import registry
    from emulator.workload.dlrm import Exchange

    if isinstance(it, Exchange):  # the baseline's collective of an operation, on its own
        return it.repeat * (spec.launch_s + meas.comm[key(it.of)])
    if isinstance(it, Kernel):
        return it.repeat * kernel_time(it, spec, dtype)
    if it.op is None:
        return it.repeat * meas.alone[key(it)]
    return it.repeat * meas.ops[key(it)][registry().design_configuration(design, it.op)]


def compose(s: Setting, meas: Measured, spec) -> dict:
    """Per design: each item's time and exposed communication, the layer's forward and
    backward, the pipeline's iteration (``iteration``), its speedup over the baseline;
    the baseline's communication share."""
    from emulator.app.catalog import registry

    from emulator.workload.dlrm import Exchange

    base = registry().baseline()
    fwd, bwd, head = items(s)
    p2p = p2p_time(s, spec) if s.pp > 1 else 0.0
    params = [] if s.dlrm else stage_parameters(s)
    out = {"designs": {}, "baseline": base, "p2p_s": p2p}
    for design in (base, *s.designs):
        rows = []
        for part, its in (("forward", fwd), ("backward", bwd), ("head", head)):
            for it in its:
                t = item_time(it, design, meas, spec, s.dtype)
                gemm = isinstance(it, Gemm)
                exposed = comm = 0.0  # comm: the baseline's collective phases (its share)
                if gemm and it.op is not None:
                    exposed = t - it.repeat * meas.alone[key(it)]
                    comm = it.repeat * meas.comm[key(it)]
                elif isinstance(it, Exchange):
                    exposed = t
                    comm = it.repeat * meas.comm[key(it.of)]
                rows.append({"part": part, "item": it.name,
                             "op": ((it.op or "GEMM") if gemm else "collective"
                                    if isinstance(it, Exchange) else "kernel"),
                             "shape": [it.m, it.n, it.k] if gemm else None,
                             "repeat": it.repeat, "time_s": t, "exposed_comm_s": exposed,
                             "baseline_comm_s": comm})
        f = sum(r["time_s"] for r in rows if r["part"] == "forward")
        b = sum(r["time_s"] for r in rows if r["part"] == "backward")
        head_f = sum(r["time_s"] for r in rows if r["part"] == "head" and "fwd" in r["item"])
        head_b = sum(r["time_s"] for r in rows if r["part"] == "head" and "fwd" not in
                     r["item"])
        d = {"items": rows, "layer_forward_s": f, "layer_backward_s": b}
        d.update(dlrm_iteration(s, f, b, spec) if s.dlrm else
                 iteration(s, f, b, head_f, head_b, p2p, params, spec))
        layer_exposed = sum(r["exposed_comm_s"] for r in rows if r["part"] != "head")
        head_exposed = sum(r["exposed_comm_s"] for r in rows if r["part"] == "head")
        d["exposed_comm_s"] = s.microbatches * (layers_per_stage(s) * layer_exposed
                                                + head_exposed)
        out["designs"][design] = d
    b = out["designs"][base]
    for d in out["designs"].values():
        d["speedup"] = b["iteration_s"] / d["iteration_s"]
        d["layer_speedup"] = ((b["layer_forward_s"] + b["layer_backward_s"])
                              / (d["layer_forward_s"] + d["layer_backward_s"]))

    def collectives(its: list[Item]) -> float:  # the baseline's collective phases
        return sum(it.repeat * meas.comm[key(it.of if isinstance(it, Exchange) else it)]
                   for it in its if isinstance(it, Exchange)
                   or isinstance(it, Gemm) and it.op)

    comm = layers_per_stage(s) * collectives(fwd + bwd) + collectives(head)
    out["comm_share"] = s.microbatches * comm / b["iteration_s"]
    return out


def layers_per_stage(s: Setting) -> int:
    """How many times a stage runs the layer's items (a DLRM's passes: once)."""
    return 1 if s.dlrm else s.model.layers // s.pp


def dlrm_iteration(s: Setting, f: float, b: float, spec) -> dict:
    """A DLRM's iteration (``dlrm.py``): its forward and backward passes, the exposed part
    of the MLPs' gradient all-reduce over every GPU (in PyTorch DDP's buckets; every bucket
    but the last hidden behind the backward pass), then SGD over the MLPs."""
    from emulator.workload.dlrm import DDP_BUCKET_BYTES, SGD_ELEMENTS, mlp_parameters

    params = mlp_parameters(s.model, s.dp)
    total, last = dp_allreduce(s, spec, params, DDP_BUCKET_BYTES / s.e, "ring")
    exposed = max(last, total - b) if s.dp > 1 else 0.0
    opt = spec.launch_s + SGD_ELEMENTS * s.e * params / spec.hbm_bw
    return {"stage_forward_s": [f], "stage_backward_s": [b], "pipeline_s": f + b,
            "dp_allreduce_s": total, "dp_exposed_s": exposed, "optimizer_s": opt,
            "iteration_s": f + b + exposed + opt}


def iteration(s: Setting, f: float, b: float, head_f: float, head_b: float, p2p: float,
              params: list[float], spec) -> dict:
    """The iteration from one micro-batch's layer times (1F1B, Narayanan et al. 2021).
    Stage i runs ``layers / pp`` layers (the last also the LM head and loss): F_i forward,
    B_i backward per micro-batch. With m micro-batches the pipeline runs m - 1 of them at
    the slowest stage's pace (F_i + B_i + 2 p2p: an activation in, a gradient out) and one
    through every stage (sum of F_i + B_i and 2 (pp - 1) p2p); prefill and decode have no
    backward (one p2p per boundary). Training then waits for the data-parallel gradient
    all-reduce beyond what the last micro-batch's backward hides (every bucket but the
    last overlaps it; each stage's, the slowest counted) and runs the optimizer step
    (mixed-precision Adam, ``ADAM_BYTES`` per parameter of the largest stage at the HBM's
    peak, one launch)."""
    L, m, pp = s.model.layers // s.pp, s.microbatches, s.pp
    train = s.phase == "training"
    F = [L * f] * pp
    B = [L * b] * pp if train else [0.0] * pp
    F[-1] += head_f
    B[-1] += head_b
    links = 2 if train else 1
    per = [x + y + links * p2p * (pp > 1) for x, y in zip(F, B)]
    pipeline = (m - 1) * max(per) + sum(F) + sum(B) + links * (pp - 1) * p2p
    out = {"stage_forward_s": F, "stage_backward_s": B, "pipeline_s": pipeline,
           "dp_allreduce_s": 0.0, "dp_exposed_s": 0.0, "optimizer_s": 0.0}
    if train:
        exposed = 0.0
        for i, n in enumerate(params):
            total, last = dp_allreduce(s, spec, n)
            exposed = max(exposed, max(last, total - B[i]))
            out["dp_allreduce_s"] = max(out["dp_allreduce_s"], total)
        out["dp_exposed_s"] = exposed
        out["optimizer_s"] = spec.launch_s + ADAM_BYTES * max(params) / spec.hbm_bw
    out["iteration_s"] = pipeline + out["dp_exposed_s"] + out["optimizer_s"]
    return out


def estimate(s: Setting, cache: Path | None = None, progress=None,
             watchdog_s: float = 60.0) -> dict:
    """Measure (or read from the cache) and compose; the result document."""
    from devices.spec import load_device
    from devices.system import load_system

    spec = (load_device(s.device, s.parsed_overrides) if s.device
            else load_system(s.system, s.parsed_overrides))
    fwd, bwd, head = items(s)
    run = Runner(s, cache, progress, watchdog_s)
    meas = measure(s, fwd + bwd + head, run)
    doc = compose(s, meas, spec)
    doc["setting"] = {"model": s.model.name, "system": s.where, "phase": s.phase,
                      "tp": s.tp, "pp": s.pp, "dp": s.dp, "microbatches": s.microbatches,
                      "sp": s.sp, "ep": s.ep, "split_heads": s.split_heads,
                      "attention": s.attention,
                      "designs": list(s.designs), "dtype": s.dtype,
                      "tokens": s.tokens, "seq": getattr(s.model, "seq", None),
                      "batch": s.model.batch, "layers": getattr(s.model, "layers", 1),
                      "kind": s.model.kind, "set": list(s.overrides),
                      "tp_group_set": list(s.group), "alone_set": list(s.alone_job[1])}
    from emulator.app import provenance

    # what made it: the version, commit, code hash, the model, system and GPU files
    doc["provenance"] = provenance.record([
        ("model", getattr(s.model, "source", None)),
        ("system", provenance.preset_file(s.system, "system") if s.system else None),
        ("device", provenance.spec_path(getattr(spec, "source", "")))])
    if isinstance(doc["setting"]["system"], str):
        doc["setting"]["system"] = provenance.shown(doc["setting"]["system"])
    return doc
