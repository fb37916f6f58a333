"""The causes of each gain: every configuration and its baseline run again on the
counterfactual devices of ``emulator/model/ablation.py`` (costs removed one after the
other, in ``ORDER``), and the gain split by how much each removal closes the gap.

The counterfactual runs are timing-only (their modelled times are those of numeric
runs) and use the configuration's own plan (built once, run on each counterfactual
device); a step that leaves the device as it was (``gemm-efficiency`` on a GPU without a
modelled GEMM kernel) reuses the previous step's times instead of running again. A
search configuration (``flux-best``)
is timed as the candidate it chose, a heuristic (``ficco-auto``) picks from the real
device as it did.
"""

from __future__ import annotations

import dataclasses

from emulator.model.ablation import ORDER, ablate, split, steps


def counterfactual_times(comm, cfg, spec, ends: dict[str, float], choices: dict[str, str],
                         memory, plans: dict | None = None) -> dict[str, list[float]]:
    """Configuration -> its modelled time with nothing removed (``ends``) and then under
    each cumulative step, for every configuration of the job that has a baseline in the
    job, and those baselines. ``choices``: a search configuration's chosen candidate.
    ``plans``: the plans the job's own runs built (name -> plan), run again here instead
    of built again (``build`` is deterministic: the same plan)."""
    from mpi4py import MPI

    from emulator.app.catalog import registry
    from emulator.app.runs import build, run_built

    reg = registry(cfg.configs)
    pairs = {m: reg.baseline_of(m) for m in ends}
    pairs = {m: b for m, b in pairs.items() if b in ends}
    needed = list(dict.fromkeys([*pairs, *pairs.values()]))
    times = {m: [ends[m]] for m in needed}
    plans = dict(plans or {})  # each configuration's plan, built once from the real device
    clock = spec  # the device the previous step's runs were timed on
    for removed in steps():
        device = ablate(spec, removed)
        if device == clock:  # this step removes nothing here (no modelled GEMM kernel): the
            for m in needed:  # same device gives the same times (deterministic clock)
                times[m].append(times[m][-1])
            continue
        clock = device
        twin = dataclasses.replace(cfg, ablate=removed, causes=False, timing_only=True,
                                   trace=None, record_wall=False, inject_fault=None)
        ran: dict[str, float] = {}  # a tuner's pick is often a configuration of the job too
        for m in needed:
            name = choices.get(m, m)
            if name not in ran:
                if name not in plans:
                    plans[name] = build(comm, twin, spec, name)
                res = run_built(comm, twin, spec, plans[name], name, None, memory)
                ran[name] = comm.allreduce(res.end, op=MPI.MAX)
            times[m].append(ran[name])
    return times


def causes_of(mode: str, baseline: str, times: dict[str, list[float]]) -> dict:
    """The ``causes`` object of ``mode``'s run (see docs/concepts.md, 'Causes of a gain')."""
    b, c = times[baseline], times[mode]
    parts = split(b, c)
    return {"baseline": baseline, "order": list(ORDER), "baseline_s": b[0], "time_s": c[0],
            "gain_s": b[0] - c[0], "parts_s": parts,
            "steps": [{"removed": list(ORDER[:i]), "baseline_s": b[i], "time_s": c[i]}
                      for i in range(len(b))]}


def line(mode: str, causes: dict) -> str:
    """'t3 over sequential: cut 25.3% = launches +0.0 link-efficiency +3.1 ... overlap
    +21.4' (the gain and its parts in points of the baseline's time; a negative cut is a
    slowdown)."""
    base = causes["baseline_s"]
    gain = causes["gain_s"] / base * 100
    return (f"{mode} over {causes['baseline']}: cut {gain:.1f}% = " + " ".join(
        f"{k} {v / base * 100:+.1f}" for k, v in causes["parts_s"].items()))
