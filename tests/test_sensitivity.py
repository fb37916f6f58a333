"""The sensitivity of a figure to an assumption (``emulator/app/validation/sensitivity.py``):
a toy figure whose verdict flips within an assumption's range is "decided by an
assumption"; one that stays in band is not; the range and the movers are the variants';
variants run together give what each gives alone."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from emulator.app.validation import sensitivity as sv
from emulator.app.validation.common import Claim, Direction, Measured, Published
from emulator.app.validation.sensitivity import Spread, Variant, merged, section, spreads


def _sweeps(speedup: float) -> dict:
    return {"toy": {"scenario": "toy", "points": [{"key": "p0", "x": speedup},
                                                  {"key": "p1", "x": 1.0}]}}


def _claim(text="1.30x", value=1.30, needs=("toy",)) -> Claim:
    return Claim("toy speedup", "Fig. 0", Published.value(value, "speedup", text), needs,
                 lambda s: Measured(s["toy"]["points"][0]["x"]))


def _variant(end: str, value: float, key="gpu.dma.setup_ns") -> Variant:
    return Variant("toy", "toy-gpu", key, end, value, 50, ("p0",), "a guess")


def _under(base: dict, v: Variant, x: float) -> tuple[Variant, dict]:
    return v, merged(base, v, {"points": [{"key": "p0", "x": x}]})


def test_a_verdict_flipping_within_the_range_is_decided_by_an_assumption():
    base = _sweeps(1.30)  # within 1.30x's band (1.225x to 1.375x)
    low, high = _variant("low", 10), _variant("high", 500)
    [sp] = spreads((_claim(),), base, [_under(base, low, 1.28), _under(base, high, 1.10)])
    assert sp.decided
    assert [(v.end, s) for v, s in sp.flips()] == [("high", "outside")]
    assert sp.range() == (1.10, 1.30)
    # moved by more than the band's half-width (0.075x): only the high end (0.20x)
    assert [(v.end, round(d, 6)) for v, d in sp.movers()] == [("high", 0.2)]
    text = "\n".join(section([sp], [low, high], [], [], "t3emu validate --sensitivity"))
    assert "**decided by an assumption**: gpu.dma.setup_ns=500 (toy-gpu) -> outside" in text
    assert "1 of 1 figures are decided by an assumption." in text


def test_a_figure_in_band_across_the_range_is_not_decided():
    base = _sweeps(1.30)
    vs = [_under(base, _variant("low", 10), 1.29), _under(base, _variant("high", 500), 1.33)]
    [sp] = spreads((_claim(),), base, vs)
    assert not sp.decided and sp.movers() == [] and sp.range() == (1.29, 1.33)


def test_a_finding_that_stops_holding_is_decided():
    claim = Claim("toy finding", "Sec. 0", None, ("toy",),
                  lambda s: Direction(s["toy"]["points"][0]["x"] > 1.0, "faster"))
    base = _sweeps(1.05)
    [sp] = spreads((claim,), base, [_under(base, _variant("high", 500), 0.98)])
    assert sp.decided and sp.flips()[0][1] == "does not hold"


def test_merged_keeps_the_points_a_variant_did_not_run():
    base = _sweeps(1.30)
    out = merged(base, _variant("low", 10), {"points": [{"key": "p0", "x": 9.0}]})
    assert [p["x"] for p in out["toy"]["points"]] == [9.0, 1.0]
    assert base["toy"]["points"][0]["x"] == 1.30  # the base is not changed


def test_a_variant_of_another_scenario_leaves_the_figure_unvaried():
    base = _sweeps(1.30)
    other = Variant("other", "g", "gpu.cus", "low", 1, 2, ("q",))
    [sp] = spreads((_claim(),), base, [(other, base)])
    assert not sp.varied and isinstance(sp, Spread)


def test_a_subset_says_on_how_many_points_a_figure_was_varied():
    from emulator.app.validation.sensitivity import points_read

    claim = Claim("toy mean", "Fig. 0", Published.value(1.2, "speedup", "1.20x"), ("toy",),
                  lambda s: Measured(sum(p["x"] for p in s["toy"]["points"]) / 2))
    base = _sweeps(1.30)
    assert points_read(claim, base) == {("toy", "p0"), ("toy", "p1")}
    subset = {"toy": (lambda pt: pt["key"] == "p0", "p0 only")}
    [sp] = spreads((claim,), base, [_under(base, _variant("high", 500), 1.50)], subset)
    assert sp.of == (1, 2) and sp.range() == (1.15, 1.25)
    text = "\n".join(section([sp], [_variant("high", 500)], [], [], "cmd", subset))
    assert "(varied on 1 of its 2 points)" in text and "Subset varied in `toy`: p0 only" in text


def test_a_rate_is_varied_only_on_points_of_its_dtype():
    from emulator.app.validation.sensitivity import reads_rate

    assert reads_rate("compute.fp16_flops_per_cycle_per_cu", "fp16")
    assert not reads_rate("compute.fp32_flops_per_cycle_per_cu", "fp16")
    assert reads_rate("compute.fp32_vector_flops_per_cycle_per_cu", "bf16")
    assert not reads_rate("compute.fp32_flops_per_cycle_per_cu", "bf16")
    assert reads_rate("dma.setup_ns", "fp16")


def test_variants_run_together_as_each_alone(tmp_path):
    """``run_all`` runs two variants' points as one sweep (each point with its variant's
    --set as its own override) and writes each variant what a sweep of its points with
    that --set writes: the same point records, times and bytes, keyed as the scenario's
    points; ``load`` then finds both complete."""
    from emulator.app import provenance
    from emulator.app.scenario import load_scenario
    from emulator.app.sweep import load_results, run_sweep

    tiny = str(Path(__file__).parent / "data" / "tiny.toml")
    sc = load_scenario(tiny)
    keys = tuple(p.key for p in sc.points[:2])
    vs = [sv.Variant(tiny, "t3-sim", "gpu.dma.engines", "high", 2, 1, keys),
          sv.Variant(tiny, "t3-sim", "gpu.compute.wgs_per_cu", "low", 1, 2, keys[:1])]
    base = {"provenance": {"model": provenance.model_hash()}}
    sv.run_all(vs, tmp_path, base)
    for v in vs:
        got = sv.load(v, tmp_path, base)
        assert got is not None and [p["key"] for p in got["points"]] == list(v.points)
        alone = tmp_path / "alone" / v.slug
        sub = dataclasses.replace(sc, points=tuple(p for p in sc.points if p.key in v.points))
        assert run_sweep(sub, alone, True, 120.0, (), (), False, ((v.key, v.value),)) == 0
        ref = load_results(alone)
        assert got["set"] == ref["set"] == [[v.key, v.value]]
        for a, b in zip(got["points"], ref["points"]):
            assert a["set"] == b["set"] == {v.key: v.value}
            assert a["device_spec"] == b["device_spec"]
            strip = lambda runs: [{k: x for k, x in r.items() if k != "wall_time_s"}  # noqa: E731
                                  for r in runs]
            assert strip(a["runs"]) == strip(b["runs"])
    # the two variants differ from each other: the --set reached each point's device
    one, two = (sv.load(v, tmp_path, base)["points"][0]["runs"] for v in vs)
    assert [r["modelled_time_s"] for r in one] != [r["modelled_time_s"] for r in two]
