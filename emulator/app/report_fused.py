"""The fused computation-collective operators' views of a sweep (Punniyamurthy et al., SC 2024),
for sweeps whose points run configurations of that design:

- per case and system: the time of each configuration against the baseline per point,
  and the fused operator's reduction of the baseline's time in percent;
- skew per rank (each rank's last kernel end over the fastest rank's) for both task
  orders (the design's communication-aware and oblivious configurations);
- time against occupancy (points that sweep the ``occupancy`` parameter).

The configurations are the registry's: the design's (``design == "Fused ops"``), its
baseline and bound; nothing here knows a configuration by name except through them.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from emulator.app.catalog import registry
from emulator.app.tables import fill

DESIGN = "Fused ops"
_REG = registry()


def _runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def designs_modes(doc: dict) -> list[str]:
    modes = {r["mode"] for pt in doc["points"] for r in pt["runs"]}
    return [n for n, c in _REG.configurations.items() if c.design == DESIGN and n in modes]


def applies(doc: dict) -> bool:
    return bool(designs_modes(doc))


def _swept(pt: dict) -> bool:
    return "occupancy" in (pt.get("params") or {})


def _case(pt: dict) -> str:
    """The case's name, with its parameters (e.g. tables per GPU; the occupancy sweep's
    occupancy apart): a grid of parameters gives one group per value."""
    from emulator.app.report import set_text

    params = {k: v for k, v in (pt.get("params") or {}).items() if k != "occupancy"}
    return " ".join([pt["model"], pt["sublayer"], *(f"{k}={v:g}" for k, v in params.items())]
                    ) + set_text(pt)


def comparison_groups(doc: dict) -> dict[tuple[str, str], list[dict]]:
    """(case, system) -> its points with a baseline run and a fused operator's, by m (the
    occupancy sweep apart; points of other designs in the same sweep left out)."""
    base, fused = _REG.baseline(), designs_modes(doc)
    out: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for pt in doc["points"]:
        runs = _runs(pt)
        if base in runs and not _swept(pt) and any(m in runs for m in fused):
            out[(_case(pt), pt.get("system") or pt["device"])].append(pt)
    return {k: sorted(v, key=lambda p: p["m"]) for k, v in out.items()}


def shown(doc: dict) -> list[str]:
    """The baseline, the isolated bound and the design's configurations, as run."""
    modes = {r["mode"] for pt in doc["points"] for r in pt["runs"]}
    return [n for n, c in _REG.configurations.items() if n in modes
            and (c.design == DESIGN or c.baseline or c.design.endswith("bound"))]


def reduction(pt: dict, mode: str) -> float | None:
    """How much of the baseline's time ``mode`` saves, in percent."""
    runs = _runs(pt)
    base = runs.get(_REG.baseline())
    if base is None or mode not in runs:
        return None
    return 100.0 * (1.0 - runs[mode]["modelled_time_s"] / base["modelled_time_s"])


def occupancy_groups(doc: dict) -> dict[tuple[str, str, int], list[dict]]:
    out: dict[tuple[str, str, int], list[dict]] = defaultdict(list)
    for pt in doc["points"]:
        if _swept(pt):
            out[(_case(pt), pt.get("system") or pt["device"], pt["m"])].append(pt)
    return {k: sorted(v, key=lambda p: p["params"]["occupancy"]) for k, v in out.items()}


def _grid(rows: list[tuple]) -> str:
    from emulator.app.report import _grid as grid

    return grid(rows)


def text(doc: dict) -> str:
    modes = shown(doc)
    fused = designs_modes(doc)
    parts = []
    for (case, system), pts in comparison_groups(doc).items():
        rows = [("m", *(f"{m} us" for m in modes), *(f"{m} cut %" for m in fused),
                 *(f"{m} skew" for m in fused))]
        for pt in pts:
            runs = _runs(pt)
            rows.append((str(pt["m"]),
                         *(f"{runs[m]['modelled_time_s'] * 1e6:.1f}" if m in runs else "-"
                           for m in modes),
                         *(f"{reduction(pt, m):.1f}" if reduction(pt, m) is not None else "-"
                           for m in fused),
                         *(f"{max(runs[m]['rank_skew']):.3f}"
                           if m in runs and runs[m].get("rank_skew") else "-" for m in fused)))
        parts += [fill(f"{case} on {system}: time per configuration, the fused operators' cut "
                       f"of the {_REG.baseline()} time (%) and their rank skew (slowest / "
                       f"fastest)"),
                  _grid(rows), ""]
    for (case, system, m), pts in occupancy_groups(doc).items():
        names = [n for n in modes if any(n in _runs(p) for p in pts)]
        rows = [("occupancy", *(f"{n} us" for n in names))]
        for pt in pts:
            runs = _runs(pt)
            rows.append((f"{pt['params']['occupancy']:g}",
                         *(f"{runs[n]['modelled_time_s'] * 1e6:.1f}" if n in runs else "-"
                           for n in names)))
        parts += [fill(f"{case} on {system}, m = {m}: time against occupancy (fraction of "
                       f"the most persistent WGs the fused kernel can have)"), _grid(rows), ""]
    return "\n".join(parts).rstrip()


def figures(doc: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.app.report import _save, _wrap

    colors = {n: c.color for n, c in _REG.configurations.items()}
    modes, fused = shown(doc), designs_modes(doc)
    written = []
    groups = comparison_groups(doc)
    if groups:  # 1. time per configuration, normalised to the baseline; cut in percent
        keys = list(groups)
        cols = min(3, len(keys))
        rows = -(-len(keys) // cols)
        # constrained layout: the suptitle and the legend get their own room (with
        # tight_layout the suptitle ran over the first row's titles)
        fig, axes = plt.subplots(rows, cols, figsize=(5.0 * cols, 3.6 * rows), squeeze=False,
                                 layout="constrained")
        for idx, key in enumerate(keys):
            ax = axes[idx // cols][idx % cols]
            pts = groups[key]
            width = 0.8 / len(modes)
            for j, m in enumerate(modes):
                for x, pt in enumerate(pts):
                    runs = _runs(pt)
                    if m not in runs:
                        continue
                    y = runs[m]["modelled_time_s"] / runs[_REG.baseline()]["modelled_time_s"]
                    xs = x + (j - (len(modes) - 1) / 2) * width
                    ax.bar(xs, y, width * 0.95, color=colors.get(m),
                           label=m if x == 0 else None)
                    if m == fused[0]:
                        ax.annotate(f"{-reduction(pt, m):+.0f}%", (xs, y), fontsize=6,
                                    ha="center", xytext=(0, 2), textcoords="offset points")
            ax.set_xticks(range(len(pts)))
            ax.set_xticklabels([str(p["m"]) for p in pts], fontsize=7)
            ax.set_title(f"{key[0]} · {key[1]}", fontsize=9)
            ax.set_ylabel(f"time / {_REG.baseline()}", fontsize=8)
            ax.grid(axis="y", alpha=0.3)
            if idx == 0:
                handles, labels = ax.get_legend_handles_labels()
        for idx in range(len(keys), rows * cols):
            axes[idx // cols][idx % cols].axis("off")
        fig.legend(handles, labels, fontsize=8, loc="outside lower center", ncol=len(labels))
        fig.suptitle(_wrap(f"{doc['scenario']}: modelled time of each configuration over "
                           f"{_REG.baseline()} per point (x axis: M; label: {fused[0]}'s "
                           f"change of time)", fig.get_figwidth()), fontsize=10)
        written.append(_save(plt, fig, out / "fused_time.png", tight=False))
    orders = [m for m in fused if any(m in _runs(p) and _runs(p)[m].get("rank_skew")
                                      for pts in groups.values() for p in pts)]
    skewed = [(key, p) for key, pts in groups.items() for p in pts
              if sum(m in _runs(p) for m in orders) > 1 and p["tp"] > 1]
    if skewed:  # 2. skew per rank, both task orders
        fig, ax = plt.subplots(figsize=(min(16.0, 1.2 * len(skewed) + 3), 3.8))
        width = 0.8 / len(orders)
        labels = []
        for x, (key, pt) in enumerate(skewed):
            labels.append(f"{key[1]}\nm={pt['m']}")
            for j, m in enumerate(orders):
                sk = _runs(pt)[m]["rank_skew"]
                w = width / len(sk)
                for r, v in enumerate(sk):
                    ax.bar(x + (j - (len(orders) - 1) / 2) * width + (r - (len(sk) - 1) / 2) * w,
                           (v - 1.0) * 100, w * 0.9, color=colors.get(m),
                           label=m if x == 0 and r == 0 else None)
        ax.set_xticks(range(len(skewed)))
        ax.set_xticklabels(labels, fontsize=7)
        ax.set_ylabel("rank's end over the fastest's (% later)", fontsize=8)
        ax.set_title(_wrap(f"{doc['scenario']}: skew per rank (one bar per rank) for each "
                           f"task order", fig.get_figwidth()), fontsize=10)
        ax.legend(fontsize=8)
        ax.grid(axis="y", alpha=0.3)
        written.append(_save(plt, fig, out / "fused_skew.png"))
    occ = occupancy_groups(doc)
    if occ:  # 3. time against occupancy
        fig, ax = plt.subplots(figsize=(6.0, 4.0))
        for key, pts in occ.items():
            for m in [n for n in modes if any(n in _runs(p) for p in pts)]:
                xs = [p["params"]["occupancy"] for p in pts if m in _runs(p)]
                ys = [_runs(p)[m]["modelled_time_s"] * 1e6 for p in pts if m in _runs(p)]
                ax.plot(xs, ys, marker="o", color=colors.get(m),
                        label=f"{m}: {key[0]} · {key[1]} m={key[2]}")
        ax.set_xlabel("occupancy (fraction of the most resident persistent WGs)")
        ax.set_ylabel("modelled time (us)")
        ax.set_title(f"{doc['scenario']}: time against occupancy", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        written.append(_save(plt, fig, out / "fused_occupancy.png"))
    return written
