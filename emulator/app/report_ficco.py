"""FiCCO's views of a sweep (Pal et al., FiCCO, arXiv:2512.10236), for sweeps whose points run its
configurations:

- per GEMM: the speedup over the serial baseline of shard-based overlap, each FiCCO
  schedule, FiCCO with CU-driven transfers, the heuristic's pick and the ideal;
- the heuristic against the oracle (the fastest of the four schedules, measured): per
  point its pick, the oracle's, the loss when they differ, and the agreement rate on
  the paper's GEMMs and on the synthetic set apart;
- DIL and CIL per point from the ``ficco-dil`` and ``ficco-cil`` runs: the GEMM split 8 and 64 ways by
  rows and by K (the decomposed launches' total isolated time over the whole GEMM's),
  the collective in W pieces per shard over whole, and the contention loss of the GEMM
  by rows and of the pieces when they run together, with DMA and with CU transfers, and
  shard-based overlap's (W launches of a shard's rows beside whole shards sent to one
  peer after another); figures of CIL against the GEMM's memory traffic MT and of DIL
  against its op-to-byte ratio.

Configurations are found through the registry (design "FiCCO", its baselines, bound and
measure); the schedule names come from ``collectives.ficco``.
"""

from __future__ import annotations

from pathlib import Path

from collectives import ficco
from emulator.app.catalog import registry
from emulator.app.tables import fill

_REG = registry()
SERIAL, DIL, CIL = "ficco-serial", "ficco-dil", "ficco-cil"
E = 2  # bytes per element (bf16/fp16: the ficco-paper scenario's dtype)


def otb(p: dict) -> float:
    """The sharded GEMM's op-to-byte ratio (FLOPs over the bytes of A, B and C)."""
    m, n, k = p["m"], p["n"], p["k"]
    return 2.0 * m * n * k / ((m * k + n * k + m * n) * E)


def traffic(p: dict) -> float:
    """The GEMM's static memory traffic MT = MK + NK + MN (elements)."""
    m, n, k = p["m"], p["n"], p["k"]
    return float(m * k + n * k + m * n)


def _runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def applies(doc: dict) -> bool:
    return any(SERIAL in _runs(pt) for pt in doc["points"])


def schedules() -> list[str]:
    return [f"ficco-{s}" for s in ficco.SCHEDULES]


def shown(doc: dict) -> list[str]:
    """Every FiCCO configuration the sweep ran but the serial baseline and the measure."""
    modes = {r["mode"] for pt in doc["points"] for r in pt["runs"]}
    return [n for n, c in _REG.configurations.items() if n in modes and n != SERIAL
            and c.design.startswith("FiCCO") and c.design != "FiCCO measure"]


def _t(pt: dict, mode: str) -> float | None:
    r = _runs(pt).get(mode)
    return r["modelled_time_s"] if r else None


def speedup(pt: dict, mode: str) -> float | None:
    base, t = _t(pt, SERIAL), _t(pt, mode)
    return base / t if base and t else None


def synthetic(pt: dict) -> bool:
    return "synthetic" in pt["sublayer"]


def pick(pt: dict) -> str | None:
    """The heuristic's schedule at the point's shape (``collectives.ficco.pick``)."""
    import numpy as np

    from collectives.common import Problem
    from devices.system import load_system

    if pt.get("system") is None:
        return None
    spec = load_system(pt["system"])
    dt = np.dtype(np.float16 if pt.get("dtype", "fp16") == "fp16" else np.float32)
    params = tuple((k, float(v)) for k, v in (pt.get("params") or {}).items())
    p = Problem(0, pt["tp"], pt["m"], pt["n"], pt["k"], spec, dt, params=params)
    return f"ficco-{ficco.pick(p)}"


def oracle(pt: dict) -> str | None:
    times = {m: _t(pt, m) for m in schedules() if _t(pt, m)}
    return min(times, key=times.get) if times else None


def heuristic(doc: dict) -> list[dict]:
    """Per point with all four schedules: the pick, the oracle, the loss (pick's time over
    the oracle's - 1)."""
    out = []
    for pt in doc["points"]:
        best = oracle(pt)
        if best is None or len([m for m in schedules() if _t(pt, m)]) < 4:
            continue
        chosen = pick(pt)
        loss = _t(pt, chosen) / _t(pt, best) - 1.0 if chosen in _runs(pt) else None
        out.append({"point": _label(pt), "set": "synthetic" if synthetic(pt) else "paper",
                    "pick": chosen, "oracle": best, "loss": loss})
    return out


def agreement(rows: list[dict], which: str) -> tuple[int, int]:
    sel = [r for r in rows if r["set"] == which]
    return sum(r["pick"] == r["oracle"] for r in sel), len(sel)


def losses(pt: dict) -> dict[str, float] | None:
    """DIL and CIL of a point from its ``ficco-dil`` and ``ficco-cil`` runs (Pal et al., FiCCO,
    arXiv:2512.10236)."""
    runs = _runs(pt)
    if DIL not in runs and CIL not in runs:
        return None
    ph = {**(runs.get(DIL) or {}).get("phases", {})}
    cil = (runs.get(CIL) or {}).get("phases", {})
    f = ficco
    out: dict[str, float] = {}
    whole = ph.get("gemm")
    for ways in f.SPLITS:
        for kind, n in (("rows", pt["m"]), ("k", pt["k"])):
            total = sum(c * ph.get(f"{kind}{ways}-{h}", 0.0)
                        for h, c in f._pieces(n, ways).items())
            if whole:
                out[f"DIL {kind} x{ways}"] = total / whole
    if ph.get("comm"):
        out["DIL comm x8"] = ph["comm8"] / ph["comm"]
    for ex, gemm, comm in f.CIL_RUNS:
        if cil.get(gemm) and f"cil-{ex}.kernel" in cil:
            out[f"CIL gemm {ex}"] = cil[f"cil-{ex}.kernel"] / cil[gemm]
        if cil.get(comm) and f"cil-{ex}.executors" in cil:
            out[f"CIL comm {ex}"] = cil[f"cil-{ex}.executors"] / cil[comm]
    return out


def _grid(rows: list[tuple]) -> str:
    from emulator.app.report import _grid as grid

    return grid(rows)


def _label(pt: dict) -> str:
    from emulator.app.report import set_text

    return pt["model"] + set_text(pt)


def text(doc: dict) -> str:
    modes = shown(doc)
    pts = [pt for pt in doc["points"] if SERIAL in _runs(pt)]
    rows = [("GEMM", "M", "N/GPU", "K", "serial ms", *modes, "oracle")]
    for pt in pts:
        best = oracle(pt)
        rows.append((_label(pt), str(pt["m"]), str(pt["n"]), str(pt["k"]),
                     f"{_t(pt, SERIAL) * 1e3:.2f}",
                     *(f"{speedup(pt, m):.2f}" if speedup(pt, m) else "-" for m in modes),
                     f"{speedup(pt, best):.2f}" if best else "-"))
    parts = ["Speedup over the serial baseline (library collective, then one GEMM)",
             _grid(rows), ""]
    h = heuristic(doc)
    if h:
        rows = [("GEMM", "set", "heuristic", "oracle", "loss %")]
        for r in h:
            rows.append((r["point"], r["set"], r["pick"].removeprefix("ficco-"),
                         r["oracle"].removeprefix("ficco-"),
                         "-" if r["pick"] == r["oracle"] or r["loss"] is None
                         else f"{100 * r['loss']:.1f}"))
        parts += ["The heuristic (ficco-auto) against the oracle (the fastest of the four "
                  "schedules, measured)", _grid(rows)]
        for which in ("paper", "synthetic"):
            a, n = agreement(h, which)
            if n:
                parts.append(f"agreement on the {which} set: {a} of {n} ({100 * a / n:.0f}%)")
        parts.append("")
    ls = [(pt, losses(pt)) for pt in pts]
    ls = [(pt, x) for pt, x in ls if x]
    if ls:
        keys = list(dict.fromkeys(k for _, x in ls for k in x))
        rows = [("GEMM", *keys)]
        for pt, x in ls:
            rows.append((_label(pt), *(f"{x[k]:.2f}" if k in x else "-" for k in keys)))
        parts += [fill("Decomposition (DIL) and contention (CIL) losses: decomposed over "
                       "whole, concurrent over alone (1.00 = no loss)"), _grid(rows)]
    return "\n".join(parts).rstrip()


def figures(doc: dict, out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    from emulator.app.report import _save, _wrap

    written = []
    pts = [pt for pt in doc["points"] if SERIAL in _runs(pt)]
    modes = shown(doc)
    sets = [s for s in ([pt for pt in pts if not synthetic(pt)],
                        [pt for pt in pts if synthetic(pt)]) if s]
    if sets and modes:
        fig, axes = plt.subplots(len(sets), 1, figsize=(16, 4.2 * len(sets)), squeeze=False)
        for ax, group in zip(axes[:, 0], sets):
            x = np.arange(len(group))
            w = 0.8 / len(modes)
            for i, m in enumerate(modes):
                ax.bar(x + i * w, [speedup(pt, m) or 0 for pt in group], w, label=m,
                       color=_REG.configuration(m).color)
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(x + 0.4 - w / 2, [_label(pt) for pt in group], fontsize=8)
            ax.set_ylabel("speedup over serial")
            ax.grid(axis="y", alpha=0.3)
        # beside the axes: inside, the legend hid the bars of the last GEMMs
        axes[0, 0].legend(fontsize=7, title="configuration", title_fontsize=8,
                          loc="upper left", bbox_to_anchor=(1.005, 1.0), borderaxespad=0.0)
        axes[0, 0].set_title("FiCCO: speedup over the serial baseline per GEMM" + (
            " (the paper's GEMMs above, the synthetic set below)" if len(sets) > 1 else ""))
        written.append(_save(plt, fig, out / "ficco_speedup.png"))
    ls = [(pt, losses(pt)) for pt in pts]
    ls = [(pt, x) for pt, x in ls if x]
    if ls:
        keys = list(dict.fromkeys(k for _, x in ls for k in x))
        fig, axes = plt.subplots(2, 1, figsize=(16, 7.5))
        for ax, kind in zip(axes, ("DIL", "CIL")):
            ks = [k for k in keys if k.startswith(kind)]
            x = np.arange(len(ls))
            w = 0.8 / max(1, len(ks))
            for i, k in enumerate(ks):
                ax.bar(x + i * w, [v.get(k, 0) for _, v in ls], w, label=k.removeprefix(kind))
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xticks(x + 0.4 - w / 2, [_label(pt) for pt, _ in ls], fontsize=7)
            ax.set_ylabel(f"{kind} (x, log)")
            ax.set_yscale("log")
            ax.legend(fontsize=7, ncol=4)
        axes[0].set_title("FiCCO's losses: decomposition (decomposed / whole, alone) and "
                          "contention (together / alone)")
        written.append(_save(plt, fig, out / "ficco_losses.png"))
        fig, axes = plt.subplots(1, 2, figsize=(14, 4.8))
        for ax, kind, x_of, xlabel in (
                (axes[0], "CIL", traffic, "GEMM memory traffic MT = MK + NK + MN (elements)"),
                (axes[1], "DIL", otb, "sharded GEMM's op-to-byte ratio (FLOP/B)")):
            for k in [k for k in keys if k.startswith(kind)]:
                xy = sorted((x_of(pt), v[k]) for pt, v in ls if k in v)
                ax.plot([a for a, _ in xy], [b for _, b in xy], "o-", ms=4, lw=0.8,
                        label=k.removeprefix(kind).strip())
            ax.axhline(1.0, color="black", lw=0.8)
            ax.set_xscale("log")
            ax.set_xlabel(xlabel)
            ax.set_ylabel(f"{kind} (x)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7, ncol=2)
        axes[0].set_title("contention loss (together / alone) against MT", fontsize=10)
        axes[1].set_title("decomposition loss (decomposed / whole) against op-to-byte",
                          fontsize=10)
        written.append(_save(plt, fig, out / "ficco_losses_vs_shape.png"))
    h = heuristic(doc)
    if h:
        fig, ax = plt.subplots(figsize=(max(8, 0.35 * len(h)), 3.8))
        x = np.arange(len(h))
        ax.bar(x, [100 * (r["loss"] or 0) if r["pick"] != r["oracle"] else 0 for r in h],
               color=["#2ca02c" if r["pick"] == r["oracle"] else "#d62728" for r in h])
        ax.set_xticks(x, [f"{r['point']}" for r in h], rotation=60, fontsize=7)
        ax.set_ylabel("loss of the pick vs the oracle (%)")
        title = "FiCCO heuristic vs oracle (green: same schedule)"
        for which in ("paper", "synthetic"):
            a, n = agreement(h, which)
            if n:
                title += f"; {which}: {a}/{n}"
        ax.set_title(_wrap(title, fig.get_figwidth(), 9), fontsize=9)
        written.append(_save(plt, fig, out / "ficco_heuristic.png"))
    return written
