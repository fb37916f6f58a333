"""The registry entries of this package: the operations, T3's five configurations, Flux's
and the TransformerEngine-style baseline Flux compares against.

Importing this module fills ``REGISTRY`` (``emulator.engine.registry``). A new
configuration is one file in ``collectives/`` and one ``add_configuration`` call
here (or, outside the repository, in a file given to ``--configs``).
"""

from __future__ import annotations

from collectives import (baselines, c3, embedding, ficco, flux, fused_ops, operations, persistent,
                         t3, transformer_engine)
from collectives.common import EXPERT_SKEW
from emulator.engine.registry import REGISTRY, Configuration, Design, Operation


def _mpi_collective(name: str):
    """MPI's own collective for the reference (imported when a check runs, not before)."""
    def collective(comm, x, chunks):
        from collectives import reference

        return getattr(reference, name)(comm, x, chunks)
    collective.__name__ = name
    return collective


BOTH = ("ring", "direct")


def _nccl_names(name: str, binary: str) -> tuple[str, ...]:
    """The names nccl-tests users type for a collective: ours (``all-gather``), nccl-tests'
    (``all_gather``) and its binary's (``all_gather_perf``); ``t3emu run`` and ``t3emu
    nccl-tests`` take each."""
    return name, binary, f"{binary}_perf"


def _moved(n: int) -> float:
    return (n - 1) / n


def _ar(n: int) -> float:
    return 2 * (n - 1) / n


# nccl-tests' bus-bandwidth factors (its PERFORMANCE.md) of the phases a configuration
# names after a collective: busbw = algbw x factor(n)
BUS = {"rs": _moved, "ag": _moved, "a2a": _moved}
AR = {**BUS, "ar": _ar}

REGISTRY.add_operation(Operation(
    "gemm+rs", "reduce-scatter of the GEMM's partial output", "T3 sec. 1",
    BOTH, operations.REDUCE_SCATTER, _mpi_collective("reduce_scatter"),
    lambda m, n, k, rows, e: (m - rows) * e * n,
    aliases=("rs", *_nccl_names("reduce-scatter", "reduce_scatter")), reducing=True,
    bus_factors=BUS))
REGISTRY.add_operation(Operation(
    "gemm+ag", "all-gather of each rank's GEMM output rows", "T3 sec. 1",
    BOTH, operations.ALL_GATHER, _mpi_collective("all_gather"),
    lambda m, n, k, rows, e: (m - rows) * e * n,
    aliases=("ag", *_nccl_names("all-gather", "all_gather")), a_rows="own",
    compute_rows="own", bus_factors=BUS))
REGISTRY.add_operation(Operation(
    "gemm+ar", "all-reduce = RS + AG (T3's tensor-parallel case)", "T3 sec. 1",
    BOTH, operations.ALL_REDUCE, _mpi_collective("all_reduce"),
    lambda m, n, k, rows, e: 2 * (m - rows) * e * n,
    aliases=("ar", *_nccl_names("all-reduce", "all_reduce")), reducing=True,
    bus_factors=AR, spans={"ar": ("rs", "ag")}, passes=2))
REGISTRY.add_operation(Operation(
    "gemm+a2a", "all-to-all of the GEMM's output row chunks", "T3 sec. 1",
    ("direct",), operations.ALL_TO_ALL, _mpi_collective("all_to_all"),
    lambda m, n, k, rows, e: (m - rows) * e * n,
    aliases=("a2a", *_nccl_names("all-to-all", "alltoall")), bus_factors=BUS, exchange=True,
    params={"expert_skew": EXPERT_SKEW}))
REGISTRY.add_operation(Operation(
    "ag+gemm", "all-gather of the input rows feeding a GEMM (consumer-side fusion)",
    "T3 sec. 1", BOTH, operations.AG_GEMM, _mpi_collective("all_gather"),
    lambda m, n, k, rows, e: (m - rows) * e * k, aliases=("ag-gemm",), a_rows="own",
    collective_bytes=lambda m, n, k, e: m * k * e, bus_factors=BUS, k_blocks=True))

REGISTRY.add_operation(Operation(
    "gemv+ar", "all-reduce of a decode GEMV's partial output (row-parallel layer)",
    "fused ops sec. 3", ("direct",), operations.GEMV_ALL_REDUCE,
    _mpi_collective("all_reduce"), lambda m, n, k, rows, e: 2 * (m - rows) * e * n,
    aliases=("gemv-ar",), reducing=True, split_k=False, bus_factors=AR, spans={"ar": ("rs", "ag")},
    passes=2, producer="gemv", shape=(4096, 1, 4096),  # not a parameter: default size, Llama-2-7B's attention projection, TP 4
    dims="M = output rows, N = right-hand sides (decode tokens), K = this GPU's input slice"))
REGISTRY.add_operation(Operation(
    "emb+a2a", "embedding-bag pooling of this GPU's tables, all-to-all of the pooled rows "
    "to the samples' GPUs (DLRM)", "fused ops sec. 3", ("direct",),
    operations.EMBEDDING_ALL_TO_ALL, _mpi_collective("all_to_all"),
    lambda m, n, k, rows, e: (m - rows) * e * n, aliases=("embedding+a2a",),
    params={"tables": embedding.TABLES, "rows": embedding.ROWS,
            "fixed_lookups": embedding.FIXED}, inputs=embedding.inputs,
    check_reference=embedding.reference, bounds=embedding.bounds, split_k=False, exchange=True,
    host_memory=embedding.host_memory, producer="embedding",
    shape=(1024, 256, 10),  # not a parameter: default size; the fused operators' DLRM: batch 1024, D = 256, and DLRM's data
    # generator's default of up to 10 indices per lookup
    dims="M = global batch, N = embedding dimension D, K = pooling factor L"))
REGISTRY.add_operation(Operation(
    "a2a+gemm", "all-to-all dispatch of tokens to the experts' GPUs feeding each expert's "
    "GEMM (EP; FiCCO sec. 4)", "FiCCO sec. 4", ("direct",), operations.A2A_GEMM,
    _mpi_collective("all_to_all"), lambda m, n, k, rows, e: (m - rows) * e * k,
    aliases=("a2a-gemm",), collective_bytes=lambda m, n, k, e: m * k * e, bus_factors=BUS,
    exchange=True, inputs=ficco.dispatch_inputs, check_reference=ficco.dispatch_reference,
    params={"expert_skew": EXPERT_SKEW},
    dims="M = rows every GPU's expert receives (tokens), N = the expert's columns, K = "
    "hidden size; rank r sends its chunk's rows to every GPU"))


def _t3_op(op) -> bool:
    return op.design == "T3 sec. 1"


REGISTRY.add_configuration(Configuration(
    "sequential", "the compute kernel(s), then the collective as a CU-driven library kernel "
    "(baseline)", "T3 baseline", baselines.sequential, baseline=True, color="#7f7f7f",
    short="S", tile_bytes=1024))  # not a parameter: host memory
REGISTRY.add_configuration(Configuration(
    "t3", "GEMM fused with the collective by track & trigger, NMC updates, round-robin HBM "
    "arbitration", "T3", t3.t3, applies=_t3_op, color="#1f77b4", short="T"))
REGISTRY.add_configuration(Configuration(
    "t3-mca", "t3 with memory-controller arbitration", "T3", t3.t3_mca, applies=_t3_op,
    color="#2ca02c", short="M"))
REGISTRY.add_configuration(Configuration(
    "ideal-overlap", "max(GEMM alone, collective alone) (+ AG alone), isolated runs",
    "T3 bound", baselines.ideal_overlap, color="#ff7f0e", tile_bytes=1024))  # not a parameter: host memory
REGISTRY.add_configuration(Configuration(
    "ideal-rs-nmc", "ideal-overlap with a near-memory RS (reductions only)", "T3 bound",
    baselines.ideal_rs_nmc, applies=lambda op: op.reducing and _t3_op(op), color="#d62728"))


def _gemm_rs(op) -> bool:
    return op.parts is operations.REDUCE_SCATTER


def _ag_gemm(op) -> bool:
    return op.parts is operations.AG_GEMM


DIRECT, RING = ("direct",), ("ring",)
# Flux's knob space (flux.py): (name, builder, operation test, algorithms, help, colour)
FLUX = (
    ("flux-rs-w", flux.rs_write, _gemm_rs, DIRECT, "Flux GEMM-RS, RS-W: tiles stored into the "
     "owners' slot buffers, then each owner's reduction kernel (swizzled tile order)",
     "#17becf"),
    ("flux-rs-a", flux.rs_atomic, _gemm_rs, DIRECT, "Flux GEMM-RS, RS-A: tiles reduced into "
     "the owners' chunks by atomic updates (swizzled); on several nodes Flux's two-node form "
     "(atomics within the node, a NIC put to the owner, a final reduction)", "#bcbd22"),
    ("flux-rs-w-noswizzle", flux.rs_write_unswizzled, _gemm_rs, DIRECT, "flux-rs-w without the "
     "tile swizzle: every rank writes the same owner at once", "#9edae5"),
    ("flux-rs-a-noswizzle", flux.rs_atomic_unswizzled, _gemm_rs, DIRECT, "flux-rs-a without "
     "the tile swizzle", "#dbdb8d"),
    ("flux-rs-pull", flux.rs_pull, _gemm_rs, DIRECT, "Flux GEMM-RS, Hopper variant (sm90): "
     "tiles stored locally with flags, the peers' tiles fetched and reduced by warps of the "
     "persistent kernel; on several nodes the node sums put by NIC, then a reduction",
     "#7f7f7f"),
    ("flux-rs-ring", flux.rs_ring, _gemm_rs, RING, "Flux GEMM-RS on PCIe: the GEMM writes "
     "locally with per-tile flags beside a ring RS kernel on 6 CUs that forwards and reduces "
     "tile by tile (1D ring)", "#17becf"),
    ("flux-rs-ring2d", flux.rs_ring2d, _gemm_rs, RING, "flux-rs-ring as a 2D ring over the "
     "two sockets: the other socket's chunks reduced first, each sum crossing once", "#bcbd22"),
    ("flux-ag", flux.ag_gemm, _ag_gemm, DIRECT, "Flux AG-GEMM: input tiles of m/N rows pushed "
     "by DMA, each with its signal; the GEMM's WGs wait for the tiles covering their rows; on "
     "several nodes Flux's two-node form", "#17becf"),
    ("flux-ag-tile2", flux.ag_gemm_tile2, _ag_gemm, DIRECT, "flux-ag with communication tiles "
     "of m/2N rows", "#9edae5"),
    ("flux-ag-tile4", flux.ag_gemm_tile4, _ag_gemm, DIRECT, "flux-ag with communication tiles "
     "of m/4N rows", "#bcbd22"),
    ("flux-ag-tile8", flux.ag_gemm_tile8, _ag_gemm, DIRECT, "flux-ag with communication tiles "
     "of m/8N rows", "#8c564b"),
    ("flux-ag-pull", flux.ag_gemm_pull, _ag_gemm, DIRECT, "flux-ag with the peers' tiles "
     "pulled by this rank's DMA engine instead of pushed by theirs", "#1f77b4"),
    ("flux-ag-pull-tile2", flux.ag_gemm_pull_tile2, _ag_gemm, DIRECT, "flux-ag-pull with "
     "communication tiles of m/2N rows", "#aec7e8"),
    ("flux-ag-pull-tile4", flux.ag_gemm_pull_tile4, _ag_gemm, DIRECT, "flux-ag-pull with "
     "communication tiles of m/4N rows", "#c5b0d5"),
    ("flux-ag-pull-tile8", flux.ag_gemm_pull_tile8, _ag_gemm, DIRECT, "flux-ag-pull with "
     "communication tiles of m/8N rows", "#c49c94"),
    ("flux-ag-noswizzle", flux.ag_gemm_unswizzled, _ag_gemm, DIRECT, "flux-ag with every "
     "rank's WGs walking the chunks from 0 (no swizzle)", "#dbdb8d"),
    ("flux-ag-ring", flux.ag_ring, _ag_gemm, RING, "Flux AG-GEMM on PCIe: whole chunks pushed "
     "along the ring by DMA and forwarded (1D ring)", "#17becf"),
    ("flux-ag-ring2d", flux.ag_ring2d, _ag_gemm, RING, "flux-ag-ring with the inter-socket "
     "transfers first, then a ring within each socket", "#bcbd22"),
)
for _name, _build, _op, _algos, _help, _color in FLUX:
    REGISTRY.add_configuration(Configuration(
        _name, _help, "Flux", _build, applies=_op, algorithms=_algos, color=_color,
        atomics=_name.startswith("flux-rs-a"),
        wide_atomics=flux.wide_reduction if _name.startswith("flux-rs-a") else None,
        refuses=flux.hopper_refusal if _name == "flux-rs-pull" else None))


def _flux_default(p, op, algorithm):
    """flux-best's default candidate (its plan when built directly)."""
    if algorithm == "ring":
        return (flux.rs_ring if _gemm_rs(op) else flux.ag_ring)(p, op, algorithm)
    return (flux.rs_write if _gemm_rs(op) else flux.ag_gemm)(p, op, algorithm)


REGISTRY.add_configuration(Configuration(
    "flux-best", "Flux tuned as Flux does: every Flux configuration of the operation and "
    "algorithm run in timing-only mode, the fastest kept (RS-W vs RS-A, ring 1D vs 2D, push "
    "vs pull, communication tile, swizzle)", "Flux", _flux_default,
    applies=lambda op: _gemm_rs(op) or _ag_gemm(op), search=True, color="#e377c2"))
TE = "TransformerEngine"
REGISTRY.add_configuration(Configuration(
    "te-ring", "TransformerEngine's ring exchange (AG + GEMM): N chunk GEMMs, each chunk sent "
    "on by the copy engine while it is computed", TE, transformer_engine.te_ring_ag,
    applies=_ag_gemm, refuses=transformer_engine.refusal, color="#8c564b"))
REGISTRY.add_configuration(Configuration(
    "te-ring-aggregate", "TransformerEngine's aggregate ring exchange (AG + GEMM): pairs swap "
    "their chunks, then N/2 GEMMs over two-chunk blocks on stride-2 rings", TE,
    transformer_engine.te_ring_aggregate_ag, applies=_ag_gemm,
    refuses=transformer_engine.aggregate_refusal, color="#8c564b"))
REGISTRY.add_configuration(Configuration(
    "te-pipeline", "TransformerEngine's pipelined split GEMM + RS: 4 column splits, each "
    "split's reduce-scatter on 16 SMs beside the next split's GEMM", TE,
    transformer_engine.te_pipeline_rs, applies=_gemm_rs, refuses=transformer_engine.refusal,
    color="#8c564b"))
REGISTRY.add_configuration(Configuration(
    "te-p2p", "TransformerEngine's ring-exchange GEMM + RS: N chunk GEMMs, each partial sent "
    "to its owner by the copy engine beside the next, summed at the end", TE,
    transformer_engine.te_p2p_rs, applies=_gemm_rs, refuses=transformer_engine.refusal,
    color="#8c564b"))
REGISTRY.add_configuration(Configuration(
    "te-best", "TransformerEngine tuned (Flux's baseline, 'the best of all TransformerEngine "
    "configurations'): every TE configuration of the operation run in timing-only mode, the "
    "fastest kept", TE, lambda p, op, algorithm: (
        transformer_engine.te_ring_ag if _ag_gemm(op) else
        transformer_engine.te_pipeline_rs)(p, op, algorithm),
    applies=lambda op: _ag_gemm(op) or _gemm_rs(op), refuses=transformer_engine.refusal,
    baseline=True, search=True, color="#8c564b"))


def _is(name: str):
    return lambda op: op.name == name


OCC = {"occupancy": persistent.OCCUPANCY}
REGISTRY.add_configuration(Configuration(
    "fused", "the fused computation-collective operator: one persistent kernel whose WGs "
    "send their own results (embedding: communication-aware order, remote slices first; "
    "GEMV: two-phase direct all-reduce; GEMM: tiles stored to the tokens' GPUs)",
    "Fused ops", lambda p, op, algorithm: _FUSED[op.name](p),
    applies=lambda op: op.name in _FUSED, color="#9467bd", short="F",
    refuses_op=lambda spec, ranks, op: "" if op == "emb+a2a" else  # puts through the NIC
    fused_ops.across_nodes_refusal(spec, ranks, op), params={**OCC, "slice": embedding.SLICE}))
REGISTRY.add_configuration(Configuration(
    "fused-oblivious", "fused embedding + all-to-all with the communication-oblivious task "
    "order (bags in index order: sample by sample)", "Fused ops",
    lambda p, op, algorithm: embedding.fused(p, aware=False), applies=_is("emb+a2a"),
    color="#c5b0d5", params={**OCC, "slice": embedding.SLICE}))

_FUSED = {"emb+a2a": lambda p: embedding.fused(p, aware=True), "gemv+ar": fused_ops.gemv_ar,
          "gemm+a2a": fused_ops.gemm_a2a}


def _ficco_op(op) -> bool:
    return op.name in ("ag+gemm", "a2a+gemm")


FICCO_PARAMS = {"cu_share": ficco.CU_SHARE, "cu_dispatch": ficco.CU_DISPATCH, "copy2d": ficco.COPY2D,
                "tile_level": ficco.TILE_LEVEL}
# FiCCO's plans hold a few arrays per output tile (their WGs and tiles are computed when a
# stage asks): measured at M = 327680, N = 28672, K = 4096 on 8 ranks, 40 to 100 B per tile
# per rank above the process's own 80 MB (the gather area included)
LEAN = {"tile_bytes": 128, "tiles": 1.0}  # not a parameter: host memory
AUTO = {"otb_low": ficco.OTB_LOW, "otb_high": ficco.OTB_HIGH}
FICCO = (
    ("ficco-uniform-fused-1d", "FiCCO uniform-fused-1D: per step the W pieces gathered into "
     "one block, one GEMM (M/W, N, K), its rows scattered into C", "#1f77b4"),
    ("ficco-hetero-fused-1d", "FiCCO hetero-fused-1D: the local shard's GEMM first, then per "
     "step one GEMM over the W-1 gathered pieces, scattered", "#2ca02c"),
    ("ficco-hetero-unfused-1d", "FiCCO hetero-unfused-1D: the local shard's GEMM first, then "
     "one GEMM (M/W^2, N, K) per piece as it lands, straight into C", "#d62728"),
    ("ficco-uniform-fused-2d", "FiCCO uniform-fused-2D: per step column block j of every "
     "shard gathered (M x K/W), C += G_j B_j (accumulating GEMMs, no scatter)", "#9467bd"),
)
LIGHT = {"#1f77b4": "#aec7e8", "#2ca02c": "#98df8a", "#d62728": "#ff9896", "#9467bd": "#c5b0d5"}


def _schedule(sched: str, executor: str):
    return lambda p, op, algorithm: ficco.schedule(p, op, sched, executor=executor)


for _name, _help, _color in FICCO:
    _sched = _name[len("ficco-"):]
    for _prefix, _how, _executor, _col in (
            ("ficco-", "by DMA engines, every link at once", "dma", _color),
            ("ficco-cu-", "CU-driven (library, RCCL-style) on a share of the CUs instead of "
             "DMA engines", "cu", LIGHT[_color])):
        REGISTRY.add_configuration(Configuration(
            _prefix + _sched, f"{_help}; transfers {_how}", "FiCCO", _schedule(_sched, _executor),
            applies=_ficco_op, algorithms=DIRECT, color=_col, params=FICCO_PARAMS,
            over="ficco-serial", **LEAN))
REGISTRY.add_configuration(Configuration(
    "ficco-auto", "FiCCO with the schedule its static heuristic picks (M <= K: 2D; else by "
    "the GEMM's op-to-byte ratio against the machine balance)", "FiCCO",
    lambda p, op, algorithm: ficco.auto(p, op), applies=_ficco_op, algorithms=DIRECT,
    picks=lambda p, op, algorithm: ficco.picks(p), color="#e377c2",
    params={**FICCO_PARAMS, **AUTO}, over="ficco-serial", **LEAN))
REGISTRY.add_configuration(Configuration(
    "ficco-cu", "ficco-auto's schedule with CU-driven (library, RCCL-style) transfers on a "
    "share of the CUs instead of DMA engines", "FiCCO", lambda p, op, algorithm:
    ficco.auto_cu(p, op), applies=_ficco_op, algorithms=DIRECT, color="#bcbd22",
    picks=lambda p, op, algorithm: ficco.picks(p, "cu"),
    params={**FICCO_PARAMS, **AUTO}, over="ficco-serial", **LEAN))
MEASURES = (  # the runs the report computes FiCCO's losses from (isolated clocks; their
    # time is not a schedule's)
    ("ficco-dil", ficco.dil, "the runs FiCCO's decomposition loss (DIL) is computed from: "
     "the GEMM whole and split 8 and 64 ways by rows and by K, the collective whole and in "
     "pieces, each alone", "#c7c7c7"),
    ("ficco-cil", ficco.cil, "the runs FiCCO's contention loss (CIL) is computed from: the "
     "GEMM by rows and the collective in pieces alone, and together with DMA and with CU "
     "transfers", "#dbdbdb"),
)
for _name, _build, _help, _color in MEASURES:
    REGISTRY.add_configuration(Configuration(
        _name, _help + " (isolated clocks; its time is not a schedule's)", "FiCCO measure",
        (lambda build: lambda p, op, algorithm: build(p, op))(_build), applies=_ficco_op,
        algorithms=DIRECT, color=_color, params=FICCO_PARAMS, tile_bytes=128, compared=False,  # not a parameter: host memory
        balanced=True))  # the losses of one GEMM shape, the same on every rank
REGISTRY.add_configuration(Configuration(
    "c3", "concurrent computation and communication (the C3 study's runs, an anchor of the "
    "contention model): the GEMM alone, the collective alone by the library's CU kernel and "
    "by DMA, and the GEMM with the CU collective dispatched plain, prioritised and "
    "partitioned and with the DMA collective (isolated clocks; its time is not a "
    "schedule's)", "C3 measure", lambda p, op, algorithm: c3.plan(p, op),
    applies=_ficco_op, algorithms=DIRECT, color="#9edae5", params=FICCO_PARAMS,
    tile_bytes=128, compared=False,  # not a parameter: host memory
    balanced=True))
REGISTRY.add_configuration(Configuration(
    "ficco-serial", "FiCCO's serial baseline: the library collective (CU kernel), then one "
    "GEMM; as sequential, the received data landing as one stream", "FiCCO baseline",
    lambda p, op, algorithm: ficco.serial(p, op), applies=_ficco_op, algorithms=DIRECT,
    color="#7f7f7f", over="ficco-serial", **LEAN))
REGISTRY.add_configuration(Configuration(
    "ficco-shard", "shard-based overlap (PyTorch async TP): whole shards from one peer per "
    "step by a copy engine while the previous shard's GEMM runs", "FiCCO baseline",
    lambda p, op, algorithm: ficco.shard(p, op), applies=_ficco_op, algorithms=DIRECT,
    color="#8c564b", params=FICCO_PARAMS, over="ficco-serial", **LEAN))
REGISTRY.add_configuration(Configuration(
    "ficco-ideal", "FiCCO's ideal: max(the whole GEMM alone, the whole collective by DMA on "
    "every link alone)", "FiCCO bound", lambda p, op, algorithm: ficco.ideal(p, op),
    applies=_ficco_op, algorithms=DIRECT, color="#ff7f0e", params=FICCO_PARAMS,
    over="ficco-serial", **LEAN))

# Whole-model estimates (``emulator/workload``): each design's configuration for the
# operations it fuses; every other operation of a model runs the baseline (``sequential``).
for _design in (
        Design("t3", "T3: track & trigger with memory-controller arbitration on the "
               "reduce-scatters and all-reduces after GEMMs", {"gemm+rs": "t3-mca",
                                                              "gemm+ar": "t3-mca"}),
        Design("t3-plain", "T3 without the arbitration (configuration t3: track & trigger, "
               "NMC) on the reduce-scatters and all-reduces after GEMMs",
               {"gemm+rs": "t3", "gemm+ar": "t3"}),
        Design("flux", "Flux, tuned as Flux tunes (flux-best) on GEMM-RS and AG-GEMM",
               {"gemm+rs": "flux-best", "ag+gemm": "flux-best"}),
        Design("te", "TransformerEngine's comm+GEMM overlap, its best configuration (te-best)",
               {"gemm+rs": "te-best", "ag+gemm": "te-best"}),
        Design("ficco", "FiCCO's heuristic schedule (ficco-auto) on the collectives feeding a "
               "GEMM", {"ag+gemm": "ficco-auto", "a2a+gemm": "ficco-auto"}),
        Design("fused", "the fused computation-collective operators (persistent kernels)",
               {"gemm+a2a": "fused", "gemv+ar": "fused", "emb+a2a": "fused"})):
    REGISTRY.add_design(_design)
