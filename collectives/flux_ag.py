"""Flux's AllGather + GEMM, fused in the GEMM's prologue (Chang et al., Flux, arXiv:2406.06858).

Rank r's input rows (chunk r of the M x K input) are resident in its gathered
buffer AG at the start (Flux: local copy, its own signal set, a barrier). The
rest arrive by copy-engine transfers (DMA), in communication tiles of
``comm_rows`` rows (Flux tunes it from m/N down to the GEMM tile height), each
followed by its signal (never below the GEMM's tile height); each GEMM WG waits on the signals of the tiles its rows
read (a stage waits for its WGs'), then runs the unchanged GEMM. The GEMM's
WGs walk the chunks in arrival order (own rows first), or, without the swizzle,
chunk 0 first on every rank. The transfers follow the platform:

- one node, a switch or full mesh (Flux's All2All): direct transfers in ring
  order after the local rank, pushed (``dma_map`` to each peer) or pulled
  (``pull_map`` from each peer, on this rank's engine);
- PCIe or a ring (``algorithm="ring"``): ring pushes with forwarding, whole
  chunks (``ring_push``); ``two_d`` on a node of two sockets (Flux's Ring2D,
  inter-socket transfers first): the chunks first travel G/2 hops along the
  node's ring, which crosses the CPU link at two hops, so 1/2 of the input
  crosses each way, one GPU at a time, instead of (N-1)/N; then each socket's
  ring carries every chunk on to its GPUs that do not hold it yet;
- several nodes: each rank sends its chunk with a second DMA engine directly
  to the rank of the same local index on every other node (through the NIC),
  concurrently with the intra-node transfers; every arrival triggers the
  intra-node transfers of that chunk: flags to the node's other ranks, which
  pull it (``pull``), or pushes to them.
"""

from __future__ import annotations

import numpy as np

from collectives import consumer
from collectives.common import Problem
from collectives.flux_rs import ARBITRATION, socket_groups
from devices.commands import DMA0, Executor
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.registry import Operation


class _Input:
    """The gathered input AG on this rank: its map, flag space and the signal of every
    input tile (what the GEMM's gates wait on)."""

    def __init__(self, p: Problem, slots: Slots, comm_rows: int, flags: bool = False):
        self.p, self.comm_rows = p, comm_rows
        self.space = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
        self.own = self.space.tiles_in(p.chunk_region(p.rank, p.k))
        writes = np.zeros(len(self.space), np.int64)
        writes[self.own] = 1  # resident before the kernel
        self.map = AddressMap(self.space, p.rank, p.world, "store", writes,
                              incoming_op="store")
        self.flags = (TileSpace("AG", self.space.tiles, slots.alloc("AG flag", len(self.space)))
                      if flags else None)
        self.signal: dict = {}
        # the own rows' pushes on a second queue over the same buffer (maps earlier in a
        # phase queue first, so it goes ahead of the entries that wait for arrivals)
        self.own_push = AddressMap(self.space, p.rank, p.world, "store", writes,
                                   incoming_op="store", local_ok=True)

    def tiles(self, c: int):
        return consumer.comm_tiles(self.p, c, self.comm_rows)

    def mark(self, region, sig) -> None:
        for t in self.space.tiles_in(region):
            self.signal[self.space.region(t)] = sig

    def plan(self, op: Operation, algorithm: str, chunks: list[int], slots: Slots,
             arrival_order: bool = False) -> Plan:
        p = self.p
        layout, inputs, result = op.parts.layout(p, algorithm)
        kernel, cmap = consumer.gated_gemm(p, slots, self.signal, chunks, plain=True)
        extra = [self.own_push] if self.own_push.entries else []
        phase = KernelPhase("ag+gemm", kernel, [cmap, *extra, self.map], op.parts.stream,
                            fused=True,
                            preload=consumer.resident(p, self.space, self.own),
                            arrival_order=arrival_order)
        return Plan(layout, inputs, [phase], slots, result, arbitration=ARBITRATION)


def _second_engine(p: Problem) -> Executor:
    """The copy engine beside engine 0 (engine 0 if the device has one)."""
    return Executor("dma", min(1, p.spec.dma_engines - 1))


def _order(p: Problem, arrival: list[int], swizzle: bool) -> list[int]:
    return arrival if swizzle else list(range(p.world))


def ag_gemm(p: Problem, op: Operation, algorithm: str, halvings: int = 0,
            swizzle: bool = True, pull: bool = False) -> Plan:
    """Flux's AG + GEMM on the platform's transfers (module docstring); communication
    tiles of ceil(m/N / 2^halvings) rows, never below the GEMM's tile height (Flux tunes
    the tile from m/N down to it: a WG waits for all the rows it reads anyway); ``pull``:
    peers' tiles pulled, not pushed."""
    rows = min(p.max_chunk, max(-(-p.max_chunk // (1 << halvings)), p.tile_m))
    if algorithm == "ring":
        return ring_push(p, op, algorithm, rows, swizzle)
    if p.topology.nodes > 1:
        return two_node(p, op, algorithm, rows, swizzle, pull)
    slots = Slots()
    inp = _Input(p, slots, rows)
    amap = inp.map
    ready = None
    behind = [(p.rank - s) % p.world for s in range(1, p.world)]  # who wants it soonest:
    # rank r - 1 reads rank r's rows right after its own, r - 2 next, ...
    for region in inp.tiles(p.rank):
        if p.world > 1 and not pull:
            inp.mark(region, amap.dma_map(region, behind, op="store", after=1))
        else:  # resident; tracked so that the gates (and the pulls) see it
            inp.mark(region, sig := amap.track(region, after=1))
            ready = ready or sig
    for c in p.others:  # ring order after the local rank
        for region in inp.tiles(c):
            inp.mark(region, amap.pull_map(region, c, flag=ready) if pull
                     else amap.track(region, after=1))
    return inp.plan(op, algorithm, _order(p, [p.rank] + p.others, swizzle), slots)


def ring_push(p: Problem, op: Operation, algorithm: str, comm_rows: int, swizzle: bool = True,
              two_d: bool = False) -> Plan:
    """Ring pushes with forwarding (1D), or inter-socket first (``two_d``; on several nodes
    with the chunks also sent across nodes, see ``_ring2d``)."""
    slots = Slots()
    inp = _Input(p, slots, comm_rows)
    amap = inp.map
    if not (two_d and socket_groups(p)):
        for c in [p.rank] + p.others:  # to the left; forwarded until the chunk's last stop
            for region in inp.tiles(c):
                inp.mark(region, amap.track(region, after=1) if c == p.left or p.world == 1
                         else amap.dma_map(region, p.left, op="store", after=1))
        return inp.plan(op, algorithm, _order(p, [p.ring_at(s) for s in range(p.world)],
                                              swizzle), slots, arrival_order=True)
    return inp.plan(op, algorithm, _order(p, _ring2d(p, inp), swizzle), slots)


def _ring2d(p: Problem, inp: _Input) -> list[int]:
    """Flux's Ring2D on nodes of two sockets: the chunks first travel per_socket hops
    along the node's ring (so 1/2 of the input crosses each way, one GPU at a time, at
    the two ring hops between the sockets), then each socket's ring carries every chunk
    on from the last of its GPUs that holds it to those that do not yet (each arrival
    forwarded as soon as it lands). On several nodes (PCIe, inter-NUMA first, then
    intra-NUMA together with inter-node): each rank's chunk goes, after its inter-socket
    push on the same engine, to the rank of the same local index on every other node
    (through the NIC), and there it enters that node's Ring2D as a chunk of its own. Maps
    ``inp``; returns the chunks in arrival order."""
    topo, n, amap = p.topology, p.world, inp.map
    g = topo.per_node
    node = p.rank // g
    ring = [r for r in p.ring if r // g == node]  # this node's part of the ring
    pos = {r: i for i, r in enumerate(ring)}
    members = [[r for r in ring if topo.socket(r) == s] for s in range(topo.sockets)]
    sock = {r: m for m in members for r in m}
    far = [b * g + p.rank % g for b in range(topo.nodes) if b != node]

    def sleft(r: int) -> int:
        m = sock[r]
        return m[(m.index(r) - 1) % len(m)]

    forwards: dict[tuple[int, int], list[int]] = {}  # (holder, chunk) -> where it sends it
    hops: dict[int, tuple[int, int]] = {}  # chunk -> (nodes crossed, hops in the node)
    for c in range(n):
        path = [node * g + c % g]  # where it enters this node: its holder, or the NIC's
        for _ in range(topo.per_socket):  # along the node's ring
            path.append(ring[(pos[path[-1]] - 1) % g])
        held = {r: h for h, r in enumerate(path)}
        for a, b in zip(path, path[1:]):
            forwards.setdefault((a, c), []).append(b)
        for m in members:  # then along each socket's ring to the GPUs still without it
            ends = [r for r in m if r in held and sleft(r) not in held]
            for x in ends:
                while sleft(x) not in held:
                    forwards.setdefault((x, c), []).append(sleft(x))
                    held[sleft(x)] = held[x] + 1
                    x = sleft(x)
        hops[c] = (int(c // g != node), held[p.rank])
    engine1 = _second_engine(p)
    # the entries in arrival order (fewest hops first): the engine serves them in that
    # order where stages gate alike, so no rank waits on a chunk that reaches it later
    # ahead of one it must forward sooner (in chunk order the engines deadlock once a
    # GEMM tile spans chunks, at m/N below the tile's rows)
    arrival = sorted(range(n), key=lambda c: (hops[c], (c - p.rank) % n))
    for c in arrival:
        dsts = list(dict.fromkeys(forwards.get((p.rank, c), [])))
        for region in inp.tiles(c):
            if c == p.rank and (far or len(dsts) > 1):  # across (then to the other nodes)
                # on a second engine, along on engine 0
                sig = amap.dma_map(region, dsts[:1] + far, op="store", after=1,
                                   executor=engine1)
                if dsts[1:]:
                    sig = (sig, inp.own_push.dma_map(region, dsts[1:], op="store", after=1))
                inp.mark(region, sig)
            elif not dsts:
                inp.mark(region, amap.track(region, after=1))
            else:
                inp.mark(region, amap.dma_map(region, dsts, op="store", after=1))
    return arrival


def two_node(p: Problem, op: Operation, algorithm: str, comm_rows: int, swizzle: bool = True,
             pull: bool = False) -> Plan:
    """Across nodes: direct to the same local rank on the other nodes, intra-node pulls (or
    pushes) of every chunk as it arrives."""
    topo = p.topology
    g, nodes = topo.per_node, topo.nodes
    node, local = divmod(p.rank, g)
    slots = Slots()
    inp = _Input(p, slots, comm_rows, flags=pull)
    amap = inp.map
    far = [b * g + local for b in range(nodes) if b != node]  # same local index elsewhere
    near = [node * g + (local + s) % g for s in range(1, g)]  # this node, ring order
    wire = _second_engine(p)  # beside the intra-node engine
    ready = None
    for region in inp.tiles(p.rank):
        sig = amap.dma_map(region, far, op="store", after=1, executor=wire)
        ready = ready or sig
        if not pull and near:  # its resident rows gate the GEMM on both queues' entries,
            # so both come first in program order
            sig = (sig, inp.own_push.dma_map(region, near, op="store", after=1,
                                             executor=DMA0))
        inp.mark(region, sig)
    # this node's chunks first (resident at their holders from the start), then each
    # other node's: the one arriving here first, then those arriving at this node's peers
    chunks = near + [b * g + (local + s) % g for b in range(nodes) if b != node
                     for s in range(g)]
    for c in chunks:
        b, j = divmod(c, g)
        for region in inp.tiles(c):
            if b != node and j == local:  # arrived from the other node: share it
                sig = (amap.track(region, after=1) if not near
                       else amap.flag_map(region, near, inp.flags, after=1) if pull
                       else amap.dma_map(region, near, op="store", after=1))
            elif pull:  # held by node rank j once there: pull it
                flag = ready if b == node else amap.flag_signal(inp.flags, region)
                sig = amap.pull_map(region, node * g + j, flag=flag, executor=DMA0)
            else:  # pushed here by its holder on this node
                sig = amap.track(region, after=1)
            inp.mark(region, sig)
    return inp.plan(op, algorithm, _order(p, [p.rank] + chunks, swizzle), slots)
