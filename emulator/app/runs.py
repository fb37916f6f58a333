"""One configuration of one operation on this rank: the problem, the plan the registry's
builder makes, and the engine's run of it; plus the run's lower bounds."""

from __future__ import annotations

import dataclasses

import numpy as np

from collectives.common import Problem
from collectives.reference import NP_DTYPE
from devices.spec import DeviceSpec
from emulator.app.catalog import registry
from emulator.app.config import RunConfig
from emulator.engine.runner import DeviceMemory, RankResult, RunOptions, run_plan
from emulator.runtime import watchdog


def device_for(spec: DeviceSpec, topology: str) -> DeviceSpec:
    """The device with the run's topology (the preset's unless ``--topology`` says otherwise)."""
    return dataclasses.replace(spec, interconnect=dataclasses.replace(spec.interconnect,
                                                                      topology=topology))


def problem(comm, cfg: RunConfig, spec: DeviceSpec) -> Problem:
    return Problem(comm.rank, comm.size, cfg.m, cfg.n, cfg.k, device_for(spec, cfg.topology),
                   np.dtype(NP_DTYPE[cfg.dtype]), cfg.split_k)


def run_mode(comm, cfg: RunConfig, spec: DeviceSpec, a: np.ndarray | None,
             b: np.ndarray | None, mode: str, memory: DeviceMemory | None = None) -> RankResult:
    """Run configuration ``mode`` of ``cfg``'s operation. ``a``/``b`` None: timing-only."""
    watchdog.post("compute", f"{mode}: building the plan and maps")
    reg = registry(cfg.configs)
    p = problem(comm, cfg, spec)
    plan = reg.configuration(mode).build(p, reg.operation(cfg.collective), cfg.algorithm)
    opts = RunOptions(cfg.dtype, cfg.watchdog_s, bool(cfg.trace), cfg.record_wall, cfg.fault)
    inputs = None if a is None else {"A": a, "B": b}
    return run_plan(comm, plan, p.spec, mode, inputs, opts, memory)


def lower_bounds(cfg: RunConfig, spec: DeviceSpec, world: int, chunks) -> dict[str, float]:
    """GEMM: its FLOPs at peak. Collective: the bytes a rank must send or receive over
    every link (or port) it has at once (ring: 2 directions, full mesh: N-1, switch: 1)."""
    from emulator.model.cost import DTYPE_BYTES

    op = cfg.operation
    e = DTYPE_BYTES[cfg.dtype]
    rows_min = min(r1 - r0 for r0, r1 in chunks)
    moved = op.link_bytes(cfg.m, cfg.n, cfg.k, rows_min, e)
    links = spec.interconnect.links_needed(world)
    rows = rows_min if op.compute_rows == "own" else cfg.m
    return {"gemm_compute": 2.0 * rows * cfg.n * cfg.k / spec.peak_flops(cfg.dtype),
            "collective_link": moved / (max(links, 1) * spec.interconnect.link_bw)
            if world > 1 else 0.0}
