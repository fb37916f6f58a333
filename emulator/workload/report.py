"""The tables ``t3emu model`` prints from an estimate (``estimate.estimate``)."""

from __future__ import annotations


def _us(s: float) -> str:
    return f"{s * 1e6:10.1f}"


def text(doc: dict) -> str:
    st = doc["setting"]
    designs = list(doc["designs"])
    base = doc["baseline"]
    lines = [f"{st['model']} on {st['system']}: {st['phase']}, TP {st['tp']} "
             f"({'sequence parallel: AG + GEMM, GEMM + RS' if st['sp'] else 'all-reduce'}) "
             f"x PP {st['pp']} x DP {st['dp']}, {st['microbatches']} micro-batch(es) of "
             f"{st['tokens']} tokens (sequence {st['seq']} x batch {st['batch']}), "
             f"{st['layers']} layers, {st['dtype']}"
             + (f"; the TP group's operations run with --set {' '.join(st['tp_group_set'])}"
                if st["tp_group_set"] else ""),
             "",
             "per layer and per model item, modelled us (exposed communication: the time "
             "less the GEMM alone)"]
    head = f"{'part':9s} {'item':22s} {'operation':9s} " + " ".join(
        f"{d:>10s}" for d in designs) + "  exposed " + " ".join(f"{d:>10s}" for d in designs)
    lines += [head, "-" * len(head)]
    rows = doc["designs"][base]["items"]
    for i, r in enumerate(rows):
        times = " ".join(_us(doc["designs"][d]["items"][i]["time_s"]) for d in designs)
        exp = " ".join(_us(doc["designs"][d]["items"][i]["exposed_comm_s"]) for d in designs)
        lines.append(f"{r['part']:9s} {r['item']:22s} {r['op']:9s} {times}          {exp}")
    lines.append("")
    for key, what in (("layer_forward_s", "layer forward"), ("layer_backward_s",
                                                            "layer backward"),
                      ("pipeline_s", "forward and backward passes (pipeline)"),
                      ("dp_exposed_s", "data-parallel all-reduce, exposed"),
                      ("optimizer_s", "optimizer step"), ("iteration_s", "iteration"),
                      ("exposed_comm_s", "exposed TP communication")):
        vals = " ".join(_us(doc["designs"][d][key]) for d in designs)
        lines.append(f"{what:42s} {vals}")
    for key, what in (("layer_speedup", "layer speedup over " + base),
                      ("speedup", "iteration speedup over " + base)):
        lines.append(f"{what:42s} " + " ".join(f"{doc['designs'][d][key]:9.3f}x"
                                              for d in designs))
    lines += ["", f"communication share of the {base} iteration (its collectives' phases): "
              f"{doc['comm_share'] * 100:.1f}%",
              f"pipeline point-to-point per micro-batch and boundary: {doc['p2p_s'] * 1e6:.1f} us; "
              "composition: a layer's items one after another, layers / PP per stage, 1F1B "
              "over the micro-batches, then the data-parallel all-reduce's exposed part and "
              "the optimizer (docs/models.md)"]
    return "\n".join(lines)
