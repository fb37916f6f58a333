"""``t3emu report``: the tables and figures of a sweep, fitted to the designs it ran.

From a sweep directory's ``results.json``:
- per point, the speedup of every configuration over its own baseline (the registry's
  ``baseline_of``: ``sequential`` for T3's, Flux's, TransformerEngine's and the fused
  operators' configurations, ``ficco-serial`` for FiCCO's), with the geomean and max per
  configuration, a table per operation;
- Flux's overlap efficiency per point, for operations whose producer is a GEMM;
- the causes of each gain, for sweeps run with ``--causes``;
- each design's own views when its configurations ran: Flux's (``report_overlap.py``),
  the fused operators' (``report_fused.py``), FiCCO's (``report_ficco.py``);
- DRAM traffic per GPU by category for every configuration, against its baseline;
- T3's end-to-end estimate per model and TP degree, when a model has T3's four AR
  sub-layers (method below);
- PNG figures (matplotlib): speedup bars, stacked DRAM bars, a per-rank timeline (a
  colour per kind of kernel), T3's per-stage view, and the designs' figures.

End-to-end method (stated in the output as well). T3 scales a measured
per-layer breakdown by the sub-layer speedups; we have no measured breakdown,
so we model one. A transformer layer in Megatron tensor parallelism runs 12
GEMMs per iteration: forward, input gradient and weight gradient of QKV (3H
outputs), OP (H), FC-1 (4H) and FC-2 (H <- 4H). Four of them carry an
all-reduce and are the sweep's sub-layers (OP and FC-2 forward, FC-1 and IP
input gradients): their modelled time per configuration comes from the sweep.
The other eight have the same FLOPs as their forward GEMM and run at the FLOP
rate the sequential configuration's GEMM phases achieved on that model and TP
degree. Attention scores, softmax, layer norms and the optimizer are left out,
so the estimate is an upper bound on the end-to-end gain. It needs all four
sub-layers of a model, so scenarios that list only FC-2 and OP get none (and the
report leaves the section out).
"""

from __future__ import annotations

import json
import re
import textwrap
from collections import defaultdict
from pathlib import Path

from emulator.app.catalog import registry
from emulator.app.causes import columns
from emulator.app.scenario import SUBLAYERS, ScenarioError, geomean
from emulator.app.tables import fill

_REG = registry()
FUSED_ORDER = tuple(_REG.configurations)  # the registry's order
BASE = _REG.baseline()  # the registry's first baseline (T3's end-to-end and stage views)
DRAM_CATS = (("gemm_read", "GEMM reads"), ("gemm_write", "GEMM writes"),
             ("rs_read", "RS reads"), ("rs_write", "RS writes"), ("ag_read", "AG reads"),
             ("ag_write", "AG writes"), ("a2a_read", "A2A reads"), ("a2a_write", "A2A writes"))
# flops of a layer's linear GEMMs relative to T x H x H / TP (x2 for multiply-add):
# QKV 3, OP 1, FC-1 4, FC-2 4; each has forward, input-gradient and weight-gradient GEMMs.
_LINEAR = {"QKV": 3, "OP": 1, "FC-1": 4, "FC-2": 4}
E2E_METHOD = ("end-to-end: per layer, the 4 AR sub-layers (OP, FC-2 fwd; FC-1, IP bwd) take "
              "their modelled times; the other 8 GEMMs (fwd QKV, FC-1; input-gradient OP, "
              "FC-2; 4 weight gradients) run at the FLOP rate of the sequential GEMM phases; "
              "attention, norms and optimizer are left out (an upper bound on the gain)")


def load(out: Path) -> dict:
    path = Path(out) / "results.json"
    if not path.is_file():
        raise ScenarioError(f"{path} not found: run `t3emu sweep SCENARIO --out {out}` first")
    from emulator.app.sweep import read_results

    doc = read_results(path)
    if not doc.get("points"):
        raise ScenarioError(f"{path} holds no finished point yet")
    from emulator.app.sweep import without_failing

    return without_failing(doc)  # failing runs: in no table or figure, listed instead


def modes_of(doc: dict) -> list[str]:
    """Every configuration the sweep ran, in the registry's order (one's own after)."""
    ran = list(dict.fromkeys([*doc.get("modes", []),
                              *(r["mode"] for p in doc["points"] for r in p["runs"])]))
    return [m for m in FUSED_ORDER if m in ran] + [m for m in ran if m not in FUSED_ORDER]


def _runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def set_text(pt: dict) -> str:
    """`` [gpu.cus=152]``: the point's --set values (a what-if's swept ones and the command
    line's), "" without any; what tells a what-if sweep's points apart."""
    from devices.overrides import describe

    over = tuple((pt.get("set") or {}).items())
    return f" [{describe(over)}]" if over else ""


def _base_label(pt: dict, with_device: bool = False) -> str:
    if pt.get("system"):  # a case on a system (scenario.Point.label)
        params = ",".join(f"{n}={v:g}" for n, v in (pt.get("params") or {}).items())
        return (f"{pt['model']} {pt['sublayer']} m={pt['m']} TP{pt['tp']} {pt['system']}"
                + (f" {params}" if params else ""))
    s = f"{pt['model']} {pt['sublayer']} TP{pt['tp']}"
    return s + f" {pt['device']}" if with_device else s


def _label(pt: dict, with_device: bool = False) -> str:
    """A point's name in tables, figures and ``--timeline``: its case, shape and system,
    and its --set values (``... [gpu.cus=152]``)."""
    return _base_label(pt, with_device) + set_text(pt)


# ------------------------------------------------------------- baselines and speedups
def compared(mode: str) -> bool:
    """False for a measurement run (FiCCO's DIL/CIL): its time is not a schedule's."""
    cfg = _REG.configurations.get(mode)
    return cfg.compared if cfg else True


def baseline_of(mode: str, run: dict | None = None) -> str | None:
    """The configuration ``mode``'s gain is over: the run's own record (sweeps since the
    registry's ``over``), else the registry's ``baseline_of``; a configuration of one's
    own the report does not know is over the registry's first baseline."""
    if run is not None and "baseline" in run:
        return run["baseline"]
    if mode in _REG.configurations:
        return _REG.baseline_of(mode)
    return BASE if mode != BASE else None


def speedup(pt: dict, mode: str) -> tuple[str | None, float | None]:
    """(baseline, speedup of ``mode`` over it at ``pt``); the speedup is None where the
    configuration has no baseline or the point did not run it."""
    runs = _runs(pt)
    r = runs.get(mode)
    if r is None:
        return None, None
    b = baseline_of(mode, r)
    if b is None or b not in runs:
        return b, None
    if r.get("speedup") is not None and r.get("baseline") == b:
        return b, r["speedup"]
    return b, runs[b]["modelled_time_s"] / r["modelled_time_s"]


def baselines_used(doc: dict, pts: list[dict] | None = None) -> list[str]:
    """The baselines the speedups of ``pts`` (default: every point) are over."""
    return list(dict.fromkeys(b for p in (pts or doc["points"]) for m in _runs(p)
                              for b, s in [speedup(p, m)] if s is not None))


def _operation(doc: dict, pt: dict) -> str:
    return pt.get("collective") or doc["collective"]


def op_groups(doc: dict) -> dict[str, list[dict]]:
    """Operation -> its points (tables per operation: the configurations differ)."""
    out: dict[str, list[dict]] = {}
    for pt in doc["points"]:
        out.setdefault(_operation(doc, pt), []).append(pt)
    return out


def _group_title(op: str, pts: list[dict]) -> str:
    subs = list(dict.fromkeys(p["sublayer"] for p in pts))
    return f"{op} ({', '.join(subs) if len(subs) <= 4 else f'{len(subs)} sub-layers'}; " \
           f"{len(pts)} point{'s' if len(pts) != 1 else ''})"


def gemm_producer(doc: dict, pt: dict) -> bool:
    """Flux's ECT and overlap efficiency compare with a GEMM alone: only operations whose
    producer is a GEMM have them."""
    try:
        return _REG.operation(_operation(doc, pt)).producer == "gemm"
    except ValueError:  # RegistryError: an operation of one's own the report does not know
        return True


def speedup_title(doc: dict) -> str:
    bases = baselines_used(doc)
    per = "sub-layer" if not any(p.get("system") for p in doc["points"]) else "point"
    if len(bases) == 1:
        return f"Speedup over {bases[0]} (modelled time, per {per})"
    if not bases:
        return f"Speedup (modelled time, per {per}): no configuration ran with its baseline"
    return (f"Speedup over each configuration's baseline (modelled time, per {per}; the "
            f"second header row names it: {', '.join(bases)})")


def speedup_table(doc: dict) -> tuple[str, dict[str, list[float]]]:
    """Per operation: each point's baseline time(s) and every configuration's speedup over
    its baseline, with the geomean and max per configuration."""
    per_mode: dict[str, list[float]] = defaultdict(list)
    groups = op_groups(doc)
    two_rows = len(baselines_used(doc)) > 1
    blocks = []
    for op, pts in groups.items():
        modes = [m for m in modes_of(doc) if any(speedup(p, m)[1] is not None for p in pts)]
        if not modes:
            continue
        over = {m: next(speedup(p, m)[0] for p in pts if speedup(p, m)[1] is not None)
                for m in modes}
        bases = list(dict.fromkeys(over.values()))
        head = [("point" if any(p.get("system") for p in pts) else "sub-layer", "M x N x K",
                 *(f"{b} us" for b in bases), *modes)]
        if two_rows:
            head.append(("", "", *("" for _ in bases), *(f"over {over[m]}" for m in modes)))
        rows = list(head)
        mine: dict[str, list[float]] = defaultdict(list)
        for pt in pts:
            runs = _runs(pt)
            cells = []
            for m in modes:
                sp = speedup(pt, m)[1]
                if sp is not None:
                    mine[m].append(sp)
                cells.append(f"{sp:.3f}x" if sp is not None else "-")
            if not any(c != "-" for c in cells):
                continue
            rows.append((_label(pt), f"{pt['m']}x{pt['n']}x{pt['k']}",
                         *(f"{runs[b]['modelled_time_s'] * 1e6:.1f}" if b in runs else "-"
                           for b in bases), *cells))
        blank = ("" for _ in bases)
        rows.append(("geomean", "", *blank, *(f"{geomean(mine[m]):.3f}x" if mine[m] else "-"
                                              for m in modes)))
        rows.append(("max", "", *("" for _ in bases),
                     *(f"{max(mine[m]):.3f}x" if mine[m] else "-" for m in modes)))
        for m, v in mine.items():
            per_mode[m] += v
        table = _grid(rows, rule_before=len(rows) - 2, head=len(head))
        blocks.append(f"{_group_title(op, pts)}\n{table}" if len(groups) > 1 else table)
    return "\n\n".join(blocks), per_mode


def overlap_table(doc: dict) -> str:
    """Flux's overlap efficiency per point and configuration (E = 1 - ECT / ECT of its
    baseline; ECT = time - the baseline's GEMM alone), with the GEMM-alone time; only
    operations with a GEMM producer (the others have no GEMM alone to compare with)."""
    groups = op_groups(doc)
    blocks = []
    for op, pts in groups.items():
        pts = [p for p in pts if gemm_producer(doc, p) and any(
            r.get("overlap_efficiency") is not None for r in p["runs"])]
        modes = [m for m in modes_of(doc) if compared(m) and any(
            m in _runs(p) and _runs(p)[m].get("overlap_efficiency") is not None
            and speedup(p, m)[0] in _runs(p) for p in pts)]
        if not modes:
            continue
        bases = list(dict.fromkeys(speedup(p, m)[0] for p in pts for m in modes
                                   if speedup(p, m)[0] in _runs(p)))
        rows = [("point" if any(p.get("system") for p in pts) else "sub-layer",
                 "GEMM alone us", *(f"{b} ECT us" for b in bases), *modes)]
        for pt in pts:
            runs = _runs(pt)
            alone = next((runs[b]["gemm_alone_s"] for b in bases
                          if b in runs and runs[b].get("gemm_alone_s")), None) or next(
                (r["gemm_alone_s"] for r in pt["runs"] if r.get("gemm_alone_s")), None)
            ect = lambda b: (f"{runs[b]['ect_s'] * 1e6:.1f}" if b in runs  # noqa: E731
                             and runs[b].get("ect_s") is not None else "-")
            cells = [f"{runs[m]['overlap_efficiency']:+.2f}"
                     if m in runs and runs[m].get("overlap_efficiency") is not None else "-"
                     for m in modes]
            rows.append((_label(pt), f"{alone * 1e6:.1f}" if alone else "-",
                         *(ect(b) for b in bases), *cells))
        blocks.append(f"{_group_title(op, pts)}\n{_grid(rows)}" if len(groups) > 1
                      else _grid(rows))
    return "\n\n".join(blocks)


def _mb(nbytes: float) -> str:
    mb = nbytes / 1e6
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.1f}"


def dram_categories(doc: dict) -> list[tuple[str, str]]:
    """(key, name) of the categories some run of the sweep has traffic in."""
    present = {c for p in doc["points"] for r in p["runs"]
               for c, v in r["dram_bytes"].items() if v}
    known = [(c, n) for c, n in DRAM_CATS if c in present]
    return known + [(c, c) for c in sorted(present) if c not in dict(DRAM_CATS)]


def _baselines_first(doc: dict, pt: dict) -> list[str]:
    """The configurations of ``pt`` in the registry's order, those the others are over
    first."""
    runs = _runs(pt)
    bases = {baseline_of(m, r) for m, r in runs.items()}
    modes = [m for m in modes_of(doc) if m in runs]
    return [m for m in modes if m in bases] + [m for m in modes if m not in bases]


def dram_table(doc: dict) -> str:
    """Every configuration's DRAM traffic per GPU by category at every point, and its
    change against its baseline's."""
    cats = dram_categories(doc)
    bases = baselines_used(doc)
    single = bases[0] if len(bases) == 1 else None
    rows = [("point" if any(p.get("system") for p in doc["points"]) else "sub-layer",
             "configuration", *(name for _, name in cats), "total",
             f"vs {single}" if single else "vs its baseline")]
    reductions: dict[tuple[str, str], list[float]] = defaultdict(list)
    for pt in doc["points"]:
        runs = _runs(pt)
        first = True
        for m in _baselines_first(doc, pt):
            d = runs[m]["dram_bytes"]
            tp = pt["tp"]
            total = sum(d.values())
            b = baseline_of(m, runs[m])
            rel = ""
            if not compared(m):
                rel = "(measurement)"
            elif b in runs:
                base = sum(runs[b]["dram_bytes"].values())
                if base:
                    reductions[(m, b)].append(1 - total / base)
                    rel = f"{(total / base - 1) * 100:+.1f}%" + ("" if single else f" of {b}")
            rows.append((_label(pt) if first else "", m,
                         *(_mb(d.get(c, 0) / tp) for c, _ in cats), _mb(total / tp), rel))
            first = False
    lines = [_grid(rows), "MB per GPU (the sum over the TP GPUs / TP); updates count as writes."]
    order = modes_of(doc)
    for (m, b), vals in sorted(reductions.items(), key=lambda kv: order.index(kv[0][0])):
        mean = sum(vals) / len(vals)
        lines.append(fill(f"DRAM traffic reduction of {m} vs {b}: mean {mean * 100:.1f}%, max "
                          f"{max(vals) * 100:.1f}%" + (" (negative: more traffic)"
                                                       if mean < 0 else "")))
    return "\n".join(lines)


def causes_table(doc: dict) -> str:
    """Per point and configuration with a ``causes`` record (``--causes`` sweeps): the
    cut of its baseline's time and each cause's part of it, in points of the baseline's
    time (the parts add up to the cut), then per configuration the geomean speedup and
    the mean cut and parts."""
    found = [(pt, r) for pt in doc["points"] for r in pt["runs"] if r.get("causes")]
    if not found:
        return ""
    keys = columns([r["causes"] for _, r in found])  # (an older sweep's lack: "-")
    rows = [("point", "configuration", "over", "speedup", "cut %", *keys)]
    per: dict[tuple[str, str], list[dict]] = defaultdict(list)
    last = None
    for pt, r in found:
        c = r["causes"]
        base = c["baseline_s"]
        per[(r["mode"], c["baseline"])].append(c)
        rows.append((_label(pt) if pt is not last else "", r["mode"], c["baseline"],
                     f"{base / c['time_s']:.3f}x", f"{c['gain_s'] / base * 100:.1f}",
                     *(f"{c['parts_s'][k] / base * 100:+.1f}" if k in c["parts_s"] else "-"
                       for k in keys)))
        last = pt
    rule = len(rows)
    for (m, b), cs in per.items():
        mean = lambda f: sum(f(c) for c in cs) / len(cs)  # noqa: E731
        rows.append((f"geomean / mean of {len(cs)}", m, b,
                     f"{geomean([c['baseline_s'] / c['time_s'] for c in cs]):.3f}x",
                     f"{mean(lambda c: c['gain_s'] / c['baseline_s']) * 100:.1f}",
                     *(f"{mean(lambda c: c['parts_s'].get(k, 0.0) / c['baseline_s']) * 100:+.1f}"
                       for k in keys)))
    return _grid(rows, rule_before=rule)


CAUSES_METHOD = ("cut: the configuration's gain in % of its baseline's time; each cause: how "
                 "much of it goes when that cost is removed from both (cumulatively, in the "
                 "order of the columns), in points of the baseline's time; dram-traffic: the "
                 "DRAM bytes the baseline moves beyond the configuration (rank means) at the "
                 "HBM's rate; overlap: what is left with every cost removed, less that. The "
                 "parts add up to the cut ('-': a cause the sweep was run without, the causes "
                 "it has holding its part); the last rows: geomean speedup, mean cut and "
                 "parts per configuration")
def end_to_end(doc: dict) -> tuple[str | None, list[dict]]:
    by_case: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for pt in doc["points"]:
        by_case[(pt["model"], pt["tp"], pt["device"], set_text(pt))][pt["sublayer"]] = pt
    modes = modes_of(doc)
    out = []
    for (model, tp, device, what), subs in by_case.items():
        if set(subs) != set(SUBLAYERS) or not all(BASE in _runs(p) for p in subs.values()):
            continue
        any_pt = next(iter(subs.values()))
        t, h = any_pt["m"], any_pt["n"]
        unit = 2.0 * t * h * h / tp  # FLOPs of a T x H x H/TP GEMM
        flops = gemm_s = 0.0
        for p in subs.values():
            seq = _runs(p)[BASE]
            g = seq["phases"].get("gemm")
            if g:
                flops += 2.0 * p["m"] * p["n"] * p["k"]
                gemm_s += g
        rate = flops / gemm_s
        # the 8 GEMMs without an AR: fwd QKV, fwd FC-1, dgrad OP, dgrad FC-2, 4 wgrads
        # (every linear layer's forward + input gradient: one of each; weight gradients: all)
        other_units = 2 * sum(_LINEAR.values())
        other_s = other_units * unit / rate
        row = {"model": model, "tp": tp, "device": device, "set": what,
               "other_gemms_s": other_s}
        for m in modes:
            if all(m in _runs(p) for p in subs.values()):
                row[m] = other_s + sum(_runs(p)[m]["modelled_time_s"] for p in subs.values())
        out.append(row)
    if not out:
        return None, out
    rows = [("model", "TP", "layer (seq) us", "AR sub-layers share",
             *(m for m in modes if m != BASE))]
    for r in out:
        seq = r[BASE]
        rows.append((r["model"] + r["set"], str(r["tp"]), f"{seq * 1e6:.0f}",
                     f"{(seq - r['other_gemms_s']) / seq * 100:.0f}%",
                     *(f"{seq / r[m]:.3f}x" if m in r else "-" for m in modes
                       if m != BASE)))
    return _grid(rows) + "\n" + fill(E2E_METHOD), out


def _grid(rows: list[tuple], rule_before: int | None = None, head: int = 1) -> str:
    """A text table (``emulator.app.tables``'s layout): ``head`` header rows (stacked in
    each column), a rule, the rest (another rule before row index ``rule_before``); the
    first column aligned left, the others right. No column wraps (the cells are numbers
    and the headers are the names the report's readers and tests look for): a table wider
    than the terminal is printed in groups of columns, each led by the row's name."""
    from emulator.app.tables import render

    cols = [str(i) for i in range(len(rows[0]))]
    labels = {c: "\n".join(str(r[i]) for r in rows[:head]).strip("\n")
              for i, c in enumerate(cols)}
    body: list[dict | None] = []
    for i, r in enumerate(rows[head:], start=head):
        if rule_before is not None and i == rule_before:
            body.append(None)
        body.append({c: str(x) for c, x in zip(cols, r)})
    return "\n".join(line.rstrip() for line in render(
        body, cols, labels=labels, align={c: "right" for c in cols[1:]},
        wrap=[], split=True).splitlines())


def sections(doc: dict) -> list[tuple[str, str]]:
    """(title, body) of every section that applies to the sweep, in the report's order."""
    from emulator.app import report_ficco, report_fused, report_overlap

    out = []
    table, _ = speedup_table(doc)
    out.append((speedup_title(doc), table))
    overlap = overlap_table(doc)
    if overlap:
        gemm_pts = [p for p in doc["points"] if gemm_producer(doc, p)]
        bases = ", ".join(baselines_used(doc, gemm_pts)) or "the baseline"
        out.append((f"Overlap efficiency (Flux's E = 1 - ECT / ECT of the configuration's "
                    f"baseline, {bases}; ECT = time - the GEMM alone; operations with a GEMM "
                    f"producer)", overlap))
    causes = causes_table(doc)
    if causes:
        out.append(("Causes of each gain (the sweep's --causes runs)",
                    causes + "\n" + textwrap.fill(CAUSES_METHOD, 100)))
    if report_overlap.applies(doc):
        out.append(("Flux's views per cluster: GEMM alone, ECT and E per method, the tuned "
                    "configuration's speedups and the knobs it chose", report_overlap.text(doc)))
    if report_fused.applies(doc):
        out.append(("The fused computation-collective operators' views", report_fused.text(doc)))
    if report_ficco.applies(doc):
        out.append(("FiCCO's views", report_ficco.text(doc)))
    out.append(("DRAM traffic by category (every configuration, against its baseline)",
                dram_table(doc)))
    e2e, _ = end_to_end(doc)
    if e2e:
        out.append(("End-to-end estimate per layer (T3's AR sub-layers)", e2e))
    return out


def text_report(doc: dict) -> str:
    kind = "timing-only" if doc["timing_only"] else "numeric"
    n_runs = sum(len(p["runs"]) for p in doc["points"])
    verdicts = defaultdict(int)
    for p in doc["points"]:
        for r in p["runs"]:
            verdicts[r["numerics"]] += 1
    verdicts["fail"] += len(doc.get("excluded_failing") or [])
    n_runs += len(doc.get("excluded_failing") or [])
    ops = ", ".join(op_groups(doc)).upper()
    topo = doc["topology"]
    topo = f"a {topo}" if "," not in topo else f"{topo.replace(',', ', ')} topologies"
    parts = [f"t3emu report: scenario {doc['scenario']} ({kind}), {len(doc['points'])} points, "
             f"{n_runs} runs, {ops} on {topo}, {doc['dtype']}; numerics: "
             + ", ".join(f"{v} {k}" for k, v in sorted(verdicts.items()))]
    bad = doc.get("excluded_failing") or []
    if bad:
        parts.append(f"{len(bad)} run(s) FAILED the numerics check and are left out of every "
                     f"table, figure and geomean below (a wrong result has no time worth "
                     f"reporting; rerun the sweep to run them again): " + "; ".join(
                         f"{k} {m}" for k, m in bad))
    for title, body in sections(doc):
        parts += ["", fill(title), body]
    return "\n".join([fill(parts[0]), *parts[1:]])


# ---------------------------------------------------------------------------- figures
_COLORS = {n: c.color for n, c in _REG.configurations.items()}
_CAT_COLORS = {"gemm_read": "#1f77b4", "gemm_write": "#aec7e8", "rs_read": "#d62728",
               "rs_write": "#ff9896", "ag_read": "#2ca02c", "ag_write": "#98df8a",
               "a2a_read": "#9467bd", "a2a_write": "#c5b0d5"}
# the kinds of kernel and executor a timeline tells apart (a fused kernel is a GEMM's
# colour hatched with its collective's)
KINDS = (("compute", "GEMM / compute kernel", "#1f77b4"),
         ("reduce", "reduction (RS, reduce)", "#d62728"),
         ("gather", "copy / gather / scatter (AG, A2A)", "#2ca02c"),
         ("transfer", "send / transfer (DMA, executors)", "#ff7f0e"),
         ("other", "wait / other", "#7f7f7f"))
_KIND = {k: (name, color) for k, name, color in KINDS}
_COMPUTE = {"gemm", "gemv", "embedding", "emb", "kernel", "compute", "matmul", "rows", "k"}
_REDUCE = {"rs", "reduce", "ar", "reduction", "allreduce"}
_GATHER = {"ag", "a2a", "gather", "scatter", "copy", "allgather", "alltoall"}
_TRANSFER = {"comm", "executors", "send", "transfer", "dma", "push", "put", "recv"}
_BOTH = {"ficco", "step", "cil"}  # phases that compute and communicate (FiCCO's kernel, TE's
# AG steps, FiCCO's CIL runs): their collective is the operation's


def _comm_kind(words: list[str]) -> str | None:
    for kind, names in (("reduce", _REDUCE), ("gather", _GATHER), ("transfer", _TRANSFER)):
        if any(w in names for w in words):
            return kind
    return None


def _words(name: str) -> list[str]:
    """'gemm+rs-ring' -> gemm, rs, ring; 'comm8' -> comm; 'rows8-512' -> rows."""
    return [w for w in (re.sub(r"\d+$", "", t) for t in re.split(r"[^a-z0-9]+", name.lower()))
            if w]


def phase_kind(name: str, operation: str = "") -> tuple[str, str | None]:
    """(kind, the collective's kind if a fused kernel runs one inside, else None) of a
    phase from its name (``collectives/*.py`` name them: ``gemm``, ``rs``, ``ag``,
    ``a2a``, ``gemm+rs``, ``ag+gemm``, ``reduce``, ``comm8``, ``gemm 3``, ``step 2``,
    ``ficco``, ``cil-dma.executors``, ...)."""
    words = _words(name)
    if "kernel" in words:  # a fused phase's kernel reported apart
        return "compute", None
    if "executors" in words:  # ... and its executors
        return "transfer", None
    compute = any(w in _COMPUTE for w in words)
    comm = _comm_kind(words)
    if any(w in _BOTH for w in words) or (compute and comm):
        return "compute", comm or _comm_kind(_words(operation)) or "transfer"
    if compute:
        return "compute", None
    return (comm, None) if comm else ("other", None)


def _distinct_colors(modes: list[str]) -> dict[str, str]:
    """The registry's colour of each configuration, a free tab20 one where two share it."""
    import matplotlib

    spare = [matplotlib.colors.to_hex(c) for c in matplotlib.colormaps["tab20"].colors]
    used: set[str] = set()
    out = {}
    for m in modes:
        c = _COLORS.get(m)
        if c is None or c in used:
            c = next((s for s in spare if s not in used and s not in _COLORS.values()),
                     next(s for s in spare if s not in used))
        used.add(c)
        out[m] = c
    return out


def _point_axis(ax, pts: list[dict]) -> None:
    ax.set_xticks(range(len(pts)))
    ax.set_xticklabels([_label(p) for p in pts], rotation=40, ha="right", fontsize=8)


def _wrap(text: str, width_in: float, fontsize: float = 10) -> str:
    """``text`` in lines that fit a figure ``width_in`` inches wide."""
    return textwrap.fill(text, max(40, int(width_in * 72 / (fontsize * 0.55))),
                         break_on_hyphens=False)


def _save(plt, fig, path: Path, tight: bool = True) -> Path:
    if tight:
        fig.tight_layout()
    fig.savefig(path, dpi=130, bbox_inches="tight")  # nothing clipped (titles, legends)
    plt.close(fig)
    return path


def _what(doc: dict, pts: list[dict]) -> str:
    devices = sorted({p.get("system") or p["device"] for p in pts})
    topo = "" if "," in doc["topology"] else f" on a {doc['topology']}"
    return (f"{doc['scenario']}: {', '.join(op_groups(doc)).upper()}{topo}, {doc['dtype']}, "
            f"{'system' if any(p.get('system') for p in pts) else 'device'}"
            f"{'s' if len(devices) > 1 else ''} {', '.join(devices)}")


def drawn_modes(doc: dict, pts: list[dict]) -> list[str]:
    """The configurations with a speedup at ``pts``, a search configuration standing for
    its candidates (its design's others) when it ran."""
    modes = [m for m in modes_of(doc) if any(speedup(p, m)[1] is not None for p in pts)]
    cfg = _REG.configurations.get
    designs = {cfg(m).design for m in modes if cfg(m) and cfg(m).search}
    return [m for m in modes if not (cfg(m) and not cfg(m).search and cfg(m).design in designs)]


def figures(doc: dict, out: Path, timeline_point: str | None = None,
            timeline_modes: list[str] | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    pt = _timeline_point(doc, timeline_point)  # refused before any figure is written
    written = [speedup_figure(plt, doc, out / "speedup.png"),
               dram_figure(plt, doc, out / "dram_traffic.png")]
    if pt is not None:
        written.append(timeline_figure(plt, doc, pt, out / "timeline.png", timeline_modes))
        drawn = [r["mode"] for r in timeline_runs(pt, timeline_modes)]
        written.append(stage_figure(plt, pt, out / "stages.png", drawn))
    return [p for p in written if p] + _design_figures(doc, out)


def speedup_figure(plt, doc: dict, path: Path) -> Path | None:
    """Per operation, each point's speedup of every configuration over its baseline."""
    groups = []
    for op, pts in op_groups(doc).items():
        modes = drawn_modes(doc, pts)
        pts = [p for p in pts if any(speedup(p, m)[1] is not None for m in modes)]
        if modes and pts:
            groups.append((op, pts, modes))
    if not groups:
        return None
    bases = baselines_used(doc)
    width = min(16.0, max(8.0, max(0.12 * len(p) * len(m) + 0.3 * len(p)
                                   for _, p, m in groups) + 3))
    fig, axes = plt.subplots(len(groups), 1, figsize=(width, 4.4 * len(groups)),
                             squeeze=False)
    for ax, (op, pts, modes) in zip(axes[:, 0], groups):
        colors = _distinct_colors(modes)
        w = 0.8 / len(modes)
        lo = 0.9
        for j, m in enumerate(modes):
            xs, ys = [], []
            for i, p in enumerate(pts):
                sp = speedup(p, m)[1]
                if sp is not None:
                    xs.append(i + (j - (len(modes) - 1) / 2) * w)
                    ys.append(sp)
            lo = min([lo, *ys])
            ax.bar(xs, ys, w, label=m if len(bases) == 1 else f"{m} / {speedup_over(doc, m)}",
                   color=colors[m])
        ax.axhline(1.0, color="black", linewidth=0.8)
        _point_axis(ax, pts)
        ax.set_ylabel(f"speedup over {bases[0]} (x)" if len(bases) == 1 else
                      "speedup over its baseline (x)")
        ax.set_ylim(max(0.0, lo - 0.1), None)
        if len(groups) > 1:
            ax.set_title(_group_title(op, pts), fontsize=9, loc="left")
        ax.legend(title="configuration" + ("" if len(bases) == 1 else " / its baseline"),
                  fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    over = bases[0] if len(bases) == 1 else "each configuration's baseline"
    fig.suptitle(_wrap(f"Speedup over {over} (modelled time) — {_what(doc, doc['points'])}",
                       width), fontsize=10)
    return _save(plt, fig, path)


def speedup_over(doc: dict, mode: str) -> str | None:
    return next((b for p in doc["points"] for b, s in [speedup(p, mode)] if s is not None),
                None)


def _dram_bars(doc: dict) -> list[tuple[dict, list[str]]]:
    """(point, the configurations drawn there): measurement runs left out, and every bar
    has its baseline (or is one) at the point to be normalised by."""
    out = []
    for p in doc["points"]:
        runs = _runs(p)
        bases = {baseline_of(m, runs[m]) for m in runs}
        mine = [m for m in _baselines_first(doc, p) if compared(m) and (
            baseline_of(m, runs[m]) in runs or m in bases)]
        if len(mine) > 1:
            out.append((p, mine))
    return out


def _dram_ref(pt: dict, mode: str) -> float:
    runs = _runs(pt)
    b = baseline_of(mode, runs[mode])
    return sum(runs[b if b in runs else mode]["dram_bytes"].values()) or 1.0


def dram_figure(plt, doc: dict, path: Path) -> Path | None:
    """Stacked DRAM traffic by category, each bar over its baseline's total: per point and
    configuration (up to 120 bars), else per operation and configuration, the mean over
    the points (whiskers: the total's range)."""
    bars = _dram_bars(doc)
    if not bars:
        return None
    cats = [c for c, _ in dram_categories(doc)]
    names = dict(dram_categories(doc))
    bases = baselines_used(doc, [p for p, _ in bars])
    norm = bases[0] if len(bases) == 1 else "its baseline"
    colors = {c: _CAT_COLORS.get(c, "#7f7f7f") for c in cats}
    handles = [plt.Rectangle((0, 0), 1, 1, color=colors[c]) for c in cats]
    n_bars = sum(len(m) for _, m in bars)
    if n_bars <= 120:
        modes = list(dict.fromkeys(m for _, ms in bars for m in ms))
        codes, n = {}, 0
        for m in modes:
            c = _REG.configurations[m].short if m in _REG.configurations else ""
            if not c or c in codes.values():
                n += 1
                c = str(n)
            codes[m] = c
        pts = [p for p, _ in bars]
        width = min(16.0, max(8.0, 0.5 * len(pts) + 0.06 * n_bars + 3))
        fig, ax = plt.subplots(figsize=(width, 5.4))
        top = 1.0
        for i, (p, ms) in enumerate(bars):
            w = 0.8 / len(ms)
            for j, m in enumerate(ms):
                x = i + (j - (len(ms) - 1) / 2) * w
                ref = _dram_ref(p, m)
                bottom = 0.0
                for c in cats:
                    v = _runs(p)[m]["dram_bytes"].get(c, 0) / ref
                    ax.bar(x, v, w * 0.95, bottom=bottom, color=colors[c], edgecolor="white",
                           linewidth=0.3)
                    bottom += v
                ax.text(x, bottom + 0.01, codes[m], ha="center", va="bottom", fontsize=6)
                top = max(top, bottom)
        ax.set_ylim(0, top * 1.08)
        _point_axis(ax, pts)
        ax.set_ylabel(f"DRAM accesses ({norm} = 1)")
        title = (f"DRAM traffic by category over {norm}'s, per point; bars left to right: "
                 + ", ".join(f"{codes[m]} = {m}" for m in modes) + f" — {doc['scenario']}")
        ax.set_title(_wrap(title, width - 1.5), fontsize=10)
    else:
        groups = []
        for op, pts in op_groups(doc).items():
            mine = [(p, ms) for p, ms in bars if p in pts]
            modes = list(dict.fromkeys(m for _, ms in mine for m in ms))
            if mine:
                groups.append((op, mine, modes))
        cols = [len(m) for _, _, m in groups]
        width = min(16.0, max(8.0, 0.45 * sum(cols) + 1.5 * len(groups) + 1))
        fig, axes = plt.subplots(1, len(groups), figsize=(width, 5.6), squeeze=False,
                                 sharey=True, gridspec_kw={"width_ratios": cols})
        for ax, (op, mine, modes) in zip(axes[0], groups):
            for x, m in enumerate(modes):
                at = [p for p, ms in mine if m in ms]
                bottom = 0.0
                for c in cats:
                    v = sum(_runs(p)[m]["dram_bytes"].get(c, 0) / _dram_ref(p, m)
                            for p in at) / len(at)
                    ax.bar(x, v, 0.8, bottom=bottom, color=colors[c], edgecolor="white",
                           linewidth=0.3)
                    bottom += v
                tot = [sum(_runs(p)[m]["dram_bytes"].values()) / _dram_ref(p, m) for p in at]
                ax.errorbar(x, bottom, yerr=[[max(0.0, bottom - min(tot))],
                                             [max(0.0, max(tot) - bottom)]],
                            color="black", capsize=2, linewidth=0.8)
            ax.set_xticks(range(len(modes)))
            ax.set_xticklabels(modes, rotation=40, ha="right", fontsize=8)
            ax.set_title(_wrap(_group_title(op, [p for p, _ in mine]), 0.45 * len(modes) + 1,
                               9), fontsize=9)
            ax.grid(axis="y", alpha=0.3)
        axes[0][0].set_ylabel(f"DRAM accesses ({norm} = 1)")
        fig.suptitle(_wrap(f"DRAM traffic by category over {norm}'s, the mean over each "
                           f"operation's points (whiskers: the total's min and max) — "
                           f"{doc['scenario']}", width), fontsize=10)
        ax = axes[0][-1]
    ax.legend(handles, [names[c] for c in cats], fontsize=8, title="category",
              loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="y", alpha=0.3)
    return _save(plt, fig, path)


def _timeline_point(doc: dict, wanted: str | None) -> dict | None:
    pts = [p for p in doc["points"] if any(r.get("rank_phases_s") for r in p["runs"])]
    if wanted:
        return _one_point(pts, wanted)
    # the first point with the fewest ranks of at most 8
    return max(pts, key=lambda p: (p["tp"] <= 8, -p["tp"])) if pts else None


def _one_point(pts: list[dict], wanted: str) -> dict:
    """The point ``--timeline`` names: by its key, its label, or its label without the
    --set values when only one point has it; a name that fits several is refused, naming
    them (their labels, or their keys where the labels are the same)."""
    for match in (lambda p: p["key"] == wanted, lambda p: _label(p) == wanted,
                  lambda p: _base_label(p) == wanted):
        found = [p for p in pts if match(p)]
        if len(found) == 1:
            return found[0]
        if found:
            names = [_label(p) for p in found]
            if len(set(names)) < len(names):  # the same label: only the keys differ
                names = [p["key"] for p in found]
            raise ScenarioError(f"--timeline {wanted!r} is ambiguous: {len(found)} points "
                                f"match ({'; '.join(names)}); give one of these")
    raise ScenarioError(f"--timeline {wanted!r}: no such point (e.g. "
                        f"{_label(pts[0]) if pts else 'none has phases'!r})")


def timeline_runs(pt: dict, wanted: list[str] | None = None) -> list[dict]:
    """The runs of ``pt`` a timeline draws: ``wanted`` (in its order), else every compared
    run when there are up to 6, else the baselines, the configurations that pick another
    (a tuner, a heuristic: their run records the pick) and the fastest of the others that
    is not a bound."""
    runs = [r for r in pt["runs"] if r.get("rank_phases_s")]
    by = {r["mode"]: r for r in runs}
    if wanted:
        bad = [m for m in wanted if m not in by]
        if bad:
            raise ScenarioError(f"--timeline-modes: {', '.join(bad)} did not run at "
                                f"{_label(pt)!r} (it ran {', '.join(by)})")
        return [by[m] for m in wanted]
    shown = [r for r in runs if compared(r["mode"])]
    if len(shown) <= 6:
        return shown
    cfg = _REG.configurations.get
    bases = {baseline_of(r["mode"], r) for r in shown}
    keep = {m for m, r in by.items() if m in bases or (cfg(m) and (cfg(m).baseline or cfg(m)
            .search)) or (r.get("search") or {}).get("chosen")}  # tuners and heuristics
    rest = [r for r in shown if r["mode"] not in keep
            and not (cfg(r["mode"]) and cfg(r["mode"]).design.endswith("bound"))]
    if rest:
        keep.add(min(rest, key=lambda r: r["modelled_time_s"])["mode"])
    order = list(FUSED_ORDER)  # the baselines first, then the registry's order
    return sorted((r for r in shown if r["mode"] in keep), key=lambda r: (
        r["mode"] not in bases, not (cfg(r["mode"]) and cfg(r["mode"]).baseline),
        order.index(r["mode"]) if r["mode"] in order else len(order)))


def timeline_figure(plt, doc: dict, pt: dict, path: Path,
                    modes: list[str] | None = None) -> Path:
    """Each rank's phases of ``pt`` per configuration: a colour per kind of kernel or
    executor (a fused kernel: the GEMM's colour hatched with its collective's); phases
    that overlap on a rank take lanes."""
    runs = timeline_runs(pt, modes)
    tp = pt["tp"]
    op = _operation(doc, pt)
    fig, ax = plt.subplots(figsize=(10, 1.4 + 0.16 * tp * len(runs) + 0.25 * len(runs)))
    y = 0
    yt, yl = [], []
    seen: dict[tuple[str, str | None], None] = {}
    for r in reversed(runs):
        for rank in reversed(range(tp)):
            phases = sorted(r["rank_phases_s"][rank].items(), key=lambda kv: kv[1][0])
            lanes: list[float] = []  # end of the last phase in each lane (overlap -> lanes)
            placed = []
            for name, (s, e) in phases:
                lane = next((i for i, end in enumerate(lanes) if end <= s), len(lanes))
                if lane < len(lanes):
                    lanes[lane] = e
                else:
                    lanes.append(e)
                placed.append((name, s, e, lane))
            h = 0.8 / max(1, len(lanes))
            for name, s, e, lane in placed:
                kind, inside = phase_kind(name, op)
                seen[(kind, inside)] = None
                ax.barh(y + 0.4 - h * (lane + 0.5), (e - s) * 1e6, left=s * 1e6, height=h,
                        color=_KIND[kind][1], edgecolor=_KIND[inside][1] if inside else "white",
                        hatch="////" if inside else None, linewidth=0.3 if not inside else 0.0)
            if rank in (0, tp - 1) or tp <= 8:
                yt.append(y)
                yl.append(f"{r['mode']} · rank {rank}" if rank == 0 else f"rank {rank}")
            y += 1
        y += 1.5
    ax.set_yticks(yt)
    ax.set_yticklabels(yl, fontsize=7)
    ax.set_xlim(left=0)
    ax.set_xlabel("modelled time (us)")
    shown = ", ".join(r["mode"] for r in runs)
    left = len([r for r in pt["runs"] if r.get("rank_phases_s")]) - len(runs)
    ax.set_title(_wrap(f"Per-rank timeline — {_label(pt, True)} (M={pt['m']} N={pt['n']} "
                       f"K={pt['k']}): {shown}" + (f" ({left} more configurations ran; "
                                                   f"--timeline-modes draws others)"
                                                   if left else ""), 10), fontsize=10)
    order = [k for k, _, _ in KINDS]
    handles, labels = [], []
    for kind, inside in sorted(seen, key=lambda k: (order.index(k[0]), k[1] is not None,
                                                    order.index(k[1]) if k[1] else 0)):
        if inside:
            handles.append(plt.Rectangle((0, 0), 1, 1, facecolor=_KIND[kind][1],
                                         edgecolor=_KIND[inside][1], hatch="////",
                                         linewidth=0))
            labels.append(f"GEMM fused with {_KIND[inside][0].split(' (')[0]}")
        else:
            handles.append(plt.Rectangle((0, 0), 1, 1, color=_KIND[kind][1]))
            labels.append(_KIND[kind][0])
    ax.legend(handles, labels, title="kind of kernel", fontsize=8, loc="upper left",
              bbox_to_anchor=(1.0, 1.0))
    ax.grid(axis="x", alpha=0.3)
    return _save(plt, fig, path)


def _design_figures(doc: dict, out: Path) -> list[Path]:
    """The figures of the designs whose configurations the sweep ran."""
    from emulator.app import report_ficco, report_fused, report_overlap

    written = []
    if report_ficco.applies(doc):
        written += report_ficco.figures(doc, out)
    if report_fused.applies(doc):
        written += report_fused.figures(doc, out)
    if report_overlap.applies(doc):
        written += report_overlap.figures(doc, out)
    return written


def _stage_base(pt: dict) -> str | None:
    """The baseline whose GEMM, run alone, the fused kernels' stages are compared with:
    the one most configurations with a stage profile are over, if it has one too."""
    runs = _runs(pt)
    bases = [baseline_of(m, r) for m, r in runs.items() if (r.get("stage_profile") or {})
             .get("stages_s")]
    bases = [b for b in bases if b in runs and (runs[b].get("stage_profile") or {})
             .get("stages_s")]
    return max(set(bases), key=bases.count) if bases else None


def stage_slowdown(pt: dict) -> dict[str, list[tuple[float, float]]]:
    """Per configuration with a stage profile: (stage start from its kernel's start, its
    duration over the same stage of the baseline's GEMM run alone) for each stage."""
    runs = _runs(pt)
    b = _stage_base(pt)
    base = (runs.get(b) or {}).get("stage_profile") or {}
    iso = [e - a for a, e in base.get("stages_s", [])]
    out = {}
    for mode, r in runs.items():
        prof = r.get("stage_profile") or {}
        st = prof.get("stages_s", [])
        if mode == b or not st or len(st) != len(iso):
            continue
        t0 = prof["window_s"][0]
        out[mode] = [(a - t0, (e - a) / d if d > 0 else 1.0) for (a, e), d in zip(st, iso)]
    return out


def stage_figure(plt, pt: dict, path: Path, modes: list[str] | None = None) -> Path | None:
    """T3's per-stage view of one point: the HBM's bandwidth by stream over the GEMM run
    alone (the baseline's GEMM) and over each fused kernel, and each GEMM stage's
    slowdown against the same stage run alone. Drawn when a fused kernel has as many
    stages as the baseline's GEMM; ``modes``: the configurations to draw."""
    runs = _runs(pt)
    base = _stage_base(pt)
    slow = {m: v for m, v in stage_slowdown(pt).items() if not modes or m in modes}
    if base is None or not slow or not runs[base]["stage_profile"].get("hbm_gb_per_s"):
        return None
    shown = [base] + [m for m in runs if m in slow
                      and runs[m]["stage_profile"].get("hbm_gb_per_s")]
    streams = sorted({s for m in shown for s in runs[m]["stage_profile"]["hbm_gb_per_s"]})
    cmap = plt.get_cmap("tab10")
    colors = {s: cmap(i % 10) for i, s in enumerate(streams)}
    staged = len(runs[base]["stage_profile"]["stages_s"]) > 1  # else no per-stage panel
    rows = len(shown) + staged
    fig, axes = plt.subplots(rows, 1, figsize=(10, 1.9 * rows + 0.6), sharex=True,
                             squeeze=False)
    axes = list(axes[:, 0])
    peak = pt["device_spec"]["hbm_bw"] / 1e9 if pt.get("device_spec") else None
    for ax, m in zip(axes, shown):
        prof = runs[m]["stage_profile"]
        n = len(next(iter(prof["hbm_gb_per_s"].values())))
        xs = [(i + 0.5) * prof["bin_s"] * 1e6 for i in range(n)]
        ys = [prof["hbm_gb_per_s"].get(s, [0.0] * n) for s in streams]
        ax.stackplot(xs, ys, labels=streams, colors=[colors[s] for s in streams], step="mid")
        t0 = prof["window_s"][0]
        for a, _ in prof["stages_s"][1:]:
            ax.axvline((a - t0) * 1e6, color="black", linewidth=0.3, alpha=0.4)
        if peak:
            ax.axhline(peak, color="red", linewidth=0.8, linestyle="--")
        what = "GEMM run alone" if m == base else "fused kernel"
        ax.set_ylabel("HBM GB/s", fontsize=8)
        n_st = len(prof["stages_s"])
        ax.set_title(f"{m}: {what} {prof['kernel']} ({n_st} stage{'s' if n_st > 1 else ''})",
                     fontsize=9, loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=min(5, len(streams)), loc="upper right")
    if not staged:
        axes[-1].set_xlabel("modelled time from the kernel's start (us)")
        fig.suptitle(_wrap(f"HBM bandwidth by stream, rank 0 (the GEMM has one stage: no "
                           f"per-stage slowdown) — {_label(pt, True)} (M={pt['m']} "
                           f"N={pt['n']} K={pt['k']})", 10), fontsize=10)
        return _save(plt, fig, path)
    ax = axes[-1]
    colors_m = _distinct_colors(shown[1:])
    for m in shown[1:]:
        pts = slow[m]
        ax.step([x * 1e6 for x, _ in pts], [y for _, y in pts], where="post", label=m,
                color=colors_m[m])
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("stage time /\nalone", fontsize=8)
    ax.set_xlabel("modelled time from the kernel's start (us); thin lines: stage boundaries")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.suptitle(_wrap(f"DRAM traffic and GEMM slowdown per stage, rank 0 — {_label(pt, True)} "
                       f"(M={pt['m']} N={pt['n']} K={pt['k']})", 10), fontsize=10)
    return _save(plt, fig, path)
