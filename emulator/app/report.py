"""``t3emu report``: the tables and figures a reader of the T3 paper looks for.

From a sweep directory's ``results.json``:
- per-sub-layer speedup of every configuration over sequential, with the
  geomean and max per configuration;
- DRAM traffic per GPU by T3's categories (GEMM, RS and AG reads and writes)
  for sequential and the fused configurations, and its reduction;
- an end-to-end estimate per model and TP degree (method below);
- PNG figures (matplotlib): speedup bars, stacked DRAM bars, a per-rank timeline;
- for sweeps of cases on systems, Flux's views (``report_overlap.py``), or, when they
  run the fused computation-collective operators, theirs (``report_fused.py``).

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
sub-layers of a model, so scenarios that list only FC-2 and OP get none.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from emulator.app.catalog import registry
from emulator.app.scenario import SUBLAYERS, ScenarioError, geomean

_REG = registry()
FUSED_ORDER = tuple(_REG.configurations)  # the registry's order
BASE = _REG.baseline() or BASE  # speedups are over this configuration
TRAFFIC_MODES = tuple(n for n, c in _REG.configurations.items() if c.short)
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
    doc = json.loads(path.read_text())
    if not doc.get("points"):
        raise ScenarioError(f"{path} holds no finished point yet")
    return doc


def modes_of(doc: dict) -> list[str]:
    return [m for m in FUSED_ORDER if m in doc["modes"]] + \
        [m for m in doc["modes"] if m not in FUSED_ORDER]


def _runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def _label(pt: dict, with_device: bool = False) -> str:
    if pt.get("system"):  # a case on a system (scenario.Point.label)
        params = ",".join(f"{n}={v:g}" for n, v in (pt.get("params") or {}).items())
        return (f"{pt['model']} {pt['sublayer']} m={pt['m']} TP{pt['tp']} {pt['system']}"
                + (f" {params}" if params else ""))
    s = f"{pt['model']} {pt['sublayer']} TP{pt['tp']}"
    return s + f" {pt['device']}" if with_device else s


def speedup_table(doc: dict) -> tuple[str, dict[str, list[float]]]:
    modes = [m for m in modes_of(doc) if m != BASE]
    rows = [("sub-layer", "M x N x K", "sequential us", *modes)]
    per_mode: dict[str, list[float]] = defaultdict(list)
    for pt in doc["points"]:
        runs = _runs(pt)
        seq = runs.get(BASE)
        if seq is None:
            continue
        cells = []
        for m in modes:
            sp = seq["modelled_time_s"] / runs[m]["modelled_time_s"] if m in runs else None
            if sp is not None:
                per_mode[m].append(sp)
            cells.append(f"{sp:.3f}x" if sp else "-")
        rows.append((_label(pt), f"{pt['m']}x{pt['n']}x{pt['k']}",
                     f"{seq['modelled_time_s'] * 1e6:.1f}", *cells))
    rows.append(("geomean", "", "", *(f"{geomean(per_mode[m]):.3f}x" if per_mode[m] else "-"
                                     for m in modes)))
    rows.append(("max", "", "", *(f"{max(per_mode[m]):.3f}x" if per_mode[m] else "-"
                                 for m in modes)))
    return _grid(rows, rule_before=len(rows) - 2), per_mode


def overlap_table(doc: dict) -> str:
    """Flux's overlap efficiency per point and configuration (E = 1 - ECT / ECT of the
    baseline; ECT = time - the baseline's GEMM alone), with the GEMM-alone time."""
    modes = [m for m in modes_of(doc) if m != BASE]
    rows = [("sub-layer", "GEMM alone us", "baseline ECT us", *modes)]
    for pt in doc["points"]:
        runs = _runs(pt)
        seq = runs.get(BASE)
        if seq is None or seq.get("gemm_alone_s") is None or seq.get("ect_s") is None:
            continue
        cells = [f"{runs[m]['overlap_efficiency']:+.2f}"
                 if m in runs and runs[m].get("overlap_efficiency") is not None else "-"
                 for m in modes]
        rows.append((_label(pt), f"{seq['gemm_alone_s'] * 1e6:.1f}",
                     f"{seq['ect_s'] * 1e6:.1f}", *cells))
    return _grid(rows) if len(rows) > 1 else ""


def _mb(nbytes: float) -> str:
    mb = nbytes / 1e6
    return f"{mb:,.0f}" if mb >= 100 else f"{mb:.1f}"


def dram_table(doc: dict) -> str:
    modes = [m for m in TRAFFIC_MODES if m in doc["modes"]]
    cats = [(c, name) for c, name in DRAM_CATS
            if any(r["dram_bytes"].get(c, 0) for pt in doc["points"] for r in pt["runs"])]
    rows = [("sub-layer", "config", *(name for _, name in cats), "total", "vs sequential")]
    reductions: dict[str, list[float]] = defaultdict(list)
    for pt in doc["points"]:
        runs = _runs(pt)
        base = sum(runs[BASE]["dram_bytes"].values()) if BASE in runs else None
        for m in modes:
            if m not in runs:
                continue
            d = runs[m]["dram_bytes"]
            tp = pt["tp"]
            total = sum(d.values())
            rel = ""
            if base and m != BASE:
                reductions[m].append(1 - total / base)
                rel = f"{(total / base - 1) * 100:+.1f}%"
            rows.append((_label(pt) if m == modes[0] else "", m,
                         *(_mb(d.get(c, 0) / tp) for c, _ in cats), _mb(total / tp), rel))
    lines = [_grid(rows), "MB per GPU (the sum over the TP GPUs / TP); updates count as writes."]
    for m, vals in reductions.items():
        lines.append(f"DRAM traffic reduction of {m} vs sequential: mean "
                     f"{sum(vals) / len(vals) * 100:.1f}%, max {max(vals) * 100:.1f}%")
    return "\n".join(lines)


def end_to_end(doc: dict) -> tuple[str | None, list[dict]]:
    by_case: dict[tuple, dict[str, dict]] = defaultdict(dict)
    for pt in doc["points"]:
        by_case[(pt["model"], pt["tp"], pt["device"])][pt["sublayer"]] = pt
    modes = modes_of(doc)
    out = []
    for (model, tp, device), subs in by_case.items():
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
        row = {"model": model, "tp": tp, "device": device, "other_gemms_s": other_s}
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
        rows.append((r["model"], str(r["tp"]), f"{seq * 1e6:.0f}",
                     f"{(seq - r['other_gemms_s']) / seq * 100:.0f}%",
                     *(f"{seq / r[m]:.3f}x" if m in r else "-" for m in modes
                       if m != BASE)))
    return _grid(rows) + "\n" + E2E_METHOD, out


def _grid(rows: list[tuple], rule_before: int | None = None) -> str:
    widths = [max(len(str(r[i])) for r in rows) for i in range(len(rows[0]))]
    fmt = lambda r: "  ".join(str(c).ljust(w) if i == 0 else str(c).rjust(w)  # noqa: E731
                              for i, (c, w) in enumerate(zip(r, widths)))
    lines = [fmt(rows[0]), "-" * (sum(widths) + 2 * (len(widths) - 1))]
    for i, r in enumerate(rows[1:], start=1):
        if rule_before is not None and i == rule_before:
            lines.append("-" * len(lines[1]))
        lines.append(fmt(r))
    return "\n".join(lines)


def text_report(doc: dict) -> str:
    kind = "timing-only" if doc["timing_only"] else "numeric"
    n_runs = sum(len(p["runs"]) for p in doc["points"])
    verdicts = defaultdict(int)
    for p in doc["points"]:
        for r in p["runs"]:
            verdicts[r["numerics"]] += 1
    parts = [f"t3emu report: scenario {doc['scenario']} ({kind}), {len(doc['points'])} points, "
             f"{n_runs} runs, {doc['collective'].upper()} on a {doc['topology']}, "
             f"{doc['dtype']}; numerics: "
             + ", ".join(f"{v} {k}" for k, v in sorted(verdicts.items())),
             "", "Speedup over sequential (modelled time, per sub-layer)"]
    table, _ = speedup_table(doc)
    parts += [table]
    overlap = overlap_table(doc)
    if overlap:
        parts += ["", "Overlap efficiency (Flux's E = 1 - ECT / ECT of sequential; ECT = time - "
                  "the GEMM alone)", overlap]
    from emulator.app import report_ficco, report_fused, report_overlap

    if report_ficco.applies(doc):
        parts += ["", "FiCCO's views", report_ficco.text(doc)]
    if report_fused.applies(doc):
        parts += ["", "The fused computation-collective operators' views", report_fused.text(doc)]
    elif report_overlap.applies(doc):
        parts += ["", "Flux's views per cluster: GEMM alone, ECT and E per method, the tuned "
                  "configuration's speedups and the knobs it chose", report_overlap.text(doc)]
    parts += ["", "DRAM traffic by category"]
    parts.append(dram_table(doc))
    e2e, _ = end_to_end(doc)
    parts += ["", "End-to-end estimate per layer"]
    parts.append(e2e if e2e else "none: needs OP, FC-2, FC-1 and IP of a model (" +
                 E2E_METHOD + ")")
    return "\n".join(parts)


# ---------------------------------------------------------------------------- figures
_COLORS = {n: c.color for n, c in _REG.configurations.items()}
_CAT_COLORS = {"gemm_read": "#1f77b4", "gemm_write": "#aec7e8", "rs_read": "#d62728",
               "rs_write": "#ff9896", "ag_read": "#2ca02c", "ag_write": "#98df8a",
               "a2a_read": "#9467bd", "a2a_write": "#c5b0d5"}
_PHASE_COLORS = {"gemm": "#1f77b4", "rs": "#d62728", "gemm+rs": "#9467bd", "ag": "#2ca02c",
                 "gemm+ag": "#17becf", "a2a": "#8c564b", "gemm+a2a": "#e377c2",
                 "ag+gemm": "#bcbd22"}


def _point_axis(ax, pts: list[dict]) -> None:
    ax.set_xticks(range(len(pts)))
    ax.set_xticklabels([_label(p) for p in pts], rotation=40, ha="right", fontsize=8)


def _save(plt, fig, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def figures(doc: dict, out: Path, timeline_point: str | None = None) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    pts = [p for p in doc["points"] if BASE in _runs(p)]
    if not pts:  # no point runs T3's baseline: only the design's own views apply
        return _design_figures(doc, out)
    modes = [m for m in modes_of(doc) if m != BASE]
    title = f"{doc['scenario']}: {doc['collective'].upper()} on a {doc['topology']}, " \
            f"{doc['dtype']}, device {', '.join(sorted({p['device'] for p in pts}))}"

    # 1. speedup bars
    fig, ax = plt.subplots(figsize=(min(16.0, max(8.0, 0.6 * len(pts) + 3)), 5.0))
    width = 0.8 / max(1, len(modes))
    for j, m in enumerate(modes):
        xs, ys = [], []
        for i, p in enumerate(pts):
            r = _runs(p)
            if m in r:
                xs.append(i + (j - (len(modes) - 1) / 2) * width)
                ys.append(r[BASE]["modelled_time_s"] / r[m]["modelled_time_s"])
        ax.bar(xs, ys, width, label=m, color=_COLORS.get(m))
    ax.axhline(1.0, color="black", linewidth=0.8)
    _point_axis(ax, pts)
    ax.set_ylabel("speedup over sequential (x)")
    ax.set_title(f"Sub-layer speedup — {title}", fontsize=10)
    lo = min([0.9] + [b.get_height() for b in ax.patches])
    ax.set_ylim(max(0.0, lo - 0.1), None)
    ax.legend(title="configuration", fontsize=8, ncol=min(4, len(modes)), loc="upper left")
    ax.grid(axis="y", alpha=0.3)
    written.append(_save(plt, fig, out / "speedup.png"))

    # 2. stacked DRAM traffic, normalised to sequential
    dmodes = [m for m in TRAFFIC_MODES if m in doc["modes"]]
    cats = [c for c, _ in DRAM_CATS
            if any(r["dram_bytes"].get(c, 0) for p in pts for r in p["runs"])]
    fig, ax = plt.subplots(figsize=(min(16.0, max(8.0, 0.6 * len(pts) + 3)), 5.4))
    width = 0.8 / len(dmodes)
    for i, p in enumerate(pts):
        r = _runs(p)
        base = sum(r[BASE]["dram_bytes"].values())
        for j, m in enumerate(dmodes):
            if m not in r:
                continue
            x = i + (j - (len(dmodes) - 1) / 2) * width
            bottom = 0.0
            for c in cats:
                v = r[m]["dram_bytes"].get(c, 0) / base
                ax.bar(x, v, width * 0.95, bottom=bottom, color=_CAT_COLORS[c],
                       edgecolor="white", linewidth=0.3)
                bottom += v
            ax.text(x, bottom + 0.01, (_REG.configurations[m].short if m in _REG.configurations else m),
                    ha="center", va="bottom", fontsize=6)
    names = dict(DRAM_CATS)
    handles = [plt.Rectangle((0, 0), 1, 1, color=_CAT_COLORS[c]) for c in cats]
    ax.legend(handles, [names[c] for c in cats], fontsize=8, ncol=len(cats), loc="upper center",
              bbox_to_anchor=(0.5, -0.28))
    _point_axis(ax, pts)
    ax.set_ylabel("DRAM accesses (sequential = 1)")
    ax.set_title(f"DRAM traffic by category, bars S = sequential, T = t3, M = t3-mca — "
                 f"{doc['scenario']}", fontsize=10)
    ax.grid(axis="y", alpha=0.3)
    written.append(_save(plt, fig, out / "dram_traffic.png"))

    # 3. per-rank timeline of one point
    pt = next((p for p in pts if p["key"] == timeline_point or _label(p) == timeline_point),
              None) if timeline_point else None
    if timeline_point and pt is None:
        raise ScenarioError(f"--timeline {timeline_point!r}: no such point (e.g. "
                            f"{_label(pts[0])!r})")
    pt = pt or max(pts, key=lambda p: (p["tp"] <= 8, -p["tp"]))
    runs = [r for r in pt["runs"] if r.get("rank_phases_s")]
    tp = pt["tp"]
    fig, ax = plt.subplots(figsize=(10, 0.9 + 0.16 * tp * len(runs) + 0.25 * len(runs)))
    y = 0
    yt, yl = [], []
    seen = set()
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
                lab = name if name not in seen else None
                seen.add(name)
                ax.barh(y + 0.4 - h * (lane + 0.5), (e - s) * 1e6, left=s * 1e6, height=h,
                        color=_PHASE_COLORS.get(name, "#7f7f7f"), label=lab)
            if rank in (0, tp - 1) or tp <= 8:
                yt.append(y)
                yl.append(f"{r['mode']} · rank {rank}" if rank == 0 else f"rank {rank}")
            y += 1
        y += 1.5
    ax.set_yticks(yt)
    ax.set_yticklabels(yl, fontsize=7)
    ax.set_xlabel("modelled time (us)")
    ax.set_title(f"Per-rank timeline — {_label(pt, True)} (M={pt['m']} N={pt['n']} K={pt['k']})",
                 fontsize=10)
    ax.legend(title="kernel", fontsize=8, loc="lower right")
    ax.grid(axis="x", alpha=0.3)
    written.append(_save(plt, fig, out / "timeline.png"))
    stages = stage_figure(plt, pt, out / "stages.png")
    if stages:
        written.append(stages)
    return written + _design_figures(doc, out)


def _design_figures(doc: dict, out: Path) -> list[Path]:
    """The figures of the designs whose configurations the sweep ran."""
    from emulator.app import report_ficco, report_fused, report_overlap

    written = []
    if report_ficco.applies(doc):
        written += report_ficco.figures(doc, out)
    if report_fused.applies(doc):
        written += report_fused.figures(doc, out)
    elif report_overlap.applies(doc):
        written += report_overlap.figures(doc, out)
    return written


def stage_slowdown(pt: dict) -> dict[str, list[tuple[float, float]]]:
    """Per configuration with a stage profile: (stage start from its kernel's start, its
    duration over the same stage of the baseline's GEMM run alone) for each stage."""
    runs = _runs(pt)
    base = (runs.get(BASE) or {}).get("stage_profile") or {}
    iso = [b - a for a, b in base.get("stages_s", [])]
    out = {}
    for mode, r in runs.items():
        prof = r.get("stage_profile") or {}
        st = prof.get("stages_s", [])
        if mode == BASE or not st or len(st) != len(iso):
            continue
        t0 = prof["window_s"][0]
        out[mode] = [(a - t0, (b - a) / d if d > 0 else 1.0) for (a, b), d in zip(st, iso)]
    return out


def stage_figure(plt, pt: dict, path: Path) -> Path | None:
    """T3's per-stage view of one sub-layer: the HBM's bandwidth by stream over the GEMM
    run alone (the baseline's GEMM) and over each fused kernel, and each GEMM stage's
    slowdown against the same stage run alone."""
    runs = _runs(pt)
    shown = [m for m, r in runs.items() if (r.get("stage_profile") or {}).get("hbm_gb_per_s")]
    slow = stage_slowdown(pt)
    if BASE not in shown or not slow:
        return None
    shown = [BASE] + [m for m in shown if m in slow]
    streams = sorted({s for m in shown for s in runs[m]["stage_profile"]["hbm_gb_per_s"]})
    cmap = plt.get_cmap("tab10")
    colors = {s: cmap(i % 10) for i, s in enumerate(streams)}
    fig, axes = plt.subplots(len(shown) + 1, 1, figsize=(10, 1.9 * (len(shown) + 1) + 0.6),
                             sharex=True)
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
        what = "GEMM run alone" if m == BASE else "fused GEMM + RS"
        ax.set_ylabel("HBM GB/s", fontsize=8)
        ax.set_title(f"{m}: {what} ({prof['kernel']}, {len(prof['stages_s'])} stages)",
                     fontsize=9, loc="left")
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7, ncol=min(5, len(streams)), loc="upper right")
    ax = axes[-1]
    for m in shown[1:]:
        pts = slow[m]
        ax.step([x * 1e6 for x, _ in pts], [y for _, y in pts], where="post", label=m,
                color=_COLORS.get(m))
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_ylabel("stage time /\nalone", fontsize=8)
    ax.set_xlabel("modelled time from the kernel's start (us); thin lines: stage boundaries")
    ax.legend(fontsize=8, loc="upper right")
    ax.grid(alpha=0.3)
    fig.suptitle(f"DRAM traffic and GEMM slowdown per stage, rank 0 — {_label(pt, True)} "
                 f"(M={pt['m']} N={pt['n']} K={pt['k']})", fontsize=10)
    return _save(plt, fig, path)
