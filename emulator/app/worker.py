"""The MPI program every rank runs for ``t3emu run``: all modes, checks, summary, JSON."""

from __future__ import annotations

import sys
import time

from emulator.app.config import RunConfig
from emulator.app.files import write_json_atomic
from emulator.runtime.process import (abort, install_abort_handlers, mark_rank, note_shm,
                                      pin_threads)
from emulator.runtime.rank import RANK

pin_threads()


def _fmt_bytes(n: float) -> str:
    return f"{n / 1e6:,.1f} MB"


def platform(spec, world: int) -> str:
    """The emulated machine in words: its GPUs, and for several nodes the intra-node
    topology and the network, e.g. "2 nodes x 8 a100-sxm (switch in a node) over a fabric
    of 4 NICs x 25 GB/s/dir per node (system a100-sxm-2x8)"."""
    from emulator.model.topology import Topology

    ic = spec.interconnect
    system = f" (system {spec.system})" if getattr(spec, "system", None) else ""
    topo = Topology(ic, world)
    if topo.nodes == 1:
        return f"a {ic.topology} of {world} x {spec.name}{system}"
    return (f"{topo.nodes} nodes x {topo.per_node} {spec.name} ({ic.topology} in a node) over "
            f"a {ic.network} of {ic.nics_per_node} NIC{'s' if ic.nics_per_node > 1 else ''} x "
            f"{ic.nic_bw / 1e9:g} GB/s/dir per node{system}")


def header(cfg: RunConfig, spec, world: int) -> str:
    """The first line of a run's summary (also printed before the launch)."""
    params = cfg.resolved_params()
    return (f"t3emu: {cfg.collective.upper()} ({cfg.algorithm}) on {platform(spec, world)}, "
            f"M={cfg.m} N={cfg.n} K={cfg.k} {cfg.dtype}"
            + (f", split-K {cfg.split_k}" if cfg.split_k > 1 else "")
            + "".join(f", {n}={v:g}" for n, v in params)
            + "".join(f", --set {k}={v}" for k, v in cfg.overrides))


# the summary's columns (keys: their headers) and those aligned right
SUMMARY_LABELS = {"mode": "mode", "modelled": "modelled", "speedup": "speedup",
                  "phases": "phases (us)", "dram": "DRAM", "numerics": "numerics",
                  "wall": "wall"}
SUMMARY_RIGHT = {c: "right" for c in ("modelled", "speedup", "dram", "wall")}


def _summary_rows(doc: dict) -> list[dict]:
    """A row per configuration of the summary's table, each cell as it is printed."""
    rows = []
    for run in doc["runs"]:
        phases = ", ".join(f"{k} {v * 1e6:.1f}" for k, v in run["phases"].items())
        if run["numerics"] == "timing-only":
            verdict = "timing-only"
        else:
            frac = run.get("max_error_vs_tolerance")
            verdict = run["numerics"].upper() + f" (max err {run['max_abs_error']:.3g}" + (
                f", {frac:.2g} of tol)" if frac is not None and frac == frac and frac > 0
                and frac != float("inf") else ")")
        sp = run.get("speedup", run.get("speedup_vs_sequential"))
        rows.append({"mode": run["mode"], "modelled": f"{run['modelled_time_s'] * 1e6:.1f} us",
                     "speedup": f"{sp:.3f}x" if sp else "-", "phases": phases,
                     "dram": _fmt_bytes(sum(run["dram_bytes"].values())),
                     "numerics": verdict, "wall": f"{run['wall_time_s']:.2f}s"})
    return rows


def summary_table(doc: dict) -> str:
    from emulator.app.tables import render, width

    lines = []
    cfg = doc["config"]
    system = doc["device"].get("system")
    lines.append(doc.get("header") or (
        f"t3emu: {cfg['collective'].upper()} ({cfg['algorithm']}) on a "
        f"{cfg['topology']} of {doc['world_size']} x {doc['device']['name']}"
        + (f" (system {system})" if system else "") + ", "
        f"M={cfg['m']} N={cfg['n']} K={cfg['k']} {cfg['dtype']}"
        + (f", split-K {cfg['split_k']}" if cfg["split_k"] > 1 else "")
        + "".join(f", {n}={v:g}" for n, v in (doc.get("params") or {}).items())))
    if cfg.get("ablate"):
        from emulator.model.ablation import HELP

        lines.append("counterfactual (--ablate): " + "; ".join(
            f"{a}: {HELP[a]}" for a in cfg["ablate"]))
    w = max([13] + [len(run["mode"]) for run in doc["runs"]])  # the mode column
    lines.append(render(_summary_rows(doc), list(SUMMARY_LABELS), labels=SUMMARY_LABELS,
                        align=SUMMARY_RIGHT, wrap=["phases"]))
    bw = [(run["mode"], run.get("bandwidth") or {}) for run in doc["runs"]]
    if any(b for _, b in bw):
        lines.append("collective bandwidth, GB/s (nccl-tests: algbw = bytes / time, busbw = "
                     "algbw x (n-1)/n, AR x 2(n-1)/n):")
        for mode, b in bw:
            if b:
                lines.append(f"  {mode:<{w}} " + "; ".join(
                    f"{k} {v['bytes']} B algbw {v['algbw_gb_s']:.1f} busbw "
                    f"{v['busbw_gb_s']:.1f}" for k, v in b.items()))
    from emulator.app.catalog import registry

    first = registry(tuple(cfg.get("configs", ()))).baseline()  # the speedup column's
    for b in dict.fromkeys(b for run in doc["runs"] for b in run.get("speedup_vs") or {}):
        if b == first:
            continue
        lines.append(f"speedup over {b}: " + ", ".join(
            f"{run['mode']} {run['speedup_vs'][b]:.3f}x" for run in doc["runs"]
            if b in (run.get("speedup_vs") or {})))
    if doc["world_size"] > 1:
        lines.append("rank skew (slowest rank's last kernel end / fastest's): " + ", ".join(
            f"{run['mode']} {max(run['rank_skew']):.3f}" for run in doc["runs"]))
    over = {r["mode"]: r.get("baseline") for r in doc["runs"]}
    if any(b not in (None, first) for b in over.values()):
        lines.append("speedup column: over each configuration's baseline; " + ", ".join(
            f"{m} over {b}" for m, b in over.items() if b not in (None, first)))
    for run in doc["runs"]:
        pick = run.get("search")
        if pick and "candidates_s" in pick:
            lines.append(f"{run['mode']}: chose {pick['chosen']} of " + ", ".join(
                f"{m} {t * 1e6:.1f} us" for m, t in pick["candidates_s"].items()))
        elif pick:
            lines.append(f"{run['mode']}: picked {pick['chosen']} ({pick['why']})")
    libs: dict = {}  # one line per library call: its phases, and which configurations ran it
    for run in doc["runs"]:
        calls: dict = {}
        for phase, c in (run.get("library") or {}).items():
            key = (c["library"], c["collective"], c["algorithm"], c["protocol"], c["channels"],
                   c["predicted_us"])
            calls.setdefault(key, []).append(phase)
        for key, phases in calls.items():
            libs.setdefault((*key, ", ".join(phases)), []).append(run["mode"])
    for (name, coll, algo, proto, ch, pred, phases), modes in libs.items():
        lines.append(f"library {coll} ({phases}): {name} {algo}/{proto} on {ch} channel(s), "
                     f"its model predicts {pred:.1f} us ({', '.join(modes)})")
    ov = [(run["mode"], run["ect_s"], run["overlap_efficiency"]) for run in doc["runs"]
          if run.get("ect_s") is not None]
    alone = next((run["gemm_alone_s"] for run in doc["runs"] if run.get("gemm_alone_s")), None)
    kern = doc.get("gemm_kernel")
    if kern and kern.get("modelled"):
        dec = (f" split-K {kern['split_k']}" if kern.get("split_k", 1) > 1 else "") + (
            " stream-K" if kern.get("stream_k") else "")
        lines.append(f"GEMM kernel (the library's heuristic): tile {kern['tile']}{dec}, "
                     f"{kern['wgs_per_cu']} WG/CU, {kern['stages']} pipeline stages, main loop "
                     f"at {kern['efficiency']:.0%} of peak, latency {kern['latency_ns']:.0f} ns; "
                     f"predicted {kern['predicted_us']:.1f} us")
    if ov and alone:
        lines.append(f"overlap (Flux's metrics; GEMM alone {alone * 1e6:.1f} us): ECT = time - "
                     f"GEMM alone, E = 1 - ECT / ECT of the baseline:")
        ect = [{"mode": m, "ECT": f"{e * 1e6:.1f} us", "E": "" if x is None else f"{x:+.2f}"}
               for m, e, x in ov]
        lines += ["  " + line for line in render(ect, ["mode", "ECT", "E"], limit=width() - 2,
                                                 align={"ECT": "right", "E": "right"},
                                                 wrap=[]).splitlines()]
    causes = [(run["mode"], run["causes"]) for run in doc["runs"] if run.get("causes")]
    if causes:
        from emulator.app.causes import line
        from emulator.model.ablation import ORDER

        lines.append(f"causes of each gain (counterfactual runs, costs removed in the order "
                     f"{', '.join(ORDER)}; points of the baseline's time):")
        lines += [f"  {line(m, c)}" for m, c in causes]
    if cfg.get("causes"):
        from emulator.app.catalog import registry

        reg = registry(tuple(cfg.get("configs", ())))
        lost = [(r["mode"], reg.baseline_of(r["mode"])) for r in doc["runs"]
                if not r.get("causes") and reg.baseline_of(r["mode"])
                and not r.get("baseline")]
        lines += [f"no causes for {m}: its baseline {b} is not in --mode" for m, b in lost]
    lines += beaten_bounds(doc)
    sep = doc.get("numerics_detection")
    if sep is not None:
        from collectives.reference import WEAK

        if sep < WEAK:
            lines.append(f"numerics: WEAK CHECK at this size: a rank's contribution exceeds "
                         f"the tolerance in only {sep:.1%} of the elements, so a result "
                         f"missing one may pass (--values int is exact at every size)")
    lb = doc["lower_bounds_s"]
    lines.append(f"lower bounds: GEMM compute {lb['gemm_compute'] * 1e6:.1f} us, collective on "
                 f"the links {lb['collective_link'] * 1e6:.1f} us; ideal-* are computed from "
                 f"isolated runs; modelled times are deterministic, wall time is this host's")
    return "\n".join(lines)


def beaten_bounds(doc: dict) -> list[str]:
    """A line for every configuration faster than a bound of the job: an ideal bound (an
    isolated run the registry compares, not a measurement run such as FiCCO's DIL and CIL
    runs) or the GEMM alone, saying by how much and why it may be (it does not run those
    kernels), so a beaten bound is never silent."""
    from emulator.app.catalog import registry

    reg = registry(tuple(doc.get("config", {}).get("configs", ())))
    runs = doc["runs"]
    bounds = [(r["mode"], r["modelled_time_s"], "the baseline's kernels, each run alone")
              for r in runs if r.get("isolated")
              and getattr(reg.configurations.get(r["mode"]), "compared", False)]
    alone = next((r["gemm_alone_s"] for r in runs if r.get("gemm_alone_s")), None)
    if alone:
        bounds.append(("the GEMM alone", alone, "the baseline's GEMM kernel, run alone"))
    out = []
    for r in runs:
        if r.get("isolated"):
            continue
        beaten = [(b, t, what) for b, t, what in bounds
                  if r["modelled_time_s"] < t * (1 - 1e-9)]
        for b, t, what in beaten:
            text = (f"{r['mode']} beats {b}: {r['modelled_time_s'] * 1e6:.1f} < {t * 1e6:.1f} "
                    f"us ({what}; {r['mode']} runs other kernels, so the bound is not its "
                    f"own)")
            mine = r.get("causes")
            theirs = next((x.get("causes") for x in runs if x["mode"] == b), None)
            if mine and theirs and mine["baseline"] == theirs["baseline"]:
                diff = {k: v - theirs["parts_s"].get(k, 0.0)
                        for k, v in mine["parts_s"].items() if k != "overlap"}
                k = max(diff, key=diff.get)
                if diff[k] > 0:
                    text += (f": by the causes, {k} gives it {diff[k] * 1e6:.1f} us more of "
                             f"its gain than the bound's")
            elif mine:
                parts = {k: v for k, v in mine["parts_s"].items() if k != "overlap"}
                k = max(parts, key=parts.get)
                if parts[k] > 0:
                    text += (f": by the causes, its largest part besides overlap is {k} "
                             f"({parts[k] * 1e6:.1f} us of its gain)")
            else:
                text += ": --causes names the costs it saves there"
            out.append(text)
    return out


def non_finite_inputs(**arrays) -> str:
    """'input A has 1 NaN, 0 Inf' for inputs that are not all finite, else ''."""
    import numpy as np

    notes = []
    for name, x in arrays.items():
        nan, inf = int(np.isnan(x).sum()), int(np.isinf(x).sum())
        if nan or inf:
            notes.append(f"input {name.upper()} has {nan} NaN, {inf} Inf")
    return "; ".join(notes)


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB (ru_maxrss: KB on Linux, bytes on macOS)."""
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1 << 20) if sys.platform == "darwin" else peak / 1024


def pss_mb() -> float | None:
    """This process's proportional set size in MB (shared pages split among the processes
    that map them: the fair per-rank share of the host's memory); None off Linux."""
    try:
        with open("/proc/self/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def _own_memory() -> int:
    """Bytes of this process's own (anonymous) memory now: what its start-up took of the
    host's available memory (Linux RssAnon; 0 if unknown)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("RssAnon:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _memory_refused(comm, cfg: RunConfig, device) -> bool:
    """The per-node memory check (a launch by the CLI also checked this host before)."""
    import os

    from mpi4py import MPI

    from emulator.app.config import ConfigError, available_memory

    node = comm.Split_type(MPI.COMM_TYPE_SHARED)
    msg = ""
    own = node.allreduce(_own_memory())  # the job's ranks are not other load: count them in
    if node.rank == 0 and not os.environ.get("T3EMU_SKIP_MEMORY_CHECK"):
        try:
            free = available_memory()
            cfg.check_memory(device, node.size, None if free is None else free + own)
        except ConfigError as exc:
            msg = f"t3emu: error: {exc} (rank {comm.rank}'s node)"
    node.Free()
    msgs = [m for m in comm.allgather(msg) if m]
    if msgs and comm.rank == 0:
        sys.stderr.write(msgs[0] + "\n")
    return bool(msgs)


def main(cfg: RunConfig) -> int:
    from emulator.runtime import watchdog

    install_abort_handlers()
    try:
        rc = _main(cfg)
        # a refusal returns on every rank alike before the board is closed: free its window
        # (collective) so that MPI_Finalize never meets a window in a passive-target epoch
        watchdog.close_board()
        mark_rank("end", str(rc))
        return rc
    except SystemExit as exc:
        mark_rank("end", str(exc.code if isinstance(exc.code, int) else 1))
        raise
    except BaseException as exc:  # noqa: BLE001
        abort(exc)
        return 1


def execute(comm, cfg: RunConfig, device) -> tuple[dict | None, list]:
    """Every mode of ``cfg`` on ``comm``, checked against the reference. Rank 0 gets the
    results document and the trace events; the other ranks get ``{}`` (None if a
    numerics check failed). ``--mode all`` runs what the device runs at this job's size."""
    from mpi4py import MPI

    from collectives.common import expert_chunks
    from emulator.runtime import faults, watchdog
    from collectives.reference import check_against, compute_reference, detection, make_inputs
    from devices.spec import with_topology
    from emulator.app.runs import bandwidths, lower_bounds, run_mode
    from emulator.engine.runner import DeviceMemory, categories
    from emulator.runtime.process import warm_kernels

    world, rank = comm.size, comm.rank
    spec = with_topology(device, cfg.topology)  # a system's own (preflight set it) or --topology
    cfg = cfg.runnable(spec, world)
    chunks = expert_chunks(cfg.m, world, cfg.param("expert_skew")
                           if "expert_skew" in cfg.param_specs() else 0.0)
    inputs = ref = tol = sep = None
    bad_input = ""
    faults.busy(cfg.fault, rank)
    if not cfg.timing_only:
        warm_kernels(comm, cfg.watchdog_s, cfg.operation.producer)
        watchdog.post("compute", "making the inputs")
        own = chunks[rank][1] - chunks[rank][0]
        op = cfg.operation
        if op.inputs is not None:  # an operation with inputs of its own (embedding tables)
            inputs = op.inputs(cfg, rank, world)
        else:
            rows = own if op.a_rows == "own" else cfg.m
            a, b = make_inputs(rows, cfg.n, cfg.k, cfg.dtype, cfg.values, cfg.seed, rank)
            inputs = {"A": a, "B": b}
        first = next(iter(inputs))
        faults.in_inputs(cfg.fault, rank, inputs[first])
        bad_input = non_finite_inputs(**{n: x for n, x in inputs.items()
                                         if x.dtype.kind == "f"})
        watchdog.wait_all(comm, "the numpy/MPI reference", cfg.watchdog_s)
        watchdog.post("compute", "computing the numpy/MPI reference")
        if op.check_reference is not None:
            ref, tol = op.check_reference(comm, cfg, inputs)
        else:
            roundings = world * cfg.split_k if op.reducing else cfg.split_k
            ref, tol = compute_reference(comm, inputs["A"], inputs["B"], cfg.dtype, cfg.values,
                                         chunks, op.reference, op.parts.consumer,
                                         max(roundings, world) if op.k_blocks else roundings,
                                         cfg.split_k, world if op.k_blocks else 1)
            sep = detection(comm, inputs["A"], inputs["B"], tol, op.parts.consumer)
    runs = []
    traced = []
    any_fail = False
    memory = DeviceMemory(comm)
    earlier = {}  # configuration -> its result in this job (a search reuses the times)
    plans = {} if cfg.causes else None  # configuration -> its plan (the causes rerun it)
    if cfg.causes:
        from emulator.app.causes import Counterfactuals

        counterfactuals = Counterfactuals(comm, cfg, spec, memory)
    chosen: dict[str, str] = {}  # a search or heuristic configuration -> what it ran as
    for mode in cfg.modes:
        res = earlier[mode] = run_mode(comm, cfg, spec, inputs, mode, memory, earlier, plans)
        if res.choice and "candidates_s" in res.choice:
            chosen[mode] = res.choice["chosen"]
        if res.same_as:
            chosen[mode] = res.same_as
        if cfg.timing_only:
            ok, err, frac, note = True, 0.0, 0.0, ""
        elif bad_input:
            ok, err, frac, note = (False, float("nan"), float("nan"),
                                   bad_input + ": the results cannot be checked")
        else:
            faults.in_result(cfg.fault, rank, res.result)
            ok, err, frac, note = check_against(res.result, ref, tol)
        faults.freeze(cfg.fault, rank, f"results of {mode}")
        watchdog.wait_all(comm, f"results of {mode}", cfg.watchdog_s)
        all_ok = comm.allreduce(ok, MPI.LAND)
        any_fail = any_fail or not all_ok
        errs = comm.gather(err, root=0)
        fracs = comm.gather(frac, root=0)
        notes = comm.gather(note, root=0)
        times = comm.gather(res.phases, root=0)
        walls = comm.gather(res.wall_s, root=0)
        want_events = cfg.record_wall or cfg.trace
        events = comm.gather([(ev.track, ev.name, ev.start, ev.end, ev.args)
                              for ev in res.events] if want_events else None, root=0)
        wall_events = comm.gather(res.wall_events, root=0)
        kernel_ends = comm.gather(res.kernel_end, root=0)
        if rank == 0:
            names = list(times[0])
            windows = {n: (max(t[n][0] for t in times), max(t[n][1] for t in times))
                       for n in names}
            total = max(w[1] for w in windows.values())
            per_rank = [categories(res.traffic[r]) for r in range(world)]
            totals = {key: sum(p[key] for p in per_rank) for key in per_rank[0]}
            nan = any(e != e for e in errs)
            run = {
                "mode": mode,
                "numerics": "timing-only" if cfg.timing_only else ("pass" if all_ok else "fail"),
                "numerics_pass": None if cfg.timing_only else bool(all_ok),
                "max_abs_error": None if cfg.timing_only else
                (float("nan") if nan else float(max(errs))),
                # the largest error over its element's tolerance (1: at the tolerance)
                "max_error_vs_tolerance": None if cfg.timing_only else
                (float("nan") if any(f != f for f in fracs) else float(max(fracs))),
                "numerics_notes": [f"rank {r}: {n}" for r, n in enumerate(notes) if n],
                "modelled_time_s": total,
                "phases": {n: w[1] - w[0] for n, w in windows.items()},
                "phase_windows_s": windows,
                "rank_phases_s": times,
                "rank_end_s": [max(e for _, e in t.values()) for t in times],
                "rank_kernel_end_s": kernel_ends,
                "rank_skew": skew(kernel_ends),
                "dram_bytes": totals,
                "dram_bytes_per_rank": per_rank,
                "arbitration": res.policy,
                "wall_time_s": max(walls),
                "bandwidth": bandwidths(cfg, world, windows, res.isolated),
                "isolated": res.isolated,  # a bound: its phases each ran alone
                "stage_profile": res.profile,
                "search": res.choice,  # a search configuration: its pick and the candidates
                "same_as": res.same_as or None,  # a heuristic's run taken from its pick's
                "library": res.library,  # phase -> the library's algorithm, protocol, channels
                "gemm_kernel": res.gemm_kernel,  # the kernel its tiled GEMMs run
                # the producer's kernel run alone (its longest rank), if the plan has one
                "gemm_alone_s": (max(sum(t[n][1] - t[n][0] for n in res.alone) for t in times)
                                 if res.alone else None),
            }
            if cfg.record_wall:
                run["wall_events"] = wall_events
                run["events"] = [[e[:4] for e in evs if not e[0].startswith("counter:")]
                                 for evs in events]
            if cfg.trace:
                traced.append((mode, events))
            runs.append(run)
            progress(len(runs), len(cfg.modes), run)
        if cfg.causes:  # every rank: its counterfactual runs now, on the plan it built
            if mode in counterfactuals.needed:
                name = chosen.get(mode, mode)
                counterfactuals.run(name, plans.get(name))
            plans.clear()  # (one plan alive at a time)
    if cfg.causes:
        ends = {m: comm.allreduce(r.end, op=MPI.MAX) for m, r in earlier.items()}
        times_cf = counterfactuals.times(ends, chosen)
    memory.free()
    rss = comm.gather(peak_rss_mb(), root=0)
    pss = comm.gather(pss_mb(), root=0)
    first_stage = comm.gather(RANK.first_stage_unix, root=0)
    if rank != 0:
        return (None if any_fail else {}), traced
    from emulator.app.catalog import registry
    from emulator.app.causes import causes_of, dram_seconds

    reg = registry(cfg.configs)
    base = reg.baseline()
    seq = next((r["modelled_time_s"] for r in runs if r["mode"] == base), None)
    others = {r["mode"]: r["modelled_time_s"] for r in runs if r["mode"] in reg.baselines()}
    by_mode = {r["mode"]: r for r in runs}
    gemm = cfg.operation.producer == "gemm"  # Flux's ECT compares with a GEMM alone
    measured = {reg.baseline_of(m) for m in by_mode}  # the baselines of this job's runs
    for run in runs:
        own = reg.baseline_of(run["mode"])
        own = own if own in by_mode else None
        run["baseline"] = own  # the configuration its gain is over (the registry's)
        run["speedup"] = (by_mode[own]["modelled_time_s"] / run["modelled_time_s"] if own
                          else 1.0 if run["mode"] in measured else None)  # a baseline: 1
        run["speedup_vs_sequential"] = seq / run["modelled_time_s"] if seq else None
        run["speedup_vs"] = {b: t / run["modelled_time_s"] for b, t in others.items()
                             if b != run["mode"]}
        # the non-overlapped method: the baseline this run's is over (or the run itself)
        plain = by_mode.get(own or run["mode"]) if reg.configuration(run["mode"]).compared \
            else None
        run.update(overlap_metrics(run["modelled_time_s"],
                                   plain and plain["modelled_time_s"],
                                   plain and plain["gemm_alone_s"]) if gemm and plain
                   else {"ect_s": None, "overlap_efficiency": None})
    if cfg.causes:
        for run in runs:
            if run["baseline"] and run["mode"] in times_cf and run["baseline"] in times_cf:
                run["causes"] = causes_of(run["mode"], run["baseline"], times_cf,
                                          dram_seconds(runs, world, spec.hbm_bw))
    from emulator.app import provenance
    from emulator.model import params as model_params

    doc = {
        "header": header(cfg, spec, world),
        "config": cfg.to_dict(),
        "world_size": world,
        "device": spec.to_dict(),
        # the version, commit, code hash and the files it read (``app/provenance.py``)
        "provenance": provenance.of_run(cfg, spec),
        "params": dict(cfg.resolved_params()),  # every --param of the run, defaults too
        # the model's code parameters its runs read (``emulator/model/params.py``)
        "model_params_read": model_params.reads(),
        "lower_bounds_s": lower_bounds(cfg, spec, world, chunks),
        # the fraction of elements in which one rank's contribution exceeds the numerics
        # check's tolerance (``reference.detection``; None: timing-only, exact integer
        # checks alike, or an operation's own reference)
        "numerics_detection": sep,
        # the GEMM kernel the problem's configurations run (``emulator/model/gemm.py``)
        "gemm_kernel": next((r["gemm_kernel"] for r in runs if r.get("gemm_kernel")), None),
        "runs": runs,
        "peak_rss_mb_per_rank": rss,
        "pss_mb_per_rank": pss,
        "first_gemm_stage_unix": first_stage,
        "created_unix": time.time(),
    }
    return doc, traced


def progress(done: int, total: int, run: dict) -> None:
    """A line on stderr as each configuration finishes (rank 0)."""
    verdict = run["numerics"]
    sys.stderr.write(f"t3emu: [{done}/{total}] {run['mode']}: {run['modelled_time_s'] * 1e6:.1f} "
                     f"us modelled, numerics {verdict}, {run['wall_time_s']:.1f} s wall\n")
    sys.stderr.flush()


def skew(ends: list[float]) -> list[float]:
    """Each rank's end (its last kernel's) over the fastest rank's (1.0: the fastest; how
    much later the others finish: the skew between GPUs)."""
    first = min(ends)
    return [e / first if first > 0 else 1.0 for e in ends]


def overlap_metrics(total: float, baseline: float | None, gemm_alone: float | None) -> dict:
    """Flux's metrics: ECT (exposed communication time) = the run's time - the GEMM's
    time alone (the baseline's unsplit GEMM, same shape and device), and overlap
    efficiency E = 1 - ECT / ECT of the non-overlapped baseline (0: no better than
    it, 1: communication wholly hidden, < 0: slower). None without the baseline."""
    if baseline is None or gemm_alone is None:
        return {"ect_s": None, "overlap_efficiency": None}
    ect, base = total - gemm_alone, baseline - gemm_alone
    return {"ect_s": ect, "overlap_efficiency": 1.0 - ect / base if base > 0 else None}


def _main(cfg: RunConfig) -> int:
    import os

    from mpi4py import MPI

    from emulator.runtime import faults, watchdog

    comm = MPI.COMM_WORLD
    world, rank = comm.size, comm.rank
    mark_rank("pid")
    watchdog.open_board(comm)
    note_shm()  # MPI's files for its channels within the node, and the board's window
    watchdog.post("compute", "setting up")
    if world == 1 < cfg.ranks and os.environ.get("T3EMU_UNDER_MPI") == "1":
        sys.stderr.write(f"t3emu: error: this task is an MPI job of one rank, not one of "
                         f"-n {cfg.ranks}: the launcher wired up no PMI (srun: --mpi=pmi2 "
                         f"or --mpi=pmix)\n")
        return 2
    if world != cfg.ranks and rank == 0:
        sys.stderr.write(f"t3emu: running on {world} MPI ranks (the job's size), not -n {cfg.ranks}\n")
    if cfg.m < world:
        raise ValueError(f"--m {cfg.m} needs at least one row per rank ({world} ranks)")
    device = cfg.load_spec()
    size = device.interconnect.gpus_per_node * device.interconnect.nodes
    if size and world != size:  # an outside mpiexec with another -n than the system's
        if rank == 0:
            sys.stderr.write(f"t3emu: error: invalid value for -n/--ranks: {world} (the job "
                             f"has {world} MPI ranks; system {device.system} has {size} GPUs)\n")
        return 2
    if _memory_refused(comm, cfg, device):
        return 2
    if rank == 0 and not os.environ.get("T3EMU_PID_DIR"):  # else the launcher printed it
        sys.stderr.write(header(cfg, device, world) + "\n")
        sys.stderr.flush()
    doc, traced = execute(comm, cfg, device)
    watchdog.close_board()
    if cfg.fault[1] == rank and not RANK.faults_fired:
        sys.stderr.write(f"[t3emu rank {rank}] warning: --inject-fault {cfg.inject_fault} never "
                         f"fired (this run has no such operation on rank {rank}, e.g. no DMA "
                         f"transfer carrying data)\n")
    if rank != 0:
        return 1 if doc is None else 0
    summary = summary_table(doc)  # (before the paths are shown without this machine's)
    from emulator.app.provenance import relative_paths

    relative_paths(doc)  # the document as written: no absolute path of this machine
    if cfg.json == "-":  # the document on stdout, what people read on stderr
        sys.stderr.write(summary + "\n")
        sys.stderr.flush()
        import json

        sys.stdout.write(json.dumps(doc, indent=2) + "\n")
        sys.stdout.flush()
    else:
        print(summary, flush=True)
    if cfg.json and cfg.json != "-":
        write_json_atomic(cfg.json, doc)
    if cfg.trace:
        from emulator.app.trace import chrome_trace

        write_json_atomic(cfg.trace, chrome_trace(traced, doc), indent=None)
        print(f"trace: {cfg.trace} (open in https://ui.perfetto.dev)", flush=True,
              file=sys.stderr if cfg.json == "-" else sys.stdout)
    failed = [r for r in doc["runs"] if r["numerics"] == "fail"]
    if failed:
        sys.stderr.write(f"t3emu: numerics FAIL in {', '.join(r['mode'] for r in failed)}: "
                         f"{'; '.join(n for r in failed for n in r['numerics_notes'])}\n")
        return 1
    return 0
