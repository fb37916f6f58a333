"""The DMA engine: executes pre-programmed commands when their trigger region completes.

Commands are queued ahead, in the order the driver programmed them (T3: "commands
are pre-programmed ... triggering costs nothing extra at run time"). The engine
is a thread of its own, so it moves data with one-sided MPI operations while the
rank's compute thread runs later GEMM stages (the kernels release the GIL).
Each command: wait for its trigger region, ask the modelled clock when the
transfer arrives, read the source region, write it to the destination as a
store or an update, then signal the destination tracker with the arrival time
(put-with-signal).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from devices.hbm import Hbm, Region
from devices.tracker import TrackedRegion, Tracker


@dataclass
class DmaCommand:
    trigger: TrackedRegion
    buffer: str
    src: Region | None  # None: a sink entry, tracked but not forwarded
    dst_rank: int = -1
    dst_buffer: str = ""
    dst: Region | None = None
    op: str = "update"  # "store" or "update"
    dst_slots: list[int] = field(default_factory=list)
    dst_elems: list[int] = field(default_factory=list)
    order: int = 0  # index in the rank's program order
    compute_after: bool = False  # a GEMM stage follows it in program order


# timing(command, modelled arrival time of the trigger's remote updates) -> modelled
# arrival time at the destination (or completion time for a sink)
Timing = Callable[[DmaCommand, float], float]


class DmaEngine:
    def __init__(self, hbm: Hbm, tracker: Tracker, commands: list[DmaCommand], timing: Timing,
                 watchdog_s: float, on_error: Callable[[BaseException], None], stream: str = "rs",
                 fault: Callable[[DmaCommand], str] | None = None,
                 status: Callable[[str, bool], None] | None = None):
        self.hbm = hbm
        self.tracker = tracker
        self.commands = commands
        self.timing = timing
        self.watchdog_s = watchdog_s
        self.on_error = on_error
        self.stream = stream
        self.fault = fault
        self.status = status or (lambda label, waiting: None)  # (what it does, is it a wait)
        self.wall_events: list[tuple[str, float, float]] = []
        self._next = 0
        self._thread = threading.Thread(target=self._run, name=f"dma-r{hbm.rank}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def join(self) -> None:
        self._thread.join()

    def pending(self) -> list[TrackedRegion]:
        return [c.trigger for c in self.commands[self._next :]]

    def _run(self) -> None:
        try:
            for i, cmd in enumerate(self.commands):
                self._next = i
                self.status(f"DMA entry {i}/{len(self.commands)} waits for {cmd.trigger.name} "
                            f"({cmd.trigger.label})", True)
                t_remote = self.tracker.wait(cmd.trigger, self.watchdog_s, self.pending)
                t_arrival = self.timing(cmd, t_remote)
                if cmd.src is None:
                    continue
                w0 = time.perf_counter()
                self.status(f"DMA entry {i}/{len(self.commands)} moves {cmd.trigger.name} to "
                            f"rank {cmd.dst_rank}", False)
                data = self.hbm.load(cmd.buffer, cmd.src, self.stream)
                action = self.fault(cmd) if self.fault else ""
                if action != "drop":
                    for _ in range(2 if action == "double" else 1):
                        if cmd.op == "update":
                            self.hbm.update(cmd.dst_buffer, cmd.dst, data, self.stream, cmd.dst_rank)
                        else:
                            self.hbm.store(cmd.dst_buffer, cmd.dst, data, self.stream, cmd.dst_rank)
                self.tracker.signal(cmd.dst_rank, cmd.dst_slots, cmd.dst_elems, t_arrival)
                self.wall_events.append((cmd.trigger.name, w0, time.perf_counter()))
            self._next = len(self.commands)
            self.status("DMA queue finished", True)
        except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
            self.on_error(exc)

