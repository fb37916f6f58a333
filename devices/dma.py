"""The engine thread that executes pre-programmed commands when their trigger completes:
the rank's DMA engines, its NICs and a concurrent CU-driven kernel's steps.

Commands are queued ahead, in the order the driver programmed them (T3: "commands
are pre-programmed ... triggering costs nothing extra at run time"). The engine
is a thread of its own, so it moves data with one-sided MPI operations while the
rank's compute thread runs later GEMM stages (the kernels release the GIL).
Each command: wait for its trigger region, ask the modelled clock when the
transfer arrives, read the source region, write it to the destination as a
store or an update, then signal the destination tracker with the arrival time
(put-with-signal). Ready commands that follow each other are served as a batch
(see ``DmaEngine._run``): the same bytes, fewer MPI operations.

Commands of every executor of the rank sit in one queue in the rank's program
order, served by this one host thread; each executor (DMA engine i, NIC i, the
CU kernel) is its own resource in modelled time (``emulator/engine/executors.py``),
so several engines overlap there while the host thread serves them in turn. A
command moves data as a push (read here, store or update there), a pull (get
from a peer, store here), a CU step (read here and add local copies first) or a
flag (no data, only the signal).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from devices.commands import DmaCommand
from devices.hbm import Hbm
from devices.regions import Region, join, region_shape
from devices.signals import TrackedRegion
from devices.tracker import Tracker


# timing(command, modelled arrival time of the trigger's remote updates) -> modelled
# arrival time at the destination (or completion time for a sink)
Timing = Callable[[DmaCommand, float], float]


class DmaEngine:
    BATCH = 64  # entries served at most as one batch

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
        """Serve the queue in order. Entries whose triggers are already complete when the
        engine reaches them, and that follow each other in the rank's program order, are
        served as one batch: each is timed on its own, but transfers that continue each
        other (the next tile of a row, the next whole rows) move as one MPI operation and
        each destination gets one put-with-signal for the batch. Nothing in a batch
        waits: it only holds back signals for as long as its transfers take."""
        try:
            cmds, n = self.commands, len(self.commands)
            i = 0
            while i < n:
                self._next = i
                cmd = cmds[i]
                self.status(f"DMA entry {i}/{n} waits for {cmd.trigger.name} "
                            f"({cmd.trigger.label})", True)
                t_remote = self.tracker.wait(cmd.trigger, self.watchdog_s, self.pending)
                self.status(f"DMA entries {i}.. of {n} move data from {cmd.trigger.name}", False)
                w0 = time.perf_counter()
                moves: list[list] = []
                signals: dict[int, dict[int, list]] = {}  # dst -> slot -> [elems, arrival]
                j = i
                while True:
                    t_arrival = self.timing(cmd, t_remote)
                    if cmd.src is not None:
                        if cmd.moves_data:
                            self._plan(moves, cmd, self.fault(cmd) if self.fault else "")
                        sig = signals.setdefault(cmd.dst_rank, {})
                        for slot, elems in zip(cmd.dst_slots, cmd.dst_elems):
                            cur = sig.setdefault(int(slot), [0, t_arrival])
                            cur[0] += int(elems)
                            cur[1] = max(cur[1], t_arrival)
                    j += 1
                    if (j == n or j - i == self.BATCH or cmds[j].order != cmd.order + 1
                            or not self.tracker.complete(cmds[j].trigger)):
                        break
                    cmd = cmds[j]
                    t_remote = self.tracker.arrival(cmd.trigger)
                for mv in moves:
                    self._move(*mv)
                for dst, sig in signals.items():
                    if sig:  # (a copy nothing waits for signals nothing)
                        self.tracker.signal(dst, list(sig), [v[0] for v in sig.values()],
                                            [v[1] for v in sig.values()])
                self.wall_events.append((cmds[i].trigger.name, w0, time.perf_counter()))
                i = j
            self._next = n
            self.status("DMA queue finished", True)
        except BaseException as exc:  # noqa: BLE001 - any failure must end the whole job
            self.on_error(exc)

    def _plan(self, moves: list[list], cmd: DmaCommand, action: str) -> None:
        """Add ``cmd``'s transfer to ``moves``, joined to the last one if it continues it."""
        if cmd.pull or cmd.adds:
            moves.append([cmd.buffer, cmd.src, cmd.dst_rank, cmd.dst_buffer, cmd.dst, cmd.op,
                          action, cmd])
            return
        if moves and not action and not moves[-1][6] and len(moves[-1]) == 7:
            last = moves[-1]
            if (last[0], last[2], last[3], last[5]) == (cmd.buffer, cmd.dst_rank,
                                                        cmd.dst_buffer, cmd.op):
                src = join(last[1], cmd.src, self.hbm.specs[cmd.buffer].shape[1])
                dst = join(last[4], cmd.dst, self.hbm.specs[cmd.dst_buffer].shape[1])
                if src and dst and region_shape(src) == region_shape(dst):
                    last[1], last[4] = src, dst
                    return
        moves.append([cmd.buffer, cmd.src, cmd.dst_rank, cmd.dst_buffer, cmd.dst, cmd.op,
                      action])

    def _move(self, buffer: str, src: Region, dst_rank: int, dst_buffer: str, dst: Region,
              op: str, action: str, cmd: DmaCommand | None = None) -> None:
        if cmd is not None and cmd.pull:  # a get from the source rank, stored here
            data = self.hbm.get(buffer, src, self.stream, cmd.src_rank)
        else:
            data = self.hbm.load(buffer, src, self.stream)
        if cmd is not None and cmd.adds:  # a CU kernel step adds its local copies
            for name, region in cmd.adds:
                more = self.hbm.load(name, region, self.stream)
                if data is not None:
                    from devices import kernels  # numba: only runs that move data

                    data = kernels.add(data, more)
        if action == "drop":
            return
        for _ in range(2 if action == "double" else 1):
            if op == "update":
                self.hbm.update(dst_buffer, dst, data, self.stream, dst_rank)
            else:
                self.hbm.store(dst_buffer, dst, data, self.stream, dst_rank)
