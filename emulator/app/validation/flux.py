"""Flux's validation page: its published overlap efficiencies and speedups over
TransformerEngine per cluster (GPT-3 175B MLP at TP 8, m = 1024 to 8192, AG-GEMM and
GEMM-RS) and its findings (PCIe, small m, swizzle, pull vs push, tile size), beside the
emulator's from the ``flux-paper`` sweep; the two-node (TP 16) points as a table with what
decides them.

Overlap efficiency is computed here as Flux defines it, from the modelled times: ECT =
time - the non-split GEMM's time alone (the sequential run's ``gemm_alone_s``, the same
for every method), E = 1 - ECT / ECT of the non-overlapped baseline.
"""

from __future__ import annotations

from emulator.app.catalog import registry

from emulator.app.validation.common import (
    CauseGroup, Claim, Direction, Measured, NotComputed, Paper, Published, Sweeps,
    causes_section, mean, pooled_cause, runs, time_of, end_to_end)

PAPER = Paper(
    "flux", "Flux",
    "Li-Wen Chang, Wenlei Bao, Qi Hou, Chengquan Jiang, Ningxin Zheng, Yinmin Zhong, "
    "Xuanrun Zhang, Zuquan Song, Chengji Yao, Ziheng Jiang, Haibin Lin, Xin Jin, Xin Liu, "
    "\"FLUX: Fast Software-based Communication Overlap On GPUs Through Kernel Fusion\", "
    "arXiv:2406.06858, 2024.",
    ("flux-paper", "flux-models"), "sections 2, 5 and 6")
MODELS = "flux-models"  # the whole-model estimates (t3emu model --scenario)
SWEEP = "flux-paper"
BASE, TE, FLUX = "sequential", "te-best", "flux-best"
# Flux's clusters -> the scenario's systems (one node of 8; run/flux-paper.toml)
CLUSTERS = {"A100 PCIe": "a100-pcie-x8", "A100 NVLink": "a100-sxm-x8",
            "H800 NVLink": "h800-x8"}
TWO_NODE = {"A100 PCIe": "a100-pcie-2x8", "A100 NVLink": "a100-sxm-2x8",
            "H800 NVLink": "h800-2x8"}
M_TABLE = (1024, 2048, 4096, 8192)  # the m of Flux's operator table
# the points ``t3emu validate --sensitivity`` varies: each cluster's AG and RS at m = 2048,
# one m of the operator table (every point at both ends of every assumption its cluster's
# presets state would take hours on 2 cores); the other points keep their values as run
SENSITIVITY_SUBSET = {SWEEP: (lambda pt: pt["tp"] == 8 and (
    pt["m"] == 2048 or (pt["m"] == 8192 and pt["sublayer"] == "AG-GEMM"
                        and pt["system"] == "h800-x8")),
    "each cluster's AG and RS at m = 2048, and H800's AG at m = 8192, the AG point where "
    "push and pull are nearest (7 of the 42 points)")}
# Flux's operator results per cluster over M_TABLE and both operations (Flux's evaluation,
# its operator table): (Flux E, TE E, Flux over TE), each a (low, high) range
PUBLISHED = {
    "A100 PCIe": ((0.41, 0.57), (-1.25, 0.36), (1.20, 3.25)),
    "A100 NVLink": ((0.36, 0.96), (-0.99, 0.74), (1.01, 1.33)),
    "H800 NVLink": ((0.37, 0.93), (-0.40, 0.80), (1.10, 1.51)),
}
WHERE = "Flux evaluation, operator table per cluster (GPT-3 MLP, TP 8, m = 1024 to 8192)"
WHERE_FIND = "Flux evaluation"
SWIZZLE = (("flux-rs-w", "flux-rs-w-noswizzle"), ("flux-rs-a", "flux-rs-a-noswizzle"),
           ("flux-ag", "flux-ag-noswizzle"))
PUSH = ("flux-ag", "flux-ag-tile2", "flux-ag-tile4", "flux-ag-tile8")
PULL = ("flux-ag-pull", "flux-ag-pull-tile2", "flux-ag-pull-tile4", "flux-ag-pull-tile8")
TILES = {"m/N": ("flux-ag", "flux-ag-pull"), "m/2N": ("flux-ag-tile2", "flux-ag-pull-tile2"),
         "m/4N": ("flux-ag-tile4", "flux-ag-pull-tile4"),
         "m/8N": ("flux-ag-tile8", "flux-ag-pull-tile8")}


def cases(sw: Sweeps, system: str, ms: tuple[int, ...] = M_TABLE, tp: int = 8) -> list[dict]:
    return [p for p in sw[SWEEP]["points"] if p["system"] == system and p["tp"] == tp
            and p["m"] in ms]


def gemm_alone(pt: dict) -> float | None:
    return runs(pt).get(BASE, {}).get("gemm_alone_s")


def efficiency(pt: dict, mode: str) -> float | None:
    """Flux's E of ``mode`` at ``pt`` from the modelled times (module docstring)."""
    g, t, base = gemm_alone(pt), time_of(pt, mode), time_of(pt, BASE)
    if g is None or t is None or base is None or base <= g:
        return None
    return 1.0 - (t - g) / (base - g)


def over_te(pt: dict) -> float | None:
    t, te = time_of(pt, FLUX), time_of(pt, TE)
    return te / t if t and te else None


def _range(sw: Sweeps, cluster: str, f, kind: str) -> Measured | NotComputed:
    pts = cases(sw, CLUSTERS[cluster])
    vals = [(v, p) for p in pts if (v := f(p)) is not None]
    if not vals:
        return NotComputed(f"no {cluster} point with the runs it needs")
    lo, plo = min(vals, key=lambda x: x[0])
    hi, phi = max(vals, key=lambda x: x[0])
    unit = (lambda v: f"{v * 100:+.0f}%") if kind == "share" else (lambda v: f"{v:.2f}x")
    return Measured(lo, hi, f"{unit(lo)} ({plo['sublayer']} m={plo['m']}) to {unit(hi)} "
                            f"({phi['sublayer']} m={phi['m']})")


def _claims_for(cluster: str) -> list[Claim]:
    (fl, fh), (tl, th), (sl, sh) = PUBLISHED[cluster]
    pct = lambda a, b: f"{a * 100:.0f}% to {b * 100:.0f}%"  # noqa: E731
    return [
        Claim(f"{cluster}: Flux's overlap efficiency E", WHERE,
              Published(fl, fh, "share", pct(fl, fh)), (SWEEP,),
              lambda sw: _range(sw, cluster, lambda p: efficiency(p, FLUX), "share")),
        Claim(f"{cluster}: TransformerEngine's overlap efficiency E", WHERE,
              Published(tl, th, "share", pct(tl, th)), (SWEEP,),
              lambda sw: _range(sw, cluster, lambda p: efficiency(p, TE), "share")),
        Claim(f"{cluster}: Flux's speedup over TransformerEngine", WHERE,
              Published(sl, sh, "speedup", f"{sl:.2f}x to {sh:.2f}x"), (SWEEP,),
              lambda sw: _range(sw, cluster, over_te, "speedup")),
    ]


def collective_s(pt: dict) -> float:
    """The non-overlapped baseline's collective: its phases but the GEMM."""
    return sum(v for k, v in runs(pt)[BASE]["phases"].items() if k != "gemm")


def _pcie_beats_nccl(sw: Sweeps) -> Direction:
    pts = cases(sw, CLUSTERS["A100 PCIe"], M_TABLE[-2:])
    xs = [(time_of(p, FLUX) / collective_s(p), p) for p in pts]
    wins = [f"{p['sublayer']} m={p['m']} ({x:.2f})" for x, p in xs if x < 1]
    return Direction(bool(wins), "Flux's time / the library collective's alone at m = "
                     f"{M_TABLE[-2]}, {M_TABLE[-1]}: "
                     + ", ".join(f"{p['sublayer']} m={p['m']} {x:.2f}" for x, p in xs))


def _te_small_m(sw: Sweeps) -> Direction:
    vals = [(efficiency(p, TE), c, p) for c, s in CLUSTERS.items()
            for p in cases(sw, s, M_TABLE[:1])]
    neg = [v for v in vals if v[0] is not None and v[0] < 0]
    cause = pooled_cause([p for _, _, p in neg], TE, loss=True) if neg else None
    return Direction(2 * len(neg) > len(vals), f"TE's E at m = {M_TABLE[0]} below 0 on "
                     f"{len(neg)} of {len(vals)} cluster/operation pairs: "
                     + ", ".join(f"{c} {p['sublayer']} {e * 100:+.0f}%" for e, c, p in vals
                                 if e is not None)
                     + (f"; the loss carried by {cause}" if cause else ""), cause)


def _flux_near_gemm(sw: Sweeps) -> Direction:
    pts = [p for s in CLUSTERS.values() for p in cases(sw, s)]
    es = [efficiency(p, FLUX) for p in pts]
    ratio = [time_of(p, FLUX) / gemm_alone(p) for p in pts if gemm_alone(p)]
    return Direction(all(e is not None and e > 0 for e in es),
                     f"Flux's time / the GEMM's alone {min(ratio):.2f} to {max(ratio):.2f}; "
                     f"its ECT below the baseline's on {sum(e > 0 for e in es if e is not None)}"
                     f" of {len(es)} points")


def _pcie_lowest(sw: Sweeps) -> Direction:
    m = {c: mean([e for p in cases(sw, s) if (e := efficiency(p, FLUX)) is not None])
         for c, s in CLUSTERS.items()}
    lowest = min(m, key=m.get)
    return Direction(lowest == "A100 PCIe", "mean E: " + ", ".join(
        f"{c} {v * 100:.0f}%" for c, v in m.items()))


def _te_slower(sw: Sweeps) -> Direction:
    pts = [p for s in CLUSTERS.values() for p in cases(sw, s)]
    e = {id(p): efficiency(p, TE) for p in pts}
    neg = sum(v < 0 for v in e.values() if v is not None)
    by_op = {op: mean([e[id(p)] for p in pts if p["sublayer"] == op]) for op in
             sorted({p["sublayer"] for p in pts})}
    small = mean([e[id(p)] for p in pts if p["m"] == M_TABLE[0]])
    large = mean([e[id(p)] for p in pts if p["m"] == M_TABLE[-1]])
    rs = next((v for k, v in by_op.items() if "RS" in k), None)
    ag = next((v for k, v in by_op.items() if "AG" in k), None)
    holds = neg > 0 and small < large and rs is not None and ag is not None and rs < ag
    return Direction(holds, f"TE's E < 0 on {neg} of {len(pts)} points; mean E "
                     + ", ".join(f"{k} {v * 100:+.0f}%" for k, v in by_op.items())
                     + f"; at m = {M_TABLE[0]} {small * 100:+.0f}%, at m = {M_TABLE[-1]} "
                       f"{large * 100:+.0f}%")


def swizzle_gains(sw: Sweeps) -> list[tuple[str, int, float]]:
    """(operation, m, unswizzled time / swizzled time) of every Flux form with a swizzle
    switch, on every point of the one-node clusters."""
    out = []
    for s in CLUSTERS.values():
        for p in cases(sw, s, tuple(sorted({q["m"] for q in sw[SWEEP]["points"]}))):
            for on, off in SWIZZLE:
                a, b = time_of(p, on), time_of(p, off)
                if a and b:
                    out.append((p["sublayer"], p["m"], b / a))
    return out


def swizzle_causes(sw: Sweeps) -> tuple[int, float, dict[str, float]] | None:
    """The causes of the RS swizzle's gain, from runs with causes: (pairs, the summed gain
    (unswizzled - swizzled time, s), cause -> its summed part). Both runs' causes are
    splits of their cut of the same ``sequential``, so a cause's part of the swizzle's
    gain is its part of the swizzled run's cut less its part of the unswizzled one's."""
    n, gain, parts = 0, 0.0, {}
    for s in CLUSTERS.values():
        for p in cases(sw, s, tuple(sorted({q["m"] for q in sw[SWEEP]["points"]}))):
            for on, off in SWIZZLE:
                if "RS" not in p["sublayer"]:
                    continue
                a, b = (runs(p).get(on) or {}).get("causes"), \
                    (runs(p).get(off) or {}).get("causes")
                if not (a and b and a["baseline"] == b["baseline"]):
                    continue
                n += 1
                gain += a["gain_s"] - b["gain_s"]
                for k in dict.fromkeys([*a["parts_s"], *b["parts_s"]]):
                    parts[k] = parts.get(k, 0.0) + a["parts_s"].get(k, 0.0) \
                        - b["parts_s"].get(k, 0.0)
    return (n, gain, parts) if n else None


def _swizzle(sw: Sweeps) -> Direction | NotComputed:
    gains = swizzle_gains(sw)
    if not gains:
        return NotComputed("no point ran a configuration with and without the swizzle")
    hurts = sum(g < 1 - 1e-9 for *_, g in gains)
    helps = sum(g > 1 + 1e-9 for *_, g in gains)
    ms = sorted({m for _, m, _ in gains})
    lo = mean([g for _, m, g in gains if m == ms[0]])
    hi = mean([g for _, m, g in gains if m == ms[-1]])
    ops = sorted({op for op, *_ in gains})
    table = [g for _, m, g in gains if m >= M_TABLE[0]]  # "always": at the table's m
    return Direction(all(g > 1 + 1e-9 for g in table) and hi > lo,
                     f"unswizzled / swizzled time > 1 on {helps}, equal on "
                     f"{len(gains) - helps - hurts}, < 1 on {hurts} of {len(gains)} pairs; "
                     f"mean {lo:.3f} at m = {ms[0]}, {hi:.3f} at m = {ms[-1]}; at most "
                     + ", ".join(f"{op} {max(g for o, _, g in gains if o == op):.2f}"
                                 for op in ops)
                     + " (NVLink clusters: PCIe's ring forms have no swizzle switch)")


def _no_winner(sw: Sweeps) -> Direction | NotComputed:
    push_wins = pull_wins = 0
    tile_wins: dict[str, int] = {k: 0 for k in TILES}
    for s in CLUSTERS.values():
        for p in cases(sw, s, tuple(sorted({q["m"] for q in sw[SWEEP]["points"]}))):
            t = {m: time_of(p, m) for m in PUSH + PULL if time_of(p, m)}
            if len(t) < len(PUSH + PULL):
                continue
            if min(t[m] for m in PUSH) <= min(t[m] for m in PULL):
                push_wins += 1
            else:
                pull_wins += 1
            best = {k: min(t[m] for m in v) for k, v in TILES.items()}
            tile_wins[min(best, key=best.get)] += 1
    if not push_wins + pull_wins:
        return NotComputed("no point ran every push/pull and tile configuration")
    varied = sum(v > 0 for v in tile_wins.values()) > 1
    return Direction(push_wins > 0 and pull_wins > 0 and varied,
                     f"push fastest on {push_wins}, pull on {pull_wins} AG points; fastest "
                     f"communication tile: " + ", ".join(f"{k} on {v}"
                                                         for k, v in tile_wins.items()))


CLAIMS = [c for cluster in CLUSTERS for c in _claims_for(cluster)] + [
    Claim("On PCIe Flux's whole operator is sometimes faster than NCCL's collective alone "
          "at large m", "Flux evaluation, A100 PCIe", None, (SWEEP,), _pcie_beats_nccl),
    # the paper's cause: chunk GEMMs underuse the SMs and pay launches
    Claim("TransformerEngine is worse than no overlap at small m",
          "Flux evaluation, operator table", None, (SWEEP,), _te_small_m,
          named=("gemm-efficiency", "launches")),
    Claim("Flux's time is close to the GEMM's alone plus a small exposed tail or head",
          WHERE_FIND, None, (SWEEP,), _flux_near_gemm),
    Claim("Overlap efficiency is lowest on PCIe, highest on fast NVLink", WHERE_FIND, None,
          (SWEEP,), _pcie_lowest),
    Claim("The medium-grained baseline can be slower than no overlap, especially at small "
          "m and for RS", WHERE_FIND, None, (SWEEP,), _te_slower),
    Claim("Swizzling always helps, more at large m", WHERE_FIND, None, (SWEEP,), _swizzle),
    Claim("Pull vs push and the communication tile size have no universal winner",
          WHERE_FIND, None, (SWEEP,), _no_winner),
]


# ---------------------------------------------------------------- details
def _cluster_table(sw: Sweeps) -> list[str]:
    lines = ["## Per cluster, operation and m", "",
             "E of each method from the modelled times (ECT over the sequential run's GEMM "
             "alone); Flux = flux-best (the fastest Flux configuration, as Flux tunes).", "",
             "| cluster | operation | m | GEMM alone us | sequential us | E flux | E TE | "
             "Flux over TE | flux-best chose |", "|---|---|---|---|---|---|---|---|---|"]
    for c, s in CLUSTERS.items():
        for p in sorted(cases(sw, s, tuple(sorted({q["m"] for q in sw[SWEEP]["points"]}))),
                        key=lambda p: (p["sublayer"], p["m"])):
            ef, et, o = efficiency(p, FLUX), efficiency(p, TE), over_te(p)
            chose = (runs(p).get(FLUX, {}).get("search") or {}).get("chosen", "-")
            lines.append(f"| {c} | {p['sublayer']} | {p['m']} | {gemm_alone(p) * 1e6:.0f} | "
                         f"{time_of(p, BASE) * 1e6:.0f} | "
                         + " | ".join("-" if v is None else f"{v * 100:+.0f}%" for v in (ef, et))
                         + f" | {'-' if o is None else f'{o:.2f}x'} | {chose} |")
    return lines + ["", f"The operator table's m are {', '.join(map(str, M_TABLE))}; the "
                    f"decode m (64, 512) are shown, not compared.", ""]


def flat_network_check(pt: dict) -> dict | None:
    """For a point on several nodes run by the direct algorithm: the library collective's
    time if every GPU sent its chunk to each GPU of the other nodes through its share of
    the NICs (a flat direct collective), and if each chunk crossed once per node."""
    ds = pt["device_spec"]
    ic = ds["interconnect"]
    nodes, g = ic.get("nodes", 1), ic.get("gpus_per_node", 0)
    if nodes < 2 or pt.get("algorithm") != "direct" or not ic.get("nics_per_node"):
        return None
    e = 2  # fp16 / bf16
    op = registry().operation(pt["collective"])  # the gathered or reduced array's bytes
    chunk = op.collective_bytes(pt["m"], pt["n"], pt["k"], e) / pt["tp"]
    share = ic["nic_bw"] * ic.get("library_fraction_network", 1.0) / (g / ic["nics_per_node"])
    flat = chunk * g * (nodes - 1) / share
    return {"flat_s": flat, "once_s": chunk * (nodes - 1) / share, "share": share,
            "modelled_s": collective_s(pt), "copies": g}


def _two_node(sw: Sweeps) -> list[str]:
    pts = [p for s in TWO_NODE.values() for p in sw[SWEEP]["points"] if p["system"] == s]
    if not pts:
        return []
    lines = ["## Two nodes (TP 16, m = 8192)", "",
             "Not in the operator table Flux publishes per cluster; shown with what decides "
             "it. Library collective: the sequential run's collective phase; flat: its time "
             "if each GPU sends its chunk to every GPU of the other node through its share "
             "of the node's NICs; once: if each chunk crossed the network once.", "",
             "| system | operation | collective us | flat us | once us | E flux | E TE | "
             "Flux over TE | flux-best chose |", "|---|---|---|---|---|---|---|---|---|"]
    for p in sorted(pts, key=lambda p: (p["sublayer"], p["system"])):
        chk = flat_network_check(p)
        ef, et, o = efficiency(p, FLUX), efficiency(p, TE), over_te(p)
        chose = (runs(p).get(FLUX, {}).get("search") or {}).get("chosen", "-")
        lines.append(f"| {p['system']} | {p['sublayer']} | {collective_s(p) * 1e6:.0f} | "
                     + (f"{chk['flat_s'] * 1e6:.0f} | {chk['once_s'] * 1e6:.0f}" if chk
                        else "- | -")
                     + " | " + " | ".join("-" if v is None else f"{v * 100:+.0f}%"
                                          for v in (ef, et))
                     + f" | {'-' if o is None else f'{o:.2f}x'} | {chose} |")
    return lines + [""]


def _notes(sw: Sweeps) -> list[str]:
    lines = ["## What decides it", "",
             "- Flux's forms (`collectives/flux_rs.py`, `flux_ag.py`): on NVSwitch the GEMM's "
             "epilogue stores (RS-W) or atomically adds (RS-A) each tile into its owner, "
             "tiles rotated by rank (the swizzle), and AG tiles are pushed or pulled by the "
             "copy engine with a signal per tile that gates the GEMM's WGs; on PCIe a ring "
             "RS kernel on 6 CUs runs beside the GEMM, and AG chunks are pushed along the "
             "ring (1D, or inter-socket first). `flux-best` times every form of the "
             "operation and algorithm and keeps the fastest, as Flux's tuner does.",
             "- TransformerEngine (`collectives/transformer_engine.py`, from TE's "
             "userbuffers code): `te-best` is the fastest of TE's forms of the operation: "
             "for AG + GEMM the ring exchange (N chunk GEMMs, each chunk sent on by the copy "
             "engine while it is computed) and its aggregate form (a pair swap, then N/2 "
             "GEMMs of two-chunk blocks); for GEMM + RS the pipeline (4 column splits on the "
             "SMs less 16, each split's RS on 16 SMs beside the next GEMM) and the P2P form "
             "(N chunk GEMMs, each partial sent to its owner beside the next, summed at the "
             "end). Chunk GEMMs of few rows run the GPU poorly (wave quantisation, B read "
             "again per chunk) and each pays a launch, the cause Flux gives for TE's E "
             "below 0. TE runs within one node: no TE figure at TP 16.",
             "- The baseline's collective is the library's (NCCL's tuning model, "
             "[library collectives](../library.md)); every executor moves data at its own "
             "share of the link's peak (`[executors]`: Flux's epilogue stores at "
             "`store_fraction`, its and TE's copy engines at `copy_fraction`, the library at "
             "`library_fraction` x its protocol's share)."]
    split = [(p["m"], r / gemm_alone(p)) for s in CLUSTERS.values() for p in
             (cases(sw, s, tuple(sorted({q["m"] for q in sw[SWEEP]["points"]})))
              if SWEEP in sw else [])
             if (r := runs(p).get(TE, {}).get("gemm_alone_s")) and gemm_alone(p)]
    if split:
        ms = sorted({m for m, _ in split})
        at = lambda m: [x for mm, x in split if mm == m]  # noqa: E731
        lines.append(
            f"- TE's chunk GEMMs alone (recorded by its runs of the chosen form) take "
            f"{min(at(M_TABLE[0])):.2f}x to {max(at(M_TABLE[0])):.2f}x the whole GEMM's time "
            f"at m = {M_TABLE[0]}, {min(at(ms[-1])):.2f}x to {max(at(ms[-1])):.2f}x at m = "
            f"{ms[-1]} and up to {max(at(ms[0])):.2f}x at m = {ms[0]}: this is where its E "
            f"turns negative.")
    gains = swizzle_gains(sw) if SWEEP in sw else []
    ag = [g for op, _, g in gains if "AG" in op]
    rs = [g for op, _, g in gains if "RS" in op]
    if ag and rs:
        lines.append(
            f"- The swizzle: AG-GEMM without it walks the chunks from 0 on every rank "
            f"(`flux_ag._order`), so its WGs wait for rows in an order the transfers do not "
            f"deliver them in (up to {max(ag):.2f}x slower here): the AG part of Flux's "
            f"swizzle (GEMM order = arrival order). GEMM-RS without it has every rank write "
            f"the same owner at once (`flux_rs.flux_order`): the owner's receiving port "
            f"takes those writers one after another in modelled time (`RankClock.receive`, "
            f"from the region's first arrival), which costs where their combined rate "
            f"exceeds the port's (the RS swizzle's gain here: up to {max(rs):.2f}x, most "
            f"where the GEMM outruns the port); the senders are not slowed by it (no "
            f"backpressure across ranks), and the model has no write-request conflicts in "
            f"the owner's memory controller, Flux's cause (no source gives their cost): the "
            f"RS gain is the port's queue, not Flux's reason.")
        split = swizzle_causes(sw)
        if split and split[1] > 0:
            n, gain, parts = split
            lines.append(
                f"- The causes of the RS swizzle's gain (its part of each cause: the swizzled "
                f"run's part of the cut of `sequential` less the unswizzled run's, summed "
                f"over {n} pairs, in % of their summed gain): "
                + ", ".join(f"{k} {v / gain * 100:+.0f}%" for k, v in parts.items()
                            if abs(v / gain) >= 0.005) + ".")
    two = [p for s in TWO_NODE.values() for p in sw[SWEEP]["points"] if p["system"] == s] \
        if SWEEP in sw else []
    checks = [(p, c) for p in two if (c := flat_network_check(p))]
    flat = [(p, c) for p, c in checks if abs(c["modelled_s"] / c["flat_s"] - 1) < 0.05]
    if flat:
        ex = flat[0][1]
        shares = ", ".join(dict.fromkeys(f"{c['share'] / 1e9:.2f} GB/s on {p['system']}"
                                         for p, c in flat))
        lines.append(
            f"- Not for the paper's reason: the TP 16 two-node gains of Flux on the NVLink "
            f"clusters come mostly from a weak library baseline. The sequential collective "
            f"is a flat direct one: every GPU sends its chunk to each of the {ex['copies']} "
            f"GPUs of the other node through its share of the NICs "
            f"({shares}, the library's fraction of the line rate), so {ex['copies']} copies "
            f"of every chunk "
            f"cross the network; its modelled time is within 5% of that arithmetic on "
            f"{len(flat)} of {len(checks)} direct two-node points (table above). NCCL's "
            f"hierarchical algorithms cross once per node (the 'once' column), as Flux's "
            f"two-node forms do, which is where their gain comes from. TransformerEngine's "
            f"ring over 16 GPUs crosses the network twice per ring and is bounded by those "
            f"two hops.")
    return lines + [""]


def vllm_pairs(doc: dict) -> list[tuple[dict, dict]]:
    """(the inference estimate with sequence parallelism, the same step in vLLM's form: no
    SP, the row-parallel GEMMs' all-reduce) pairs of a ``flux-models`` document."""
    def key(e: dict) -> tuple:
        st = e["setting"]
        return st["model"], st["phase"], st["system"], st["tokens"], st["dtype"]

    ar = {key(e): e for e in doc["estimates"] if not e["setting"]["sp"]}
    return [(e, ar[key(e)]) for e in doc["estimates"]
            if e["setting"]["sp"] and e["setting"]["phase"] != "training" and key(e) in ar]


def _vllm(sw: Sweeps) -> list[str]:
    pairs = vllm_pairs(sw[MODELS]) if MODELS in sw else []
    if not pairs:
        return []
    lines = ["### Against vLLM's form", "",
             "Flux's inference comparison is against vLLM, which runs tensor parallelism "
             "without sequence parallelism: every row-parallel GEMM, then the library's "
             "all-reduce. Each inference step above runs again in that form (the baseline "
             "alone); times per step in ms, speedups over it.", "",
             "| model | phase | system | tokens | vLLM's form (AR) | baseline with SP | "
             "Flux | TE | Flux over vLLM's form |", "|---|---|---|---|---|---|---|---|---|"]
    for sp, ar in pairs:
        st, base = sp["setting"], ar["designs"][ar["baseline"]]["iteration_s"]
        it = {d: v["iteration_s"] for d, v in sp["designs"].items()}
        cell = lambda d: f"{it[d] * 1e3:.2f}" if d in it else "-"  # noqa: E731
        lines.append(f"| {st['model']} | {st['phase']} | {st['system']} | {st['tokens']} | "
                     f"{base * 1e3:.2f} | {cell(sp['baseline'])} | {cell('flux')} | "
                     f"{cell('te')} | "
                     + (f"{base / it['flux']:.3f}x |" if "flux" in it else "- |"))
    return lines + [""]


def details(sw: Sweeps) -> list[str]:
    lines: list[str] = []
    if SWEEP in sw:
        lines += _cluster_table(sw) + _two_node(sw)
        groups = [CauseGroup(f"{c} (TP 8, m = {M_TABLE[0]} to {M_TABLE[-1]}, both operations)",
                             cases(sw, s), [FLUX, TE]) for c, s in CLUSTERS.items()]
        groups += [CauseGroup(f"{c}, two nodes (TP 16, m = 8192, both operations)",
                              cases(sw, s, (8192,), 16), [FLUX, TE])
                   for c, s in TWO_NODE.items() if cases(sw, s, (8192,), 16)]
        lines += causes_section(groups, [SWEEP])
    return lines + end_to_end(sw, MODELS) + _vllm(sw) + _notes(sw)
