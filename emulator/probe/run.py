"""``t3emu probe``: run every case on a backend and write one JSON file.

Each case is measured ``repeats`` times after ``warmup`` runs; the file keeps every time
and its median, minimum, maximum and relative spread ((max - min) / median). A case the
backend cannot run is kept with ``skipped`` (the reason), one that fails with ``error``:
the probe never stops at a case. The file is rewritten (atomically) after every case, so a
probe stopped by a time limit keeps what it measured; ``budget_s`` skips the cases left
when the budget is spent.
"""

from __future__ import annotations

import datetime
import platform
import statistics
import time
from pathlib import Path

PROBE_VERSION = 1


def _summary(times: list[float]) -> dict:
    med = statistics.median(times)
    return {"median_s": med, "min_s": min(times), "max_s": max(times),
            "spread": (max(times) - min(times)) / med if med > 0 else 0.0,
            "times_s": times}


def measured(case: dict, res: dict) -> dict:
    """The case's record from a backend's result: the summary of its times, and for a case
    run beside another (interference, loaded latency) each side alone and its slowdown."""
    out = {**case, **_summary(res["times_s"])}
    if "alone_s" in res:
        out["alone_median_s"] = statistics.median(res["alone_s"])
        out["slowdown"] = out["median_s"] / out["alone_median_s"]
    if "copy_alone_s" in res:
        out["copy_alone_median_s"] = statistics.median(res["copy_alone_s"])
        out["copy_together_median_s"] = statistics.median(res["copy_together_s"])
        out["copy_slowdown"] = out["copy_together_median_s"] / out["copy_alone_median_s"]
    return out


def probe(backend, cases: list[dict], out: Path | None, warmup: int = 3, repeats: int = 10,
          budget_s: float = 280.0, log=print) -> dict:
    from emulator.app.files import write_json_atomic
    from emulator.probe.backends import Skip

    try:
        from importlib.metadata import version

        t3emu = version("t3emu")
    except Exception:  # noqa: BLE001 - a checkout that is not installed
        t3emu = "unknown"
    doc = {"probe_version": PROBE_VERSION, "t3emu": t3emu,
           "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "host": {"python": platform.python_version(), "machine": platform.machine()},
           "backend": backend.name, "gpu": backend.info(), "warmup": warmup,
           "repeats": repeats, "budget_s": budget_s, "cases": []}
    t0 = time.monotonic()
    for i, case in enumerate(cases, 1):
        if time.monotonic() - t0 > budget_s:
            doc["cases"].append({**case, "skipped": f"the probe's time budget ({budget_s:g} s) "
                                                    f"was spent"})
            continue
        t = time.monotonic()
        try:
            rec = measured(case, backend.measure(case, warmup, repeats))
        except Skip as exc:
            rec = {**case, "skipped": str(exc)}
        except Exception as exc:  # noqa: BLE001 - recorded; the next case runs
            rec = {**case, "error": f"{type(exc).__name__}: {exc}"[:500]}
        rec["wall_s"] = time.monotonic() - t
        doc["cases"].append(rec)
        what = (f"{rec['median_s'] * 1e6:.1f} us (spread {rec['spread']:.1%})"
                if "median_s" in rec else rec.get("skipped") or rec.get("error"))
        log(f"[{i}/{len(cases)}] {case['id']}: {what}")
        if out is not None:
            write_json_atomic(out, doc, indent=1)
    doc["wall_s"] = time.monotonic() - t0
    if out is not None:
        write_json_atomic(out, doc, indent=1)
    return doc
