"""Each counterfactual of ``emulator/model/ablation.py`` removes exactly its cost: the
event logs of tests/mpi/event_log.py's toy cases, run on the ablated device, against
logs derived by hand with that cost taken out of the same formulas.

usage: ablation_log.py   (2 ranks)

- launches:        launch-wait (two launches) and cu-steps with ``launch_us`` = 0: the
                   hand logs of event_log.py with LAUNCH = 0 (and no launch events).
- library-latency: cu-steps run by a toy library (base latency FIXED, per-step latency
                   HW_LAT): unablated, its base latency after the launch, then cu-steps'
                   log from there with each send arriving HW_LAT after it left; ablated,
                   the plain cu-steps log (no base latency, the link's own LAT).
- executor-parity: wg-stores with the GPU's stores at 0.5 of the link and the library at
                   1: ablated, the stores at the library's fraction, so wg-stores' own log;
                   likewise dma-push with the copy engines at 0.5 and nic (two nodes) with
                   the NIC's puts at 0.5 of its line rate (the network library's is 1).
- gemm-efficiency: loaded-latency (the dma-push plan whose GEMM runs a modelled kernel,
                   latency-bound) on the toy device given a ``[gemm]`` section: unablated,
                   its hand log; ablated, each stage's 2 tiles take their FLOPs at the peak
                   (2 x WG_FLOPS / F = WG_S), so the log of the plain dma-push case.
- link-efficiency: cu-steps on the toy device with library_fraction 0.5: unablated, its
                   send holds the link for B / 0.5 (cu_steps_log(frac=0.5)); ablated, the
                   log of the device at fraction 1 (cu_steps_log()).
- contention:      dma-push (round-robin) with communication on a DRAM of its own: the
                   DMA reads at the whole HBM rate one after the other, stage 1's reads
                   no longer stalled, the landing absorbed at the whole rate
                   (``dma_push_apart_log`` below, derived here).
- dram-traffic:    wg-stores, cu-steps and launch-wait with the HBM at FREE_DRAM x its
                   bandwidth: the hand logs with BW x FREE_DRAM.

Prints ``ABLATION OK <cost> <case>`` or ``ABLATION MISMATCH <cost> <case>`` with the
side-by-side table; ends with ``ABLATION DONE``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import sys

import numpy as np
from mpi4py import MPI

import event_log as ev
from devices.spec import GemmSpec, load_device
from emulator.engine.runner import RunOptions, run_plan
from emulator.model.ablation import FREE_DRAM, ablate
from emulator.model.dram import Dram
from emulator.runtime import watchdog


@contextlib.contextmanager
def hand(**values):
    """event_log's device constants replaced while a hand log is derived."""
    old = {k: getattr(ev, k) for k in values}
    for k, v in values.items():
        setattr(ev, k, v)
    try:
        yield
    finally:
        for k, v in old.items():
            setattr(ev, k, v)


def no_launches(log: list) -> list:
    """A log of a device whose launches are free: no launch events."""
    return [e for e in log if e[0] != "launch"]


def dma_push_apart_log(r, o):
    """dma-push with communication served by a DRAM of its own (the formulas of
    event_log.dma_push_log, the shared queue taken out)."""
    ta, tb = ev.tiles_of(o)
    t = ev.LAUNCH
    s0_end = t + ev.WG_S + ev.UPD * 2 * ev.TILE / ev.BW  # stage 0 as before
    a_t0 = b_t0 = s0_end + ev.SETUP  # both engines triggered at stage 0's end
    a_read = a_t0 + ev.TILE / ev.BW  # A's reads alone on communication's DRAM: the whole rate
    b_read = a_read + ev.TILE / ev.BW  # B's reads issued at once, served after A's
    a_link = a_t0 + ev.TILE / ev.L
    b_link = a_link + ev.TILE / ev.L  # the one link to o: B follows A
    a_end, b_end = max(a_read, a_link), max(b_read, b_link)
    b_arr = b_end + ev.LAT
    # stage 1: its reads at STAGE_CAP never wait (no communication in its queue)
    s1_read = max(s0_end + ev.WG_S, s0_end + ev.STAGE_READS / ev.STAGE_CAP)
    s1_end = s1_read + ev.UPD * 2 * ev.TILE / ev.BW
    # the landing: offered burst by burst as it streams in, each at the whole rate, no
    # read/write turnaround (no compute reads on its bus)
    dram = Dram("x", ev.BW, load_device(str(ev.DEVICE)).dram)
    land_from = b_arr - 2 * ev.TILE / ev.L
    cost_bytes = ev.UPD * 2 * ev.TILE
    nb = math.ceil(cost_bytes / dram.burst_bytes - 1e-9)
    last = land_from + (nb - 1) * (2 * ev.TILE / ev.L) / nb
    absorbed = last + (cost_bytes / nb) / ev.BW
    landed = max(b_arr, absorbed)
    done = max(s1_end, landed)
    nm = ev.nm
    return [
        ("launch", "dma-push", 0.0, t),
        ("gemm", "stage 0", t, s0_end),
        ("tracker", f"{nm('C', ta)} complete", s0_end, s0_end),
        ("tracker", f"{nm('C', tb)} complete", s0_end, s0_end),
        ("dma", f"{nm('C', ta)} -> {o}", a_t0, a_end),
        (f"link->{o}", f"dma {nm('C', ta)}", a_t0, a_link),
        ("dma", f"{nm('C', tb)} -> {o}", b_t0, b_end),
        (f"link->{o}", f"dma {nm('C', tb)}", b_t0, b_link),
        ("gemm", "stage 1", s0_end, s1_end),
        ("hbm", f"{nm('C', ev.chunk(r))} remote updates land", b_arr, landed),
        ("tracker", f"{nm('C', ev.chunk(r))} complete", done, done),
    ]


HW_LAT, FIXED = 3e-6, 5e-6  # the toy library's per-step and base latency


def _library_choice():
    from emulator.model.library import Choice

    return Choice("toy", "all-gather", "ring", "Simple", 1, 1, ev.XB, 0.0, 0.0, 0.0, 1.0,
                  HW_LAT, HW_LAT, FIXED)


def cu_steps_library_plan(spec, r, o):
    """cu-steps' plan run by a toy library (its choice on the steps phase)."""
    plan, inputs = ev.cu_steps_plan(spec, r, o)
    phases = [dataclasses.replace(ph, library=_library_choice()) for ph in plan.phases]
    return dataclasses.replace(plan, phases=phases), inputs


def cu_steps_library_log(r, o):
    """cu-steps run by the toy library: the launch, the library's base latency (FIXED),
    then cu-steps' log from there (LAUNCH + FIXED), each send arriving the library's
    per-step latency (HW_LAT) after it left instead of the link's."""
    with hand(LAUNCH=ev.LAUNCH + FIXED, LAT=HW_LAT):
        log = ev.cu_steps_log(r, o)
    return [("launch", "cu-steps", 0.0, ev.LAUNCH),
            ("library", "Simple base latency", ev.LAUNCH, ev.LAUNCH + FIXED),
            *(e for e in log if e[0] != "launch")]


ev.CASES["cu-steps-library"] = (cu_steps_library_plan, ev.cu_steps_want, cu_steps_library_log)


def _log(case: str, r: int, o: int, **kw) -> list:
    return ev.CASES[case][2](r, o, **kw)


def checks(r: int, o: int):
    """(cost, case, the device before the ablation (None: an unablated check), the device
    run, expected log) of every check."""
    spec = load_device(str(ev.DEVICE))
    half = dataclasses.replace(spec, interconnect=dataclasses.replace(
        spec.interconnect, library_fraction=0.5))
    out = []
    with hand(LAUNCH=0.0):
        for case in ("launch-wait", "cu-steps"):
            out.append(("launches", case, spec, ablate(spec, ("launches",)),
                        no_launches(_log(case, r, o))))
    lib = dataclasses.replace(spec, interconnect=dataclasses.replace(
        spec.interconnect, library="nccl-ampere"))  # a library modelled: its latency to remove
    out.append(("library-latency (unablated)", "cu-steps-library", None, lib,
                _log("cu-steps-library", r, o)))
    out.append(("library-latency", "cu-steps-library", lib,
                ablate(lib, ("library-latency",)), _log("cu-steps", r, o)))
    stores = dataclasses.replace(spec, executors=dataclasses.replace(
        spec.executors, store_fraction=0.5))  # the GPU's stores below the library's 1
    out.append(("executor-parity", "wg-stores", stores,
                ablate(stores, ("executor-parity",)), _log("wg-stores", r, o)))
    copies = dataclasses.replace(spec, executors=dataclasses.replace(
        spec.executors, copy_fraction=0.5))  # the copy engines below the library's 1
    out.append(("executor-parity", "dma-push", copies,
                ablate(copies, ("executor-parity",)), _log("dma-push", r, o)))
    nodes = ev.two_nodes(spec)
    puts = dataclasses.replace(nodes, executors=dataclasses.replace(
        nodes.executors, put_fraction=0.5))  # NIC puts below the network library's 1
    out.append(("executor-parity", "nic", puts, ablate(puts, ("executor-parity",)),
                _log("nic", r, o)))
    assert ablate(spec, ("executor-parity",)) == spec  # already at the library's: unchanged
    gemm = dataclasses.replace(spec, gemm=GemmSpec((), 1.0))  # the kernel model on
    out.append(("gemm-efficiency (unablated)", "loaded-latency", None, gemm,
                _log("loaded-latency", r, o)))
    out.append(("gemm-efficiency", "loaded-latency", gemm, ablate(gemm, ("gemm-efficiency",)),
                _log("dma-push", r, o)))
    assert ablate(spec, ("gemm-efficiency",)) == spec  # no [gemm]: nothing to remove
    out.append(("link-efficiency (unablated, fraction 0.5)", "cu-steps", None, half,
                _log("cu-steps", r, o, frac=0.5)))
    out.append(("link-efficiency", "cu-steps", half, ablate(half, ("link-efficiency",)),
                _log("cu-steps", r, o)))
    out.append(("contention (unablated)", "dma-push", None, spec, _log("dma-push", r, o)))
    out.append(("contention", "dma-push", spec, ablate(spec, ("contention",)),
                dma_push_apart_log(r, o)))
    with hand(BW=ev.BW * FREE_DRAM):
        for case in ("wg-stores", "cu-steps", "launch-wait"):
            out.append(("dram-traffic", case, spec, ablate(spec, ("dram-traffic",)),
                        _log(case, r, o)))
    return out


def main() -> int:
    comm = MPI.COMM_WORLD
    if comm.size != 2:
        print("ablation_log.py runs on 2 ranks", flush=True)
        return 2
    r, o = comm.rank, 1 - comm.rank
    watchdog.open_board(comm)
    opts = RunOptions("fp32", 60.0, record=True)
    failed = []
    for cost, case, before, spec, want in checks(r, o):
        build, want_of, _ = ev.CASES[case]
        plan, inputs = build(spec, r, o)
        res = run_plan(comm, plan, spec, case, inputs, opts)
        data_ok = res.result is not None and np.array_equal(res.result, want_of(r, o))
        log_ok, table = ev.compare(want, ev._events(res))
        if before is not None:  # the cost was there: removing it changes this case's log
            # (else the check could not fail)
            base = run_plan(comm, build(before, r, o)[0], before, case, None, opts)
            same, _ = ev.compare(ev._events(base), ev._events(res))
            log_ok = log_ok and not comm.allreduce(same, MPI.LAND)
        ok = comm.allreduce(data_ok and log_ok, MPI.LAND)
        tables = comm.gather((data_ok, table), root=0)
        if r == 0:
            print(f"ABLATION {'OK' if ok else 'MISMATCH'} {cost} {case}", flush=True)
            if not ok:
                failed.append(f"{cost} {case}")
                for rank, (d_ok, tab) in enumerate(tables):
                    print(f" rank {rank}: data {'OK' if d_ok else 'WRONG'}\n{tab}", flush=True)
    watchdog.close_board()
    if r == 0:
        print(f"ABLATION DONE failed: {'; '.join(failed) or '-'}", flush=True)
    return 1 if comm.bcast(failed, root=0) else 0


if __name__ == "__main__":
    sys.exit(main())
