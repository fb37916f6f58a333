"""The rank's program order: when, among a kernel's stages, each queued command reserves
its resources (so modelled time never depends on host scheduling)."""

from __future__ import annotations

import numpy as np

from devices.commands import DmaCommand
from emulator.engine.kernel import Kernel, LaunchItems


def program_order(kernel: Kernel, commands: list[DmaCommand], lookahead: int,
                  nslots: int, slot_of: np.ndarray | None = None,
                  resident: np.ndarray | None = None, arrival_order: bool = False
                  ) -> tuple[list[int], list[DmaCommand]]:
    """``_program_order``, fixed once per kernel and inputs: a plan run again (a point's
    counterfactual runs) gets the same order (its commands' ``order`` and
    ``compute_after`` set again)."""
    key = (tuple(id(c) for c in commands), lookahead, nslots, id(slot_of),
           None if resident is None else resident.tobytes(), arrival_order)
    cache = kernel.__dict__.setdefault("_program_orders", {})
    got = cache.get(key)
    if got is None:
        stage_index, ordered = _program_order(kernel, commands, lookahead, nslots, slot_of,
                                              resident, arrival_order)
        got = cache[key] = (stage_index, ordered, [(c.order, c.compute_after) for c in ordered],
                            commands, slot_of)  # (the objects whose ids key it, kept alive)
    stage_index, ordered, marks = got[:3]
    for cmd, (order, after) in zip(ordered, marks):
        cmd.order, cmd.compute_after = order, after
    return list(stage_index), list(ordered)


def _program_order(kernel: Kernel, commands: list[DmaCommand], lookahead: int,
                   nslots: int, slot_of: np.ndarray | None = None,
                   resident: np.ndarray | None = None, arrival_order: bool = False
                   ) -> tuple[list[int], list[DmaCommand]]:
    """Fix the rank's program order of stages and queued commands (every executor's).

    Stage s sits at position s. A command whose trigger (or, for a pull, whose
    result) gates stage g comes just before it; a command whose region the producer writes comes after the stage of
    its last local write plus ``lookahead`` stages (the arbitration policy's), unless
    it is a sink (a region only marked complete, ``src`` None, which may need peers'
    writes that the peers' later stages make); a sink, and any other command, comes
    after the last stage (``slot_of``: the tracker slot each output tile's write counts
    into, when a map tracks a region whole). A command whose trigger is resident before
    the kernel (``resident``: the preloaded slots), as an all-gather's push of the rank's
    own rows, never comes after a command waiting for arrivals queued behind it (a
    forward, a sink or a pull of peers' rows, which may wait for what a peer sends only
    once this push has reached it); and, with ``arrival_order`` (forwards queued as their
    data arrives: a 1D ring), a forward is moved up to any forward queued behind it on
    the same executor to the same peer that a stage pulls ahead. Returns each stage's
    order index and the commands in program order (with ``order`` and ``compute_after``
    set).
    """
    stages = kernel.stages()
    slot_stage = np.full(nslots, -1, np.int32)
    items = kernel.wgs if isinstance(kernel.wgs, LaunchItems) else None
    spanned = _spanned(kernel, stages, slot_stage, slot_of)
    for s, ids in enumerate(stages):
        if spanned is not None and spanned[s]:
            continue
        span = items.span(ids) if items is not None else None
        if span is not None:  # consecutive tiles, stages in order: s is the latest stage
            t0, n = span[:2]  # of each of their slots (the same as the maximum below)
            a = kernel.space.slot_base + t0
            slot_stage[a : max(a, min(a + n, nslots))] = s
            if slot_of is not None:
                mapped = slot_of[t0 : t0 + n]
                slot_stage[mapped[mapped >= 0]] = s
            continue
        tiles = kernel.wg_tile[ids]
        slots = kernel.space.slot_base + tiles
        slots = slots[slots < nslots]  # (a space nothing tracks takes no slots)
        slot_stage[slots] = np.maximum(slot_stage[slots], s)
        if slot_of is not None:  # tiles counted into another slot (a region tracked whole)
            mapped = slot_of[tiles]
            mapped = mapped[mapped >= 0]
            slot_stage[mapped] = np.maximum(slot_stage[mapped], s)
    gate_stage: dict[int, int] = {}
    for s, ids in enumerate(stages):
        for g in kernel.gates_of(ids):
            gate_stage.setdefault(id(g), s)
    last = len(stages) - 1
    plain_after = plain_wave(kernel) if any(
        c.executor.kind == "cu" and c.executor.dispatch == "plain" for c in commands) else None
    keyed = []
    for i, cmd in enumerate(commands):
        keys = [id(cmd.trigger)] + ([id(cmd.result)] if cmd.result is not None else [])
        gated = [gate_stage[k] for k in keys if k in gate_stage]
        written = int(slot_stage[cmd.trigger.slots].max()) if len(cmd.trigger.slots) else -1
        if gated:
            pos = min(gated) - 0.5
        elif written >= 0 and cmd.src is not None:
            pos = min(written + lookahead, last) + 0.5
        else:
            pos = last + 0.5
        held = (written < 0 and resident is not None and len(cmd.trigger.slots) > 0
                and bool(resident[cmd.trigger.slots].all()))  # its trigger: resident rows
        ready = held and cmd.src is not None and not cmd.pull  # a push of them
        if ready and not gated and cmd.executor.kind == "cu" and not cmd.executor.resident:
            # a CU kernel launched with the producer, moving resident data: its blocks
            # take their CUs first (partitioned, prioritised), or once the running
            # launch's last wave is dispatched (plain: ``plain_wave``); its transfers come
            # there in program order, so the stages after it see its CUs, its traffic in
            # the L2 and its L2 bandwidth taken (``cu_side.py``, ``cache.py``)
            pos = (plain_after + 0.5 if cmd.executor.dispatch == "plain"
                   and plain_after is not None else -0.5)
        keyed.append([pos, i, cmd, written < 0 and not held, ready])
    # a push of resident rows never comes after a command that waits for arrivals (a
    # forward, a sink of peers' rows, a pull) queued behind it: that command may wait for
    # what a peer sends only after this push reaches it (else the engines deadlock)
    behind = float("inf")
    for entry in reversed(keyed):
        if entry[4]:
            entry[0] = min(entry[0], behind)
        elif entry[3]:
            behind = min(behind, entry[0])
    # where forwards are queued in arrival order (a 1D ring), they keep it per executor and
    # destination: a forward (ungated when no stage waits on its chunk alone: a stage gates
    # on the latest chunk it reads) never comes after one queued behind it that a stage
    # pulls ahead, as the peer waits for the earlier chunk first
    ahead: dict = {}  # per executor and destination: its forwards' queue
    for entry in reversed(keyed if arrival_order else []):
        cmd = entry[2]
        if entry[3] and cmd.src is not None and not cmd.pull:
            key = (cmd.executor.kind, cmd.executor.index, cmd.dst_rank)
            entry[0] = ahead[key] = min(entry[0], ahead.get(key, float("inf")))
    items = sorted([(float(s), -1, None) for s in range(len(stages))] + [e[:3] for e in keyed],
                   key=lambda x: (x[0], x[1]))
    stage_index, ordered = [], []
    for idx, (pos, _, cmd) in enumerate(items):
        if cmd is None:
            stage_index.append(idx)
        else:
            cmd.order = idx
            cmd.compute_after = pos < last
            ordered.append(cmd)
    return stage_index, ordered


SPAN_CHUNK = 1 << 20  # not a parameter: bookkeeping (items expanded at once, ``_spanned``)


def _spanned(kernel: Kernel, stages: list[np.ndarray], slot_stage: np.ndarray,
             slot_of: np.ndarray | None) -> np.ndarray | None:
    """For a kernel of ``LaunchItems`` in dispatch order (each stage consecutive items):
    the latest stage of every slot the stages that are a ``LaunchItems.span`` write, in
    ``slot_stage`` (the maximum, as ``_program_order``'s loop takes it), for all of them
    at once; which stages those are (the loop does the rest). None: not such a kernel."""
    items = kernel.wgs
    if not isinstance(items, LaunchItems) or not stages:
        return None
    known = items._slices
    if not all(known.get(id(ids)) is ids for ids in stages):  # (``Kernel.stages``: cut
        return None  # from the identity order, each registered consecutive)
    a = np.array([int(ids[0]) if len(ids) else -1 for ids in stages], np.int64)
    n = np.array([len(ids) for ids in stages], np.int64)
    offsets = items.offsets
    r = np.searchsorted(offsets, a, "right") - 1
    ok = (n > 0) & (r >= 0) & (r < len(offsets) - 1)
    rr = np.where(ok, r, 0)
    ok &= a + n <= offsets[np.minimum(rr + 1, len(offsets) - 1)]
    t0 = items.first[rr] + a - offsets[rr]
    base, nslots = kernel.space.slot_base, len(slot_stage)
    which = np.flatnonzero(ok)
    step = max(1, SPAN_CHUNK // max(1, int(n.max())))
    for lo in range(0, len(which), step):
        part = which[lo : lo + step]
        counts = n[part]
        tiles = np.arange(int(counts.sum()), dtype=np.int64) + np.repeat(
            t0[part] - (np.cumsum(counts) - counts), counts)
        stage = np.repeat(part.astype(np.int32), counts)
        slots = base + tiles
        inside = slots < nslots
        np.maximum.at(slot_stage, slots[inside], stage[inside])
        if slot_of is not None:  # (tiles past the map's end: none, as its slice has)
            held = tiles < len(slot_of)
            mapped, at = slot_of[tiles[held]], stage[held]
            np.maximum.at(slot_stage, mapped[mapped >= 0], at[mapped >= 0])
    return ok


def plain_wave(kernel: Kernel) -> int | None:
    """The stage a concurrent CU kernel dispatched ``plain`` waits for: the last wave of the
    producer's first launch, which the block scheduler dispatches whole before a kernel
    launched beside it at the same priority; None where that launch waits on a signal
    (then it is not dispatched first: the CU kernel's blocks take their CUs at once)."""
    stages = kernel.stages()
    if not len(stages):
        return None
    later = kernel.launch_stages()
    last = min(later) - 1 if later else len(stages) - 1
    if any(kernel.gates_of(stages[s]) for s in range(last + 1)):
        return None
    return last
