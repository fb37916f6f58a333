"""Flux's GEMM + reduce-scatter forms (Chang et al., Flux, arXiv:2406.06858), each a map over the GEMM's
output: rank r owns rows chunk r; ``split`` WGs per tile (split-K) write each tile.

- ``rs_write`` (RS-W): every WG stores its tile into the owner's slot buffer X at
  block r (its own rows locally): an all-to-all of the partial output; the
  owner's reduction kernel waits for the peers' blocks (the flag barrier) and
  sums the N blocks into its chunk (memory-bound).
- ``rs_atomic`` (RS-A): every WG reduces its tile into the owner's pre-zeroed
  chunk by atomic updates (``red.global.add``: the device's ``nmc_update_cost``
  per update); the owner's chunk is complete after N x split writes; no
  reduction kernel.
- ``rs_two_node`` (Flux across nodes, RS-A within them): a WG's tile goes by
  atomic updates to the rank of its own node with the owner's local index;
  when all G local ranks' partials are in (Flux's per-tile counter up to the
  local world size) that rank puts the tile with its NIC (GPU-initiated, as
  NVSHMEM's put) into the owner's slot buffer X at the block of its node; the
  owner's final reduction adds the other nodes' blocks to its chunk. Tiles of
  the chunks that end on the rank's own local index come last (Flux's
  inter-node swizzle), other nodes' before its own node's.
- ``rs_pull`` (Flux's Hopper variant, ``sm90_gemm_tma_warpspecialized_cooperative_
  reduce_scatter.hpp``): the GEMM stores every tile locally and flags it; in each thread
  block of the persistent kernel a fetch warp of the load warp group brings the peers'
  matching tiles of the rank's own chunk (after their flags) and a reduce warp adds them
  to its own partial tile by tile, into the output O: no remote store in the epilogue,
  no atomics, no reduction kernel. On several nodes (Flux's two-node RS on sm90: its
  reduce buffer [nodes, nodes, m/N, n] and ``bsr_reduce``): the rank with local index j
  reduces, with its node's peers' tiles, every node's chunk of local index j; its own
  node's into O, the others' into Y, put from there by NIC (NVSHMEM) into the owner's
  receive buffer X2 at its node's block (the all-to-all across nodes, fused); then a
  reduction kernel adds the other nodes' blocks to O (the discrete reduction).
- ``rs_ring`` (Flux on PCIe): the GEMM writes its tiles locally, each tracked
  (per-tile flags), while a ring reduce-scatter kernel on a few CUs
  (``Executor("cu", share)``, Flux's default 6 thread blocks on a
  high-priority stream) forwards and reduces them tile by tile: step 1 sends
  the rank's partial to the left neighbour's receive buffer R, steps 2..N-1
  add the partial received from the right to its own and send the sum on, the
  last adds the received partial into the output O. The GEMM computes the
  chunks in ring order, its own last. ``two_d``: Flux's 2D ring over the two
  sockets of a PCIe node: each socket ring-reduces the other socket's chunks
  first, then sends each sum once across the CPU link to the owner (rank +-
  G/2, into its R2), while it ring-reduces its own socket's chunks; the owner
  adds R and R2 to its partial. Fewer bytes cross the CPU link: 1/2 of the
  output per direction instead of (N-1)/N. On several PCIe nodes (inter-NUMA first,
  then intra-NUMA together with inter-node): each socket ring-reduces the other socket
  of its node's chunks first, then every other node's sockets' chunks, whose sums it
  adds into Y and the NIC puts into the owner's R2 (a block per sending socket) while
  its own socket's ring runs; after the kernel a reduction adds the own partial, R and
  every R2 block (Flux: a barrier, then a final reduction over the nodes).

ASSUMPTION (``rs_pull``): the GEMM walks the chunks from rank + 1, the ones it reduces
last and its own chunk at the very end (Flux's Hopper swizzle starts on the own segment):
the peers' tiles of a chunk are in by the time its reduction's turn comes, and the
engine, which serves a kernel's executors in program order, never has a reduction wait
ahead of the fetches the peers wait for. The fetch warp's remote read of a peer's tile is modelled as the
peer's own warp sending it into this rank's receive buffer once it is written: the same
bytes on the same link direction, at the SM-driven ``store_fraction``, without the read
request's latency. The fetch and reduce warps take no CUs from the GEMM (they are idle
warps of its load warp group); the reduce warp's adds run at ``flux_hopper_reduce_share`` of
the CUs' vector issue.

ASSUMPTION (ring forms): Flux's RS kernel pulls from the right neighbour; a CU
step here sends to the left: the same bytes on the same link direction, without
the read request's latency.
"""

from __future__ import annotations

import numpy as np

from collectives import direct
from collectives.common import Problem
from devices.commands import Executor
from devices.regions import shift_rows
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.plan import KernelPhase, Plan, Slots, StepsPhase
from emulator.engine.registry import Operation
from emulator.engine.steps import CuStep
from emulator.model import params

ARBITRATION = "fr-fcfs"  # a stock GPU's HBM: no T3-style memory-controller policy
# ``flux_hopper_reduce_share`` and ``flux_pcie_rs_ctas`` (emulator/model/params.py): the
# share of an SM a Hopper reduce warp issues at, and the PCIe RS kernel's thread blocks


def flux_order(p: Problem, space, swizzle: bool) -> list[int]:
    """WG tiles chunk by chunk: rotated by rank (own chunk first) with ``swizzle``, else
    chunk 0 first on every rank."""
    chunks = ([(p.rank + s) % p.world for s in range(p.world)] if swizzle
              else list(range(p.world)))
    return [t for c in chunks for t in space.tiles_in(p.chunk_region(c))]


def _plan(p: Problem, layout, inputs, result, phases, slots) -> Plan:
    return Plan(layout, inputs, phases, slots, result, arbitration=ARBITRATION)


def rs_atomic(p: Problem, op: Operation, algorithm: str, swizzle: bool = True) -> Plan:
    if p.topology.nodes > 1:
        return rs_two_node(p, op, algorithm, swizzle)
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    job, amap = direct.rs_map(p, slots, lambda s: flux_order(p, s, swizzle))
    phases = [KernelPhase("gemm+rs-a", job, [amap], op.parts.stream, fused=True)]
    return _plan(p, layout, inputs, result, phases, slots)


def rs_write(p: Problem, op: Operation, algorithm: str, swizzle: bool = True) -> Plan:
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    layout = layout + [("X", (p.world * p.max_chunk, p.n), p.dtype)]
    job, maps, arrived = direct.slot_writes(p, slots, lambda s: flux_order(p, s, swizzle))
    blocks = [("X", p.slot_region(s, p.rank)) for s in range(p.world)]
    reduce = CuStep("rs-w reduce", op.parts.stream, blocks, ("C", p.chunk_region(p.rank)),
                    p.rank)
    phases = [KernelPhase("gemm+rs-w", job, maps, op.parts.stream, fused=True),
              StepsPhase("reduce", [reduce], waits=tuple(arrived))]
    return _plan(p, layout, inputs, result, phases, slots)


def wide_reduction(spec, dtype: str, ranks: int) -> bool:
    """Flux's SM80 RS across nodes for a dtype without native atomics (bf16): fp32
    ``red.global.add`` into an output buffer of doubled size
    (``gemm_reduce_scatter.cc`` ``init_output_buffer``; ``epilogue_evt_nvshmem.hpp``
    ``end_step`` and ``recast_backto_bf16``). Within a node, and on sm90, Flux has no such
    path and RS-A stays refused."""
    per_node = spec.interconnect.gpus_per_node
    return (spec.arch == "sm80" and dtype not in spec.atomic_dtypes
            and "fp32" in spec.atomic_dtypes and bool(per_node) and ranks > per_node)


def rs_two_node(p: Problem, op: Operation, algorithm: str, swizzle: bool = True) -> Plan:
    topo = p.topology
    g, nodes = topo.per_node, topo.nodes
    node, local = divmod(p.rank, g)
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    layout = layout + [("X", (nodes * p.max_chunk, p.n), p.dtype)]
    out = "C"
    if wide_reduction(p.spec, p.dtype_name, p.world):  # node sums in fp32, narrowed
        out = "C32"  # to the dtype by the putting WG before its NIC put
        layout = layout + [(out, next(s for n, s, _ in layout if n == "C"), np.float32)]
    space = p.space(slots, out, p.chunks)
    targets = [(local + s) % g if swizzle else s % g for s in range(1, g + 1)]
    order_nodes = [(node + d) % nodes for d in range(1, nodes + 1)]  # its own node last
    chunks = [b * g + j for j in targets for b in order_nodes]
    job = p.gemm(space, [t for c in chunks for t in space.tiles_in(p.chunk_region(c))],
                 store_queue=p.store_queue(g - 1))
    amap = AddressMap(space, p.rank, p.world, "update", job.local_writes())
    xbase = slots.alloc("X tile", len(direct.x_space(p, 0, 0, nodes)))  # chunk 0: largest
    nic = Executor("nic", 0)
    own = None
    for c in range(p.world):
        region = p.chunk_region(c)
        b, j = divmod(c, g)
        if j != local:  # reduced by the rank of this node with the owner's local index
            amap.remote_map(region, node * g + j, op="update")
        elif b == node:
            own = amap.track(region, after=p.split * g)
        else:  # this rank reduces chunk c's node-local partial, then puts it to the owner
            rows = p.slot_region(node, c)
            amap.dma_map(region, c, op="store", after=p.split * g,
                         to=direct.x_space(p, xbase, c, nodes), to_region=rows, executor=nic)
    mine = direct.x_space(p, xbase, p.rank, nodes)
    xmap = AddressMap(mine, p.rank, p.world, "store", [0] * len(mine), incoming_op="store")
    arrived = [xmap.track(p.slot_region(b, p.rank), after=1) for b in range(nodes) if b != node]
    xmap.local(p.slot_region(node, p.rank))  # its own node's partial is its chunk of C
    region = p.chunk_region(p.rank)
    final = CuStep("rs final over nodes", op.parts.stream,
                   [(out, region)] + [("X", p.slot_region(b, p.rank)) for b in range(nodes)
                                      if b != node], ("C", region), p.rank)
    phases = [KernelPhase("gemm+rs-a", job, [amap, xmap], op.parts.stream, fused=True),
              StepsPhase("reduce", [final], waits=(own, *arrived))]
    return _plan(p, layout, inputs, result, phases, slots)


def _moved(space: TileSpace, name: str, rows: int) -> TileSpace:
    """``space``'s tiles ``rows`` further down buffer ``name``, on the same tracker slots:
    what lands there counts at the matching tile of ``space`` (a receive buffer whose
    arrivals a tile of the output waits for)."""
    tiles = np.asarray(space.tiles).copy()
    tiles[:, :2] += rows
    return TileSpace(name, tiles, space.slot_base)


def rs_pull(p: Problem, op: Operation, algorithm: str) -> Plan:
    """Flux's Hopper GEMM + RS (module docstring): local stores with per-tile flags, the
    peers' tiles fetched and reduced by warps of the persistent kernel; across nodes the
    intra-node reduction, a fused NIC all-to-all of the node sums and a final reduction."""
    topo = p.topology
    g, nodes = topo.per_node, topo.nodes
    node, local = divmod(p.rank, g)
    slots = Slots()
    layout, inputs, _ = op.parts.layout(p, algorithm)
    shape = (p.m, p.n)
    layout = layout + [("X", (g * p.max_chunk, p.n), p.dtype), ("O", shape, p.dtype)]
    if nodes > 1:
        layout += [("Y", shape, p.dtype), ("X2", (nodes * p.max_chunk, p.n), p.dtype)]
    space = p.space(slots, "C", p.chunks)
    ospace = TileSpace("O", space.tiles, slots.alloc("O tile", len(space)))
    # the chunks others reduce first (their tiles only wait for this GEMM), then those this
    # rank reduces (another node's, then its own): each rotated from rank + 1
    turn = [(p.rank + s) % p.world for s in range(1, p.world + 1)]
    chunks = ([c for c in turn if c % g != local] + [c for c in turn if c % g == local
                                                     and c // g != node] + [p.rank])
    job = p.gemm(space, [t for c in chunks for t in space.tiles_in(p.chunk_region(c))])
    amap = AddressMap(space, p.rank, p.world, p.producer_op(), job.local_writes(),
                      incoming_op="store")
    share = params.value("flux_hopper_reduce_share")
    fetch = Executor("cu", 0, share, resident=True)
    reduce = Executor("cu", 1, share, resident=True)
    peers = [node * g + (local + s) % g for s in range(1, g)]  # the node's other ranks
    if nodes > 1:  # Y: the node sums this rank puts; their arrivals at the owner count on
        # its Y slots of its own chunk's tiles
        yspace = TileSpace("Y", space.tiles, slots.alloc("Y tile", len(space)))
        ymap = AddressMap(yspace, p.rank, p.world, "store", np.zeros(len(yspace), np.int64),
                          incoming_op="store", local_ok=True)
        nic = Executor("nic", 0)
    for c in range(p.world):
        b, j = divmod(c, g)
        reducer = node * g + j
        row0 = p.chunk(c)[0]
        rows = local * p.max_chunk - row0  # where this rank's block of X is at the reducer
        to_x = _moved(space, "X", rows) if reducer != p.rank else None  # one per chunk
        x2_rows = node * p.max_chunk - row0  # this node's block of the owner's X2
        to_x2 = _moved(yspace, "X2", x2_rows) if reducer == p.rank and b != node else None
        for t in space.tiles_in(p.chunk_region(c)):
            tile = space.region(t)
            if reducer != p.rank:  # fetched by the reducer into its X, block = local index
                amap.dma_map(tile, reducer, op="store", after=p.split, to=to_x,
                             to_region=shift_rows(tile, rows), executor=fetch)
                continue
            adds = [("X", shift_rows(tile, (q % g) * p.max_chunk - row0)) for q in peers]
            mine = b == node  # this rank's own chunk, else another node's: put its sum
            amap.dma_map(tile, p.rank, op="store", after=p.split + len(adds),
                         to=ospace if mine else yspace, executor=reduce, adds=adds)
            if not mine:
                ymap.dma_map(tile, c, op="store", after=1, to=to_x2,
                             to_region=shift_rows(tile, x2_rows), executor=nic)
    phases = [KernelPhase("gemm+rs-pull", job, [amap], op.parts.stream, fused=True)]
    if nodes > 1:
        region = p.chunk_region(p.rank)
        omap = AddressMap(ospace, p.rank, p.world, "store", np.zeros(len(ospace), np.int64),
                          incoming_op="store", local_ok=True)
        summed = omap.track(region, after=1)  # the node's sum of its own chunk, in O
        arrived = ymap.track(region, after=nodes - 1)  # the other nodes' sums, in X2
        phases[0].maps += [ymap, omap]
        blocks = [("X2", p.slot_region(b, p.rank)) for b in range(nodes) if b != node]
        final = CuStep("rs final over nodes", op.parts.stream, [("O", region)] + blocks,
                       ("O", region), p.rank)
        phases.append(StepsPhase("reduce", [final], waits=(summed, arrived)))
    return _plan(p, layout, inputs, [("O", p.chunk_region(p.rank))], phases, slots)


def _ring_steps(p: Problem, two_d: bool) -> list[tuple[int, int, int, int, int]]:
    """(chunk, step, left, partner, block) of the ring RS on this rank, in the GEMM's order:
    the step is 1..L-1 for a partial passed on, 0 where the chunk's ring ends here (L: the
    ring's length); ``partner``: where the ring's sum goes then (-1: it is this rank's),
    into its block ``block`` of R2. 1D: the topology's ring over all ranks. 2D (nodes of
    two sockets): a ring within the socket over each other socket's chunks, then over its
    own socket's; the other socket of its node first (inter-NUMA), then the other nodes'
    sockets (their sums go by NIC while its own socket's ring runs)."""
    groups = socket_groups(p)
    if not (two_d and groups):
        return [(p.ring_at(s), s % p.world, p.left, -1, -1) for s in range(1, p.world + 1)]
    topo = p.topology
    per = topo.per_socket
    mine = p.rank // per  # this socket's group (node-major, two per node)
    base = mine * per
    j = p.rank - base
    left = base + (j - 1) % per
    node, sock = divmod(mine, 2)
    order = [node * 2 + 1 - sock] + [(node + d) % topo.nodes * 2 + s
                                     for d in range(1, topo.nodes) for s in (sock, 1 - sock)]
    out = []
    for grp in order + [mine]:
        partner = -1 if grp == mine else grp * per + j
        block = (mine - grp) % groups - 1  # the sender's block among the owner's others
        for s in list(range(1, per)) + [0]:
            out.append((grp * per + (j + s) % per, s, left, partner if s == 0 else -1, block))
    return out


def across_of(steps) -> bool:
    """Some sum of ``_ring_steps`` goes to another socket's owner (a 2D form)."""
    return any(partner >= 0 for *_, partner, _ in steps)


def socket_groups(p: Problem) -> int:
    """The job's socket groups (node-major, two per node) where Flux's 2D forms apply: every
    node of two equal sockets; else 0."""
    topo = p.topology
    two = topo.sockets == 2 and topo.per_socket * 2 == topo.per_node
    return 2 * topo.nodes if two and topo.per_node * topo.nodes == p.world else 0


def rs_ring(p: Problem, op: Operation, algorithm: str, two_d: bool = False) -> Plan:
    """Flux's PCIe GEMM + RS: the GEMM beside a ring RS kernel on ``flux_pcie_rs_ctas`` CUs (1D, or
    ``two_d`` over the sockets, also across nodes; 1D where a node has no two equal
    sockets)."""
    slots = Slots()
    layout, inputs, _ = op.parts.layout(p, algorithm)
    shape = (p.m, p.n)
    steps = _ring_steps(p, two_d)
    others = max(1, max(block for *_, block in steps) + 1)  # R2 blocks: one per other group
    layout = layout + [("R", shape, p.dtype), ("R2", (others * p.m, p.n), p.dtype),
                       ("O", shape, p.dtype)]
    space = p.space(slots, "C", p.chunks)
    rspace = _moved(space, "R", 0)  # arrivals count at C's tiles
    ospace = TileSpace("O", space.tiles, slots.alloc("O tile", len(space)))
    job = p.gemm(space, [t for c, *_ in steps for t in space.tiles_in(p.chunk_region(c))])
    amap = AddressMap(space, p.rank, p.world, p.producer_op(), job.local_writes(),
                      incoming_op="store")
    ring = any(s > 0 for _, s, *_ in steps)  # partials pass from rank to rank
    across = across_of(steps)  # and across the sockets
    split_final = p.topology.nodes > 1 and across  # and across nodes
    share = p.sm_share(int(params.value("flux_pcie_rs_ctas")))
    # 2D: half the thread blocks send across the sockets while the rest work the ring;
    # sums for another node go by NIC (GPU-initiated puts, as Flux's NVSHMEM across nodes)
    cu = Executor("cu", 0, share / 2 if across else share)
    cross = Executor("cu", 1, share / 2) if across else cu
    g = p.topology.per_node
    to_r2 = {k: _moved(space, "R2", k * p.m) for k in range(others)}  # one per block
    if split_final:  # Y: the sums this rank puts to other nodes
        layout.append(("Y", shape, p.dtype))
        yspace = TileSpace("Y", space.tiles, slots.alloc("Y tile", len(space)))
        ymap = AddressMap(yspace, p.rank, p.world, "store", np.zeros(len(yspace), np.int64),
                          incoming_op="store", local_ok=True)
        nic = Executor("nic", 0)
        fmap = AddressMap(space, p.rank, p.world, p.producer_op(), job.local_writes(),
                          incoming_op="store", local_ok=True)
    for c, s, left, partner, block in steps:
        passed = s > 1 or (s == 0 and ring)  # a partial from the right has come in
        for t in space.tiles_in(p.chunk_region(c)):
            tile = space.region(t)
            adds = [("R", tile)] if passed else []
            after = p.split + len(adds)
            if s > 0:  # pass the partial sum on to the left
                amap.dma_map(tile, left, op="store", after=after, to=rspace, executor=cu,
                             adds=adds)
            elif partner >= 0 and partner // g == p.rank // g:  # the socket's sum crosses
                # the CPU link to the owner
                amap.dma_map(tile, partner, op="store", after=after, to=to_r2[block],
                             to_region=shift_rows(tile, block * p.m), executor=cross,
                             adds=adds)
            elif partner >= 0:  # for another node: summed into Y, put by the NIC
                amap.dma_map(tile, p.rank, op="store", after=after, to=yspace,
                             executor=cross, adds=adds)
                ymap.dma_map(tile, partner, op="store", after=1, to=to_r2[block],
                             to_region=shift_rows(tile, block * p.m), executor=nic)
            elif split_final:  # the GEMM's own writes (the first map's routes count them)
                amap.track(tile, after=p.split)
            else:  # this rank's chunk: its partial + the ring's (+ the other socket's)
                adds += [("R2", shift_rows(tile, k * p.m)) for k in range(others)
                         if across]
                amap.dma_map(tile, p.rank, op="store", after=p.split + len(adds), to=ospace,
                             executor=cu, adds=adds)
    phases = [KernelPhase("gemm+rs-ring", job, [amap], op.parts.stream, fused=True)]
    if split_final:  # across nodes (Flux: a barrier, then a final reduction): the own
        # chunk's partial + the ring's + every other socket's sum, once all are in. (In the
        # kernel, its wait for the other nodes' puts would come before this rank's own puts
        # in program order, as the engine serves its executors.)
        region = p.chunk_region(p.rank)
        sums = [("R2", shift_rows(region, k * p.m)) for k in range(others)]
        whole = fmap.track(region, after=p.split + int(ring) + others)
        phases[0].maps += [ymap, fmap]
        final = CuStep("rs final over sockets and nodes", op.parts.stream,
                       [("C", region)] + ([("R", region)] if ring else []) + sums,
                       ("O", region), p.rank)
        phases.append(StepsPhase("reduce", [final], waits=(whole,)))
    plan = _plan(p, layout, inputs, [("O", p.chunk_region(p.rank))], phases, slots)
    if across:  # every rank sends across the CPU link at once: its share is 1/(G/2)
        plan.pattern = "direct"
    return plan
