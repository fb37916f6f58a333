"""A configuration of one's own, outside ``collectives/``: an all-gather feeding a GEMM
by *pulls*, with a gate per WG, on every DMA engine of the device.

    t3emu run --configs run/configs/pull_ag_gemm.py --collective ag+gemm \
              --topology full-mesh --mode sequential,pull-ag-gemm

Each rank's own input rows are resident when the kernel starts; a DMA engine
writes one flag per own tile into every peer (a stream write, no data). Each
peer tile is pulled by this rank's DMA engines (tile j on engine j mod E) as
soon as its flag arrives, and every GEMM WG waits only for the input tile its
rows read, so a stage's WGs start as their own rows land instead of all at once.
"""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from devices.commands import Executor
from emulator.engine.addrmap import AddressMap, TileSpace
from emulator.engine.plan import KernelPhase, Plan, Slots
from emulator.engine.registry import REGISTRY, Configuration, Operation


def build(p: Problem, op: Operation, algorithm: str) -> Plan:
    slots = Slots()
    layout, inputs, result = op.parts.layout(p, algorithm)
    n, i = p.world, p.rank
    aspace = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
    flags = TileSpace("AG", aspace.tiles, slots.alloc("AG flag", len(aspace)))
    own = aspace.tiles_in(p.chunk_region(i, p.k))
    writes = np.zeros(len(aspace), np.int64)
    writes[own] = 1  # resident before the kernel: one write each
    amap = AddressMap(aspace, i, n, "store", writes, incoming_op="store")
    arrived = {}  # input tile region -> the signal WGs reading it wait for
    for t in own:
        region = aspace.region(t)
        arrived[region] = (amap.flag_map(region, p.others, flags) if n > 1
                           else amap.track(region))
    engines = p.spec.dma_engines
    j = 0
    for c in p.others:  # ring order after this rank (Flux's order on NVLink)
        for t in aspace.tiles_in(p.chunk_region(c, p.k)):
            region = aspace.region(t)
            arrived[region] = amap.pull_map(region, c, amap.flag_signal(flags, region),
                                            executor=Executor("dma", j % engines))
            j += 1
    cspace = p.space(slots, "C", p.chunks)
    order = [t for c in [i] + p.others for t in cspace.tiles_in(p.chunk_region(c))]
    kernel = p.gemm(cspace, order, a="AG")
    kernel = kernel.with_gates({w: (arrived[(int(r0), int(r1), 0, p.k)],)
                                for w, (r0, r1) in enumerate(kernel.wgs[:, :2])})
    cmap = AddressMap(cspace, i, n, p.producer_op(), kernel.local_writes(), local_ok=True)
    preload = [([aspace.slot(t) for t in own],
                [int((aspace.tiles[t, 1] - aspace.tiles[t, 0]) * p.k) for t in own])]
    phase = KernelPhase("pull+gemm", kernel, [cmap, amap], "ag", fused=True, preload=preload)
    return Plan(layout, inputs, [phase], slots, result, arbitration="round-robin")


def refuses(spec, ranks: int) -> str:
    """Why a job of ``ranks`` GPUs cannot run it ("": it can): it pulls from every peer, so
    every GPU needs a route to every other (a ring links neighbours only)."""
    from emulator.model.topology import NoRoute, Topology

    topo = Topology(spec.interconnect, ranks)
    try:
        for dst in range(1, ranks):
            topo.route(0, dst)
    except NoRoute:
        return (f"it pulls from every peer, so it runs where every GPU reaches every other "
                f"(--topology full-mesh, switch or pcie, or a system of them); this "
                f"{spec.interconnect.topology} of {ranks} GPUs does not")
    return ""


REGISTRY.add_configuration(Configuration(
    "pull-ag-gemm", "AG by DMA pulls on every engine, a gate per GEMM WG (example plugin)",
    "example", build, applies=lambda op: op.name == "ag+gemm", color="#bcbd22",
    refuses=refuses))
