"""Modelled timing of the queued commands of every executor (DMA engines, NICs, a
concurrent CU-driven kernel), reserved in the rank's program order.

The first command of a trigger also models the trigger's completion: the
producer's local writes (``slot_done``) and the peers' writes that land in this
HBM (``land``), under the arbitration policy. The formulas are the model's
(``emulator/model/transfers.py``); this module only picks one per executor.
"""

from __future__ import annotations

from devices.commands import DmaCommand
from devices.regions import region_elems
from emulator.engine.launch import KernelRunner
from emulator.model import transfers
from emulator.model.arbitration import CommWindow
from emulator.model.clock import RankClock
from emulator.model.cost import CostModel
from emulator.runtime import watchdog


def _elems(trigger) -> int:
    """Elements of a trigger's region (its thresholds count ``after`` writes of each)."""
    return int(trigger.thresholds.sum() // max(1, trigger.meta.get("after", 1)))


class ExecutorTiming:
    def __init__(self, clock: RankClock, cost: CostModel,
                 incoming: dict[int, tuple[int, str, str]], runner: KernelRunner, policy,
                 own_writes: dict[int, int] | None = None):
        self.clock, self.cost, self.incoming, self.runner = clock, cost, incoming, runner
        self.itemsize = {name: spec.dtype.itemsize for name, spec in runner.hbm.specs.items()}
        self.own_writes = own_writes or {}  # id(trigger) -> element-writes by own WGs
        self.steady: set[int] = set()  # id(trigger): peers' data landing as one stream
        self.policy = policy
        self.complete_at = runner.complete_at
        self.last_end = 0.0
        self._elems: dict[int, int] = {}  # id(trigger) -> its elements

    def elems(self, trigger) -> int:
        n = self._elems.get(id(trigger))
        if n is None:
            n = self._elems[id(trigger)] = _elems(trigger)
        return n

    def _complete(self, cmd: DmaCommand, t_remote: float, window: CommWindow) -> float:
        """When the trigger's region is complete (computed once per trigger)."""
        trig = cmd.trigger
        key = id(trig)
        if key not in self.complete_at:  # the first command of a trigger sees it land
            elems = self.elems(trig)
            t_local = float(self.runner.slot_done[trig.slots].max()) if len(trig.slots) else 0.0
            if key not in self.incoming:  # a flag a peer wrote: done when it arrived
                t_local = max(t_local, t_remote)
            per_elem, op, buffer = self.incoming.get(key, (0, "store", ""))
            remote = elems * per_elem - self.own_writes.get(key, 0)  # this rank's own WGs'
            landed = 0.0  # stores into its other buffers are local writes (``slot_done``)
            if remote > 0:  # peers' writes land in this HBM from their arrival on
                nbytes = remote * self.itemsize[buffer]
                # they came in from the region's first arrival on (one burst from every
                # writer at once, or spread over the kernel: ``RankClock.receive``)
                tracker = self.runner.tracker
                first = tracker.first_arrival(trig)
                since = max(self.runner.start, first) if first < float("inf") else None
                far = min(remote, tracker.network_updates(trig)[0])  # from other nodes
                landed = transfers.land(self.clock, self.cost, t_remote, nbytes, op,
                                        f"{trig.name} remote {op}s land", self.policy, window,
                                        since=since, steady=key in self.steady,
                                        network=far * self.itemsize[buffer])
            done = max(t_local, landed)
            self.complete_at[key] = done
            self.clock.log("tracker", f"{trig.name} complete", done, done)
            self.last_end = max(self.last_end, done)
        return self.complete_at[key]

    def __call__(self, cmd: DmaCommand, t_remote: float) -> float:
        clock, cost = self.clock, self.cost
        name = cmd.trigger.name
        if not clock.order.ready(cmd.order):  # (its turn already: it does not wait)
            watchdog.post("dma", f"{cmd.executor.queue} entry {name}: its turn in program "
                          f"order", waiting=True)
        with clock.order.turn(cmd.order, f"{cmd.executor.queue} entry {name}"):
            window = CommWindow(cmd.compute_after)
            done = self._complete(cmd, t_remote, window)
            if cmd.src is None:
                return done
            ex = cmd.executor
            res = clock.executor(ex.kind, ex.index, ex.share)
            elems = region_elems(cmd.src) if cmd.copy else self.elems(cmd.trigger)
            src_e, dst_e = self.itemsize[cmd.buffer], self.itemsize[cmd.dst_buffer or cmd.buffer]
            nbytes = elems * dst_e  # what the transfer reads and delivers
            pol = self.policy
            if src_e > dst_e and not cmd.flag_only:  # narrowed in place first, as Flux's
                done = clock.hbm.comm(pol, done, elems * (src_e + dst_e), window,  # fp32 sums
                                      f"{name} narrowed")  # (``recast_backto_bf16``: read
                # the wide element, write the narrow one, which the transfer then reads; the
                # data path reads the wide one once: the rest is counted here)
                hbm = self.runner.hbm
                hbm.count(hbm.rank, self.runner.stream, "read", elems * dst_e)
                hbm.count(hbm.rank, self.runner.stream, "write", elems * dst_e)
            if cmd.flag_only:
                end, arrival = transfers.flag_put(clock, cost, res, done, cmd.dst_rank, name)
            elif cmd.copy:
                end, arrival = transfers.dma_copy(clock, cost, res, done, nbytes, name, pol,
                                                  window)
            elif cmd.pull:
                end, arrival = transfers.dma_pull(clock, cost, res, done, cmd.src_rank, nbytes,
                                                  name, pol, window)
            elif ex.kind == "nic":
                end, arrival = transfers.nic_put(clock, cost, done, cmd.dst_rank, nbytes,
                                                 name, pol, window)
            elif ex.kind == "cu":
                if ex.dispatch == "plain" and not ex.resident:  # its blocks wait for the
                    done = max(done, self.runner.plain_start())  # producer's launch
                end, arrival = transfers.cu_send(clock, cost, res, done, cmd.dst_rank,
                                                 1 + len(cmd.adds), nbytes, cmd.op, name, pol,
                                                 window, ex.share, ex.streams,
                                                 "library" if ex.library else "store")
                if not ex.resident:
                    self.runner.cu.ran(done, end, nbytes)
            else:
                end, arrival = transfers.dma_push(clock, cost, res, done, cmd.dst_rank, nbytes,
                                                  name, pol, window, ex.streams)
            self.last_end = max(self.last_end, end)
            return arrival
