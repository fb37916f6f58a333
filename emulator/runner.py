"""Run one configuration (mode) of one collective on this rank: functional and timed."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from collectives.common import Problem
from collectives.plans import build_plan
from devices.dma import DmaEngine
from devices.hbm import KINDS, WIN_INFO, Hbm, Segment
from devices.spec import DeviceSpec
from devices.tracker import Tracker
from emulator.arbitration import Exclusive, policy_for
from emulator.clock import Event, RankClock
from emulator.config import RunConfig
from emulator.costmodel import CostModel
from emulator.custeps import run_steps
from emulator.plan import GemmPhase, StepsPhase
from emulator.producer import DmaTiming, GemmProducer, program_order
from emulator.reference import NP_DTYPE
from emulator import faults, watchdog
from emulator.runtime import abort

STREAMS = ("gemm", "rs", "ag", "a2a")


@dataclass
class RankResult:
    mode: str
    phases: dict[str, tuple[float, float]]  # name -> modelled (start, end) on this rank
    end: float
    result: np.ndarray | None  # the rank's checked output (None: a timing-only run)
    traffic: np.ndarray  # (world, stream, kind) bytes, every rank's HBM
    wall_s: float
    policy: dict = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    wall_events: dict = field(default_factory=dict)


def device_for(spec: DeviceSpec, topology: str) -> DeviceSpec:
    """The device with the run's topology (the preset's unless ``--topology`` says otherwise)."""
    return dataclasses.replace(spec, interconnect=dataclasses.replace(spec.interconnect,
                                                                      topology=topology))


def problem(comm: MPI.Intracomm, cfg: RunConfig, spec: DeviceSpec) -> Problem:
    return Problem(comm.rank, comm.size, cfg.m, cfg.n, cfg.k, device_for(spec, cfg.topology),
                   np.dtype(NP_DTYPE[cfg.dtype]), cfg.split_k)


class _Clocks:
    """The rank's modelled clocks by name: one chained timeline, or one per isolated run."""

    def __init__(self, p: Problem, watchdog_s: float, record: bool):
        self.p, self.watchdog_s, self.record = p, watchdog_s, record
        topo = p.spec.interconnect.topology
        self.switched = topo == "switch"
        self.peers = frozenset({p.left, p.right}) if topo == "ring" else None
        self.by_name: dict[str, RankClock] = {}

    def __getitem__(self, name: str) -> RankClock:
        if name not in self.by_name:
            s = self.p.spec
            self.by_name[name] = RankClock(self.p.rank, s.hbm_bw, s.interconnect.link_bw,
                                           s.dma_engines, self.watchdog_s, self.switched,
                                           self.peers, self.record)
        return self.by_name[name]


class DeviceMemory:
    """The emulated GPU's memory for a whole job: its HBM and its tracker's counters,
    each one window allocated by the first run and reused (re-zeroed) by the next ones,
    as a GPU's DRAM exists before the kernels that use it. Free it at the end of the job."""

    def __init__(self, comm: MPI.Intracomm):
        self.hbm = Segment(comm, WIN_INFO)
        self.tracker = Segment(comm)

    def free(self) -> None:
        self.tracker.free()
        self.hbm.free()


def run_mode(comm: MPI.Intracomm, cfg: RunConfig, spec: DeviceSpec, a: np.ndarray | None,
             b: np.ndarray | None, mode: str, memory: DeviceMemory | None = None) -> RankResult:
    """Run one mode. ``a``/``b`` None: a timing-only run (same protocol, no payload).

    With ``memory`` the run binds the job's device memory (and its result is a view of
    it, valid until the next run); without, it allocates and frees windows of its own."""
    watchdog.post("compute", f"{mode}: building the plan and maps")
    p = problem(comm, cfg, spec)
    plan = build_plan(p, cfg.collective, cfg.algorithm, mode)
    compiled = {id(ph): [m.compile() for m in ph.maps] for ph in plan.phases
                if isinstance(ph, GemmPhase)}  # MapError here, before anything runs
    payload = a is not None
    watchdog.wait_all(comm, f"{mode}: allocation of the HBM and tracker windows", cfg.watchdog_s)
    shapes = {name: tuple(shape) for name, shape, _ in plan.layout}
    given = {"A": a, "B": b}
    whole = [array for name, (array, row) in plan.inputs.items()  # inputs written whole
             if payload and row == 0 and given[name].shape == shapes[array]]
    hbm = Hbm(comm, plan.layout, STREAMS, payload=payload, segment=memory and memory.hbm,
              overwritten=whole)
    tracker = Tracker(comm, plan.slots.total, plan.slots.name, memory and memory.tracker)
    for name, data in (("A", a), ("B", b)):  # inputs are resident before the operation
        if payload:
            array, row = plan.inputs[name]
            hbm.view(array)[row : row + data.shape[0], : data.shape[1]] = data
    cost = CostModel(p.spec, cfg.dtype)
    clocks = _Clocks(p, cfg.watchdog_s, bool(cfg.trace or cfg.record_wall))
    fault_kind, fault_rank = cfg.fault
    lat = p.spec.interconnect.link_latency_s
    times: dict[str, tuple[float, float]] = {}
    policy_info: dict = {}
    wall_events: dict = {}
    watchdog.wait_all(comm, f"{mode}: start", cfg.watchdog_s)
    w0 = time.perf_counter()
    for idx, ph in enumerate(plan.phases):
        if plan.isolated and idx:
            hbm.win.Sync()  # isolated runs: the previous run is over everywhere
            watchdog.wait_all(comm, f"{mode}: end of {plan.phases[idx - 1].name}", cfg.watchdog_s)
        clock = clocks[ph.clock]
        start = max([clock.cu.free_at] + [times[n][1] for n in ph.after])
        if isinstance(ph, StepsPhase):
            if ph.credit is not None:
                for r in ph.credit.notify:
                    tracker.signal(r, [int(ph.credit.region.slots[0])], [1], start + lat)
                watchdog.post("compute", f"{mode} {ph.name}: waits for credit "
                              f"{ph.credit.region.name}", waiting=True)
                start = max(start, tracker.wait(ph.credit.region, cfg.watchdog_s))
            watchdog.post("compute", f"{mode} {ph.name}: CU kernel")
            end = run_steps(ph.steps, hbm, tracker, clock, cost, cfg.watchdog_s, start)
        else:
            mine = fault_rank == p.rank and not any(  # the mode's first GEMM phase
                isinstance(q, GemmPhase) for q in plan.phases[:idx])
            end, policy, walls = _run_gemm(ph, compiled[id(ph)], mode, hbm, tracker, clock,
                                           cost, start, fault_kind if mine else "", cfg)
            if ph.fused:
                policy_info = policy.describe()
                wall_events = walls
        clock.cu.free_at = max(clock.cu.free_at, end)  # the next kernel starts after this one
        times[ph.name] = (start, end)
    hbm.win.Sync()
    watchdog.wait_all(comm, f"{mode}: end", cfg.watchdog_s)
    wall = time.perf_counter() - w0
    result = None
    if payload:
        parts = [hbm.view(buf, region) for buf, region in plan.result]
        result = parts[0] if len(parts) == 1 and memory else np.concatenate(parts, axis=0)
    traffic = hbm.traffic_by_rank()
    events = [ev for c in clocks.by_name.values() for ev in c.events]
    tracker.free()
    hbm.free()
    return RankResult(mode, times, max(e for _, e in times.values()), result, traffic, wall,
                      policy_info, events, wall_events if cfg.record_wall else {})


def _run_gemm(ph: GemmPhase, compiled, mode: str, hbm: Hbm, tracker: Tracker,
              clock: RankClock, cost: CostModel, start: float, fault_kind: str,
              cfg: RunConfig):
    clock.new_program()
    clock.cu.free_at = start
    routes = compiled[0].routes
    commands = [c for cm in compiled for c in cm.commands]
    incoming = {k: v for cm in compiled for k, v in cm.incoming.items()}
    policy = policy_for(mode) if ph.fused else Exclusive()
    stage_index, commands = program_order(ph.job, commands, policy.lookahead, tracker.nslots)
    gates = {c.trigger.name: c.trigger for c in commands}
    stage_faults = ("raise", "kill", "stall")  # in stage 1 (stage 0 with a single stage)
    fault = ((fault_kind, min(1, len(stage_index) - 1)) if fault_kind in stage_faults
             else ("", -1))
    producer = GemmProducer(hbm, tracker, clock, cost, ph.job, routes, stage_index, ph.stream,
                            policy, gates, fault, f"{mode} {ph.name}")
    for slots, elems in ph.preload:  # resident inputs: written before the phase starts
        producer.slot_done[slots] = start
        tracker.signal(hbm.rank, slots, elems, start)
    if not commands:
        return producer.run(), policy, {}
    timing = DmaTiming(clock, cost, incoming, producer, policy)
    dma = DmaEngine(hbm, tracker, commands, timing, cfg.watchdog_s,
                    on_error=lambda exc: abort(exc, "DMA engine: "), stream=ph.stream,
                    fault=faults.for_dma(fault_kind, hbm.rank, mode),
                    status=lambda label, waiting: watchdog.post("dma", f"{mode} {label}",
                                                                waiting))
    dma.start()
    gemm_end = producer.run()
    watchdog.post("compute", f"{mode} {ph.name}: waits for its DMA engine", waiting=True)
    dma.join()
    walls = {"stages": producer.wall_events, "dma": dma.wall_events}
    return max(gemm_end, timing.last_end), policy, walls


def categories(traffic: np.ndarray) -> dict[str, int]:
    """DRAM bytes by T3's categories (GEMM, RS, AG reads and writes; plus A2A) from
    (stream, kind) counts of one HBM (or a sum); updates count as writes."""
    out = {}
    for s, stream in enumerate(STREAMS):
        out[f"{stream}_read"] = int(traffic[s, KINDS.index("read")])
        out[f"{stream}_write"] = int(traffic[s, KINDS.index("write")]
                                     + traffic[s, KINDS.index("update")])
    return out
