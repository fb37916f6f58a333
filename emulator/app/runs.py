"""One configuration of one operation on this rank: the problem, the plan the registry's
builder makes, and the engine's run of it; plus the run's lower bounds."""

from __future__ import annotations

import numpy as np

from collectives.common import Problem
from collectives.reference import NP_DTYPE
from devices.spec import DeviceSpec
from emulator.app.catalog import registry
from emulator.app.config import RunConfig
from emulator.engine.runner import DeviceMemory, RankResult, RunOptions, run_plan
from emulator.model.ablation import ablate
from emulator.runtime import watchdog


def problem(comm, cfg: RunConfig, spec: DeviceSpec) -> Problem:
    from collectives.ficco import dispatch

    p = Problem(comm.rank, comm.size, cfg.m, cfg.n, cfg.k, spec,
                np.dtype(NP_DTYPE[cfg.dtype]), cfg.split_k, cfg.resolved_params(), cfg.seed,
                dispatch=dispatch(cfg.operation))
    # an operation whose ranks each compute their own chunk: the kernel is chosen for it
    return p.with_launch(p.max_chunk) if cfg.operation.compute_rows == "own" else p


def run_mode(comm, cfg: RunConfig, spec: DeviceSpec, inputs: dict[str, np.ndarray] | None,
             mode: str, memory: DeviceMemory | None = None,
             earlier: dict[str, RankResult] | None = None,
             plans: dict | None = None) -> RankResult:
    """Run configuration ``mode`` of ``cfg``'s operation. ``inputs`` (name -> array: the
    GEMM's A and B, or the operation's own) None: timing-only. ``earlier``: results of
    configurations this job already ran (a search reuses their modelled times, which
    timing-only and numeric runs share). ``plans``: where to keep the plan of every
    configuration built (name -> ``build``'s plan: the causes split runs them again)."""
    watchdog.post("compute", f"{mode}: building the plan and maps")
    reg = registry(cfg.configs)
    conf = reg.configuration(mode)
    if conf.search:
        return _best(comm, cfg, spec, inputs, mode, memory, earlier or {}, plans)
    if conf.picks is not None and inputs is None and earlier:
        same, choice = conf.picks(problem(comm, cfg, spec), reg.operation(cfg.collective),
                                  cfg.algorithm)
        if same in earlier:  # a heuristic whose pick this job ran: its plan, so its run
            import dataclasses  # (a deterministic clock: the same times, bytes, phases)

            return dataclasses.replace(earlier[same], mode=mode, choice=choice,
                                       same_as=same, wall_s=0.0, wall_events={})
    plan = build(comm, cfg, spec, mode)
    if plans is not None:
        plans[mode] = plan
    return run_built(comm, cfg, spec, plan, mode, inputs, memory)


def build(comm, cfg: RunConfig, spec: DeviceSpec, mode: str):
    """The plan of configuration ``mode`` (not a search) on this rank, from the real device
    (a heuristic picks as it would)."""
    reg = registry(cfg.configs)
    return reg.configuration(mode).build(problem(comm, cfg, spec), reg.operation(cfg.collective),
                                         cfg.algorithm)


def run_built(comm, cfg: RunConfig, spec: DeviceSpec, plan, mode: str,
              inputs: dict[str, np.ndarray] | None = None,
              memory: DeviceMemory | None = None, device: DeviceSpec | None = None
              ) -> RankResult:
    """Run ``plan`` (``build``'s) as configuration ``mode``, timed on the device with the
    costs ``cfg.ablate`` removed (a plan is the same on every counterfactual device, so the
    causes split runs one plan on each); ``device``: that device, made already."""
    opts = RunOptions(cfg.dtype, cfg.watchdog_s, bool(cfg.trace), cfg.record_wall, cfg.fault,
                      "ring" if cfg.algorithm == "ring" else "direct")
    return run_plan(comm, plan, ablate(spec, cfg.ablate) if device is None else device, mode,
                    inputs, opts, memory)


def _best(comm, cfg: RunConfig, spec: DeviceSpec, inputs, mode: str,
          memory: DeviceMemory | None, earlier: dict[str, RankResult],
          plans: dict | None = None) -> RankResult:
    """A search configuration (Flux's tuning): every candidate in timing-only mode (or
    its modelled time from ``earlier``, a run of it in this job), the fastest (modelled
    time, the slowest rank; ties to the registry's order) kept, and run numerically
    when ``inputs`` are given."""
    import dataclasses

    from mpi4py import MPI

    reg = registry(cfg.configs)
    names = [n for n in reg.candidates(mode, reg.operation(cfg.collective), cfg.algorithm)
             if not reg.refusal(n, spec, cfg.dtype, cfg.ranks, cfg.collective)]
    timed, ends = {}, {}
    for name in names:  # every rank has run the same configurations before this one
        timed[name] = earlier.get(name) or run_mode(comm, cfg, spec, None, name, memory,
                                                    plans=plans)
        ends[name] = comm.allreduce(timed[name].end, op=MPI.MAX)
        if plans is not None:  # keep the plan of the fastest so far only (one at a time)
            lead = min(ends, key=lambda n: (ends[n], names.index(n)))
            for other in [n for n in ends if n != lead]:
                plans.pop(other, None)
    chosen = min(names, key=lambda n: (ends[n], names.index(n)))
    res = timed[chosen] if inputs is None else run_mode(comm, cfg, spec, inputs, chosen, memory,
                                                        plans=plans)
    return dataclasses.replace(res, mode=mode, choice={
        "chosen": chosen, "candidates_s": ends,
        "why": f"the fastest of {len(names)} candidates in modelled time (timing-only runs)"})


def lower_bounds(cfg: RunConfig, spec: DeviceSpec, world: int, chunks) -> dict[str, float]:
    """GEMM: its FLOPs at peak. Collective: the bytes a rank must send or receive over
    every link (or port) it has at once (ring: 2 directions, full mesh: N-1, switch: 1),
    and on several nodes the bytes that must leave a node through its NICs: an
    all-to-all's bytes bound for other nodes; a gather or reduction's (nodes-1)/nodes of
    the buffer (reduced or gathered within the node first; twice for an all-reduce)."""
    from emulator.model.cost import DTYPE_BYTES

    op = cfg.operation
    e = DTYPE_BYTES[cfg.dtype]
    rows_min = min(r1 - r0 for r0, r1 in chunks)
    rows = rows_min if op.compute_rows == "own" else cfg.m
    if op.bounds is not None:  # an operation that is not a GEMM: its compute and bytes
        compute, moved = op.bounds(cfg, spec, world)
    else:
        compute = 2.0 * rows * cfg.n * cfg.k / spec.peak_flops(cfg.dtype)
        moved = op.link_bytes(cfg.m, cfg.n, cfg.k, rows_min, e)
    ic = spec.interconnect
    links = ic.links_needed(world)
    g = min(world, ic.gpus_on_node(world))
    stay = (g - 1) / (world - 1) if world > 1 else 0.0  # of the bytes, to GPUs of the node
    link = moved * stay / (max(links, 1) * ic.link_bw) if world > 1 else 0.0
    if world > g and ic.network:  # the bytes bound for other nodes, through the node's NICs
        # (a torus node: its four links)
        ports = 4 if ic.network == "torus2d" else ic.nics_per_node
        if op.exchange:
            out = moved * (1 - stay) * g
        else:
            nodes = world // g
            out = (op.collective_bytes(cfg.m, cfg.n, cfg.k, e) * (nodes - 1) / nodes
                   * op.passes)
        link = max(link, out / (ic.nic_bw * ports))
    return {"gemm_compute": compute, "collective_link": link}


def bandwidths(cfg: RunConfig, world: int, windows: dict[str, tuple[float, float]],
               isolated: bool = False) -> dict:
    """algbw and busbw of each collective phase, with nccl-tests' definitions: algbw =
    S / t (S: the collective's whole buffer, t: the phase's modelled time), busbw = algbw
    x the operation's factor for that collective ((n-1)/n for RS, AG, all-to-all;
    2(n-1)/n for an AR, timed from its RS phase's start to its AG phase's end; in
    ``isolated`` runs, where the AG starts after the GEMM and the RS each ran alone, the
    sum of the two halves' times, not a window holding the GEMM). Fused phases (a GEMM
    and its collective in one kernel) have no collective time of their own and are
    left out."""
    from emulator.model.cost import DTYPE_BYTES

    op = cfg.operation
    size = op.collective_bytes(cfg.m, cfg.n, cfg.k, DTYPE_BYTES[cfg.dtype])
    spans = {k: w for k, w in windows.items() if k in op.bus_factors}
    for name, (first, last) in op.spans.items():
        if first in spans and last in spans:
            if isolated:  # each half alone: their times add up
                t = (spans[first][1] - spans[first][0]) + (spans[last][1] - spans[last][0])
                spans[name] = (spans[first][0], spans[first][0] + t)
            else:
                spans[name] = (spans[first][0], spans[last][1])
    out = {}
    for kind, (t0, t1) in spans.items():
        if t1 > t0 and world > 1:
            alg = size / (t1 - t0)
            out[kind] = {"bytes": size, "time_s": t1 - t0, "algbw_gb_s": alg / 1e9,
                         "busbw_gb_s": alg * op.bus_factors[kind](world) / 1e9}
    return out
