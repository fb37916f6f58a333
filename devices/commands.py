"""Pre-programmed transfer commands: what an executor (a DMA engine, a NIC, a CU-driven
kernel) does when its trigger signal completes. Pure data, no MPI.

T3: "DMA commands are pre-programmed by the driver when the output is
configured (source, destination device and address, size, operation
store-or-update, trigger condition)". Here the same record also describes a
NIC put (put, fence, flag put), a CU kernel step (read the local copies, add,
send) and a pull (a get from a peer into local memory).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from devices.regions import Region
from devices.signals import TrackedRegion

Op = Literal["store", "update"]
ExecutorKind = Literal["dma", "nic", "cu"]


# How a concurrent CU kernel's thread blocks get CUs beside a running kernel (the C3
# study's remedies, Agrawal et al., arXiv:2412.14335): ``partitioned``, CU masking: its
# share of the CUs is its own for the producer's whole run; ``prioritised``, launched first
# or on a higher-priority stream: its blocks are dispatched ahead of the producer's pending
# ones and hold their CUs while it runs, then the producer has them back; ``plain``,
# launched beside a running producer at the same priority: the block scheduler dispatches
# the producer's launch whole first, so its blocks start when that launch's last wave does.
DISPATCH = ("partitioned", "prioritised", "plain")


@dataclass(frozen=True)
class Executor:
    """Who moves a map entry's data (besides the producing WG itself, ``remote_map``).

    ``dma``: DMA engine ``index`` (several per device, one queue each);
    ``nic``: NIC ``index`` (GPU-initiated put, fence, flag put);
    ``cu``: a CU-driven kernel running beside the producer on ``share`` of the CUs
    (``index``: a group of its thread blocks with a queue of its own; the groups' shares
    add up, and the producer runs on the rest of the CUs).
    """

    kind: ExecutorKind = "dma"
    index: int = 0
    share: float = 0.0  # cu only: fraction of the CUs the concurrent kernel holds
    streams: bool = False  # its HBM traffic is a steady stream at its transfer's rate (a
    # copy engine paced by its link; ``Dram.stream``) rather than offered all at once
    library: bool = False  # cu only: the collective library's kernel (its sends achieve the
    # library's fraction of the link); else a kernel's own stores (``store_fraction``)
    resident: bool = False  # cu only: warps inside the producer's own thread blocks (Flux's
    # Hopper fetch and reduce warps): they hold no CUs of the producer; ``share`` is then
    # their share of the CUs' vector issue (what their adds run at)
    dispatch: str = "partitioned"  # cu only: how its thread blocks get their CUs beside
    # the producer (``DISPATCH``; emulator/engine/launch.py, "CU dispatch")

    def __post_init__(self):
        if self.kind not in ("dma", "nic", "cu"):
            raise ValueError(f"executor kind {self.kind!r} not in dma, nic, cu")
        if self.index < 0:
            raise ValueError(f"executor index {self.index} < 0")
        if self.dispatch not in DISPATCH:
            raise ValueError(f"CU dispatch {self.dispatch!r} not in {', '.join(DISPATCH)}")
        if self.kind == "cu" and not 0.0 < self.share < 1.0:
            raise ValueError(f"a CU kernel's share of the CUs must be in (0, 1), got {self.share}")

    @property
    def queue(self) -> str:
        return f"{self.kind}{self.index}"


DMA0 = Executor()


@dataclass
class DmaCommand:
    trigger: TrackedRegion
    buffer: str
    src: Region | None  # None: a sink entry, tracked but not forwarded
    dst_rank: int = -1
    dst_buffer: str = ""
    dst: Region | None = None
    op: Op = "update"
    dst_slots: list[int] = field(default_factory=list)
    dst_elems: list[int] = field(default_factory=list)
    executor: Executor = DMA0
    pull: bool = False  # get ``src`` of rank ``src_rank`` into the local ``dst``
    src_rank: int = -1  # pulls only
    adds: tuple[tuple[str, Region], ...] = ()  # cu only: local copies added to ``src``
    flag_only: bool = False  # a signal with no data (a flag put)
    result: TrackedRegion | None = None  # pulls, copies: the local signal the data's arrival
    # completes
    copy: bool = False  # a device-local copy (gather, scatter) into ``dst`` on this rank
    order: int = 0  # index in the rank's program order
    compute_after: bool = False  # a producer stage follows it in program order

    @property
    def moves_data(self) -> bool:
        return self.src is not None and not self.flag_only


Command = DmaCommand
