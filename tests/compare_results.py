"""Compare two results files field by field (``t3emu sweep``'s results.json, matched point
by point by key, or two ``t3emu run --json`` documents), wall times, provenance and
timestamps excepted: the check that a change to the emulator's own speed left every
modelled number as it was (docs/performance.md, "Where a point's time goes").

    python -m tests.compare_results BEFORE.json AFTER.json

Prints each difference (the first 60) and a summary line; exit status 1 if any differ.
(A tool, not a test.)"""

from __future__ import annotations

import json
import math
import sys

SKIP = {"provenance", "scenario_file", "first_gemm_stage_unix", "peak_rss_mb_per_rank",
        "pss_mb_per_rank", "created_unix", "commit", "code"}  # what the host or tree sets


def differences(a, b, path: str = "") -> list[str]:
    """Where ``a`` and ``b`` (decoded JSON) differ, skipping ``SKIP`` and wall times."""
    out: list[str] = []
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k in SKIP or "wall" in k:
                continue
            if k not in a or k not in b:
                out.append(f"{path}.{k}: only in {'the second' if k not in a else 'the first'}")
            else:
                out += differences(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            out.append(f"{path}: length {len(a)} vs {len(b)}")
        for i, (x, y) in enumerate(zip(a, b)):
            out += differences(x, y, f"{path}[{i}]")
    elif not (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)):
        if a != b or type(a) is not type(b):
            out.append(f"{path}: {a!r} vs {b!r}")
    return out


def compare(first: dict, second: dict) -> tuple[list[str], int, int]:
    """(differences, points, runs) of two results documents."""
    if "points" not in first or "points" not in second:
        return differences(first, second), 1, len(first.get("runs", []))
    pa = {p["key"]: p for p in first["points"]}
    pb = {p["key"]: p for p in second["points"]}
    out = [f"point {k}: only in {'the first' if k in pa else 'the second'}"
           for k in sorted(set(pa) ^ set(pb))]
    for k in sorted(set(pa) & set(pb)):
        out += differences(pa[k], pb[k], k)
    runs = sum(len(p.get("runs", [])) for p in first["points"])
    return out, len(set(pa) & set(pb)), runs


if __name__ == "__main__":
    with open(sys.argv[1]) as f1, open(sys.argv[2]) as f2:
        diffs, points, runs = compare(json.load(f1), json.load(f2))
    for line in diffs[:60]:
        print(line)
    print(f"{points} points, {runs} runs, {len(diffs)} differences")
    sys.exit(1 if diffs else 0)
