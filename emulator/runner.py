"""Run one configuration (mode) of one collective on this rank: functional and timed."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from collectives.ring import ChunkSlots, RingContext, ag_steps, sequential_rs_steps, t3_rs_map
from devices.dma import DmaEngine
from devices.hbm import KINDS, Hbm
from devices.spec import DeviceSpec
from devices.tracker import Tracker
from emulator.addrmap import AddressMap, tile_grid
from emulator.clock import Event, RankClock
from emulator.config import RunConfig
from emulator.costmodel import DTYPE_BYTES, CostModel
from emulator.custeps import run_steps
from emulator.producer import DmaTiming, GemmJob, GemmProducer, program_order
from emulator.reference import NP_DTYPE
from emulator.runtime import abort

STREAMS = ("gemm", "rs", "ag")


@dataclass
class RankResult:
    mode: str
    gemm_end: float
    rs_end: float
    ag_end: float
    result: np.ndarray  # the rank's checked output (own chunk for RS, all for AR)
    traffic: np.ndarray  # (world, stream, kind) bytes, every rank's HBM
    flops: float
    wall_s: float
    events: list[Event] = field(default_factory=list)
    wall_events: dict = field(default_factory=dict)


def _plan(mode: str, ctx: RingContext, spec: DeviceSpec) -> tuple[AddressMap, np.ndarray]:
    if mode == "t3":
        return t3_rs_map(ctx, spec.wg_tile_m, spec.wg_tile_n)
    # the baseline GEMM knows nothing of chunks: a plain tile grid, row-major WG order
    tiles = tile_grid([(0, ctx.rows)], ctx.cols, spec.wg_tile_m, spec.wg_tile_n)
    return AddressMap(ctx.out, tiles, ctx.rank, ctx.world, "store"), np.arange(len(tiles))


def run_mode(comm: MPI.Intracomm, cfg: RunConfig, spec: DeviceSpec, a: np.ndarray,
             b: np.ndarray, mode: str) -> RankResult:
    world, rank = comm.size, comm.rank
    m, k = a.shape
    ncols = b.shape[1]
    dt = NP_DTYPE[cfg.dtype]
    e = DTYPE_BYTES[cfg.dtype]
    ctx = RingContext(rank, world, m, ncols)
    amap, order = _plan(mode, ctx, spec)
    compiled = amap.compile()
    slots = ChunkSlots(len(amap.tiles), world)
    layout = [("A", (m, k), dt), ("B", (k, ncols), dt), ("C", (m, ncols), dt)]
    if mode == "sequential" and world > 1:
        layout.append(("R", (m, ncols), dt))
    hbm = Hbm(comm, layout, STREAMS)
    tracker = Tracker(comm, slots.total, slots.name)
    try:
        hbm.view("A")[:] = a  # inputs are resident before the operation starts
        hbm.view("B")[:] = b
        clock = RankClock(rank, spec.hbm_bw, spec.interconnect.link_bw, spec.dma_engines,
                          cfg.watchdog_s)
        cost = CostModel(spec, cfg.dtype)
        job = GemmJob("A", "B", "C", k, order, spec.wgs_per_stage)
        stage_index, commands = program_order(job, compiled)
        fault_stage = -1
        if cfg.inject_fault and int(cfg.inject_fault.split("@")[1]) == rank:
            fault_stage = min(1, len(stage_index) - 1)
        producer = GemmProducer(hbm, tracker, clock, cost, job, amap.tiles, compiled.routes,
                                stage_index, cfg.watchdog_s, fault_stage)
        comm.Barrier()
        w0 = time.perf_counter()
        dma = None
        if mode == "t3":
            timing = DmaTiming(clock, cost, compiled, producer, e)
            dma = DmaEngine(hbm, tracker, commands, timing, cfg.watchdog_s,
                            on_error=lambda exc: abort(exc, "DMA engine: "))
            dma.start()
            gemm_end = producer.run()
            dma.join()
            rs_end = max(gemm_end, timing.last_end)
        else:
            gemm_end = producer.run()
            rs_end = run_steps(sequential_rs_steps(ctx, slots, e), hbm, tracker, clock, cost,
                               cfg.watchdog_s, gemm_end)
        ag_end = rs_end
        if cfg.collective == "ar" and world > 1:
            lat = spec.interconnect.link_latency_s
            tracker.signal(ctx.right, [slots.ag_credit], [1], rs_end + lat)
            ag_end = run_steps(ag_steps(ctx, slots, e), hbm, tracker, clock, cost,
                               cfg.watchdog_s, rs_end)
        hbm.win.Sync()
        comm.Barrier()
        wall = time.perf_counter() - w0
        c = hbm.view("C")
        if cfg.collective == "ar":
            result = c.copy()
        else:
            r0, r1 = ctx.chunk(rank)
            result = c[r0:r1].copy()
        traffic = hbm.traffic_by_rank()
        flops = 2.0 * m * ncols * k
        wall_events = {}
        if cfg.record_wall:
            wall_events = {"stages": producer.wall_events,
                           "dma": dma.wall_events if dma is not None else []}
    except BaseException:
        # the job aborts; freeing the windows here would pull memory from under the DMA thread
        raise
    tracker.free()
    hbm.free()
    return RankResult(mode, gemm_end, rs_end, ag_end, result, traffic, flops, wall,
                      clock.events, wall_events)


def categories(traffic: np.ndarray) -> dict[str, int]:
    """T3's six DRAM categories from (stream, kind) counts of one HBM (or a sum)."""
    out = {}
    for s, stream in enumerate(STREAMS):
        out[f"{stream}_read"] = int(traffic[s, KINDS.index("read")])
        out[f"{stream}_write"] = int(traffic[s, KINDS.index("write")]
                                     + traffic[s, KINDS.index("update")])
    return out
