"""What one configuration of one collective runs on a rank: a plan of phases.

A collective algorithm (``collectives/``) builds a ``Plan``: the HBM arrays to
allocate, where the inputs go, and the phases in order:

- ``KernelPhase``: a producer kernel (``Kernel``: a GEMM, GEMV, elementwise
  kernel, ordinary or persistent) with its address-space maps. Its executors
  (DMA engines, NICs, a concurrent CU kernel) serve the commands the maps
  programmed, under the plan's arbitration policy when ``fused``; work items
  may wait on signals (gates).
- ``StepsPhase``: a CU-driven collective kernel (a list of ``CuStep``).

Every phase is a kernel launch: it pays the device's ``launch_s`` and may wait
on signals (``waits``) before it starts; a kernel phase with ``launch=False`` is
the previous persistent kernel's next task list (no launch cost).

Phases run functionally in list order. In modelled time a phase starts when
its clock's CUs are free (``clock="main"`` for one chained timeline), or, on a
clock of its own, at the latest end of the phases named in ``after`` (the
isolated runs the ideal configurations are computed from).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from devices.signals import Signal, TrackedRegion
from emulator.engine.addrmap import AddressMap
from emulator.engine.steps import CuStep
from emulator.engine.kernel import Kernel


class Slots:
    """Tracker slot allocation: named ranges, for the watchdog's dump."""

    def __init__(self):
        self.total = 0
        self._ranges: list[tuple[int, int, str]] = []

    def alloc(self, name: str, count: int) -> int:
        base = self.total
        self.total += int(count)
        self._ranges.append((base, self.total, name))
        return base

    def name(self, slot: int) -> str:
        for a, b, name in self._ranges:
            if a <= slot < b:
                return f"{name}[{slot - a}]"
        return f"slot {slot}"

    def region(self, name: str, slots: list[int], elems: list[int], label: str = "") -> TrackedRegion:
        return TrackedRegion(name, np.array(slots, np.int64), np.array(elems, np.int64), label)


@dataclass
class KernelPhase:
    name: str
    kernel: Kernel
    maps: list[AddressMap]  # the map over the kernel's output space first
    stream: str  # traffic category of the collective part ("rs", "ag", "a2a")
    fused: bool = False  # its executors run beside it under the plan's arbitration
    preload: list[tuple[list[int], list[int]]] = field(default_factory=list)  # resident inputs
    clock: str = "main"
    after: tuple[str, ...] = ()
    waits: tuple[Signal, ...] = ()  # signals the launch waits for
    sync_launches: int = 0  # the stream synchronisation between a waited signal and this
    sync_peer: int = -1  # launch: kernel launches (the device's launch cost each) and the
    # route's latency from ``sync_peer`` (-1: none) (TE: the flag kernel that says the data
    # is here, launched when the copy ends, its flag crossing the link); timed on the
    # clock's device, so the ``launches`` counterfactual removes them too
    launch: bool = True  # False: the previous phase's persistent kernel goes on to this
    # task list (no launch of its own; it starts when that kernel's WGs are done)
    parts: bool = False  # also report the kernel's and its executors' own windows, as
    # phases "<name>.kernel" and "<name>.executors" (a concurrent run measured for losses)
    margin: float = 0.0  # share of the CUs kept from the kernel for a concurrent one (TE's
    # ``set_sm_margin``) even when none runs beside it in this phase
    arrival_order: bool = False  # its forwards are queued in the order their data arrives
    # (a 1D ring): program order keeps them so (``program.program_order``)


@dataclass
class Credit:
    """Before a kernel writes into peers' buffers, they say they are done with them."""

    notify: list[int]  # ranks that will write into this rank
    region: TrackedRegion  # credits this rank waits for (one per rank it writes into)


@dataclass
class StepsPhase:
    name: str
    steps: list[CuStep]
    clock: str = "main"
    after: tuple[str, ...] = ()
    credit: Credit | None = None
    waits: tuple[Signal, ...] = ()  # signals the launch waits for
    sync_launches: int = 0  # as ``KernelPhase.sync_launches``
    sync_peer: int = -1
    library: object = None  # the library's choice when a library runs this collective
    # (``emulator/model/library.Choice``): protocol, channels, latencies
    launch: bool = True  # False: the library's kernel goes on (an all-reduce's AG half)


@dataclass
class Plan:
    layout: list[tuple[str, tuple[int, int], object]]
    inputs: dict[str, tuple[int, int]]  # input name ("A", "B") -> (array name, row offset)
    phases: list
    slots: Slots
    result: list[tuple[str, tuple[int, int, int, int]]]  # regions checked, concatenated by rows
    isolated: bool = False  # phases are separate isolated runs (ideal configurations)
    arbitration: str = "alone"  # the HBM policy of fused phases (model.arbitration)
    pattern: str = ""  # the traffic pattern its transfers follow, for the static shares of
    # ports several GPUs send across ("ring", "direct"; "": the algorithm's)
    choice: dict = field(default_factory=dict)  # a heuristic configuration: what it picked
    # and why ({"chosen": configuration, "why": text}), reported with its run

    @property
    def library(self) -> dict:
        """Phase name -> what the library chose for it (its algorithm and protocol)."""
        return {ph.name: ph.library.to_dict() for ph in self.phases
                if getattr(ph, "library", None) is not None}
