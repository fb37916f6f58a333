"""The validation page (``t3emu validate``) from sweep-shaped results."""

from emulator.app.validation import page


def _point(model, sub, tp, speedups, u1):
    runs = []
    for mode, s in speedups.items():
        runs.append({"mode": mode, "speedup_vs_sequential": s, "modelled_time_s": 1.0 / s,
                     "phases": {"rs": 1.0 / s}, "arbitration":
                     {"first_stage_utilisation": u1, "occupancy_threshold": 10}})
    return {"model": model, "sublayer": sub, "tp": tp, "runs": runs}


def test_page_compares_published_geomeans_and_lists_mismatches():
    sp = {"sequential": 1.0, "t3": 1.2, "t3-mca": 1.3, "ideal-overlap": 1.35, "ideal-rs-nmc": 1.36}
    doc = {"points": [_point("T-NLG", "OP", 8, sp, 0.6), _point("T-NLG", "FC-2", 16, sp, 0.1)]}
    text = page(doc, None, ["t3emu sweep t3-paper --timing-only --out r"])
    assert "| t3-mca | 1.30x | 1.300x |" in text
    assert "T3 at about 1.20x: emulator 1.200x: matches" in text
    slow = {**sp, "t3": 1.0}
    text = page({"points": [_point("T-NLG", "OP", 8, slow, 0.6)]}, None, [])
    assert "T3 at about 1.20x: emulator 1.000x: **does not match**" in text
