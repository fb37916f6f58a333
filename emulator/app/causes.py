"""The causes of each gain: every configuration and its baseline run again on the
counterfactual devices of ``emulator/model/ablation.py`` (costs removed one after the
other, in ``ORDER``), and the gain split by how much each removal closes the gap.

The counterfactual runs are timing-only (their modelled times are those of numeric
runs) and use the plan the configuration's own run built, run on each counterfactual
device right after that run (one plan alive at a time): one run per cause found by a
run (``RUNS``: every cause but ``dram-traffic``), so up to ``len(RUNS)`` more runs of each
configuration and baseline. A step whose changes the run before it never read (on any
rank: ``emulator/model/reads.py``; the library's latency in a configuration with no
library collective, an executor's fraction it never uses) takes that run's times. A step
that leaves the device as it was (no library model for
``library-latency``, executors already at the library's fractions for
``executor-parity``, no switch's down port for ``ingress``, nothing of the GEMM model left
to remove for ``gemm-efficiency``) reuses the previous step's times instead of running
again. ``dram-traffic`` is no run: the two runs' own DRAM bytes (``dram_seconds``). A
search configuration (``flux-best``) is timed as the candidate it chose, a heuristic
(``ficco-auto``) picks from the real device as it did.
"""

from __future__ import annotations

import dataclasses
import os

from emulator.model import reads
from emulator.model.ablation import ORDER, RUNS, ablate, split, steps


class Counterfactuals:
    """The counterfactual runs of a job's configurations, one configuration at a time: a
    configuration's plan (the one its own run built, else built again from the real
    device) is run on each step's device right after that run, so one plan is alive at a
    time. Every rank calls ``run`` for the same names in the same order (collective)."""

    def __init__(self, comm, cfg, spec, memory):
        from emulator.app.catalog import registry

        self.comm, self.cfg, self.spec, self.memory = comm, cfg, spec, memory
        reg = registry(cfg.configs)
        pairs = {m: reg.baseline_of(m) for m in cfg.modes}
        pairs = {m: b for m, b in pairs.items() if b in cfg.modes}
        # configurations with a baseline in the job, and those baselines
        self.needed = list(dict.fromkeys([*pairs, *pairs.values()]))
        self.twins: list = []  # per step: the run's options, None when the step leaves the
        self.devices: list = []  # device as the step before left it (no modelled GEMM
        clock = spec  # kernel: the same device gives the same times, a deterministic
        for removed in steps():  # clock); and the step's device
            device = ablate(spec, removed)
            if device == clock:
                self.twins.append(None)
                self.devices.append(None)
                continue
            clock = device
            self.devices.append(device)
            self.twins.append(dataclasses.replace(
                cfg, ablate=removed, causes=False, timing_only=True, trace=None,
                record_wall=False, inject_fault=None))
        # the fields some step changes: read through ``reads.watched`` in every run here
        self.fields = set().union(*(reads.differences(spec, d) for d in self.devices if d))
        self._times: dict[str, list[float | None]] = {}  # name -> its time per step
        # a step whose changed fields the run before never read is not run
        # (T3EMU_CAUSES_EVERY_STEP=1: every step run, to check that this changes nothing)
        self.skip = os.environ.get("T3EMU_CAUSES_EVERY_STEP", "") != "1"

    def run(self, name: str, plan=None) -> None:
        """Time configuration ``name`` (not a search) on every step's device, with ``plan``
        (``runs.build``'s, deterministic: the plan its own run ran) or one built now."""
        from mpi4py import MPI

        from emulator.app.runs import build, run_built

        if name in self._times:  # a tuner's or heuristic's pick is often one of the job's
            return
        out: list[float | None] = []
        last = None  # (the device of the last run made, the fields it read on any rank)
        for twin, device in zip(self.twins, self.devices):
            if twin is None:
                out.append(None)
                continue
            if last is not None and self.skip and runs_alike(*last, device):
                out.append(None)  # it read none of the fields this step changes: the
                continue  # same reads, the same times as the run before
            if plan is None:
                plan = build(self.comm, twin, self.spec, name)
            with reads.reading() as seen:
                res = run_built(self.comm, twin, self.spec, plan, name, None, self.memory,
                                device=reads.watched(device, self.fields))
            read = set().union(*self.comm.allgather(seen))  # (every rank decides alike)
            out.append(self.comm.allreduce(res.end, op=MPI.MAX))
            last = (device, read)
        self._times[name] = out

    def times(self, ends: dict[str, float], choices: dict[str, str]) -> dict[str, list[float]]:
        """Configuration -> its modelled time with nothing removed (``ends``) and then under
        each cumulative step, for ``needed``; ``choices``: the configuration a search or
        heuristic configuration was timed as (run by ``run`` under that name)."""
        out = {}
        for m in self.needed:
            times = [ends[m]]
            for t in self._times[choices.get(m, m)]:
                times.append(times[-1] if t is None else t)
            out[m] = times
        return out


def runs_alike(ran, read: set, device) -> bool:
    """Whether a run on ``device`` gives the times of the run made on device ``ran``, which
    read the watched fields ``read`` (on some rank): it read none of the fields in which
    the two devices differ, so it would read the same values (a deterministic clock)."""
    return not reads.differences(ran, device) & read


def dram_seconds(runs: list[dict], world: int, hbm_bw: float) -> dict[str, float]:
    """Configuration -> the DRAM time of its run's bytes: its ranks' mean DRAM bytes (the
    run's ``dram_bytes``, summed over the ranks and its traffic categories, / ``world``)
    at ``hbm_bw`` (bytes/s, the device's sustained rate). The rank mean, not the bytes of
    the rank that ends last (whose end is the run's time): which rank that is can differ
    between the two runs and between ranks of equal load; where every rank moves the
    same bytes (the symmetric plans) the two are equal."""
    return {r["mode"]: sum(r["dram_bytes"].values()) / world / hbm_bw for r in runs}


def causes_of(mode: str, baseline: str, times: dict[str, list[float]],
              dram_s: dict[str, float] | None = None) -> dict:
    """The ``causes`` object of ``mode``'s run (see docs/concepts.md, 'Causes of a gain');
    ``dram_s``: configuration -> its rank-mean DRAM bytes at the HBM's rate
    (``dram_seconds``; the ``dram-traffic`` part is the baseline's less the
    configuration's, none without it)."""
    b, c = times[baseline], times[mode]
    diff = (dram_s[baseline] - dram_s[mode]) if dram_s else 0.0
    parts = split(b, c, diff)
    return {"baseline": baseline, "order": list(ORDER), "baseline_s": b[0], "time_s": c[0],
            "gain_s": b[0] - c[0], "parts_s": parts, "dram_traffic_s": diff,
            "steps": [{"removed": list(RUNS[:i]), "baseline_s": b[i], "time_s": c[i]}
                      for i in range(len(b))]}


def columns(records: list[dict]) -> list[str]:
    """The causes of ``causes`` records as columns: those of ``ORDER`` in its order, then
    any other a record names (in its own order), then ``overlap``. Records written with an
    older order (fewer causes) sit beside today's; a cause a record lacks is absent there
    (the causes it has hold that part)."""
    seen = list(dict.fromkeys(k for c in records for k in
                              [*(n for n in c.get("order", []) if n in c["parts_s"]),
                               *c["parts_s"]]))
    return [*(k for k in ORDER if k in seen), *(k for k in seen
                                                 if k not in ORDER and k != "overlap"),
            *(["overlap"] if "overlap" in seen else [])]


def line(mode: str, causes: dict) -> str:
    """'t3 over sequential: cut 25.3% = launches +0.0 link-efficiency +3.1 ... overlap
    +21.4' (the gain and its parts in points of the baseline's time; a negative cut is a
    slowdown)."""
    base = causes["baseline_s"]
    gain = causes["gain_s"] / base * 100
    return (f"{mode} over {causes['baseline']}: cut {gain:.1f}% = " + " ".join(
        f"{k} {v / base * 100:+.1f}" for k, v in causes["parts_s"].items()))
