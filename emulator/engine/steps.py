"""CU-driven collective kernels (the sequential baselines, AG after a fused RS).

A collective that runs as its own kernel is a list of ``CuStep``s executed in
order on the rank's CUs: optionally wait for received regions, read local
inputs (one copy, or several copies that are added), write the result to a
peer's or the local HBM as a store or an update, and signal the destination's
tracker with the modelled arrival time (put-with-signal). A step marked
``concurrent`` starts with the step before it (a direct kernel sends to every
peer at once, each over its own link).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from devices.regions import Region
from devices.signals import TrackedRegion
from emulator.model import transfers
from emulator.model.clock import RankClock
from emulator.model.cost import CostModel

if TYPE_CHECKING:  # the runner's types; collectives build steps without MPI
    from devices.hbm import Hbm
    from devices.tracker import Tracker


@dataclass
class CuStep:
    name: str
    stream: str  # "rs", "ag" or "a2a": the traffic category
    inputs: list[tuple[str, Region]]  # local regions read; several are added
    out: tuple[str, Region] | None  # destination array region
    dst_rank: int
    wait: TrackedRegion | None = None  # what this step must have received first
    wait_bytes: int = 0  # bytes that arrived for ``wait`` (landed in this HBM)
    wait_op: str = "store"  # how they landed (an update costs update_cost x)
    signal_slots: list[int] = field(default_factory=list)
    signal_elems: list[int] = field(default_factory=list)
    op: str = "store"  # how ``out`` is written
    concurrent: bool = False  # starts together with the previous step
    steady: bool = False  # what it waits for lands as one stream (``Dram.stream``)
    writers: int = 1  # peers whose data ``wait`` collects, sent at once (a direct kernel)


def run_steps(steps: list[CuStep], hbm: Hbm, tracker: Tracker, clock: RankClock,
              cost: CostModel, watchdog_s: float, start: float, library=None,
              fixed: bool = True) -> float:
    """Execute the steps functionally and in modelled time; return the kernel's end.
    ``library``: the library's choice for this collective (``emulator/model/library.py``):
    its fixed latency first, each send at the chosen protocol's share of the route's
    peak over the channels' route, arriving at least the protocol's per-step latency
    after it left (``fixed``: a kernel of its own; False: the second half of the
    library's one all-reduce kernel, whose fixed latency the first half paid)."""
    from emulator.runtime import watchdog

    t = group_start = max(start, clock.cu.free_at)
    if library is not None and library.fixed_s and fixed \
            and cost.spec.interconnect.library_latency:
        clock.log("library", f"{library.protocol} base latency", t, t + library.fixed_s)
        t = group_start = t + library.fixed_s
    for step in steps:
        if step.concurrent:
            ready = group_start
        else:
            ready = group_start = t
        if step.wait is not None:
            watchdog.post("compute", f"CU kernel step {step.name} waits for {step.wait.name}",
                          waiting=True)
            t_arr = tracker.wait(step.wait, watchdog_s)
            watchdog.post("compute", f"CU kernel step {step.name}")
            far, updates = tracker.network_updates(step.wait)  # the share from other nodes
            ready = max(ready, transfers.land(clock, cost, t_arr, step.wait_bytes, step.wait_op,
                                              f"{step.name} received data lands",
                                              log_hbm_end=True, steady=step.steady,
                                              network=step.wait_bytes * far / max(1, updates),
                                              channels=library is not None,
                                              writers=step.writers))
        read_bytes = sum(hbm.region_bytes(name, r) for name, r in step.inputs)
        if step.out is not None and step.dst_rank != hbm.rank:
            nbytes = hbm.region_bytes(*step.out)
            dst = step.dst_rank  # a library's kernel: its achieved share of the peak
            fraction, lat = transfers.library_send(clock, cost, dst, library)
            link_end = transfers.send(clock, dst, ready, nbytes, step.name, fraction,
                                      channels=library is not None)
            # the kernel reads what it sends as the link takes it (loads feed stores),
            # not all at once ahead of the link (an all-gather's reads, burst
            # at the HBM's rate and pushed its received data's landing out by as long)
            read_end = ready
            if read_bytes:
                pace = read_bytes / (link_end - ready) if link_end > ready else None
                read_end = clock.hbm.reserve(ready, read_bytes, pace)[1]
            end = max(read_end, link_end)
            arrival = end + lat
        else:
            read_end = clock.hbm.reserve(ready, read_bytes)[1] if read_bytes else ready
            end = arrival = read_end
            if step.out is not None:
                nbytes = hbm.region_bytes(*step.out)
                end = arrival = clock.hbm.reserve(
                    read_end, cost.update_cost_bytes(nbytes, step.op))[1]
        clock.log(step.stream, step.name, ready, end)
        t = max(t, end) if step.concurrent else end
        # functional part
        data = [hbm.load(name, region, step.stream) for name, region in step.inputs]
        if step.out is not None:
            value = data[0]
            if hbm.payload and len(data) > 1:
                from devices import kernels  # numba: only runs that move data import it

                to = hbm.specs[step.out[0]].dtype  # a wider input (Flux's fp32 node sum)
                data = [d if d.dtype == to else kernels.narrow(d, to) for d in data]  # is
                value = data[0]  # narrowed to the output's dtype first, as Flux recasts it
                for more in data[1:]:
                    value = kernels.add(value, more)
            if step.op == "update":
                hbm.update(step.out[0], step.out[1], value, step.stream, step.dst_rank)
            else:
                hbm.store(step.out[0], step.out[1], value, step.stream, step.dst_rank)
            if step.signal_slots:
                tracker.signal(step.dst_rank, step.signal_slots, step.signal_elems, arrival)
    clock.cu.free_at = t
    return t
