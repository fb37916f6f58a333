"""The producer: a tiled GEMM run as stages of WG tiles, every tile routed through the map.

The producer knows nothing of collectives. It computes a stage of tiles with
the numba kernel, then hands each tile to its route: a local store or update
(signalling the local tracker if the tile is tracked) and/or a fine-grained
remote store or update into a peer's HBM (put-with-signal). Fusion is entirely
in the routes, as in T3.

Also here: the modelled timing of the producer's stages and of the DMA queue
that the map programmed, both reserved through the rank's program order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from devices import kernels
from devices.dma import DmaCommand
from devices.hbm import Hbm
from devices.tracker import Tracker
from emulator.addrmap import CompiledMap, Route
from emulator.clock import RankClock
from emulator.costmodel import CostModel


@dataclass(frozen=True)
class GemmJob:
    a: str  # HBM array names
    b: str
    out: str
    k: int
    order: np.ndarray  # tile ids in WG dispatch order
    stage_size: int  # WG tiles per stage


def stages_of(job: GemmJob) -> list[np.ndarray]:
    return [job.order[i : i + job.stage_size] for i in range(0, len(job.order), job.stage_size)]


def program_order(job: GemmJob, compiled: CompiledMap) -> tuple[list[int], list[DmaCommand]]:
    """Fix the rank's program order: stage s, then the DMA entries its writes complete.

    An entry comes right after the stage that makes its last local write, so the
    traffic it causes is reserved before (and contends with) the next stage.
    Returns each stage's order index and the commands sorted into queue order.
    """
    stage_of_tile = np.full(len(compiled.routes), -1, np.int64)
    stages = stages_of(job)
    for s, ids in enumerate(stages):
        stage_of_tile[ids] = s
    keyed = []
    for i, cmd in enumerate(compiled.commands):
        last = int(stage_of_tile[cmd.trigger.slots].max()) if len(cmd.trigger.slots) else -1
        keyed.append((last if last >= 0 else len(stages), i, cmd))
    keyed.sort(key=lambda x: (x[0], x[1]))
    stage_index, commands, idx = [], [], 0
    pos = 0
    for s in range(len(stages) + 1):
        if s < len(stages):
            stage_index.append(idx)
            idx += 1
        while pos < len(keyed) and keyed[pos][0] == s:
            keyed[pos][2].order = idx
            commands.append(keyed[pos][2])
            idx += 1
            pos += 1
    return stage_index, commands


class GemmProducer:
    def __init__(self, hbm: Hbm, tracker: Tracker, clock: RankClock, cost: CostModel,
                 job: GemmJob, tiles: np.ndarray, routes: list[Route], stage_index: list[int],
                 watchdog_s: float, fault_stage: int = -1):
        self.hbm, self.tracker, self.clock, self.cost = hbm, tracker, clock, cost
        self.job, self.tiles, self.routes = job, tiles, routes
        self.stage_index = stage_index
        self.watchdog_s = watchdog_s
        self.fault_stage = fault_stage
        self.tile_done = np.zeros(len(tiles), np.float64)  # modelled local-write time per tile
        self.wall_events: list[tuple[int, float, float]] = []
        self.end = 0.0

    def _time_stage(self, s: int, ids: np.ndarray) -> tuple[float, dict[int, float]]:
        """Reserve stage ``s`` on the CUs, HBM and links; return its end and link arrivals."""
        clock, cost = self.clock, self.cost
        routes = [self.routes[i] for i in ids]
        sc = cost.stage(self.tiles[ids], self.job.k, [r.local_op for r in routes],
                        [r.remote_rank for r in routes])
        start = clock.cu.free_at
        compute_end = start + sc.compute_s
        read_end = compute_end
        if sc.read_bytes:
            cap = sc.read_bytes / sc.compute_s if sc.compute_s > 0 else None
            read_end = max(compute_end, clock.hbm.reserve(start, sc.read_bytes, cap)[1])
        end = clock.hbm.reserve(read_end, sc.write_cost_bytes)[1]
        arrivals = {}
        lat = cost.spec.interconnect.link_latency_s
        for dst, nbytes in sorted(sc.remote_bytes.items()):
            link_end = clock.link(dst).reserve(read_end, nbytes)[1]
            clock.log(f"link->{dst}", f"stage {s} stores", read_end, link_end, bytes=nbytes)
            arrivals[dst] = link_end + lat
            end = max(end, link_end)
        clock.cu.free_at = end
        clock.log("gemm", f"stage {s}", start, end, tiles=len(ids), flops=sc.flops,
                  read_bytes=sc.read_bytes, write_bytes=sc.write_bytes)
        self.hbm.count(self.hbm.rank, "gemm", "read", int(sc.read_bytes))
        return end, arrivals

    def run(self) -> float:
        job, hbm = self.job, self.hbm
        a, b = hbm.view(job.a), hbm.view(job.b)
        tm = int((self.tiles[:, 1] - self.tiles[:, 0]).max())
        bp = kernels.pack_b(b, self.cost.spec.wg_tile_n)
        buf = np.empty((job.stage_size, tm, bp.shape[2]), np.float32)
        out_dtype = hbm.specs[job.out].dtype
        for s, ids in enumerate(stages_of(job)):
            with self.clock.order.turn(self.stage_index[s], f"GEMM stage {s}"):
                end, arrivals = self._time_stage(s, ids)
            w0 = time.perf_counter()
            if s == self.fault_stage:
                raise RuntimeError(f"injected fault: exception in GEMM stage {s} "
                                   f"on rank {hbm.rank}")
            kernels.gemm_stage(a, bp, self.tiles[ids], buf)
            for j, t in enumerate(ids):
                r0, r1, c0, c1 = (int(x) for x in self.tiles[t])
                tile = buf[j, : r1 - r0, : c1 - c0]
                if out_dtype == np.float16:
                    tile = kernels.f32_to_f16(np.ascontiguousarray(tile))
                self._route(int(t), (r0, r1, c0, c1), tile, end, arrivals)
            self.wall_events.append((s, w0, time.perf_counter()))
        self.end = self.clock.cu.free_at
        return self.end

    def _route(self, t: int, region, tile: np.ndarray, end: float,
               arrivals: dict[int, float]) -> None:
        route, hbm = self.routes[t], self.hbm
        elems = [tile.size]
        if route.local_op != "none":
            self.tile_done[t] = end
            if route.local_op == "update":
                hbm.update(self.job.out, region, tile, "gemm")
            else:
                hbm.store(self.job.out, region, tile, "gemm")
            if route.tracked:
                self.tracker.signal(hbm.rank, [t], elems, 0.0)
        if route.remote_rank >= 0:
            dst = route.remote_rank
            if route.remote_op == "update":
                hbm.update(self.job.out, region, tile, "rs", dst)
            else:
                hbm.store(self.job.out, region, tile, "rs", dst)
            self.tracker.signal(dst, [t], elems, arrivals[dst])


class DmaTiming:
    """Modelled timing of the DMA queue (and of sink entries), in program order."""

    def __init__(self, clock: RankClock, cost: CostModel, compiled: CompiledMap,
                 producer: GemmProducer, elem_bytes: int):
        self.clock, self.cost, self.compiled, self.producer = clock, cost, compiled, producer
        self.e = elem_bytes
        self.complete_at: dict[str, float] = {}
        self.last_end = 0.0

    def __call__(self, cmd: DmaCommand, t_remote: float) -> float:
        clock, cost = self.clock, self.cost
        spec = cost.spec
        name = cmd.trigger.name
        with clock.order.turn(cmd.order, f"DMA entry {name}"):
            t_local = float(self.producer.tile_done[cmd.trigger.slots].max())
            per_elem, op = self.compiled.incoming[name]
            elems = int(cmd.trigger.thresholds.sum() // max(1, cmd.trigger.meta["after"]))
            landed = 0.0
            if per_elem > 0:  # peers' updates land in this HBM from their arrival on
                nbytes = cost.update_cost_bytes(elems * per_elem * self.e, op)
                landed = clock.hbm.reserve(t_remote, nbytes, cost.comm_cap)[1]
                clock.log("hbm", f"{name} remote {op}s land", t_remote, landed)
            done = max(t_local, landed)
            self.complete_at[name] = done
            clock.log("tracker", f"{name} complete", done, done)
            self.last_end = max(self.last_end, done)
            if cmd.src is None:
                return done
            nbytes = elems * self.e
            engine = clock.dma_engine()
            t0 = max(done, engine.free_at) + spec.dma_setup_s
            read_end = clock.hbm.reserve(t0, nbytes, cost.comm_cap)[1]
            link_end = clock.link(cmd.dst_rank).reserve(t0, nbytes)[1]
            end = max(read_end, link_end)
            engine.free_at = end
            self.last_end = max(self.last_end, end)
            clock.log("dma", f"{name} -> {cmd.dst_rank}", t0, end, bytes=nbytes)
            clock.log(f"link->{cmd.dst_rank}", f"dma {name}", t0, link_end, bytes=nbytes)
            return end + spec.interconnect.link_latency_s
