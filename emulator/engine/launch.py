"""Runs a ``Kernel`` on this rank: the numba arithmetic, the modelled time of its stages
(or of a persistent grid's WG timelines) in program order, and the routing of every
finished tile (see ``kernel.py`` for the model)."""

from __future__ import annotations

import dataclasses
import math
import time

import numpy as np

from devices.hbm import STORAGE_DTYPES, Hbm
from devices.regions import join, region_shape
from devices.tracker import Tracker
from emulator.engine.addrmap import Route, route_parts
from emulator.engine.cu_side import CuSide
from emulator.engine.kernel import STAGE, Gates, Kernel, LaunchItems
from emulator.model import cache, params, transfers
from emulator.model.arbitration import Alone
from emulator.model.clock import RankClock
from emulator.model.cost import CostModel, StageCost
from emulator.runtime import faults, watchdog
from emulator.runtime.rank import RANK


class KernelRunner:
    """Runs one kernel on this rank: functionally (numba) and in modelled time."""

    def __init__(self, hbm: Hbm, tracker: Tracker, clock: RankClock, cost: CostModel,
                 kernel: Kernel, routes: dict[int, Route], stage_index: list[int],
                 stream: str, policy=None, fault: tuple[str, int] = ("", -1),
                 label: str = "GEMM", cu_share: float = 0.0,
                 nic_regions: list[np.ndarray] | None = None, cu: CuSide | None = None):
        self.hbm, self.tracker, self.clock, self.cost = hbm, tracker, clock, cost
        self.kernel, self.routes = kernel, routes
        self.stage_index = stage_index
        self.stream = stream
        self.policy = policy or Alone()
        self.fault_kind, self.fault_stage = fault
        self.label = label
        self.cu_share = cu_share  # CUs held by a concurrent CU-driven kernel (at most)
        self.cu = cu if cu is not None else CuSide(share=cu_share)  # when it holds them
        self._cu_now = cu_share  # the share the stage being timed runs without
        self.slot_done = np.zeros(tracker.nslots, np.float64)  # modelled local-write times
        self.complete_at: dict[int, float] = {}  # id(signal) -> modelled completion
        self.wall_events: list[tuple[int, float, float]] = []
        self.stage_windows: list[tuple[float, float]] = []  # modelled (start, end) per stage
        self.start = clock.cu.free_at
        self.end = self.start
        # NIC-sent regions: slots -> tiles still to be written (the last WG issues the put)
        self._nic_left: dict[int, list] = {}
        writers = (np.bincount(kernel.wg_tile, minlength=len(kernel.space)) if nic_regions
                   else None)  # items per tile
        base = kernel.space.slot_base
        for slots in nic_regions or []:
            mine = [int(s) - base for s in slots if 0 <= int(s) - base < len(writers)]
            entry = [int(writers[mine].sum()) if mine else len(slots)]
            for s in slots:
                self._nic_left[int(s)] = entry
        self.out_e = hbm.specs[kernel.space.buffer].dtype.itemsize  # bytes per output element
        # when each WG slot is free again: a persistent kernel's physical WGs, or the
        # positions of an ordinary kernel's wave
        self.wg_free = np.full(kernel.stage_size, self.start)
        self.launch_stages = kernel.launch_stages()  # stages that begin another launch
        self._memo: dict = {}  # a timing-only stage's key -> its StageCost (``_memo_key``)
        self._stage_memos: dict = {}  # the same key -> ``CostModel.stage_memo``
        self._elems: dict = {}  # a ``LaunchItems.stage_shape`` signature -> (each item's
        # elements, their sum)
        self._spread: dict = {}  # a stage's items -> ``spread``'s answer
        slot = getattr(routes, "slot", None)  # whether a tile's local write is tracked
        self._tracked = slot is None or bool((slot >= 0).any())
        self._prev = None  # (the previous stage's items, whether the L2 has its panels)
        # slots of regions tracked whole -> the element-writes still to come from this
        # kernel: a timing-only stage adds to them and the slot is signalled once, full
        self.whole_left: dict[int, int] = {}
        self.whole_held: dict[int, int] = {}  # their counts not signalled yet
        cost.l2_reset()  # a new kernel's inputs are not in the L2 yet
        self._latency_bound = cost.latency_bound(kernel.producer)
        # communication's traffic shares the L2 with this kernel's panels (GEMM and GEMV
        # panels: other producers' reads do not go through the panel model)
        self._cache_shared = (cost.spec.comm_through_l2
                              and kernel.producer.kind in ("gemm", "gemv"))
        self._outputs_cached = getattr(kernel.producer, "outputs_cached", False)
        self._share = 1.0  # the L2 share the last items timed kept (``_l2_share``)
        # plain stages' signals to this rank's own tracker not sent yet (``_signal_here``)
        self._held_slots: list[np.ndarray] = []
        self._held_counts: list[np.ndarray] = []
        self._held_n = 0
        self._posted, self._waited = -math.inf, True  # the last status post (``_post``)

    # ---------------------------------------------------------------- modelled time
    def _gate_time(self, gates: Gates) -> float:
        t = 0.0
        for g in gates:
            t = max(t, self.complete_at[id(g)] if id(g) in self.complete_at
                    else self.tracker.arrival(g))
        return t

    def _issues(self, ids: np.ndarray) -> int:
        """NIC puts the items ``ids`` issue: regions whose last tile one of them writes."""
        if not self._nic_left:
            return 0
        n = 0
        for w in ids:
            slot = route_parts(self.routes, int(self.kernel.wg_tile[w]))[1]
            entry = self._nic_left.get(slot) if slot >= 0 else None
            if entry is not None:
                entry[0] -= 1
                n += entry[0] == 0
        return n

    def _time_items(self, s: int, ids: np.ndarray, start: float, resident: int | None,
                    read_scale: float = 1.0, sc=None, wave: np.ndarray | None = None,
                    key=None):
        """Reserve items run at once from ``start``; return (end, arrival per destination
        rank, their StageCost on an idle DRAM queue (what the memo keeps), their compute
        time with the queue's loaded latency). ``wave``: the stage the items are a group of
        (its WGs run side by side: the group takes the stage's compute time). ``key``: the
        stage's memo key (``_memo_key``), under which the cost model keeps what it derives
        from the items' rows and the L2's state (``CostModel.stage_memo``); only for a
        stage after a memo-able one, whose panels are what the L2 holds (after a stage
        outside the memo, or a launch, the key does not say what the L2 holds)."""
        if key is None:
            return self._time_items_at(s, ids, start, resident, read_scale, sc, wave)
        memo = self._stage_memos.get(key)
        if memo is None:
            if len(self._stage_memos) >= STAGE_MEMOS:
                self._stage_memos.clear()
            memo = self._stage_memos[key] = {}
        self.cost.stage_memo = memo
        try:
            return self._time_items_at(s, ids, start, resident, read_scale, sc, wave)
        finally:
            self.cost.stage_memo = None

    def _time_items_at(self, s, ids, start, resident, read_scale, sc, wave):
        clock, k = self.clock, self.kernel
        if sc is None:
            sc = stage_cost(self.cost, k, self.routes, ids, self.hbm.rank, resident,
                            read_scale, self._cu_now, self.out_e, wave)
        base = sc

        def again() -> StageCost:
            if self._prev is not None and not self._prev[1]:
                self._commit_prev()  # the L2 as the previous stage (from the memo) left it
                # Known defect, kept so that the numbers of record stay (docs/performance.md,
                # "An owed L2 commit"): the commit made here used to reset the share to the
                # whole cache, so this costing, the first substitution of ``cache.settle``
                # after a stage from the memo, is at share 1 whatever it was asked at
                self.cost.l2_share = 1.0
            return stage_cost(self.cost, k, self.routes, ids, self.hbm.rank, resident,
                              read_scale, self._cu_now, self.out_e, wave)
        share = self._l2_share(start, base, again)
        taken = self.cu.l2_rate(start, start + base.compute_s)  # the CU kernel's L2 traffic
        delay = 0.0
        if self._latency_bound:  # loaded latency: the communication queued ahead of its loads
            queued = clock.hbm.queued(start, start + sc.compute_s,
                                      self.policy.comm_room(clock.hbm))
            delay = queued / clock.hbm.rate
        if share < 1.0 or delay > 0 or taken > 0:
            self.cost.delay, self.cost.l2_share, self.cost.l2_taken = delay, share, taken
            try:
                sc = again()
            finally:
                self.cost.delay, self.cost.l2_share, self.cost.l2_taken = 0.0, 1.0, 0.0
        self._share = share
        compute_end = start + sc.compute_s
        read_end = compute_end
        if sc.read_bytes:
            nbytes = sc.read_time_bytes
            cap = nbytes / sc.compute_s if sc.compute_s > 0 else None
            read_end = max(compute_end, clock.hbm.reserve(start, nbytes, cap, "gemm reads",
                                                          compute=True)[1])
        end = hbm_end = clock.hbm.reserve(read_end, sc.write_cost_bytes, None, "gemm writes",
                                          compute=True)[1]
        arrivals = {self.hbm.rank: end}
        queue = k.store_queue
        began: dict[str, float] = {}  # STAGE: first port -> when this stage's stores began
        for dst, nbytes in sorted(sc.remote_bytes.items()):
            share = transfers.fraction(clock, self.cost, dst, "store")
            link_end = transfers.send(clock, dst, read_end, nbytes, f"stage {s} stores", share)
            arrivals[dst] = link_end + clock.latency(dst)
            route = clock.route(dst)
            if queue == STAGE:  # Kernel.store_queue: the stage retires once its stores
                # have begun to leave on every port they take (destinations behind one up
                # port queue there one after another: the first one's start counts)
                port = route.hops[0].port if route.hops else str(dst)
                began[port] = min(began.get(port, math.inf),
                                  link_end - nbytes / (route.rate * share))
            else:
                end = max(end, link_end - queue / (route.rate * share) if queue
                          else link_end)
        if began:
            end = max(end, max(began.values()))
        self.hbm.count(self.hbm.rank, "gemm", "read", int(sc.read_bytes))
        return end, arrivals, base, sc.compute_s

    def plain_start(self) -> float:
        """When a CU kernel dispatched ``plain`` may start: the start of the producer's
        first launch's last wave (``program.plain_wave``), timed before it in program
        order; 0 where none waits."""
        from emulator.engine.program import plain_wave

        if not hasattr(self, "_plain_wave"):  # once per kernel run
            self._plain_wave = plain_wave(self.kernel)
        s = self._plain_wave
        return self.stage_windows[s][0] if s is not None and s < len(self.stage_windows) \
            else 0.0

    def _l2_share(self, start: float, base: StageCost, again) -> float:
        """The share of the L2 a stage keeps beside the communication traffic that passes
        through it while the stage reads (``emulator/model/cache.py``); 1 where that
        traffic bypasses the L2 or none passes. ``again()``: the stage's cost at the
        share ``self.cost.l2_share`` is set to."""
        span = base.compute_s
        if not self._cache_shared or span <= 0:
            return 1.0
        comm = self.clock.hbm.through(start, start + span)
        if comm <= 0:
            return 1.0
        cached = self._outputs_cached

        def rate_at(share: float) -> float:
            if share >= 1.0:
                c = base
            else:
                self.cost.l2_share = share
                try:
                    c = again()
                finally:
                    self.cost.l2_share = 1.0
            return (c.read_bytes + (c.write_bytes if cached else 0.0)) / span
        return cache.settle(rate_at, comm / span)

    def _time_stage(self, s: int, groups: list[np.ndarray]) -> tuple[list[float], list[dict]]:
        """An ordinary stage: its groups start together (or at their gates) and the stage
        retires with its last group. A stage split into groups (WGs waiting on different
        signals) runs each group on WG slots as soon as they are free: the block scheduler
        gives the stage's j-th item (dispatch order) the j-th slot to free, so a group may
        start while a late group of the stage before still runs (or waits) elsewhere."""
        clock = self.clock
        free = self.wg_free
        launch = 0.0
        if s in self.launch_stages:  # another launch of the stream: its inputs are not in
            self.cost.l2_reset()  # the L2 yet; it starts once its waits are over
            self._prev = None
            launch = self.cost.spec.launch_s
        per_slot = len(groups) > 1 and not launch
        t0 = float(free.min()) if per_slot else clock.cu.free_at
        # the bytes communication took from earlier stages are served first (``Dram.settle``)
        stage_start = clock.hbm.settle(t0)
        if stage_start > t0:
            clock.log("displaced", "displaced bytes", t0, stage_start)
        if per_slot:  # the j-th item in dispatch order gets the j-th slot to free (FIFO)
            slot = np.argsort(free, kind="stable")
            pos = {w: int(slot[j]) for j, w in enumerate(self.kernel.stages()[s].tolist())}
        ends, arrivals, stage_end, first = [], [], stage_start, math.inf
        issue = self.cost.spec.put_issue_s
        self._cu_now = self.cu.share_at(stage_start)  # a concurrent CU kernel's CUs
        n = sum(len(g) for g in groups)
        if n not in self._spread:
            self._spread[n] = spread(self.cost, n, self.kernel)
        resident = self._spread[n]
        memo = self._memo_key(groups, resident) if len(groups) == 1 else None
        known = self._memo.get(memo[0]) if memo is not None else None
        if known is None and self._prev is not None and not self._prev[1]:
            self._commit_prev()  # a stage before came from the memo: its panels now
        scale = _shared_reads(self.cost, self.kernel, groups)
        wave = np.concatenate(groups) if len(groups) > 1 else None
        for g, ids in enumerate(groups):
            ready = stage_start
            if per_slot:
                at = [pos[w] for w in ids.tolist()]
                ready = max(ready, float(free[at].max()))
            start = max(ready, self._gate_time(self.kernel.gates_of(ids))) + launch
            first = min(first, start)
            if launch:
                clock.log("launch", f"stage {s}", start - launch, start)
            end, arr, sc, _ = self._time_items(s, ids, start, resident, scale, known, wave,
                                               memo[0] if memo is not None and memo[0][1]
                                               is not None else None)
            if memo is not None and known is None:
                self._memo[memo[0]] = sc
            end += issue * bool(self._issues(ids))  # the WGs that issue NIC puts
            if clock.record:
                clock.log("gemm", f"stage {s}" + (f" group {g}" if len(groups) > 1 else ""),
                          start, end, wgs=len(ids), flops=sc.flops, read_bytes=sc.read_bytes,
                          write_bytes=sc.write_bytes)
            ends.append(end)
            arrivals.append(arr)
            stage_end = max(stage_end, end)
            if per_slot:
                free[at] = end
        if per_slot:
            clock.cu.free_at = float(free.max())
        else:
            free[:] = clock.cu.free_at = stage_end
        self.stage_windows.append((first if per_slot else stage_start, stage_end))
        if memo is not None and known is not None:  # the L2 keeps its panels: committed only
            self._prev = (memo[1], False, self._share)  # when a stage outside the memo
            # needs them
        else:
            self._l2_commit(groups[0] if len(groups) == 1 else np.concatenate(groups))
            self._prev = (memo[1], True, self._share) if memo is not None else None
        return ends, arrivals

    def _memo_key(self, groups: list[np.ndarray], resident) -> tuple | None:
        """A timing-only stage of plain tiles of a GEMM: its cost depends only on its items'
        shapes relative to its first row and on the previous stage's items (the L2's
        panels) relative to the same row, so equal keys have equal costs (the same
        arithmetic). Returns (key, this stage's ``_StageItems``) or None."""
        k = self.kernel
        ids = groups[0]
        if (self.hbm.payload or k.producer.kind != "gemm" or self._nic_left
                or not _plain(self.routes, k, ids) or not len(ids)):
            return None
        items = _StageItems(k, ids)
        prev = None if self._prev is None else (self._prev[0].relative_to(items.r0),
                                                self._prev[2])
        return ((items.relative(), prev, resident, self._cu_now), items)

    def _commit_prev(self) -> None:
        """The L2 state after the previous stage (taken from the memo without its panels),
        owed to the cost model (``CostModel.l2_defer``): made when the L2 is next read."""
        items, _, share = self._prev
        self.cost.l2_defer(lambda: self._commit(items.wgs(), share))
        self._prev = (items, True, share)

    def _l2_commit(self, ids: np.ndarray) -> None:
        """The panels a stage (or a fair-share round) read stay for the next one (GEMM and
        GEMV panels; other producers' reads do not go through the panel model), as much
        of them as the share of the L2 the stage kept (``_l2_share``)."""
        if self.kernel.producer.kind in ("gemm", "gemv"):
            self._commit(_rows(self.kernel, ids), self._share)

    def _commit(self, wgs, share: float) -> None:
        was, self.cost.l2_share = self.cost.l2_share, share  # (an owed commit is made
        try:  # while a stage is costed at its own share)
            self.cost.l2_commit(wgs, self._outputs_cached)
        finally:
            self.cost.l2_share = was

    def _settle_round(self) -> None:
        """A persistent round: the bytes communication took from earlier rounds are served
        first (``Dram.settle``), from when its first WG is free; no WG starts its next task
        before they are."""
        t0 = float(self.wg_free.min())
        served = self.clock.hbm.settle(t0)
        if served > t0:
            self.clock.log("displaced", "displaced bytes", t0, served)
            np.maximum(self.wg_free, served, out=self.wg_free)

    def _time_round(self, s: int, ids: np.ndarray) -> tuple[list[float], list[dict]]:
        """A persistent kernel's round: task j of the round on physical WG j, each on its own
        timeline."""
        clock, k = self.clock, self.kernel
        self._settle_round()
        self._cu_now = self.cu.share_at(float(self.wg_free.min()))
        ends, arrivals, starts = [], [], []
        issue = self.cost.spec.put_issue_s
        for j, w in enumerate(ids):
            one = ids[j : j + 1]
            start = max(float(self.wg_free[j]), self._gate_time(k.gates_of(one)))
            starts.append(start)
            end, arr, sc, _ = self._time_items(s, one, start, k.stage_size)
            end += issue * self._issues(one)
            self.wg_free[j] = end
            clock.log(f"wg{j}", f"task {int(w)}", start, end, flops=sc.flops,
                      read_bytes=sc.read_bytes, write_bytes=sc.write_bytes)
            ends.append(end)
            arrivals.append(arr)
        clock.cu.free_at = float(self.wg_free.max())
        self.stage_windows.append((min(starts), clock.cu.free_at))
        return ends, arrivals

    def _time_shared_round(self, s: int, ids: np.ndarray) -> tuple[list[float], list[dict]]:
        """A persistent round of a ``fair_share`` kernel: the round's WGs with the same gates
        are served together (one HBM reservation from the earliest WG's start, shared
        fairly); each WG ends at the later of that and its own start plus its compute, plus
        its NIC issues."""
        clock, k = self.clock, self.kernel
        self._settle_round()
        self._cu_now = self.cu.share_at(float(self.wg_free.min()))
        issue = self.cost.spec.put_issue_s
        pos = {w: j for j, w in enumerate(ids.tolist())}
        ends: list[float] = [0.0] * len(ids)
        arrivals: list[dict] = [{}] * len(ids)
        first = np.inf
        for g, gids in enumerate(k.groups(ids)):
            gate = self._gate_time(k.gates_of(gids))
            js = [pos[w] for w in gids.tolist()]
            starts = [max(float(self.wg_free[j]), gate) for j in js]
            t0 = min(starts)
            first = min(first, t0)
            end, arr, sc, compute = self._time_items(s, gids, t0, k.stage_size)
            nic = bool(self._nic_left)
            for w, j, st in zip(gids.tolist(), js, starts):
                e = max(end, st + compute)
                if nic:
                    e += issue * self._issues((w,))  # the WG that writes a region's last
                self.wg_free[j] = ends[j] = e  # tile issues its put
                arrivals[j] = arr
                if clock.record:  # each physical WG's own track (the trace's WG timeline)
                    clock.log(f"wg{j}", f"task {w}", st, e)
            clock.log("gemm", f"round {s}" + (f" group {g}" if g else ""), t0, end,
                      wgs=len(gids), flops=sc.flops, read_bytes=sc.read_bytes,
                      write_bytes=sc.write_bytes)
        self._l2_commit(ids)
        clock.cu.free_at = float(self.wg_free.max())
        self.stage_windows.append((float(first), clock.cu.free_at))
        return ends, arrivals

    # ---------------------------------------------------------------- the run
    def run(self) -> float:
        k, hbm = self.kernel, self.hbm
        ws = k.producer.bind(hbm, RANK, k.wgs, k.stage_size, k.space.buffer) if hbm.payload \
            else None
        nstages = len(self.stage_index)
        ahead = ws is not None and ws.ahead and not k.gates
        for s, ids in enumerate(k.stages()):
            for g in k.gates_of(ids):  # the tracker releases the WGs that need it
                self._send_held()
                self._post(s, f" waits for {g.name}", waiting=True)
                self.tracker.wait(g, self.clock.watchdog_s)
            w0 = time.perf_counter()
            self._post(s, "", now=w0)
            if RANK.first_stage_unix is None:
                RANK.first_stage_unix = time.time()
            if s == self.fault_stage:
                faults.in_stage(self.fault_kind, f"{self.label} stage {s}/{nstages}", hbm.rank)
            if ahead and s == 0:  # every input resident: all the arithmetic at once
                items = k.wgs[k.order]
                ws.compute(items[np.lexsort((items[:, 2], items[:, 0]))])
            elif ws is not None and not ahead:  # the arithmetic first: no modelled time
                ws.compute(k.wgs[ids])
            turn, order = self.stage_index[s], self.clock.order
            if not order.ready(turn):  # (its turn already: it does not wait)
                self._send_held()
                self._post(s, ": its turn in program order", waiting=True)
            with order.turn(turn, f"stage {s}"):
                if k.persistent:
                    groups = [ids[j : j + 1] for j in range(len(ids))]
                    ends, arrivals = (self._time_shared_round(s, ids) if k.fair_share
                                      else self._time_round(s, ids))
                else:
                    groups = k.groups(ids)
                    ends, arrivals = self._time_stage(s, groups)
            if ws is None and not self._nic_left and _plain(self.routes, k, ids):
                self._route_plain(groups, ends)  # timing-only: the same counts, in bulk
                self.wall_events.append((s, w0, time.perf_counter()))
                continue
            self._post(s, ": writes its tiles")
            signals: dict[tuple[int, float], dict[int, int]] = {}
            if ws is None:  # timing-only: the same counts, grouped by tile and arrivals
                self._route_counted(ids if k.persistent else groups, ends, arrivals,
                                    signals)
            else:
                done = {int(w): (end, arr) for ids_g, end, arr in zip(groups, ends, arrivals)
                        for w in ids_g}
                writes = _Writes(hbm, ws, hbm.specs[k.space.buffer].shape[1],
                                 _narrower(self.cost.dtype))
                for j, (w, region, t) in enumerate(zip(ids.tolist(), k.wgs[ids, :4].tolist(),
                                                       k.wg_tile[ids].tolist())):
                    end, arr = done[w]
                    self._route(t, tuple(region), j, end, arr, signals, writes)
                writes.flush()
            for sl, c in signals.get((hbm.rank, 0.0), {}).items():  # (signalled now)
                if sl in self.whole_left:
                    self.whole_left[sl] -= c
            for (rank, t_arrival), counts in signals.items():  # one signal per destination
                self.tracker.signal(rank, list(counts), list(counts.values()), t_arrival)
            self.wall_events.append((s, w0, time.perf_counter()))
        self._send_held()
        if k.persistent:
            self._poll_at_exit()
        self.end = self.clock.cu.free_at
        return self.end

    POST_S = 0.02  # not a parameter: wall seconds between a busy thread's status posts

    def _post(self, s: int, what: str, waiting: bool = False, now: float | None = None
              ) -> None:
        """Post what the compute thread does at stage ``s`` on the rank's status board
        (``watchdog``): a wait at once, and the work after a wait at once; while it only
        works on from stage to stage, at most every ``POST_S`` of wall time (a post per
        stage of a paper-scale kernel cost some 5% of its wall time). The board's labels
        say where a stalled rank is; its progress is a busy thread's CPU time, read by
        the heartbeat, so a stale label of a working thread loses no progress."""
        now = time.perf_counter() if now is None else now
        if not (waiting or self._waited or now - self._posted >= self.POST_S):
            return
        self._posted, self._waited = now, waiting
        watchdog.post("compute", f"{self.label} stage {s}/{len(self.stage_index)}{what}",
                      waiting=waiting)

    HOLD = 1 << 16  # the most slots of held signals (then they are sent)

    def _signal_here(self, slots, counts) -> None:
        """A plain stage's signal to this rank's own tracker (time 0: a local write keeps
        its time in ``slot_done``), held and sent with the next ones as one signal. Only
        this rank's own threads read its tracker, so the signals held are sent before
        this thread waits for anything (a gate, its turn in program order) and when the
        kernel ends: no reader waits for them while this thread runs on; counts add and
        the time is 0, so the tracker ends the same."""
        self._held_slots.append(np.asarray(slots, np.int64))
        self._held_counts.append(np.asarray(counts, np.int64))
        self._held_n += len(slots)
        if self._held_n >= self.HOLD:
            self._send_held()

    def _send_held(self) -> None:
        if not self._held_slots:
            return
        slots, counts = self._held_slots, self._held_counts
        self._held_slots, self._held_counts, self._held_n = [], [], 0
        if len(slots) == 1:
            slots, counts = slots[0], counts[0]
        else:
            slots, counts = np.concatenate(slots), np.concatenate(counts)
            if not bool((slots[1:] > slots[:-1]).all()):  # a slot signalled twice: one sum
                slots, inv = np.unique(slots, return_inverse=True)
                counts = np.bincount(inv, weights=counts).astype(np.int64)
        self.tracker.signal(self.hbm.rank, slots, counts, 0.0)

    def _route_plain(self, groups: list[np.ndarray], ends: list[float]) -> None:
        """A timing-only stage whose tiles all stay here, written with the producer's op:
        its bytes counted once, its tracked slots' completion times and signals in bulk
        (what ``_route`` does tile by tile)."""
        k, hbm, routes = self.kernel, self.hbm, self.routes
        buffer = k.space.buffer
        op = routes.producer_op
        size = hbm.specs[buffer].dtype.itemsize
        shaped = self._shape_elems(groups[0]) if len(groups) == 1 else None
        if shaped is not None:  # a stage of a regular shape inside the buffer: by ranges
            total, t0, n, elems = shaped
            if op != "none" and total:
                hbm.count(hbm.rank, "gemm", _kind(op), total * size)
            if not self._tracked:
                return
            slots = routes.slot[t0 : t0 + n]
            tracked = slots >= 0
            if not tracked.any():
                return
            end = ends[0]
        else:
            ids = np.concatenate(groups)
            wgs = k.wgs[ids]
            _check_bounds(hbm, buffer, wgs)
            elems = (wgs[:, 1] - wgs[:, 0]) * (wgs[:, 3] - wgs[:, 2])
            if op != "none" and len(elems):
                hbm.count(hbm.rank, "gemm", _kind(op), int(elems.sum()) * size)
            slots = routes.slot[k.wg_tile[ids]]
            tracked = slots >= 0
            if not tracked.any():
                return
            end = np.concatenate([np.full(len(g), e) for g, e in zip(groups, ends)])
        slots, elems = slots[tracked], elems[tracked]
        end = end if np.isscalar(end) else end[tracked]
        step = slots[1:] - slots[:-1]
        if len(slots) < 2 or bool((step >= 0).all()):  # sorted: runs of one slot each
            starts = np.flatnonzero(np.concatenate(([True], step > 0)))
            uniq, counts = slots, elems
            if len(starts) < len(slots):  # some slot counts several tiles
                uniq, counts = slots[starts], np.add.reduceat(elems, starts)
                if not np.isscalar(end):
                    end = np.maximum.reduceat(end, starts)
            self.slot_done[uniq] = np.maximum(self.slot_done[uniq], end)
        else:
            np.maximum.at(self.slot_done, slots, end)
            uniq, inv = np.unique(slots, return_inverse=True)
            counts = np.bincount(inv, weights=elems).astype(np.int64)
        if not self.whole_left:  # (no region tracked whole: every count signalled now)
            self._signal_here(uniq, counts)
            return
        out_s, out_c = [], []
        for sl, c in zip(uniq.tolist(), counts.tolist()):
            left = self.whole_left.get(sl)
            if left is None:
                out_s.append(sl)
                out_c.append(c)
                continue
            self.whole_left[sl] = left - c  # a region tracked whole: held until its
            self.whole_held[sl] = self.whole_held.get(sl, 0) + c  # count is all in
            if left - c <= 0:
                out_s.append(sl)
                out_c.append(self.whole_held.pop(sl))
        if out_s:
            self._signal_here(out_s, out_c)

    def _shape_elems(self, ids: np.ndarray) -> tuple[int, int, int, np.ndarray] | None:
        """(elements, first tile, items, each item's elements) of a plain stage whose items
        have a ``LaunchItems.stage_shape`` and lie inside the output buffer; else None."""
        k = self.kernel
        if not isinstance(k.wgs, LaunchItems):
            return None
        shape = k.wgs.stage_shape(ids)
        if shape is None:
            return None
        sig, r0, height = shape
        rows, cols = self.hbm.specs[k.space.buffer].shape
        if r0 < 0 or r0 + height > rows or k.wgs.grid.ncols > cols:
            return None
        got = self._elems.get(sig)
        if got is None:
            each = k.wgs.item_elems(ids)
            got = self._elems[sig] = (each, int(each.sum()))
        return got[1], *k.wgs.span(ids)[:2], got[0]

    def _route_counted(self, groups, ends: list[float], arrivals: list[dict[int, float]],
                       signals: dict) -> None:
        """A timing-only stage's routing: what ``_route`` does item by item (bytes counted
        per destination, stream and kind; slot completion times; signal counts per
        (rank, arrival) and slot), done once per tile and arrival set on the items' summed
        elements and latest end. The same numbers as item by item. ``groups``: the
        stage's groups (``ends`` and ``arrivals`` per group), or the items of a persistent
        round (one end and arrival set per item)."""
        k, hbm, rank = self.kernel, self.hbm, self.hbm.rank
        if isinstance(groups, np.ndarray):
            ids, sizes = groups, 1
        else:
            sizes = np.fromiter((len(g) for g in groups), np.int64, len(groups))
            ids = np.concatenate(groups) if groups else np.zeros(0, np.int64)
        if not len(ids):
            return
        wgs, tiles = k.wgs[ids, :4], k.wg_tile[ids]
        buffer = k.space.buffer
        _check_bounds(hbm, buffer, wgs, np.asarray(k.space.tiles[tiles], np.int64))
        elems = (wgs[:, 1] - wgs[:, 0]) * (wgs[:, 3] - wgs[:, 2])
        end = np.repeat(np.asarray(ends, np.float64), sizes)
        index: dict[int, int] = {}  # the groups' arrival dicts (shared ones: by identity)
        arr_list: list[dict[int, float]] = []
        for a in arrivals:
            if id(a) not in index:
                index[id(a)] = len(arr_list)
                arr_list.append(a)
        arr_of = np.repeat(np.array([index[x] for x in map(id, arrivals)], np.int64), sizes)
        keys, inv = np.unique(tiles * len(arr_list) + arr_of, return_inverse=True)
        sums = np.bincount(inv, weights=elems).astype(np.int64)
        latest = np.full(len(keys), -np.inf)
        np.maximum.at(latest, inv, end)
        counted: dict[tuple, int] = {}
        itemsize = {name: spec.dtype.itemsize for name, spec in hbm.specs.items()}
        checked: set[int] = set()
        for key, n, last in zip(keys.tolist(), sums.tolist(), latest.tolist()):
            t, a = divmod(key, len(arr_list))
            arr = arr_list[a]
            local_op, slot, targets = route_parts(self.routes, t)
            if local_op != "none":
                c = (rank, "gemm", _kind(local_op))
                counted[c] = counted.get(c, 0) + n * itemsize[buffer]
                if slot >= 0:
                    if last > self.slot_done[slot]:
                        self.slot_done[slot] = last
                    counts = signals.setdefault((rank, 0.0), {})
                    counts[slot] = counts.get(slot, 0) + n
            if targets and t not in checked:
                checked.add(t)
                for tg in targets:
                    hbm.region_bytes(tg.buffer, tg.region)  # in bounds (items lie in t)
            for tg in targets:
                stream = "gemm" if tg.rank == rank else self.stream
                c = (tg.rank, stream, _kind(tg.op))
                counted[c] = counted.get(c, 0) + n * itemsize[tg.buffer]
                if tg.rank == rank and arr[rank] > self.slot_done[tg.slot]:
                    self.slot_done[tg.slot] = arr[rank]
                counts = signals.setdefault((tg.rank, arr[tg.rank]), {})
                counts[tg.slot] = counts.get(tg.slot, 0) + n
        for (dst, stream, kind), nbytes in counted.items():
            hbm.count(dst, stream, kind, nbytes)

    def _poll_at_exit(self) -> None:
        """Each physical WG polls its share of the exit flags (WG i: flags i, i+P, ...)."""
        P = self.kernel.stage_size
        for i, g in enumerate(self.kernel.exit_waits):
            watchdog.post("compute", f"{self.label}: WG {i % P} polls {g.name}", waiting=True)
            t = self.tracker.wait(g, self.clock.watchdog_s)
            self.wg_free[i % P] = max(self.wg_free[i % P], t)
        if self.kernel.exit_waits:
            self.clock.log("tracker", "exit flags polled", self.clock.cu.free_at,
                           float(self.wg_free.max()))
        self.clock.cu.free_at = float(self.wg_free.max())

    def _route(self, t: int, region, j: int, end: float, arrivals: dict[int, float],
               signals: dict, writes: _Writes) -> None:
        """Write item ``j``'s tile where its route says; add its tracker signals to
        ``signals`` ((rank, arrival) -> {slot: element-updates}), sent once the stage's
        tiles are out."""
        route, rank = self.routes[t], self.hbm.rank
        elems = (region[1] - region[0]) * (region[3] - region[2])
        if route.local_op != "none":
            writes.add(rank, self.kernel.space.buffer, route.local_op, "gemm", region,
                       region, j)
            if route.slot >= 0:
                if end > self.slot_done[route.slot]:
                    self.slot_done[route.slot] = end
                counts = signals.setdefault((rank, 0.0), {})
                counts[route.slot] = counts.get(route.slot, 0) + elems
        tile = self.kernel.space.region(t)
        for tg in route.targets:
            stream = "gemm" if tg.rank == rank else self.stream
            dst = tg.region
            if region != tile:  # the item writes part of its tile (a bag of a slice): the
                dr, dc = dst[0] - tile[0], dst[2] - tile[2]  # same part of the target
                dst = (region[0] + dr, region[1] + dr, region[2] + dc, region[3] + dc)
            writes.add(tg.rank, tg.buffer, tg.op, stream, dst, region, j)
            if tg.rank == rank and arrivals[rank] > self.slot_done[tg.slot]:
                self.slot_done[tg.slot] = arrivals[rank]  # a local write, done at the end
            counts = signals.setdefault((tg.rank, arrivals[tg.rank]), {})
            counts[tg.slot] = counts.get(tg.slot, 0) + elems


def _narrower(dtype: str):
    """The numpy element type of run dtype ``dtype`` if narrower than fp32, else None."""
    dt = np.dtype(STORAGE_DTYPES[dtype])
    return dt if dt.itemsize < 4 else None  # not a parameter: fp32 is 4 bytes


def _kind(op: str) -> str:
    """The HBM traffic kind of a write with ``op``."""
    return "update" if op == "update" else "write"


def _check_bounds(hbm: Hbm, buffer: str, regions: np.ndarray,
                  within: np.ndarray | None = None) -> None:
    """Raise the bounds error the item-by-item path would, for the first of ``regions``
    (rows of r0, r1, c0, c1) outside ``buffer`` or outside its row of ``within``."""
    if not len(regions):
        return
    rows, cols = hbm.specs[buffer].shape
    bad = ((regions[:, 0] < 0) | (regions[:, 2] < 0) | (regions[:, 1] > rows)
           | (regions[:, 3] > cols))
    if within is not None:
        bad |= ((regions[:, 0] < within[:, 0]) | (regions[:, 1] > within[:, 1])
                | (regions[:, 2] < within[:, 2]) | (regions[:, 3] > within[:, 3]))
    if bad.any():
        hbm.region_bytes(buffer, tuple(int(x) for x in regions[np.argmax(bad), :4]))


def spread(cost: CostModel, n: int, k: Kernel | None = None) -> int | None:
    """When the device spreads a partial stage of ``n`` WGs over its CUs (``partial_stage =
    "spread"``): each CU holds ceil(n / CUs) of them, so each WG gets 1/(CUs x that) of the
    peak (the WG slots a stage's time is set by); None: each WG at 1/S of the peak (S:
    the device's slots), or a modelled GEMM kernel, which spreads its own WGs
    (``GemmKernel.stage_seconds``: split-K runs several per item)."""
    cus = cost.spec.cus
    gemm = getattr(k.producer, "kernel", None) if k is not None else None
    if gemm is not None and gemm.modelled:  # the kernel spreads its own WGs (split-K's
        return None  # several per item: ``GemmKernel.stage_seconds``)
    if cost.spec.partial_stage == "spread" and n < cost.spec.wgs_per_stage:
        return -(-n // cus) * cus
    return None


def _shared_reads(cost: CostModel, k: Kernel, groups: list[np.ndarray]) -> float:
    """A stage's groups share the L2, so its panels are read once: the factor on each
    group's own reads."""
    if len(groups) < 2:
        return 1.0
    whole = k.producer.cost(cost, k.wgs[np.concatenate(groups)])[2]
    parts = sum(k.producer.cost(cost, k.wgs[ids])[2] for ids in groups)
    return whole / parts if parts else 1.0


def stage_cost(cost: CostModel, k: Kernel, routes: dict[int, Route], ids: np.ndarray,
               rank: int, resident: int | None, read_scale: float = 1.0,
               cu_share: float = 0.0, out_e: float | None = None,
               wave: np.ndarray | None = None):
    """The ``StageCost`` of items ``ids`` run at once: the producer's compute and reads
    (reads x ``read_scale``; compute slowed by the CUs a concurrent kernel holds) and
    where their routes write the tiles (``out_e`` bytes per element: the output buffer's
    element, which may be wider than the run's dtype, as Flux's fp32 reduction buffer).
    ``wave``: the whole stage ``ids`` are a group of: its WGs share the GPU, so the group's
    compute time is the stage's (a group alone would be given the whole GPU: a modelled
    kernel's split-K of a few tiles)."""
    wgs = _rows(k, ids)
    flops, compute, reads = k.producer.cost(cost, wgs, resident)
    if wave is not None:
        compute = k.producer.cost(cost, k.wgs[wave], resident)[1]
    if cu_share:
        compute /= 1.0 - cu_share
    if _plain(routes, k, ids):  # every tile written here with the producer's op
        sc = cost.with_local_writes(wgs, flops, compute, reads * read_scale,
                                    routes.producer_op, out_e)
    else:
        rs = [route_parts(routes, t) for t in k.wg_tile[ids].tolist()]
        sc = cost.with_writes(wgs, flops, compute, reads * read_scale,
                              [r[0] for r in rs], [[t.rank for t in r[2]] for r in rs],
                              rank, out_e)
    efficiency = getattr(k.producer, "read_efficiency", None)  # random rows: row locality
    if efficiency is not None and sc.read_bytes:
        eff = efficiency(cost, resident or len(ids))
        sc = dataclasses.replace(sc, read_cost_bytes=sc.read_bytes / eff)
    return sc


STAGE_MEMOS = 1 << 16  # not a parameter: a bound on memory (stage memos kept before they
# start again), which no modelled time depends on

_ROWS_LAST: list = [None, None, None]  # (kernel, ids, rows): ``_rows``


def _rows(k: Kernel, ids: np.ndarray) -> np.ndarray:
    """The rows (r0, r1, c0, c1, k0, k1) of items ``ids`` of ``k``, one array per items asked
    in a row: a stage is costed at each L2 share, loaded latency and L2 bandwidth it meets
    and then committed to the L2 on the same items, and the cost model keeps what it
    derived from them for the array it was given (``CostModel._shape``). Read only."""
    last = _ROWS_LAST
    if last[1] is ids and last[0] is k:
        return last[2]
    rows = k.wgs.rows(ids) if isinstance(k.wgs, LaunchItems) else k.wgs[ids]
    last[:] = [k, ids, rows]  # (kept alive, so no other object takes their ids)
    return rows


_PLAIN_LAST: list = [None, None, None, False]  # (routes, kernel, ids, answer): a stage asks twice


def _plain(routes, k: Kernel, ids: np.ndarray) -> bool:
    """Every item of ``ids`` writes its tile locally with the producer's op (no target)."""
    plain = getattr(routes, "plain", None)
    if plain is None:
        return False
    last = _PLAIN_LAST
    if last[2] is ids and last[0] is routes and last[1] is k:
        return last[3]
    span = k.wgs.span(ids) if isinstance(k.wgs, LaunchItems) else None
    if span is not None:  # consecutive tiles
        out = bool(plain[span[0] : span[0] + span[1]].all())
    else:
        out = bool(plain[k.wg_tile[ids]].all())
    last[:] = [routes, k, ids, out]  # (kept alive, so no other object takes their ids)
    return out


class _StageItems:
    """A memo-able stage's items as its memo key sees them: by their ``LaunchItems.stage_shape``
    (signature and first row, no per-item arithmetic) when they have one, else by their
    rows relative to the first row; the rows themselves computed only when the L2 needs
    them."""

    __slots__ = ("kernel", "ids", "shape", "r0", "_wgs")

    def __init__(self, kernel: Kernel, ids: np.ndarray):
        self.kernel, self.ids = kernel, ids
        items = kernel.wgs
        self.shape = items.stage_shape(ids) if isinstance(items, LaunchItems) else None
        self._wgs = None
        self.r0 = self.shape[1] if self.shape is not None else int(self.wgs()[0, 0])

    def wgs(self) -> np.ndarray:
        if self._wgs is None:
            self._wgs = _rows(self.kernel, self.ids)
        return self._wgs

    def relative_to(self, r0: int):
        """The items' rows relative to row ``r0`` (hashable; equal values, equal rows)."""
        if self.shape is not None:
            return ("shape", self.shape[0], self.r0 - r0)
        shift = np.array([r0, r0, 0, 0, 0, 0], np.int64)
        return (self.wgs() - shift).tobytes()

    def relative(self):
        return self.relative_to(self.r0)


def first_stage_load(cost: CostModel, k: Kernel, routes: dict[int, Route], rank: int,
                     cu_share: float = 0.0, out_e: float | None = None
                     ) -> tuple[float, float, float] | None:
    """What MCA watches during a kernel's first stage, which runs alone (T3): the
    DRAM utilisation of the stage (its reads and writes over its read and write phases),
    of its read phase alone, and the DRAM queue's mean occupancy over it
    (``queue_occupancy``), as ``KernelRunner`` times the stage on an idle HBM.
    Known before the kernel runs, so the rank's program order can follow the policy
    it picks. None for a persistent kernel (no isolated stage) or one without time."""
    if k.persistent or not len(k.wgs):
        return None
    cost.l2_reset()
    first = k.stages()[0]
    groups = k.groups(first)
    sc = stage_cost(cost, k, routes, groups[0], rank, spread(cost, len(first), k),
                    _shared_reads(cost, k, groups), cu_share, out_e)
    bw = cost.spec.hbm_bw
    read_t = max(sc.compute_s, sc.read_bytes / bw)
    total_t = read_t + sc.write_cost_bytes / bw
    cost.l2_reset()
    if total_t <= 0:
        return None
    steps = max(1, math.ceil(float((k.wgs[first][:, 5] - k.wgs[first][:, 4]).max())
                             / params.value("k_step"))) if sc.read_bytes else 1
    return ((sc.read_bytes + sc.write_cost_bytes) / (total_t * bw),
            sc.read_bytes / (read_t * bw) if read_t > 0 else 0.0,
            queue_occupancy(cost.spec, sc.read_bytes, steps, read_t, sc.write_cost_bytes,
                            total_t))


def queue_occupancy(spec, reads: float, steps: int, read_t: float, writes: float,
                    total_t: float) -> float:
    """The mean requests per channel in the DRAM's queue over a stage that runs alone (what
    MCA watches, T3): the stage's WGs walk K together, so each K step's loads reach the
    DRAM as one burst of reads / steps bytes (each panel's step read once, the L2 serving
    the other WGs), and its output leaves in one write burst (T3: "a read phase followed
    by a bursty write phase"). A burst of B bytes fills the queue (Q bytes: channels x
    depth x access) up to Q and drains at the HBM's rate mu, the rest waiting outside,
    so it holds (B^2 / 2 if B <= Q, else Q (B - Q) + Q^2 / 2) / mu byte-seconds; reads that
    keep the HBM busy through the read phase keep the queue full meanwhile. Their sum
    over the stage's time, per channel, in requests."""
    dram = spec.dram
    mu = spec.hbm_bw
    channels = dram.channels_for(spec.hbm_bw)  # as the rank's ``Dram`` counts them
    q = float(channels * dram.queue_depth * dram.access_bytes)

    def held(b: float) -> float:
        return (b * b / 2.0 if b <= q else q * (b - q) + q * q / 2.0) / mu

    read_held = min(steps * held(reads / steps), q * read_t) if reads > 0 else 0.0
    return (read_held + held(writes)) / total_t / (channels * dram.access_bytes)


class _Writes:
    """A stage's tile writes, coalesced: tiles that go side by side to one destination
    array (same rank, op and stream) from side-by-side WG outputs are one store or update
    of their union, as a GPU's write-combining merges a row of WGs' lines into one
    stream. Bytes and tracker signals are per tile either way; only the number of MPI
    operations changes."""

    def __init__(self, hbm: Hbm, ws, src_width: int, epilogue=None):
        self.hbm = hbm
        self.epilogue = epilogue  # the run's element type when narrower than fp32: a GEMM's
        # epilogue converts its tile to it even when the destination is an fp32 buffer
        # (Flux's fp32 reduction of bf16 tiles, epilogue_evt_nvshmem.hpp ``end_step``)
        self.canvas = ws.canvas if ws is not None else None
        self.buf = ws.buf if ws is not None else None
        self.src_width = src_width  # of the output buffer the WG regions (and canvas) index
        self.pending: dict[tuple, list] = {}
        self.counted: dict[tuple, int] | None = None if hbm.payload else {}  # timing-only:
        # the same bytes counted per destination, stream and kind, without the regions

    def add(self, rank: int, buffer: str, op: str, stream: str, dst, src, j: int) -> None:
        if self.counted is not None:
            key = (rank, stream, _kind(op))
            self.counted[key] = self.counted.get(key, 0) + self.hbm.region_bytes(buffer, dst)
            return
        key = (rank, buffer, op, stream)
        cur = self.pending.get(key)
        if cur is not None and self.buf is None:  # WG outputs side by side in the canvas
            to = join(cur[0], dst, self.hbm.specs[buffer].shape[1])
            frm = join(cur[1], src, self.src_width)
            if to and frm and region_shape(to) == region_shape(frm):
                cur[0], cur[1] = to, frm
                return
        if cur is not None:
            self._write(key, cur)
        self.pending[key] = [dst, src, j]

    def flush(self) -> None:
        for (rank, stream, kind), nbytes in (self.counted or {}).items():
            self.hbm.count(rank, stream, kind, nbytes)
        if self.counted:
            self.counted.clear()
        for key, cur in self.pending.items():
            self._write(key, cur)
        self.pending.clear()

    def _write(self, key: tuple, cur: list) -> None:
        rank, buffer, op, stream = key
        dst, src, j = cur
        data = None  # timing-only: the same writes, no data
        if self.canvas is not None:
            data = self.canvas[src[0] : src[1], src[2] : src[3]]
        elif self.buf is not None:
            data = self.buf[j, : src[1] - src[0], : src[3] - src[2]]
        to = self.hbm.specs[buffer].dtype
        if data is not None and (to != np.float32 or self.epilogue is not None):
            from devices import kernels  # the epilogue's element type first (an fp32

            data = kernels.narrow(data, self.epilogue or to)  # buffer then adds it widened)
        if op == "update":
            self.hbm.update(buffer, dst, data, stream, rank)
        else:
            self.hbm.store(buffer, dst, data, stream, rank)
