"""The tables ``t3emu model`` prints from an estimate (``estimate.estimate``)."""

from __future__ import annotations

import textwrap


def _us(s: float) -> str:
    return f"{s * 1e6:10.1f}"


def _rows(doc: dict) -> tuple[list[dict], list[dict]]:
    """The rows of the per-item table (part, item, op, comm, each design's time and
    exposed communication) and of the totals (what, each design's), as printed."""
    designs = list(doc["designs"])
    base = doc["baseline"]
    dlrm = doc["setting"].get("kind") == "dlrm"
    items = []
    for i, r in enumerate(doc["designs"][base]["items"]):
        row = {"part": r["part"],
               "item": r["item"] + (f" x{r['repeat']}" if r.get("repeat", 1) > 1 else ""),
               "op": r["op"], "comm": (f"{r['baseline_comm_s'] / r['time_s'] * 100:.0f}%"
                                       if r.get("baseline_comm_s") else "")}
        for d in designs:
            row[d] = _us(doc["designs"][d]["items"][i]["time_s"]).strip()
            row[f"exposed {d}"] = _us(doc["designs"][d]["items"][i]["exposed_comm_s"]).strip()
        items.append(row)
    unit = "pass" if dlrm else "layer"
    totals = []
    for key, what in (("layer_forward_s", f"{unit} forward"), ("layer_backward_s",
                                                               f"{unit} backward"),
                      ("pipeline_s", estimated(doc)["passes"] + ("" if dlrm else
                                                                 " (pipeline)")),
                      ("dp_exposed_s", "data-parallel all-reduce, exposed"),
                      ("optimizer_s", "optimizer step"), ("iteration_s", "iteration"),
                      ("exposed_comm_s", "exposed communication" if dlrm else
                       "exposed TP communication")):
        totals.append({"": what, **{d: _us(doc["designs"][d][key]).strip() for d in designs}})
    for key, what in (("layer_speedup", f"{unit} speedup over " + base),
                      ("speedup", "iteration speedup over " + base)):
        totals.append({"": what, **{d: f"{doc['designs'][d][key]:.3f}x" for d in designs}})
    return items, totals


def text(doc: dict, limit: int | None = None) -> str:
    """The estimate's tables, fitted to ``limit`` columns (default: the terminal's)."""
    from emulator.app.tables import render, width

    st = doc["setting"]
    designs = list(doc["designs"])
    base = doc["baseline"]
    dlrm = st.get("kind") == "dlrm"
    if dlrm:
        title = (f"{st['model']} on {st['system']}: a training iteration on its {st['dp']} "
                 f"GPUs (data-parallel MLPs, model-parallel tables), global batch "
                 f"{st['batch']}, {st['dtype']}"
                 + (f"; GEMMs alone run with --set {' '.join(st['alone_set'])}"
                    if st["alone_set"] else ""))
        what = "per pass item (x N: N in a row), modelled us"
    else:
        title = (f"{st['model']} on {st['system']}: {st['phase']}, TP {st['tp']} "
                 f"({'sequence parallel: AG + GEMM, GEMM + RS' if st['sp'] else 'all-reduce'}) "
                 f"x PP {st['pp']} x DP {st['dp']}"
                 + (f" (EP {st['ep']})" if st.get("ep", 1) > 1 else "")
                 + f", {st['microbatches']} micro-batch(es) of {st['tokens']} tokens "
                 f"(sequence {st['seq']} x batch {st['batch']}), {st['layers']} layers, "
                 f"{st['dtype']}"
                 + (f"; the TP group's operations run with --set "
                    f"{' '.join(st['tp_group_set'])}" if st["tp_group_set"] else ""))
        what = "per layer and per model item, modelled us"
    lines = [title, "", what + f" (comm: the share of {base}'s time in its collective; "
             "exposed communication: the time less the computation alone)"]
    items, totals = _rows(doc)
    right = {c: "right" for c in items[0]} if items else {}
    right.update(part="left", item="left", op="left")
    cols = ["part", "item", "op", "comm"] + designs + [f"exposed {d}" for d in designs]
    labels = {"op": "operation"}
    table = render(items, cols, labels=labels, align=right, wrap=["item"], limit=limit)
    if max(len(line) for line in table.splitlines()) > (limit or width()):
        # too wide for one table: the times, then the exposed communication
        table = (render(items, cols[:4 + len(designs)], labels=labels, align=right,
                        wrap=["item"], limit=limit) + "\n\nexposed communication, modelled us\n"
                 + render(items, cols[:3] + cols[4 + len(designs):],
                          labels={**labels, **{f"exposed {d}": d for d in designs}},
                          align=right, wrap=["item"], limit=limit))
    lines += [table, "", render(totals, [""] + designs, align={d: "right" for d in designs},
                                wrap=[""], limit=limit)]
    lines += ["", f"communication share of the {base} iteration (its collectives' phases): "
              f"{doc['comm_share'] * 100:.1f}%"]
    if dlrm:
        lines.append("composition: the passes' items one after another, then the MLPs' "
                     "data-parallel all-reduce's exposed part and SGD (docs/models.md)")
    else:
        lines.append(f"pipeline point-to-point per micro-batch and boundary: "
                     f"{doc['p2p_s'] * 1e6:.1f} us; composition: a layer's items one after "
                     "another, layers / PP per stage, 1F1B over the micro-batches, then the "
                     "data-parallel all-reduce's exposed part and the optimizer "
                     "(docs/models.md)")
    prose = {0, 2, len(lines) - 2, len(lines) - 1}  # the notes, wrapped to the width
    return "\n".join(textwrap.fill(line, limit or width(), break_long_words=False,
                                   break_on_hyphens=False) if i in prose else line
                     for i, line in enumerate(lines))


def estimated(doc: dict) -> dict[str, str]:
    """What an estimate measured, in words for its figure and table, from its setting and
    times: ``step`` (a training iteration, a prefill, a decode step), ``layer`` (one
    layer's passes: forward + backward only where the estimate has a backward) and
    ``passes`` (the pipeline's part of the step)."""
    st = doc["setting"]
    backward = any(d.get("layer_backward_s", 0.0) > 0.0 for d in doc["designs"].values())
    phase = st.get("phase", "training")
    step = {"training": "a training iteration", "prefill": "a prefill",
            "decode": "a decode step (one token per sequence)"}.get(phase, phase)
    if st.get("kind") == "dlrm":
        return {"step": step, "layer": "the forward and backward passes",
                "passes": "forward and backward passes"}
    passes = "forward and backward passes" if backward else "forward passes"
    return {"step": step, "passes": passes,
            "layer": "one layer (forward + backward)" if backward
            else f"one layer's forward ({phase})"}


def figure(doc: dict, path) -> str:
    """Where a layer's time goes per design (GEMMs alone, exposed TP communication, the
    other kernels; forward and backward) beside the iteration's parts (the pipeline's
    passes, the exposed data-parallel all-reduce, the optimizer), as stacked bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    designs = list(doc["designs"])
    dlrm = doc["setting"].get("kind") == "dlrm"
    words = estimated(doc)
    comm_label = "exposed communication" if dlrm else "exposed TP communication"
    alone_label = "GEMMs and the embedding alone" if dlrm else "GEMM alone"
    layer = {alone_label: [], comm_label: [], "other kernels": []}
    for d in designs:
        rows = [r for r in doc["designs"][d]["items"] if r["part"] != "head"]
        comm = sum(r["exposed_comm_s"] for r in rows)
        gemm = sum(r["time_s"] for r in rows if r["op"] != "kernel") - comm
        layer[alone_label].append(gemm * 1e6)
        layer[comm_label].append(comm * 1e6)
        layer["other kernels"].append(sum(r["time_s"] for r in rows
                                          if r["op"] == "kernel") * 1e6)
    it = {words["passes"]: [doc["designs"][d]["pipeline_s"] * 1e3
                                          for d in designs],
          "data-parallel all-reduce (exposed)": [doc["designs"][d]["dp_exposed_s"] * 1e3
                                                 for d in designs],
          "optimizer": [doc["designs"][d]["optimizer_s"] * 1e3 for d in designs]}
    it = {k: v for k, v in it.items() if any(v)}  # inference: no all-reduce, no optimizer
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, parts, unit, title in ((axes[0], layer, "us", words["layer"]),
                                   (axes[1], it, "ms", words["step"])):
        bottom = [0.0] * len(designs)
        for name, vals in parts.items():
            ax.bar(designs, vals, bottom=bottom, label=name)
            bottom = [b + v for b, v in zip(bottom, vals)]
        ax.set_ylabel(f"modelled {unit}")
        ax.set_title(title)
        ax.legend(fontsize=8)
    st = doc["setting"]
    par = (f"{st['dp']} GPUs" if dlrm else
           f"TP {st['tp']} x PP {st['pp']} x DP {st['dp']}")
    fig.suptitle(f"{st['model']} on {st['system']}, {st['phase']}, {par}; "
                 f"{doc['baseline']}'s communication share {doc['comm_share'] * 100:.1f}%",
                 fontsize=10)
    from emulator.app.files import save_atomic

    try:
        return save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=130, bbox_inches="tight"))
    finally:
        plt.close(fig)
