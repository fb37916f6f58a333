"""Run one plan on this rank: functionally and in modelled time.

The runner is the engine's one entry point: it binds the device memory, writes
the inputs, runs the plan's phases in order (kernels with their executors, CU
kernels), and returns the rank's modelled phase windows, traffic and result.
It knows no operation or configuration by name (``collectives`` builds plans,
``emulator.app`` picks them).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np
from mpi4py import MPI

from devices.dma import DmaEngine
from devices.hbm import KINDS, WIN_INFO, Hbm, Segment
from devices.spec import DeviceSpec
from devices.tracker import Doorbell, Tracker
from emulator.engine.executors import ExecutorTiming
from emulator.engine.cu_side import CuSide
from emulator.engine.launch import KernelRunner, first_stage_load
from emulator.engine.plan import KernelPhase, Plan, StepsPhase
from emulator.engine.program import program_order
from emulator.engine.steps import run_steps
from emulator.model.arbitration import Alone, policy_named
from emulator.model.clock import Event, RankClock
from emulator.model.topology import Topology
from emulator.model.cost import CostModel
from emulator.runtime import faults, watchdog
from emulator.runtime.process import abort, note_shm

STREAMS = ("gemm", "rs", "ag", "a2a")


@dataclass(frozen=True)
class RunOptions:
    dtype: str  # "fp16" or "fp32": the stored element type
    watchdog_s: float = 60.0  # not a parameter: the host's watchdog
    record: bool = False  # keep the modelled event log (traces, timeline tests)
    record_wall: bool = False  # keep wall-clock stage and queue events too
    fault: tuple[str, int] = ("", -1)  # --inject-fault (kind, rank)
    pattern: str = "direct"  # the collective's traffic ("ring" or "direct"): shared ports


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
    profile: dict = field(default_factory=dict)  # rank 0: its first kernel's stage profile
    alone: tuple[str, ...] = ()  # phases that run the producer alone (not fused)
    choice: dict = field(default_factory=dict)  # a search configuration: what it chose
    same_as: str = ""  # a heuristic's timing-only run taken from the job's run of its pick
    library: dict = field(default_factory=dict)  # phase -> the library's choice for it
    gemm_kernel: dict | None = None  # the GEMM kernel its tiled GEMMs run (None: none)
    kernel_end: float = 0.0  # when its last kernel ended (a fused operator's kernel ends
    # when its exit polls have seen every incoming flag; executors may still be sending)
    isolated: bool = False  # its phases are separate isolated runs (ideal configurations)


class _Clocks:
    """The rank's modelled clocks by name: one chained timeline, or one per isolated run."""

    def __init__(self, rank: int, topology: Topology, spec: DeviceSpec, watchdog_s: float,
                 record: bool):
        self.rank, self.spec, self.watchdog_s, self.record = rank, spec, watchdog_s, record
        self.topology = topology
        self.by_name: dict[str, RankClock] = {}

    def __getitem__(self, name: str) -> RankClock:
        if name not in self.by_name:
            s = self.spec
            self.by_name[name] = RankClock(self.rank, s.hbm_bw, self.topology, s.dma_engines,
                                           self.watchdog_s, self.record, s.nics,
                                           s.dram, log_dram=self.rank == 0)
        return self.by_name[name]


class DeviceMemory:
    """The emulated GPU's memory for a whole job: its HBM and its tracker's counters,
    each one window allocated by the first run and reused (re-zeroed) by the next ones,
    as a GPU's DRAM exists before the kernels that use it; and the tracker's doorbell.
    Free it at the end of the job."""

    def __init__(self, comm: MPI.Intracomm):
        self.hbm = Segment(comm, WIN_INFO)
        self.tracker = Segment(comm)
        self.bell = Doorbell(comm)

    def free(self) -> None:
        self.bell.close()
        self.tracker.free()
        self.hbm.free()


def run_plan(comm: MPI.Intracomm, plan: Plan, spec: DeviceSpec, mode: str,
             inputs: dict[str, np.ndarray] | None, opts: RunOptions,
             memory: DeviceMemory | None = None) -> RankResult:
    """Run ``plan`` (configuration ``mode``). ``inputs`` (name -> array, placed as
    ``plan.inputs`` says) None: a timing-only run (same protocol, no payload).

    With ``memory`` the run binds the job's device memory (and its result is a view of
    it, valid until the next run); without, it allocates and frees windows of its own."""
    rank = comm.rank
    compiled = {id(ph): [m.compile() for m in ph.maps] for ph in plan.phases
                if isinstance(ph, KernelPhase)}  # MapError here, before anything runs
    payload = inputs is not None
    watchdog.wait_all(comm, f"{mode}: allocation of the HBM and tracker windows", opts.watchdog_s)
    shapes = {name: tuple(shape) for name, shape, _ in plan.layout}
    whole = [array for name, (array, row) in plan.inputs.items()  # inputs written whole
             if payload and row == 0 and inputs[name].shape == shapes[array]]
    hbm = Hbm(comm, plan.layout, STREAMS, payload=payload, segment=memory and memory.hbm,
              overwritten=whole)
    topology = Topology.of(spec, comm.size, plan.pattern or opts.pattern)
    tracker = Tracker(comm, plan.slots.total, plan.slots.name, memory and memory.tracker,
                      memory and memory.bell,  # (which peers' updates cross the network)
                      far=[topology.crosses_network(rank, r) for r in range(comm.size)])
    note_shm()  # the windows' files (new when a window grew), for the launcher's clean-up
    if payload:  # inputs are resident before the operation
        for name, (array, row) in plan.inputs.items():
            data = inputs[name]
            hbm.view(array)[row : row + data.shape[0], : data.shape[1]] = data
    cost = CostModel(spec, opts.dtype)
    clocks = _Clocks(rank, topology, spec, opts.watchdog_s, opts.record or opts.record_wall)
    fault_kind, fault_rank = opts.fault
    times: dict[str, tuple[float, float]] = {}
    ready = 0.0  # when the rank's last kernel ended (its executors may still be sending)
    policy_info: dict = {}
    wall_events: dict = {}
    profile: dict = {}
    watchdog.wait_all(comm, f"{mode}: start", opts.watchdog_s)
    w0 = time.perf_counter()
    for idx, ph in enumerate(plan.phases):
        if plan.isolated and idx:
            hbm.win.Sync()  # isolated runs: the previous run is over everywhere
            watchdog.wait_all(comm, f"{mode}: end of {plan.phases[idx - 1].name}", opts.watchdog_s)
        clock = clocks[ph.clock]
        start = max([clock.cu.free_at] + [times[n][1] for n in ph.after])
        sync = ph.sync_launches * spec.launch_s + (
            clock.latency(ph.sync_peer) if ph.sync_peer >= 0 else 0.0)
        for sig in ph.waits:  # a launch that waits on signals (a stream wait)
            watchdog.post("compute", f"{mode} {ph.name}: waits for {sig.name}", waiting=True)
            start = max(start, tracker.wait(sig, opts.watchdog_s) + sync)
        launch = spec.launch_s if getattr(ph, "launch", True) else 0.0
        if launch:
            clock.log("launch", ph.name, start, start + launch)
        start += launch  # every kernel launch pays the device's launch cost
        if isinstance(ph, StepsPhase):
            if ph.credit is not None:
                # a library's one all-reduce kernel goes on to its AG half with no round
                # trip of its own: its per-step latency (the protocol's hwLat, flow
                # control in the data's flags) is charged on every step already
                for r in ph.credit.notify:
                    lat = 0.0 if ph.library is not None else clock.latency(r)
                    tracker.signal(r, [int(ph.credit.region.slots[0])], [1], start + lat)
                watchdog.post("compute", f"{mode} {ph.name}: waits for credit "
                              f"{ph.credit.region.name}", waiting=True)
                start = max(start, tracker.wait(ph.credit.region, opts.watchdog_s))
            watchdog.post("compute", f"{mode} {ph.name}: CU kernel")
            end = run_steps(ph.steps, hbm, tracker, clock, cost, opts.watchdog_s, start,
                            ph.library, fixed=ph.launch)
        else:
            mine = fault_rank == rank and not any(  # the mode's first kernel phase
                isinstance(q, KernelPhase) for q in plan.phases[:idx])
            end, policy, walls, stages, kernel_end, executors_end = _run_kernel(
                ph, compiled[id(ph)], mode, hbm, tracker, clock, cost, start,
                fault_kind if mine else "", opts, plan.arbitration)
            if ph.fused:
                policy_info = policy.describe()
                wall_events = walls
            if getattr(ph, "parts", False):
                times[f"{ph.name}.kernel"] = (start, kernel_end)
                times[f"{ph.name}.executors"] = (start, executors_end)
            if not profile and rank == 0 and not plan.isolated:
                profile = stage_profile(clock, ph.name, start, end, stages)
        clock.cu.free_at = max(clock.cu.free_at, end)  # the next kernel starts after this one
        if ph.name in times:  # phases of one name (a kernel per table): one window
            start = min(start, times[ph.name][0])
            end = max(end, times[ph.name][1])
        times[ph.name] = (start, end)
        ready = max(ready, end if isinstance(ph, StepsPhase) else kernel_end)
    hbm.win.Sync()
    watchdog.wait_all(comm, f"{mode}: end", opts.watchdog_s)
    wall = time.perf_counter() - w0
    result = None
    if payload:
        parts = [hbm.view(buf, region) for buf, region in plan.result]
        result = parts[0] if len(parts) == 1 and memory else np.concatenate(parts, axis=0)
    traffic = hbm.traffic_by_rank()
    events = [ev for c in clocks.by_name.values()  # the DRAM's counters: traces only
              for ev in c.events + (c.hbm.counters() if opts.record else [])]
    tracker.free()
    hbm.free()
    return RankResult(mode, times, max(e for _, e in times.values()), result, traffic, wall,
                      policy_info, events, wall_events if opts.record_wall else {}, profile,
                      tuple(dict.fromkeys(ph.name for ph in plan.phases
                                          if isinstance(ph, KernelPhase) and not ph.fused)),
                      kernel_end=ready, choice=dict(plan.choice), library=plan.library,
                      gemm_kernel=_gemm_kernel(plan), isolated=plan.isolated)


def _gemm_kernel(plan: Plan) -> dict | None:
    """The GEMM kernel of the plan's first tiled GEMM (``emulator/model/gemm.py``)."""
    for ph in plan.phases:
        kern = getattr(getattr(ph, "kernel", None), "producer", None)
        if getattr(kern, "kind", "") == "gemm" and getattr(kern, "kernel", None) is not None:
            return kern.kernel.describe()
    return None


PROFILE_BINS = 200  # not a parameter: the stage profile's bins (a report)


def stage_profile(clock: RankClock, kernel: str, start: float, end: float,
                  stages: list[tuple[float, float]]) -> dict:
    """A kernel's stages and the HBM's bandwidth by stream over its run, in
    ``PROFILE_BINS`` bins (T3's per-stage view: DRAM traffic and GEMM slowdown over
    time)."""
    if end <= start:
        return {}
    bin_s = (end - start) / PROFILE_BINS
    bw = clock.hbm.bandwidth(start, bin_s, PROFILE_BINS)
    return {"kernel": kernel, "window_s": [start, end], "bin_s": bin_s,
            "stages_s": [[a, b] for a, b in stages],
            "hbm_gb_per_s": {s: [round(v / 1e9, 3) for v in vals] for s, vals in bw.items()  # not a parameter: a report's rounding
                             if any(vals)}}


def _run_kernel(ph: KernelPhase, compiled, mode: str, hbm: Hbm, tracker: Tracker,
                clock: RankClock, cost: CostModel, start: float, fault_kind: str,
                opts: RunOptions, arbitration: str):
    clock.new_program()
    clock.cu.free_at = start
    routes = compiled[0].routes
    commands = [c for cm in compiled for c in cm.commands]
    incoming = {k: v for cm in compiled for k, v in cm.incoming.items()}
    policy = policy_named(arbitration) if ph.fused else Alone()
    groups = {(c.executor.index, c.executor.share) for c in commands
              if c.executor.kind == "cu" and not c.executor.resident}
    cu_share = max(ph.margin, sum(share for _, share in groups))  # the CU kernel's thread-
    # block groups, or the CUs the kernel leaves to one
    cu_cmds = [c for c in commands if c.executor.kind == "cu" and not c.executor.resident]
    dispatch = {c.executor.dispatch for c in cu_cmds}
    if len(dispatch) > 1:
        raise ValueError(f"{ph.name}: the concurrent CU kernel's groups are dispatched "
                         f"{' and '.join(sorted(dispatch))}; one kernel is dispatched one way")
    if cu_share >= 1.0:
        raise ValueError(f"{ph.name}: the concurrent CU kernel's groups {sorted(groups)} hold "
                         f"{cu_share:.2f} of the CUs; they must leave the producer some")
    load = first_stage_load(cost, ph.kernel, routes, hbm.rank, cu_share,
                            hbm.specs[ph.kernel.space.buffer].dtype.itemsize)
    if load is not None:  # MCA's measurement of the first stage picks its threshold
        policy.observe_first_stage(*load)
    resident = np.zeros(tracker.nslots, bool)  # slots preloaded before the phase
    for slots, _ in ph.preload:
        resident[np.asarray(slots, np.int64)] = True
    stage_index, commands = program_order(ph.kernel, commands, policy.lookahead, tracker.nslots,
                                          getattr(routes, "slot", None), resident,
                                          ph.arrival_order)
    stage_faults = ("raise", "kill", "stall")  # in stage 1 (stage 0 with a single stage)
    fault = ((fault_kind, min(1, len(stage_index) - 1)) if fault_kind in stage_faults
             else ("", -1))
    nic_regions = [c.trigger.slots for c in commands if c.executor.kind == "nic"
                   and c.moves_data and not c.pull]
    runner = KernelRunner(hbm, tracker, clock, cost, ph.kernel, routes, stage_index, ph.stream,
                          policy, fault, f"{mode} {ph.name}", cu_share,
                          list({id(s): s for s in nic_regions}.values()),
                          cu=CuSide(dispatch.pop() if dispatch else "partitioned",
                                    sum(share for _, share in groups), ph.margin,
                                    len(cu_cmds)))
    whole = {k: v for cm in compiled for k, v in cm.whole.items()}
    runner.whole_left = whole
    for slots, elems in ph.preload:  # resident inputs: written before the phase starts
        runner.slot_done[slots] = start
        tracker.signal(hbm.rank, slots, elems, start)
    if not commands:
        end = runner.run()
        return end, policy, {}, runner.stage_windows, end, start
    timing = ExecutorTiming(clock, cost, incoming, runner, policy,
                            _own_writes(routes, commands, hbm.rank, ph.kernel.space))
    timing.steady = {k for cm in compiled for k in cm.steady}
    dma = DmaEngine(hbm, tracker, commands, timing, opts.watchdog_s,
                    on_error=lambda exc: abort(exc, "DMA engine: "), stream=ph.stream,
                    fault=faults.for_dma(fault_kind, hbm.rank, mode),
                    status=lambda label, waiting: watchdog.post("dma", f"{mode} {label}",
                                                                waiting))
    dma.start()
    kernel_end = runner.run()
    watchdog.post("compute", f"{mode} {ph.name}: waits for its executors", waiting=True)
    dma.join()
    # what communication took from the last stages' reads and writes (served after them)
    settled = clock.hbm.settle(kernel_end)
    if settled > kernel_end:
        clock.log("displaced", "displaced bytes", kernel_end, settled)
        kernel_end = clock.cu.free_at = settled
    walls = {"stages": runner.wall_events, "dma": dma.wall_events}
    return (max(kernel_end, timing.last_end), policy, walls, runner.stage_windows, kernel_end,
            timing.last_end)


def _own_writes(routes, commands, rank: int, space) -> dict[int, int]:
    """id(trigger) -> element-writes into its slots by this rank's own WGs through a
    route target on this rank (a store into another local buffer, e.g. its own block of
    a slot buffer): local writes, not peers' data landing from a link."""
    per_slot: dict[int, int] = {}
    for t, route in getattr(routes, "explicit", routes).items():  # only routes with targets
        for tg in route.targets:
            if tg.rank == rank:
                per_slot[tg.slot] = per_slot.get(tg.slot, 0) + space.elems(t)
    if not per_slot:
        return {}
    return {id(c.trigger): n for c in commands
            for n in [sum(per_slot.get(int(s), 0) for s in c.trigger.slots)] if n}


def categories(traffic: np.ndarray) -> dict[str, int]:
    """DRAM bytes by T3's categories (GEMM, RS, AG reads and writes; plus A2A) from
    (stream, kind) counts of one HBM (or a sum); updates count as writes."""
    out = {}
    for s, stream in enumerate(STREAMS):
        out[f"{stream}_read"] = int(traffic[s, KINDS.index("read")])
        out[f"{stream}_write"] = int(traffic[s, KINDS.index("write")]
                                     + traffic[s, KINDS.index("update")])
    return out
