"""``t3emu probe compare``: every measured case beside the emulator's own model of a preset,
and the page ``docs/validation/hardware.md``.

Each prediction is the code ``t3emu run`` runs, not a formula of its own:

- ``gemm``: the GEMM kernel the library's heuristic picks and its predicted time
  (``emulator.model.gemm.choose``: what a run records as ``gemm_kernel``);
- ``hbm-copy-kernel`` / ``hbm-copy-engine``: the bytes read and written served by the
  preset's HBM (``emulator.model.dram.Dram`` at the sustained rate), plus one DMA command's
  set-up for the copy engine;
- ``l2-reread``: the bytes at the preset's L2 rate (the rate the GEMM model's K steps use);
- ``latency``: the preset's unloaded DRAM latency per dependent load;
- ``atomics``: the HBM bytes of the scatter (values, row ids, the writes), the writes at
  the preset's op-and-store cost for the atomic adds (``CostModel.update_cost_bytes``);
- ``loaded-latency``: the streaming copy kernel as the engine runs a CU kernel's local
  copy (``transfers.cu_send`` on a one-GPU ``RankClock``), then the queue a dependent load
  finds behind it while it streams (``Dram.queued``), added to the unloaded latency as a
  latency-bound kernel's stage adds it (``launch.py``: ``delay = queued / rate``). The
  model's CU copy offers its reads at once whatever its CTAs, so every intensity fills the
  queue: the measured intensities test that;
- ``gemv``: a one-rank timing-only run of ``gemv+ar`` (``emulator.api.run``), its GEMV
  phase; ``embedding-bag``: a one-rank run of the persistent ``fused`` kernel of
  ``emb+a2a`` with the probe's CTAs per SM as its occupancy (``occupancy`` = CTAs per SM /
  the preset's resident WGs per CU, at most 1: the note says where the preset caps it).

- ``interference`` of a GEMM beside a copy engine's copy of its own input (M x K): the
  one-rank ``ficco-cil`` run of ``a2a+gemm`` at the case's shape, FiCCO's shard-based
  contention runs: the GEMM and the copy each alone, then together (its
  ``cil-shard.kernel`` window is the GEMM's time together; the page also sets the
  modelled slowdowns of both sides beside the measured ones).

A GEMM beside a copy of other sizes, or beside a copy kernel on a given number of CTAs, is
two kernels on one GPU that no configuration of the emulator runs yet: the page lists those
measured, without a prediction, until the contention model is anchored on independent
measurements.
"""

from __future__ import annotations

import math
from pathlib import Path

from emulator.probe.cases import E  # bytes per element

NOT_PREDICTED = {  # (cases of a mechanism that no run of the emulator predicts)
    "interference": "a GEMM beside a copy that is not a copy engine's copy of its own input "
                    "is no run of the emulator yet (ficco-cil runs that one)",
}
ORDER = ("gemm", "hbm-copy-kernel", "hbm-copy-engine", "l2-reread", "latency",
         "loaded-latency", "interference", "atomics", "gemv", "embedding-bag")


def predicted(case: dict) -> bool:
    """Whether the model predicts ``case`` (``NOT_PREDICTED`` gives the reason if not)."""
    if case["mechanism"] != "interference":
        return case["mechanism"] not in NOT_PREDICTED
    return case["copy"] == "engine" and case["bytes"] == case["m"] * case["k"] * E[case["dtype"]]


def predict(case: dict, spec, preset: str) -> float | None:
    """The model's time of ``case`` on ``spec`` (None: no standalone prediction)."""
    return prediction(case, spec, preset).get("modelled_s")


def prediction(case: dict, spec, preset: str) -> dict:
    """``modelled_s`` (None: no standalone prediction) and, for a case run beside another,
    ``modelled_slowdown`` and ``modelled_copy_slowdown``."""
    if case["mechanism"] == "interference":
        return _interference(case, preset) if predicted(case) else {"modelled_s": None}
    return {"modelled_s": _predict(case, spec, preset)}


def _interference(case: dict, preset: str) -> dict:
    """A GEMM beside a copy engine's copy of its input: the one-rank ``ficco-cil`` run."""
    from collectives.ficco import CIL_RUNS
    from emulator import api

    kind, gemm, copy = CIL_RUNS[-1]  # shard-based: the whole input copied by one engine
    res = api.run("a2a+gemm", device=preset, ranks=1, m=case["m"], n=case["n"], k=case["k"],
                  dtype=case["dtype"], modes="ficco-cil", timing_only=True)
    ph = res.runs["ficco-cil"].phases
    together = ph[f"cil-{kind}.kernel"]
    return {"modelled_s": together, "modelled_slowdown": together / ph[gemm],
            "modelled_copy_slowdown": ph[f"cil-{kind}.executors"] / ph[copy]}


def _predict(case: dict, spec, preset: str) -> float | None:
    from emulator.model.dram import Dram

    mech = case["mechanism"]

    def hbm(nbytes: float) -> float:
        return Dram("hbm", spec.hbm_bw, spec.dram).reserve(0.0, nbytes)[1]

    if mech == "gemm":
        from emulator.model.gemm import choose

        if spec.dtype_refusal(case["dtype"]):
            return None
        return choose(spec, case["m"], case["n"], case["k"], 1, case["dtype"]).predicted_s or None
    if mech == "hbm-copy-kernel":
        return hbm(2.0 * case["bytes"])
    if mech == "hbm-copy-engine":
        return spec.dma_setup_s + hbm(2.0 * case["bytes"])
    if mech == "l2-reread":
        if case["bytes"] > spec.l2_bytes:
            return hbm(case["bytes"] * case["rereads"])
        return case["bytes"] * case["rereads"] / spec.l2_bw
    if mech == "latency":
        return case["hops"] * spec.mem_latency_s if spec.mem_latency_s else None
    if mech == "loaded-latency":
        return _loaded_latency(case, spec)
    if mech == "atomics":
        from emulator.model.cost import CostModel

        if case["how"] == "atomic-add" and case["dtype"] not in spec.atomic_dtypes:
            raise ValueError(f"{preset} has no native {case['dtype']} atomics "
                             f"(atomic_dtypes {list(spec.atomic_dtypes)})")
        e = E[case["dtype"]]
        n = case["elems"]
        writes = CostModel(spec, "fp32").update_cost_bytes(
            n * e, "update" if case["how"] == "atomic-add" else "store")
        return hbm(n * e + n * 8 + writes)  # values, int64 row ids, the writes
    if mech in ("gemv", "embedding-bag"):
        from emulator import api

        if mech == "gemv":
            res = api.run("gemv+ar", device=preset, ranks=1, m=case["m"], k=case["k"],
                          dtype=case["dtype"], modes="sequential", timing_only=True)
            return res.runs["sequential"].phases["gemm"]
        res = api.run("emb+a2a", device=preset, ranks=1, m=case["batch"], n=case["dim"],
                      k=case["pooling"], dtype="fp32", modes="fused", timing_only=True,
                      params={"tables": 1, "fixed_lookups": 1,
                              "occupancy": occupancy(case, spec)})
        return sum(res.runs["fused"].phases.values())
    return None


def model_note(case: dict, spec) -> str:
    """What the model assumes of a case that its measurement may contradict."""
    if case["mechanism"] == "embedding-bag":
        most = spec.max_wgs_per_cu or spec.wgs_per_cu
        if case["ctas_per_sm"] > most:
            return (f"the preset holds at most {most} WGs per SM: modelled at "
                    f"{most} (occupancy 1)")
    if case["mechanism"] == "loaded-latency":
        return "the model's copy kernel fills the DRAM queue at every intensity"
    return ""


def occupancy(case: dict, spec) -> float:
    """The fused kernel's occupancy for an embedding-bag case's CTAs per SM: its share of
    the preset's resident WGs per CU (at most all of them)."""
    return min(1.0, case["ctas_per_sm"] / (spec.max_wgs_per_cu or spec.wgs_per_cu))


def _loaded_latency(case: dict, spec) -> float | None:
    """A pointer chase of ``hops`` dependent loads while a copy kernel streams
    ``stream_bytes`` on the same GPU (module docstring)."""
    from emulator.model import transfers
    from emulator.model.clock import RankClock
    from emulator.model.cost import CostModel
    from emulator.model.topology import Topology

    if not spec.mem_latency_s:
        return None
    clock = RankClock(0, spec.hbm_bw, Topology(spec.interconnect, 1), spec.dma_engines,
                      10.0, record=False, dram=spec.dram)
    # the probe repeats the copy for the whole chase, so the chase finds the queue as one
    # copy leaves it on average over its period; the DRAM model remembers its last 4096
    # bursts (``Dram._queued``), so one copy is at most 1024 of them (a period that keeps
    # the queue full but for its last queue's worth of bytes, as a longer one does)
    nbytes = min(float(case["stream_bytes"]), 1024 * clock.hbm.burst_bytes)
    end = transfers.cu_send(clock, CostModel(spec, "fp32"), clock.cu, 0.0, 0, 1, nbytes,
                            "store", "probe stream")[0]
    queued = clock.hbm.queued(0.0, end)
    return case["hops"] * (spec.mem_latency_s + queued / clock.hbm.rate)


def compare(doc: dict, preset: str) -> list[dict]:
    """A row per case: measured, modelled, the error (modelled / measured - 1)."""
    from devices.spec import load_device
    from emulator.app.pool import pooled

    spec = load_device(preset)
    rows = []
    with pooled():  # the cases' one-rank runs in one MPI job
        for c in doc["cases"]:
            rows.append(_row(c, spec, preset))
    return rows


def _row(c: dict, spec, preset: str) -> dict:
    """One case's row (``compare``)."""
    row = {"id": c["id"], "mechanism": c["mechanism"], "measured_s": c.get("median_s"),
           "spread": c.get("spread"), "note": c.get("skipped") or c.get("error") or ""}
    for k in ("slowdown", "copy_slowdown"):
        if k in c:
            row[k] = c[k]
    if row["measured_s"] is not None:
        if not predicted(c):
            row["note"] = NOT_PREDICTED[c["mechanism"]]
            row["modelled_s"] = None
        else:
            try:
                row.update(prediction(c, spec, preset))
            except Exception as exc:  # noqa: BLE001 - a case the preset cannot run
                row["modelled_s"], row["note"] = None, f"{type(exc).__name__}: {exc}"
        if row.get("modelled_s") and not row["note"]:
            row["note"] = model_note(c, spec)
        if row.get("modelled_s"):
            row["error"] = row["modelled_s"] / row["measured_s"] - 1.0
    return row


def by_mechanism(rows: list[dict]) -> dict[str, dict]:
    """Per mechanism: cases measured, predicted, and the geometric-mean error factor
    (exp of the mean |log(modelled / measured)|, so 1.10 is 10% off either way) with its
    signed geometric mean."""
    out = {}
    for mech in ORDER:
        rs = [r for r in rows if r["mechanism"] == mech]
        if not rs:
            continue
        logs = [math.log(r["modelled_s"] / r["measured_s"]) for r in rs if r.get("error") is not None]
        out[mech] = {"cases": len(rs), "measured": sum(r["measured_s"] is not None for r in rs),
                     "predicted": len(logs),
                     "error_factor": math.exp(sum(map(abs, logs)) / len(logs)) if logs else None,
                     "bias": math.exp(sum(logs) / len(logs)) if logs else None}
    return out


def differences(gpu: dict, preset: str) -> str:
    """What differs between the probed GPU and the preset standing in for it."""
    from devices.spec import load_device

    spec = load_device(preset)
    name = str(gpu.get("name", "?"))
    lines = []
    if gpu.get("sms") and gpu["sms"] != spec.cus:
        lines.append(f"SMs/CUs: {gpu['sms']} probed, {spec.cus} in {preset}")
    if gpu.get("l2_bytes") and abs(gpu["l2_bytes"] - spec.l2_bytes) > 1 << 20:
        lines.append(f"L2: {gpu['l2_bytes'] / 2**20:.0f} MB probed, "
                     f"{spec.l2_bytes / 2**20:.0f} MB in {preset}")
    if "H100" in name and preset == "h800":
        lines.append("an H100 SXM has the H800's SMs, HBM and L2; only NVLink differs (not "
                     "probed: one GPU)")
    if gpu.get("vendor") == "host":
        lines.append("the probe ran on the host CPU (numpy or PyTorch on the CPU): its times "
                     "describe the host, not a GPU; the comparison checks the plumbing only")
    return "; ".join(lines) or "none found in the probe's device properties"


def page(doc: dict, preset: str, rows: list[dict], source: str, figure: str | None) -> str:
    """The Markdown page."""
    gpu = doc.get("gpu", {})
    mech = by_mechanism(rows)
    out = [
        "# Hardware validation: the model against a real GPU",
        "",
        f"Generated by `t3emu probe compare {source} --device {preset}` from `t3emu probe`'s "
        f"measurements ({doc.get('created', '?')}, backend {doc.get('backend')}, "
        f"{doc.get('repeats')} repeats after {doc.get('warmup')} warm-up runs, medians). "
        "Every modelled time is the emulator's own code for the preset "
        "(`emulator/probe/compare.py` names which); error = modelled / measured - 1.",
        "",
        f"- GPU probed: **{gpu.get('name', '?')}** ({gpu.get('vendor', '?')}, "
        f"{gpu.get('sms', '?')} SMs/CUs; libraries "
        f"{', '.join(f'{k} {v}' for k, v in (gpu.get('libraries') or {}).items())}"
        + (f"; driver {gpu['driver']}" if gpu.get("driver") else "") + ")",
        f"- Preset standing in: `{preset}`; differences: {differences(gpu, preset)}",
        "- Calibration and validation are kept apart: `t3emu probe preset` sets parameters "
        "from the cases named in its output (the largest square GEMM, the largest copy, the "
        "largest L2 re-read, the pointer chase, the smallest copy-engine copy); the papers' "
        "shapes judge them.",
        "",
        "## Per mechanism",
        "",
        "| mechanism | cases | measured | predicted | geomean error factor | bias (modelled / measured) |",
        "|---|---|---|---|---|---|",
    ]
    for m, s in mech.items():
        ef = f"{s['error_factor']:.3f}" if s["error_factor"] else "-"
        bias = f"{s['bias']:.3f}" if s["bias"] else "-"
        out.append(f"| {m} | {s['cases']} | {s['measured']} | {s['predicted']} | {ef} | {bias} |")
    if figure:
        out += ["", f"![modelled against measured]({figure})"]
    out += ["", "## Every case", "",
            "| case | measured us | spread | modelled us | error | note |", "|---|---|---|---|---|---|"]
    for r in rows:
        meas = f"{r['measured_s'] * 1e6:.2f}" if r["measured_s"] else "-"
        spread = f"{r['spread']:.1%}" if r.get("spread") is not None else "-"
        mod = f"{r['modelled_s'] * 1e6:.2f}" if r.get("modelled_s") else "-"
        err = f"{r['error']:+.1%}" if r.get("error") is not None else "-"
        note = r["note"]
        if "slowdown" in r:
            note = (f"slowdown {r['slowdown']:.3f}" + (f", copy {r['copy_slowdown']:.3f}"
                                                       if "copy_slowdown" in r else "")
                    + (f" (modelled {r['modelled_slowdown']:.3f}, copy "
                       f"{r['modelled_copy_slowdown']:.3f})" if "modelled_slowdown" in r
                       else "")
                    + (f"; {note}" if note else ""))
        out.append(f"| `{r['id']}` | {meas} | {spread} | {mod} | {err} | {note} |")
    return "\n".join(out) + "\n"


def figure(rows: list[dict], path: Path, title: str) -> str | None:
    """Modelled against measured, log-log, one colour per mechanism."""
    pts = [r for r in rows if r.get("error") is not None]
    if not pts:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from emulator.app.files import save_atomic

    fig, ax = plt.subplots(figsize=(6.5, 6))
    for mech in ORDER:
        xs = [r["measured_s"] * 1e6 for r in pts if r["mechanism"] == mech]
        ys = [r["modelled_s"] * 1e6 for r in pts if r["mechanism"] == mech]
        if xs:
            ax.scatter(xs, ys, s=14, label=mech)
    lo = min(min(r["measured_s"], r["modelled_s"]) for r in pts) * 1e6 / 1.5
    hi = max(max(r["measured_s"], r["modelled_s"]) for r in pts) * 1e6 * 1.5
    ax.plot([lo, hi], [lo, hi], "k--", lw=0.8, label="modelled = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("measured (us)")
    ax.set_ylabel("modelled (us)")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out = save_atomic(path, lambda tmp: fig.savefig(tmp, dpi=110))
    plt.close(fig)
    return out
