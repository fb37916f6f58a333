"""Split a py-spy profile of a run's ranks by the model's mechanisms (docs/performance.md,
"Where a point's time goes"):

    py-spy record --gil --subprocesses --format raw -r 50 -o PROFILE -- t3emu run ...
    python -m tests.profile_mechanisms PROFILE

``--gil`` keeps the samples of threads holding the GIL (a rank's compute thread and its
DMA host thread working), so waits in MPI and sleeps are not counted. A sample inside a
rank's run (``run_plan``, or the DMA thread) counts for the first mechanism of ``CATS``
one of whose functions is on its stack; the share of each is printed. (A tool for reading
a profile, not a test.)"""

from __future__ import annotations

import collections
import re
import sys

CATS = [  # (mechanism, the functions that put a sample there), first match wins
    ("L2 share: a stage costed again at its cache share (settle, again)",
     ["settle", "KernelRunner._l2_share.<locals>.rate_at",
      "KernelRunner._time_items.<locals>.again"]),
    ("bytes_within's scan (what passed through the cache; a CU kernel's L2 rate)",
     ["bytes_within"]),
    ("row switches (Dram.switch_bytes and its reservation)", ["Dram._switch",
                                                              "Dram.switch_bytes"]),
    ("a stage's own cost (panels, sums, writes)", ["stage_cost"]),
    ("DRAM timeline and arbitration (fill, preempt, bursts, the queue's mean)",
     ["BandwidthTimeline.fill", "BandwidthTimeline.preempt", "Dram.comm", "Dram.stream",
      "Dram.queued", "Dram._held", "Dram.settle", "Dram.reserve"]),
    ("DMA and executor timing (the host thread's commands)", ["ExecutorTiming.__call__",
                                                              "DmaEngine._run"]),
    ("memo key, routing and signals per stage", ["KernelRunner._memo_key",
                                                 "KernelRunner._route_plain",
                                                 "KernelRunner._route_counted",
                                                 "Tracker.signal", "KernelRunner._send_held"]),
    ("status board posts", ["post", "StatusBoard.post"]),
    ("program-order turns (thread hand-offs)", ["_Turn.__exit__", "_Turn.__enter__",
                                                "ProgramOrder.leave", "ProgramOrder.enter"]),
    ("plan, maps, program order (set-up per run)", ["build", "AddressMap.compile",
                                                    "program_order",
                                                    "run_plan.<locals>.<dictcomp>"]),
    ("per-stage bookkeeping (gates, groups, the rest of a stage's or round's timing)",
     ["KernelRunner._time_stage", "KernelRunner._time_round",
      "KernelRunner._time_shared_round", "KernelRunner.run"]),
]


def shares(path: str) -> tuple[int, list[tuple[str, int]]]:
    """(samples inside the ranks' runs, [(mechanism, samples)] most first) of a py-spy raw
    (collapsed) profile."""
    counts: collections.Counter = collections.Counter()
    total = 0
    with open(path) as f:
        for line in f:
            stack, n = line.rsplit(" ", 1)
            frames = [re.sub(r" \(.*$", "", fr) for fr in stack.split(";")]
            if "run_plan" not in frames and "DmaEngine._run" not in frames:
                continue
            total += int(n)
            name = next((c for c, keys in CATS if any(k in frames for k in keys)), "other")
            counts[name] += int(n)
    return total, counts.most_common()


if __name__ == "__main__":
    total, rows = shares(sys.argv[1])
    print(f"{total} samples in the ranks' runs")
    for name, n in rows:
        print(f"{100 * n / max(total, 1):5.1f}%  {name}")
