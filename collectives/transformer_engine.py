"""TransformerEngine's comm+GEMM overlap (userbuffers) as TE runs it: the baselines Flux
compares against ("the best of all TransformerEngine configurations").

From TE's own code (NVIDIA/TransformerEngine, ``common/comm_gemm_overlap/
comm_gemm_overlap.cpp``, ``userbuffers/userbuffers.cu``, ``pytorch/module/base.py``):

- ``te_ring_ag`` (``te-ring``; TE's ``ring_exchange`` AG, the default of qkv/fc1
  fprop): N = TP chunk GEMMs, each its own launch on all the SMs; step i computes
  the chunk it holds (its own first, then the one received last) while the copy
  engine (``use_ce``, the default: ``cudaMemcpyAsync`` into the peer's mapped buffer)
  sends that chunk on to the next rank of the ring; GEMM i+1 waits for the chunk
  received during step i.
- ``te_ring_aggregate_ag`` (``te-ring-aggregate``; ``aggregate=True``): ranks 2q and
  2q+1 first swap their chunks (the first GEMM waits for it: not overlapped), then
  N/2 GEMMs over two-chunk blocks, each block sent on to rank + 2 while it is
  computed (two one-way rings of stride 2, twice the bytes per message).
- ``te_pipeline_rs`` (``te-pipeline``; TE's ``pipeline`` RS, the default of proj/fc2
  fprop): the GEMM split in ``te_splits`` = 4 along the output columns, each split
  its own launch on the SMs less ``te_rs_sms`` = 16 (``set_sm_margin``); after GEMM
  i, the reduce-scatter of its columns runs on 16 SMs (the last on 32,
  ``UB_MAX_SM``) beside GEMM i + 1: one-shot, each rank's block summed from every
  rank's partial.
- ``te_p2p_rs`` (``te-p2p``; TE's ``ring_exchange`` RS): N chunk GEMMs, chunk
  rank + 1 first, its own last; each finished partial goes straight to its owner by
  the copy engine while the next chunk computes; the owner sums the N partials at
  the end (``reduce_bf16`` on the main stream, not overlapped).

Not run here: TE's bulk overlap (a whole collective beside an *unrelated* GEMM: a
dgrad or wgrad, which a single dependent AG + GEMM or GEMM + RS does not have) and
its atomic GEMM (FP8 with delayed scaling only; the emulator computes fp16/fp32).
TE runs tensor parallelism within one NVLink node (``userbuffers.h``: "for
TP-parallelism, only single node is implemented"; its send and receive assert an
intra-node peer): every TE configuration refuses a job across nodes, and a ring
topology of more than 3 GPUs (its buffers are mapped peer to peer among all ranks).

Per chunk, as TE's code does it (``CommOverlapP2PBase``): a copy-engine send is
``cudaMemcpyAsync`` into the peer's buffer followed on the send stream by
``kuserbuffers_pushsend`` (one thread, ``atomicAdd_system`` on the peer's flag); the
receiver's ``kuserbuffers_pushrecv`` spins on it on the receive stream, which records the
event the next GEMM's stream waits on. So a GEMM (or the final reduce) that waits for
received data starts a kernel launch (the flag kernel's, dispatched when the copy ends)
and the link's latency (its flag crossing) after the data arrived (``sync_launches``,
``sync_peer``), besides its own launch and the copy command's set-up. No published measurement of these steps on
NVLink was found; they are charged with the preset's launch and link figures, as every
other kernel and flag. The pipeline RS's comm kernel starts one launch after the split
GEMM ends (as the next split's launch: the same time), its cross-rank flag barrier not
charged.

ASSUMPTION (one-shot RS): TE's RS kernel reads each rank's block of every peer's
partial over the links; here each rank's RS kernel sends its partial blocks to their
owners, who add them as they land: the same bytes on the same link directions,
without the read requests' latency, on the same SMs.
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from collectives.flux_rs import ARBITRATION
from devices.commands import Executor
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation
from emulator.engine.steps import CuStep
from emulator.model import params

# TransformerEngine's "pipeline" overlap: its splits and SM counts (``te_splits``,
# ``te_rs_sms``, ``te_rs_last_sms`` in emulator/model/params.py)


def refusal(spec, ranks: int) -> str:
    """Why TE's userbuffers cannot run a job of ``ranks`` GPUs on ``spec`` ("" : it can)."""
    ic = spec.interconnect
    per_node = ic.gpus_on_node(ranks)
    if ranks > per_node:
        return (f"TransformerEngine's userbuffers run tensor parallelism within one node "
                f"(its send and receive assert an intra-node peer); {ranks} GPUs span "
                f"{-(-ranks // per_node)} nodes of {per_node}")
    if ic.topology == "ring" and ranks > 3:  # not a parameter: a ring of 4 lacks links
        return (f"TransformerEngine's userbuffers map every peer's buffer (its RS reads "
                f"every peer); a ring of {ranks} GPUs links neighbours only")
    return ""


def aggregate_refusal(spec, ranks: int) -> str:
    return refusal(spec, ranks) or ("" if ranks % 2 == 0 else
                                    f"TE's aggregate ring exchange pairs ranks (2q, 2q+1); "
                                    f"{ranks} GPUs is odd")


def _held(space: TileSpace, tiles) -> tuple[np.ndarray, list]:
    """Local writes and preload signals of ``tiles`` of ``space`` written before a phase
    (a previous phase's GEMM output or a resident input): complete at the phase's start."""
    tiles = list(tiles)
    writes = np.zeros(len(space), np.int64)
    writes[tiles] = 1
    return writes, ([([space.slot(t) for t in tiles], [space.elems(t) for t in tiles])]
                    if tiles else [])


def _ag_steps(p: Problem, op: Operation, algorithm: str, blocks: list[list[int]],
              send_to: int, swap: int = -1) -> Plan:
    """AG + GEMM as TE's ring exchange: step j's GEMM over the chunks ``blocks[j]`` (the
    rank's own in the first) once they are here, while the copy engine sends them on to
    ``send_to`` (but for the last block). ``swap``: a peer the rank first exchanges its
    own chunk with (the aggregate form; the first GEMM waits for it)."""
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    p = p.with_launch(max(len(b) for b in blocks) * p.max_chunk)  # a GEMM per block
    n, i = p.world, p.rank
    aspace = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
    cspace = p.space(slots, "C", p.chunks, tile_n=p.kernel.tile_n)  # chunk GEMMs: own tiles
    own = aspace.tiles_in(p.chunk_region(i, p.k))
    writes, preload = _held(aspace, own)  # resident before the operation

    def rows(chunks: list[int]) -> tuple[int, int, int, int]:
        return (p.chunk(min(chunks))[0], p.chunk(max(chunks))[1], 0, p.k)

    sync = _flag_sync(p, p.ring_at(-1))  # TE runs within one node: every peer alike
    phases: list = []
    if swap >= 0:  # the pair's exchange: a copy and its arrival, before any GEMM
        amap = AddressMap(aspace, i, n, "store", writes, incoming_op="store", local_ok=True)
        amap.dma_map(p.chunk_region(i, p.k), swap, op="store", after=1)
        phases.append(KernelPhase("swap", p.gemm(cspace, [], a="AG"), [amap], op.parts.stream,
                                  fused=True, preload=preload))
    for s, block in enumerate(blocks):
        amap = AddressMap(aspace, i, n, "store",
                          writes if s == 0 else np.zeros(len(aspace), np.int64),
                          incoming_op="store", local_ok=True)
        # the block's parts held alike (the aggregate's first block: its own chunk and
        # the partner's, sent as two copies), each sent on but for the last block
        parts = ([[i], [c for c in block if c != i]] if s == 0 and swap >= 0 else [block])
        for part in parts:
            here = (amap.dma_map(rows(part), send_to, op="store", after=1)
                    if s < len(blocks) - 1 else amap.track(rows(part), after=1))
        kernel = p.gemm(cspace, [t for c in block for t in cspace.tiles_in(p.chunk_region(c))],
                        a="AG")
        cmap = AddressMap(cspace, i, n, p.producer_op(), kernel.local_writes(), local_ok=True)
        phases.append(KernelPhase(f"step {s}", kernel, [cmap, amap], op.parts.stream,
                                  fused=True, preload=preload if s == 0 and swap < 0 else [],
                                  waits=(here,) if s > 0 or swap >= 0 else (),
                                  **sync))
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def _flag_sync(p: Problem, peer: int) -> dict:
    """The per-chunk stream synchronisation of a userbuffers receive (module docstring):
    the sender's flag kernel's launch, then its flag's crossing from ``peer`` to this rank
    (``KernelPhase.sync_launches``, ``sync_peer``: timed on the clock's device)."""
    if p.world < 2:
        return {}
    return {"sync_launches": 1, "sync_peer": peer}


def te_ring_ag(p: Problem, op: Operation, algorithm: str) -> Plan:
    """TE's ring exchange: the chunk GEMMs in the order own, then each one received from
    the ring's previous rank, each sent on to the next rank while it is computed."""
    return _ag_steps(p, op, algorithm, [[p.ring_at(-s)] for s in range(p.world)],
                     p.ring_at(1))


def te_ring_aggregate_ag(p: Problem, op: Operation, algorithm: str) -> Plan:
    """TE's aggregate ring exchange: the pair (2q, 2q+1) swaps its chunks, then the pair's
    two-chunk blocks travel the stride-2 rings (to rank + 2), one GEMM per block."""
    n, i = p.world, p.rank
    half = n // 2
    blocks = [[2 * ((i // 2 - j) % half), 2 * ((i // 2 - j) % half) + 1] for j in range(half)]
    return _ag_steps(p, op, algorithm, blocks, (i + 2) % n, i + 1 if i % 2 == 0 else i - 1)


def _rs_layout(p: Problem, op: Operation, algorithm: str, slots: Slots, tile_n: int):
    """The RS forms' buffers: C (the partials), R<s> (rank s's partial blocks landing
    here; their arrivals count at C's tiles) and O (the reduced chunk, the result); C
    tiled by chunks with tiles ``tile_n`` wide."""
    layout, inputs, _ = op.parts.layout(p, algorithm)
    layout = layout + [(f"R{s}", (p.m, p.n), p.dtype) for s in range(p.world)]
    layout.append(("O", (p.m, p.n), p.dtype))
    cspace = p.space(slots, "C", p.chunks, tile_n=tile_n)
    recv = [TileSpace(f"R{s}", cspace.tiles, cspace.slot_base) for s in range(p.world)]
    ospace = TileSpace("O", cspace.tiles, slots.alloc("O tile", len(cspace)))
    return layout, inputs, cspace, recv, ospace


def _cmap(p: Problem, cspace: TileSpace, kernel, held) -> tuple[AddressMap, list]:
    """A chunk GEMM's map, with the tiles ``held`` (a previous GEMM's output) complete at
    the phase's start."""
    before, preload = _held(cspace, held)
    writes = np.where(before > 0, before, kernel.local_writes())
    return (AddressMap(cspace, p.rank, p.world, p.producer_op(), writes, incoming_op="store",
                       local_ok=True), preload)


def te_pipeline_rs(p: Problem, op: Operation, algorithm: str) -> Plan:
    """TE's pipelined split GEMM + RS: ``te_splits`` column splits, the RS of split j on
    its own SMs beside GEMM j + 1 (module docstring)."""
    slots = Slots()
    splits = int(params.value("te_splits"))
    p = p.with_launch(p.rows_most, -(-p.n // splits))  # a GEMM per column split
    # a split's GEMM spans every chunk's rows: under the kernel model (which charges whole
    # tiles) chunks thinner than its tile are tiled with wider tiles of the tile's area
    # (``Problem.tile_n``), so a tile is charged once, not once per chunk it spans; the
    # fixed tile's clock charges each WG its own FLOPs, so its tiles stay
    layout, inputs, cspace, recv, ospace = _rs_layout(
        p, op, algorithm, slots, p.tile_n if p.kernel.modelled else p.kernel.tile_n)
    n, i = p.world, p.rank
    cols = np.unique(cspace.tiles[:, 2:4], axis=0)  # the tile columns (c0, c1)
    nsplit = min(splits, len(cols))
    edges = [cols[len(cols) * j // nsplit][0] for j in range(nsplit)] + [p.n]
    splits = [(edges[j], edges[j + 1]) for j in range(nsplit)]

    def block(c: int, j: int) -> tuple[int, int, int, int]:
        r0, r1 = p.chunk(c)
        return (r0, r1, *splits[j])

    margin = p.sm_share(int(params.value("te_rs_sms")))
    phases: list = []
    for j in range(nsplit + 1):
        tiles = [t for c in range(n) for t in cspace.tiles_in(block(c, j))] if j < nsplit \
            else []
        kernel = p.gemm(cspace, tiles)
        held = [t for c in range(n) for t in cspace.tiles_in(block(c, j - 1))] if j else []
        cmap, preload = _cmap(p, cspace, kernel, held)
        if j:  # the reduce-scatter of the previous split, beside this GEMM
            cu = Executor("cu", 0, margin if j < nsplit else p.sm_share(
                int(params.value("te_rs_last_sms"))))
            for c in p.others:
                cmap.dma_map(block(c, j - 1), c, op="store", after=1, to=recv[i], executor=cu)
            cmap.dma_map(block(i, j - 1), i, op="store", after=n, to=ospace, executor=cu,
                         adds=[(f"R{s}", block(i, j - 1)) for s in p.others])
        phases.append(KernelPhase(f"split {j}" if j < nsplit else "rs last", kernel, [cmap],
                                  op.parts.stream, fused=True, preload=preload,
                                  margin=margin if j < nsplit else 0.0))
    return Plan(layout, inputs, phases, slots, [("O", p.chunk_region(i))],
                arbitration=ARBITRATION)


def te_p2p_rs(p: Problem, op: Operation, algorithm: str) -> Plan:
    """TE's ring-exchange RS: chunk GEMMs (rank + 1 first, its own last), each partial
    sent to its owner by the copy engine beside the next GEMM; the N partials summed at
    the end (module docstring)."""
    slots = Slots()
    p = p.with_launch(p.max_chunk)  # a GEMM per chunk
    layout, inputs, cspace, recv, ospace = _rs_layout(p, op, algorithm, slots,
                                                      p.kernel.tile_n)  # a GEMM per chunk
    n, i = p.world, p.rank
    order = [(i + s + 1) % n for s in range(n)]
    phases: list = []
    done = None
    for s, c in enumerate(order):
        kernel = p.gemm(cspace, cspace.tiles_in(p.chunk_region(c)))
        held = cspace.tiles_in(p.chunk_region(order[s - 1])) if s else []
        cmap, preload = _cmap(p, cspace, kernel, held)
        if s:  # the previous chunk's partial to its owner, beside this GEMM
            cmap.dma_map(p.chunk_region(order[s - 1]), order[s - 1], op="store", after=1,
                         to=recv[i])
        if c == i:  # its own partial and the peers' land here
            done = cmap.track(p.chunk_region(i), after=p.split + n - 1)
        phases.append(KernelPhase(f"gemm {s}", kernel, [cmap], op.parts.stream, fused=True,
                                  preload=preload))
    own = p.chunk_region(i)
    reduce = CuStep("te reduce", op.parts.stream,
                    [("C", own)] + [(f"R{s}", own) for s in p.others], ("O", own), i)
    phases.append(StepsPhase("reduce", [reduce], waits=(done,),
                             **_flag_sync(p, order[0])))
    return Plan(layout, inputs, phases, slots, [("O", own)], arbitration=ARBITRATION)
