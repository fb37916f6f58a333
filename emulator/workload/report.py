"""The tables ``t3emu model`` prints from an estimate (``estimate.estimate``)."""

from __future__ import annotations


def _us(s: float) -> str:
    return f"{s * 1e6:10.1f}"


def text(doc: dict) -> str:
    st = doc["setting"]
    designs = list(doc["designs"])
    base = doc["baseline"]
    lines = [f"{st['model']} on {st['system']}: {st['phase']}, TP {st['tp']} "
             f"({'sequence parallel: AG + GEMM, GEMM + RS' if st['sp'] else 'all-reduce'}), "
             f"{st['tokens']} tokens per layer (sequence {st['seq']} x batch {st['batch']}), "
             f"{st['layers']} layers, {st['dtype']}",
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
                      ("other_s", "LM head, loss, optimizer"), ("iteration_s", "iteration"),
                      ("exposed_comm_s", "exposed communication")):
        vals = " ".join(_us(doc["designs"][d][key]) for d in designs)
        lines.append(f"{what:42s} {vals}")
    for key, what in (("layer_speedup", "layer speedup over " + base),
                      ("speedup", "iteration speedup over " + base)):
        lines.append(f"{what:42s} " + " ".join(f"{doc['designs'][d][key]:9.3f}x"
                                              for d in designs))
    lines += ["", f"communication share of the {base} iteration (its collectives' phases): "
              f"{doc['comm_share'] * 100:.1f}%",
              "composition: the layer's items one after another, x layers, plus the LM head, "
              "loss and optimizer (docs/models.md)"]
    return "\n".join(lines)
