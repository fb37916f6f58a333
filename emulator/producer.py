"""The producer: a tiled GEMM run as stages of WGs, every tile routed through the map.

The producer knows nothing of collectives. It computes a stage of WGs with the
numba kernel, then hands each WG's tile to its route: a local store or update
(signalling the local tracker if the tile is tracked) and/or fine-grained
remote stores or updates into peers' HBM (put-with-signal). A consumer GEMM
may also be *gated*: a stage waits until the tracker has seen the input
regions its WGs read (T3's consumer-side use of the tracker). Fusion is
entirely in the routes and gates, as in T3.

Also here: the modelled timing of the producer's stages and of the DMA queue
that the maps programmed, both reserved through the rank's program order.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from devices.dma import DmaCommand
from devices.hbm import Hbm, join, region_shape
from devices.tracker import TrackedRegion, Tracker
from emulator import faults, watchdog
from emulator.addrmap import Route, TileSpace
from emulator.arbitration import CommWindow, Exclusive
from emulator.clock import RankClock
from emulator.costmodel import CostModel


@dataclass(frozen=True)
class GemmJob:
    a: str  # HBM array names of the inputs
    b: str
    space: TileSpace  # the output buffer's tiles
    wgs: np.ndarray  # (n, 6): r0, r1, c0, c1, k0, k1 of each WG
    wg_tile: np.ndarray  # WG -> output tile id
    order: np.ndarray  # WG ids in dispatch order
    stage_size: int  # WGs per stage
    gates: dict[int, list[str]] = field(default_factory=dict)  # stage -> tracked input regions
    outputs_cached: bool = False  # False: outputs bypass L2 (T3's uncached allocation)

    def stages(self) -> list[np.ndarray]:
        o = self.order
        return [o[i : i + self.stage_size] for i in range(0, len(o), self.stage_size)]

    def local_writes(self) -> np.ndarray:
        """How many WGs write each output tile."""
        return np.bincount(self.wg_tile, minlength=len(self.space)).astype(np.int64)


def make_wgs(space: TileSpace, tile_ids: list[int] | np.ndarray, k: int,
             split: int) -> tuple[np.ndarray, np.ndarray]:
    """WGs for the given tiles, in that order: ``split`` WGs per tile over K slices."""
    bounds = [k * j // split for j in range(split + 1)]
    wgs, wg_tile = [], []
    for t in tile_ids:
        r0, r1, c0, c1 = space.region(t)
        for j in range(split):
            wgs.append((r0, r1, c0, c1, bounds[j], bounds[j + 1]))
            wg_tile.append(int(t))
    return np.array(wgs, np.int64).reshape(-1, 6), np.array(wg_tile, np.int64)


def program_order(job: GemmJob, commands: list[DmaCommand], lookahead: int,
                  nslots: int) -> tuple[list[int], list[DmaCommand]]:
    """Fix the rank's program order of GEMM stages and DMA queue entries.

    Stage s sits at position s. An entry that gates stage g comes just before
    it; an entry whose region the producer writes comes after the stage of its
    last local write plus ``lookahead`` stages (the arbitration policy's); any
    other entry comes after the last stage. Returns each stage's order index
    and the commands in queue order (with ``order`` and ``compute_after`` set).
    """
    stages = job.stages()
    slot_stage = np.full(nslots, -1, np.int64)
    for s, ids in enumerate(stages):
        slots = job.space.slot_base + job.wg_tile[ids]
        slot_stage[slots] = np.maximum(slot_stage[slots], s)
    gate_stage: dict[str, int] = {}
    for g in sorted(job.gates):
        for name in job.gates[g]:
            gate_stage.setdefault(name, g)
    last = len(stages) - 1
    keyed = []
    for i, cmd in enumerate(commands):
        name = cmd.trigger.name
        written = int(slot_stage[cmd.trigger.slots].max()) if len(cmd.trigger.slots) else -1
        if name in gate_stage:
            pos = gate_stage[name] - 0.5
        elif written >= 0:
            pos = min(written + lookahead, last) + 0.5
        else:
            pos = last + 0.5
        keyed.append((pos, i, cmd))
    keyed.sort(key=lambda x: (x[0], x[1]))
    items = sorted([(float(s), -1, None) for s in range(len(stages))]
                   + [(p, i, c) for p, i, c in keyed], key=lambda x: (x[0], x[1]))
    stage_index, ordered = [], []
    for idx, (pos, _, cmd) in enumerate(items):
        if cmd is None:
            stage_index.append(idx)
        else:
            cmd.order = idx
            cmd.compute_after = pos < last
            ordered.append(cmd)
    return stage_index, ordered


class GemmProducer:
    def __init__(self, hbm: Hbm, tracker: Tracker, clock: RankClock, cost: CostModel,
                 job: GemmJob, routes: dict[int, Route], stage_index: list[int],
                 stream: str, policy=None, gate_regions: dict[str, TrackedRegion] | None = None,
                 fault: tuple[str, int] = ("", -1), label: str = "GEMM"):
        self.hbm, self.tracker, self.clock, self.cost = hbm, tracker, clock, cost
        self.job, self.routes = job, routes
        self.stage_index = stage_index
        self.stream = stream
        self.policy = policy or Exclusive()
        self.gate_regions = gate_regions or {}
        self.fault_kind, self.fault_stage = fault
        self.label = label
        self.slot_done = np.zeros(tracker.nslots, np.float64)  # modelled local-write times
        self.complete_at: dict[str, float] = {}  # filled by the DMA timing (gates)
        self.wall_events: list[tuple[int, float, float]] = []
        self.start = clock.cu.free_at
        self.end = self.start

    def _time_stage(self, s: int, ids: np.ndarray) -> tuple[float, dict[int, float]]:
        """Reserve stage ``s`` on the CUs, HBM and links; return its end and link arrivals."""
        clock, cost, job = self.clock, self.cost, self.job
        routes = [self.routes[int(job.wg_tile[w])] for w in ids]
        sc = cost.stage(job.wgs[ids], [r.local_op for r in routes],
                        [[t.rank for t in r.targets] for r in routes], self.hbm.rank,
                        job.outputs_cached)
        start = clock.cu.free_at
        for name in job.gates.get(s, []):
            start = max(start, self.complete_at[name])
        compute_end = start + sc.compute_s
        read_end = compute_end
        if sc.read_bytes:
            cap = sc.read_bytes / sc.compute_s if sc.compute_s > 0 else None
            read_end = max(compute_end, clock.hbm.reserve(start, sc.read_bytes, cap)[1])
        end = clock.hbm.reserve(read_end, sc.write_cost_bytes)[1]
        arrivals = {self.hbm.rank: end}
        lat = cost.spec.interconnect.link_latency_s
        for dst, nbytes in sorted(sc.remote_bytes.items()):
            link_end = clock.link(dst).reserve(read_end, nbytes)[1]
            clock.log(f"link->{dst}", f"stage {s} stores", read_end, link_end, bytes=nbytes)
            arrivals[dst] = link_end + lat
            end = max(end, link_end)
        if s == 0 and end > start:
            self.policy.observe_first_stage((sc.read_bytes + sc.write_cost_bytes)
                                            / ((end - start) * cost.spec.hbm_bw))
        clock.cu.free_at = end
        clock.log("gemm", f"stage {s}", start, end, wgs=len(ids), flops=sc.flops,
                  read_bytes=sc.read_bytes, write_bytes=sc.write_bytes)
        self.hbm.count(self.hbm.rank, "gemm", "read", int(sc.read_bytes))
        return end, arrivals

    def run(self) -> float:
        job, hbm = self.job, self.hbm
        kernels = canvas = buf = a32 = b32 = None
        if hbm.payload:
            from devices import kernels  # numba: only runs that compute import it

            a = hbm.view(job.a)
            a32 = a if a.dtype == np.float32 else np.empty(a.shape, np.float32)
            b32 = kernels.widen(hbm.view(job.b))
            if self._whole_k(a.shape[1]):  # WGs own their tiles: compute in place
                canvas = _workspace(hbm.specs[job.space.buffer].shape)
            else:  # split-K: partial tiles overlap, one buffer per WG
                tm = int((job.wgs[:, 1] - job.wgs[:, 0]).max())
                tn = int((job.wgs[:, 3] - job.wgs[:, 2]).max())
                buf = np.empty((job.stage_size, tm, tn), np.float32)
        nstages = len(self.stage_index)
        for s, ids in enumerate(job.stages()):
            where = f"{self.label} GEMM stage {s}/{nstages}"
            for name in job.gates.get(s, []):  # the tracker releases the WGs that need it
                watchdog.post("compute", f"{where} waits for {name}", waiting=True)
                self.tracker.wait(self.gate_regions[name], self.clock.watchdog_s)
            watchdog.post("compute", where)
            w0 = time.perf_counter()
            _mark_first_stage()
            if s == self.fault_stage:
                faults.in_stage(self.fault_kind, where, hbm.rank)
            wgs = job.wgs[ids]
            if hbm.payload:  # the arithmetic first: it needs no modelled time
                if a32 is not a:  # fp16 A: widen the rows this stage reads, as it reads them
                    for r0, r1 in {(int(r[0]), int(r[1])) for r in wgs}:
                        a32[r0:r1] = kernels.widen(a[r0:r1])
                if canvas is not None:
                    kernels.gemm_blocks(a32, b32, wgs, canvas)
                else:
                    kernels.gemm_stage(a32, b32, wgs, buf)
            watchdog.post("compute", f"{where}: its turn in program order", waiting=True)
            with self.clock.order.turn(self.stage_index[s], f"GEMM stage {s}"):
                end, arrivals = self._time_stage(s, ids)
            watchdog.post("compute", f"{where}: writes its tiles")
            writes = _Writes(hbm, canvas, buf, kernels, hbm.specs[job.space.buffer].shape[1])
            signals: dict[tuple[int, float], dict[int, int]] = {}
            for j, w in enumerate(ids):
                region = tuple(int(x) for x in wgs[j, :4])
                self._route(int(job.wg_tile[w]), region, j, end, arrivals, signals, writes)
            writes.flush()
            for (rank, t_arrival), counts in signals.items():  # one signal per destination
                self.tracker.signal(rank, list(counts), list(counts.values()), t_arrival)
            self.wall_events.append((s, w0, time.perf_counter()))
        self.end = self.clock.cu.free_at
        return self.end

    def _whole_k(self, k: int) -> bool:
        wgs = self.job.wgs
        return bool(((wgs[:, 4] == 0) & (wgs[:, 5] == k)).all()) if len(wgs) else True

    def _route(self, t: int, region, j: int, end: float, arrivals: dict[int, float],
               signals: dict, writes: _Writes) -> None:
        """Write WG ``j``'s tile where its route says; add its tracker signals to ``signals``
        ((rank, arrival) -> {slot: element-updates}), sent once the stage's tiles are out."""
        route, hbm = self.routes[t], self.hbm
        elems = (region[1] - region[0]) * (region[3] - region[2])

        def signal(rank: int, slot: int, t_arrival: float) -> None:
            counts = signals.setdefault((rank, t_arrival), {})
            counts[slot] = counts.get(slot, 0) + elems

        if route.local_op != "none":
            writes.add(hbm.rank, self.job.space.buffer, route.local_op, "gemm", region, region, j)
            if route.slot >= 0:
                self.slot_done[route.slot] = max(self.slot_done[route.slot], end)
                signal(hbm.rank, route.slot, 0.0)
        for tg in route.targets:
            stream = "gemm" if tg.rank == hbm.rank else self.stream
            writes.add(tg.rank, tg.buffer, tg.op, stream, tg.region, region, j)
            signal(tg.rank, tg.slot, arrivals[tg.rank])


FIRST_STAGE_UNIX: float | None = None  # when this process began its first GEMM stage


def _mark_first_stage() -> None:
    global FIRST_STAGE_UNIX
    if FIRST_STAGE_UNIX is None:
        FIRST_STAGE_UNIX = time.time()


_WORKSPACE: dict[tuple[int, int], np.ndarray] = {}


def _workspace(shape: tuple[int, int]) -> np.ndarray:
    """An fp32 output-shaped canvas the GEMM stages compute into, kept for the next run."""
    if shape not in _WORKSPACE:
        _WORKSPACE.clear()
        _WORKSPACE[shape] = np.empty(shape, np.float32)
    return _WORKSPACE[shape]


class _Writes:
    """A stage's tile writes, coalesced: tiles that go side by side to one destination
    array (same rank, op and stream) from side-by-side WG outputs are one store or update
    of their union, as a GPU's write-combining merges a row of WGs' lines into one
    stream. Bytes and tracker signals are per tile either way; only the number of MPI
    operations changes."""

    def __init__(self, hbm: Hbm, canvas: np.ndarray | None, buf: np.ndarray | None, kernels,
                 src_width: int):
        self.hbm, self.canvas, self.buf, self.kernels = hbm, canvas, buf, kernels
        self.src_width = src_width  # of the output buffer the WG regions (and canvas) index
        self.pending: dict[tuple, list] = {}

    def add(self, rank: int, buffer: str, op: str, stream: str, dst, src, j: int) -> None:
        key = (rank, buffer, op, stream)
        cur = self.pending.get(key)
        if cur is not None and self.buf is None:  # WG outputs side by side in the canvas
            to = join(cur[0], dst, self.hbm.specs[buffer].shape[1])
            frm = join(cur[1], src, self.src_width)
            if to and frm and region_shape(to) == region_shape(frm):
                cur[0], cur[1] = to, frm
                return
        if cur is not None:
            self._write(key, cur)
        self.pending[key] = [dst, src, j]

    def flush(self) -> None:
        for key, cur in self.pending.items():
            self._write(key, cur)
        self.pending.clear()

    def _write(self, key: tuple, cur: list) -> None:
        rank, buffer, op, stream = key
        dst, src, j = cur
        data = None  # timing-only: the same writes, no data
        if self.canvas is not None:
            data = self.canvas[src[0] : src[1], src[2] : src[3]]
        elif self.buf is not None:
            data = self.buf[j, : src[1] - src[0], : src[3] - src[2]]
        if data is not None and self.hbm.specs[buffer].dtype == np.float16:
            data = self.kernels.f32_to_f16(np.ascontiguousarray(data))
        if op == "update":
            self.hbm.update(buffer, dst, data, stream, rank)
        else:
            self.hbm.store(buffer, dst, data, stream, rank)


class DmaTiming:
    """Modelled timing of the DMA queue (and of sink entries), in program order."""

    def __init__(self, clock: RankClock, cost: CostModel, incoming: dict[str, tuple[int, str]],
                 producer: GemmProducer, policy):
        self.clock, self.cost, self.incoming, self.producer = clock, cost, incoming, producer
        self.policy = policy
        self.complete_at = producer.complete_at
        self.last_end = 0.0

    def __call__(self, cmd: DmaCommand, t_remote: float) -> float:
        clock, cost = self.clock, self.cost
        spec = cost.spec
        name = cmd.trigger.name
        e = cost.e
        watchdog.post("dma", f"DMA entry {name}: its turn in program order", waiting=True)
        with clock.order.turn(cmd.order, f"DMA entry {name}"):
            window = CommWindow(cmd.compute_after)
            elems = int(cmd.trigger.thresholds.sum() // max(1, cmd.trigger.meta["after"]))
            if name not in self.complete_at:  # the first command of a trigger sees it land
                t_local = float(self.producer.slot_done[cmd.trigger.slots].max())
                per_elem, op = self.incoming[name]
                landed = 0.0
                if per_elem > 0:  # peers' writes land in this HBM from their arrival on
                    nbytes = elems * per_elem * e
                    t_in = clock.receive(t_remote, nbytes)
                    landed = max(t_in, self.policy.comm(
                        clock.hbm, clock.streamed_from(t_in, nbytes),
                        cost.update_cost_bytes(nbytes, op), window))
                    clock.log("hbm", f"{name} remote {op}s land", t_remote, landed)
                done = max(t_local, landed)
                self.complete_at[name] = done
                clock.log("tracker", f"{name} complete", done, done)
                self.last_end = max(self.last_end, done)
            done = self.complete_at[name]
            if cmd.src is None:
                return done
            nbytes = elems * e
            engine = clock.dma_engine()
            t0 = max(done, engine.free_at) + spec.dma_setup_s
            read_end = self.policy.comm(clock.hbm, t0, nbytes, window)
            link_end = clock.link(cmd.dst_rank).reserve(t0, nbytes)[1]
            end = max(read_end, link_end)
            engine.free_at = end
            self.last_end = max(self.last_end, end)
            clock.log("dma", f"{name} -> {cmd.dst_rank}", t0, end, bytes=nbytes)
            clock.log(f"link->{cmd.dst_rank}", f"dma {name}", t0, link_end, bytes=nbytes)
            return end + spec.interconnect.link_latency_s
