"""What one configuration of one collective runs on a rank: a plan of phases.

A collective algorithm (``collectives/``) builds a ``Plan``: the HBM arrays to
allocate, where the inputs go, and the phases in order:

- ``GemmPhase``: the producer GEMM with its address-space maps. Fused phases
  also run the DMA engine on the queue the maps programmed, under the mode's
  arbitration policy; a consumer GEMM may be gated on tracked input regions.
- ``StepsPhase``: a CU-driven collective kernel (a list of ``CuStep``).

Phases run functionally in list order. In modelled time a phase starts when
its clock's CUs are free (``clock="main"`` for one chained timeline), or, on a
clock of its own, at the latest end of the phases named in ``after`` (the
isolated runs the ideal configurations are computed from).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from devices.tracker import TrackedRegion
from emulator.addrmap import AddressMap
from emulator.custeps import CuStep
from emulator.producer import GemmJob


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
class GemmPhase:
    name: str
    job: GemmJob
    maps: list[AddressMap]  # the map over the job's output space first
    stream: str  # traffic category of the collective part ("rs", "ag", "a2a")
    fused: bool = False
    preload: list[tuple[list[int], list[int]]] = field(default_factory=list)  # resident inputs
    clock: str = "main"
    after: tuple[str, ...] = ()


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


@dataclass
class Plan:
    layout: list[tuple[str, tuple[int, int], object]]
    inputs: dict[str, tuple[int, int]]  # input name ("A", "B") -> (array name, row offset)
    phases: list
    slots: Slots
    result: list[tuple[str, tuple[int, int, int, int]]]  # regions checked, concatenated by rows
    isolated: bool = False  # phases are separate isolated runs (ideal configurations)
