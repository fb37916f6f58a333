"""Flux's views of a sweep (Flux, "Metrics"), for sweeps of cases on
systems (``[[cases]]`` scenarios): per cluster (system), operation and m,

- the time of each method as the GEMM alone (the baseline's unsplit GEMM, the same for
  every method) plus its exposed communication time (ECT), stacked;
- overlap efficiency E = 1 - ECT / ECT of the non-overlapped baseline per method;
- the speedup of the tuned configuration (a search configuration: ``flux-best``)
  over every baseline (non-overlapped, medium-grained);
- the knobs the tuner picked.

The methods drawn are the registry's baselines and search configurations (every
configuration's E is in the table); nothing here knows a configuration by name.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from emulator.app.catalog import registry

_REG = registry()


DESIGN = "Flux"


def applies(doc: dict) -> bool:
    """Cluster views need a Flux configuration's runs on systems with the overlap metrics
    (operations whose producer is a GEMM)."""
    return any(_REG.configurations.get(r["mode"]) is not None
               and _REG.configurations[r["mode"]].design == DESIGN
               and r.get("ect_s") is not None
               for pts in groups(doc).values() for pt in pts for r in pt["runs"])


def _runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def groups(doc: dict) -> dict[tuple[str, str, int], list[dict]]:
    """(sub-layer, system, TP) -> its points by m (points on systems of operations whose
    producer is a GEMM)."""
    from emulator.app.report import gemm_producer, set_text

    out: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for pt in doc["points"]:
        if pt.get("system") and gemm_producer(doc, pt):
            out[(pt["sublayer"], pt["system"] + set_text(pt), pt["tp"])].append(pt)
    return {k: sorted(v, key=lambda p: p["m"]) for k, v in out.items()}


def methods(doc: dict) -> tuple[list[str], list[str]]:
    """(baselines, tuned configurations) present in the sweep, in the registry's order; a
    tuner that is also a baseline (``te-best``) is a baseline only (drawn once, never
    compared with itself)."""
    modes = {r["mode"] for pt in doc["points"] for r in pt["runs"]}
    base = [b for b in _REG.baselines() if b in modes]
    tuned = [n for n, c in _REG.configurations.items()
             if c.search and n in modes and n not in base]
    return base, tuned


def _grid(rows: list[tuple]) -> str:
    from emulator.app.report import _grid as grid

    return grid(rows)


def text(doc: dict) -> str:
    base, tuned = methods(doc)
    shown = base + tuned
    parts = []
    for (sub, system, tp), pts in groups(doc).items():
        rows = [("m", "GEMM alone us", *(f"{m} ECT us" for m in shown),
                 *(f"{m} E" for m in shown),
                 *(f"{t} vs {b}" for t in tuned for b in base), *(f"{t} chose" for t in tuned))]
        for pt in pts:
            runs = _runs(pt)
            alone = next((r["gemm_alone_s"] for r in pt["runs"] if r.get("gemm_alone_s")), None)
            cell = lambda m, k, f: (f(runs[m][k]) if m in runs and runs[m].get(k)  # noqa: E731
                                    is not None else "-")
            rows.append((str(pt["m"]), f"{alone * 1e6:.1f}" if alone else "-",
                         *(cell(m, "ect_s", lambda v: f"{v * 1e6:.1f}") for m in shown),
                         *(cell(m, "overlap_efficiency", lambda v: f"{v:+.2f}") for m in shown),
                         *(f"{runs[b]['modelled_time_s'] / runs[t]['modelled_time_s']:.2f}x"
                           if t in runs and b in runs else "-" for t in tuned for b in base),
                         *((runs[t].get("search") or {}).get("chosen", "-") if t in runs else "-"
                           for t in tuned)))
        parts += [f"{sub} on {system} (TP {tp})", _grid(rows), ""]
    eff = efficiency_table(doc)
    if eff:
        parts += ["Overlap efficiency of every configuration (mean over m; min .. max)", eff]
    return "\n".join(parts).rstrip()


def efficiency_table(doc: dict) -> str:
    """Per (sub-layer, system): every configuration's overlap efficiency over its m."""
    names = [n for n in _REG.configurations if n != _REG.baseline()]
    rows = [("sub-layer", "system", "TP", "configuration", "mean E", "min E", "max E")]
    for (sub, system, tp), pts in groups(doc).items():
        for n in names:
            vals = [_runs(p)[n]["overlap_efficiency"] for p in pts if n in _runs(p)
                    and _runs(p)[n].get("overlap_efficiency") is not None]
            if vals:
                rows.append((sub, system, str(tp), n, f"{sum(vals) / len(vals):+.2f}",
                             f"{min(vals):+.2f}", f"{max(vals):+.2f}"))
    return _grid(rows) if len(rows) > 1 else ""


def figures(doc: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.app.report import _save, _wrap

    base, tuned = methods(doc)
    shown = base + tuned
    colors = {n: c.color for n, c in _REG.configurations.items()}
    grp = groups(doc)
    keys = sorted(grp, key=lambda k: (k[0], k[2], k[1]))
    subs = sorted({k[0] for k in keys})
    cols = max(sum(1 for k in keys if k[0] == s) for s in subs)
    written = []

    def panels(height: float, **kw):
        """A figure with a row per sub-layer, a panel per (system, TP): (fig, axes,
        [(row, ax, key, points)])."""
        fig, axes = plt.subplots(len(subs), cols, figsize=(4.2 * cols, height * len(subs)),
                                 squeeze=False, **kw)
        out = []
        for i, sub in enumerate(subs):
            mine = [k for k in keys if k[0] == sub]
            for j in range(cols):
                if j < len(mine):
                    out.append((i, axes[i][j], mine[j], grp[mine[j]]))
                else:
                    axes[i][j].axis("off")
        return fig, axes, out

    # 1. stacked GEMM alone + ECT per method and m
    fig, axes, cells = panels(3.6)
    for i, ax, key, pts in cells:
        width = 0.8 / len(shown)
        for mi, m in enumerate(shown):
            for x, pt in enumerate(pts):
                r = _runs(pt).get(m)
                alone = next((q["gemm_alone_s"] for q in pt["runs"]
                              if q.get("gemm_alone_s")), None)
                if r is None or alone is None or r.get("ect_s") is None:
                    continue
                ref = _runs(pt)[base[0]]["modelled_time_s"] if base and base[0] in \
                    _runs(pt) else r["modelled_time_s"]  # bars in units of the baseline
                xs = x + (mi - (len(shown) - 1) / 2) * width
                ax.bar(xs, alone / ref, width * 0.95, color="#c7c7c7",
                       edgecolor="white", linewidth=0.3)
                ax.bar(xs, max(0.0, r["ect_s"]) / ref, width * 0.95,
                       bottom=alone / ref, color=colors.get(m), edgecolor="white",
                       linewidth=0.3)
        ax.set_xticks(range(len(pts)))
        ax.set_xticklabels([str(p["m"]) for p in pts], fontsize=8)
        ax.set_xlabel("m (tokens)", fontsize=8)
        ax.set_title(f"{key[0]} · {key[1]} (TP {key[2]})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        axes[i][0].set_ylabel(f"time / time of {base[0] if base else 'itself'}", fontsize=8)
    handles = [plt.Rectangle((0, 0), 1, 1, color="#c7c7c7")] + [
        plt.Rectangle((0, 0), 1, 1, color=colors.get(m)) for m in shown]
    fig.legend(handles, ["GEMM alone"] + [f"ECT of {m}" for m in shown], loc="lower center",
               ncol=min(len(handles), 6), fontsize=8, bbox_to_anchor=(0.5, 0.0))
    fig.suptitle(_wrap(f"{doc['scenario']}: each method's time = GEMM alone + exposed "
                       f"communication (ECT), per m, over the time of "
                       f"{base[0] if base else 'itself'}; bars left to right: "
                       f"{', '.join(shown)}", fig.get_figwidth()), fontsize=10)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    written.append(_save(plt, fig, out / "flux_ect.png", tight=False))

    # 2. overlap efficiency per configuration against m (clipped below at FLOOR: a
    # medium-grained baseline at small m can be tens of ECTs worse; its value is printed)
    floor = -1.5
    bold = [m for m in shown if m != _REG.baseline()]
    fig, axes, cells = panels(3.4, sharey=True)
    for i, ax, key, pts in cells:
        names = [n for n in _REG.configurations if n != _REG.baseline()
                 and any(n in _runs(q) for q in pts)]
        for m in names:
            xs = [q["m"] for q in pts if m in _runs(q)]
            ys = [_runs(q)[m]["overlap_efficiency"] for q in pts if m in _runs(q)]
            style = dict(marker="o", color=colors.get(m), label=m,
                         linewidth=2.0 if m in bold else 0.8,
                         alpha=1.0 if m in bold else 0.55,
                         markersize=5 if m in bold else 3)
            ax.plot(xs, [max(floor, y) for y in ys], **style)
            for x, y in zip(xs, ys):
                if y < floor:
                    ax.annotate(f"{y:.0f}", (x, floor), textcoords="offset points",
                                xytext=(0, 4), fontsize=7, color=colors.get(m),
                                ha="center")
        ax.axhline(0.0, color="black", linewidth=0.8)
        ax.set_ylim(floor - 0.1, 1.05)
        ax.set_xscale("log", base=2)
        ax.set_xticks([q["m"] for q in pts])
        ax.set_xticklabels([str(q["m"]) for q in pts], fontsize=7)
        ax.set_title(f"{key[0]} · {key[1]} (TP {key[2]})", fontsize=9)
        ax.set_xlabel("m (tokens)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6, loc="lower right")
        axes[i][0].set_ylabel(f"overlap efficiency E (clipped at {floor})", fontsize=8)
    fig.suptitle(_wrap(f"{doc['scenario']}: overlap efficiency E = 1 - ECT / ECT of "
                       f"{_REG.baseline()}; bold: {', '.join(bold)}", fig.get_figwidth()),
                 fontsize=10)
    written.append(_save(plt, fig, out / "flux_efficiency.png"))
    return written
