"""How much each published figure's emulated value rests on the model's assumptions.

Every ASSUMPTION parameter (``t3emu params --assumptions``: a preset's key or a model
code parameter, each with a plausible range) that a paper's runs read is set in turn to
the low and the high end of its range, one at a time, and each figure is computed again.
A variant runs only the points its parameter can change: the points of the GPU or system
whose preset states the assumption, or, for a model code parameter, the points whose runs
read it (recorded by each run: ``model_params_read``), and a matrix or vector rate only on
points of its dtype (``reads_rate``); every other point keeps its value exactly, so the
figure is computed on the whole of its points. Variants run timing-only
(the same modelled times as numeric runs), those of one scenario together as one sweep
(``run_all``), each into ``DIR/sensitivity/KEY=VALUE`` beside the sweep ``DIR``, and are
reused while they were made by the same code as the sweep.

Per figure the page shows the emulated value's range over the variants, the assumptions
that move it by more than its band's half-width (the tolerance of its band), and the
class "decided by an assumption" when its verdict (within or outside band; a finding
holding or not) changes within the ranges.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from emulator.app.validation.common import (Claim, Direction, Measured, NotComputed,
                                            Outcome, Sweeps, fmt, verdict)

ENDS = ("low", "high")
DIRNAME = "sensitivity"


@dataclass(frozen=True)
class Variant:
    """One assumption at one end of its range, on the points of one scenario it changes."""

    scenario: str
    scope: str  # the preset (GPU or system) stating it, or "model"
    key: str  # its --set key
    end: str  # "low" or "high"
    value: float
    base: object  # its value in the runs
    points: tuple[str, ...]
    reason: str = ""

    @property
    def label(self) -> str:
        return f"{self.key}={self.value:g}" + (f" ({self.scope})" if self.scope != "model"
                                               else "")

    @property
    def slug(self) -> str:
        return f"{self.scope}.{self.key}={self.value:g}".replace("/", "_")


def _assumption_rows(device: str | None, system: str | None) -> list:
    from emulator.app.params import assumptions

    return assumptions(device, system)


_RATE = re.compile(r"compute\.(fp16|bf16|fp32)_(vector_)?flops_per_cycle_per_cu$")


def reads_rate(key: str, dtype: str) -> bool:
    """Whether a run in ``dtype`` reads the matrix or vector rate ``key`` names: a run reads
    its own dtype's rates (``DeviceSpec.peak_flops``, ``vector_flops``), and a bf16 run
    the fp32 vector rate as well (its elementwise work is widened to fp32)."""
    m = _RATE.search(key)
    if m is None:
        return True
    return m.group(1) == dtype or (dtype == "bf16" and m.group(1) == "fp32"
                                   and bool(m.group(2)))


def plan(sweeps: Sweeps, scenarios: tuple[str, ...], only: tuple[str, ...] = (),
         subset: dict | None = None) -> list[Variant]:
    """The variants of a paper's sweeps: per scenario, per assumption its points read
    (``only``: these --set keys alone), its low and its high end; ``subset``: scenario ->
    (predicate of a point, why), the points a paper varies where all of them would take
    too long (the others keep their values)."""
    from emulator.app.scenario import load_scenario

    out: list[Variant] = []
    cache: dict = {}
    for s in scenarios:
        doc = sweeps.get(s)
        if not doc or "points" not in doc:
            continue  # whole-model estimates: not varied (the page says so)
        spec_points = {p.key: p for p in load_scenario(s).points}
        found: dict[tuple[str, str], tuple] = {}
        keep = (subset or {}).get(s, (lambda pt: True, ""))[0]
        for pt in doc["points"]:
            p = spec_points.get(pt["key"])
            if p is None or not keep(pt):
                continue
            target = (p.system or None, None if p.system else p.device)
            if target not in cache:
                cache[target] = _assumption_rows(target[1], target[0])
            own = {k for k, _ in p.overrides}
            for r in cache[target]:
                if (only and r.set_key not in only) or r.set_key in own \
                        or not reads_rate(r.key, doc.get("dtype", "fp16")):
                    continue
                if r.scope == "model":
                    read = pt.get("model_params_read")
                    if read is not None and r.key not in read:
                        continue
                entry = found.setdefault((r.scope, r.set_key), (r, []))
                entry[1].append(pt["key"])
        for (scope, key), (r, pts) in found.items():
            for end, v in zip(ENDS, (r.source.low, r.source.high)):
                value = int(v) if isinstance(r.value, int) and not isinstance(r.value, bool) \
                    else float(v)
                if value == r.value:
                    continue  # the range's end is the value itself: nothing to vary
                out.append(Variant(s, scope, key, end, value, r.value, tuple(pts),
                                   r.source.ref))
    return out


def _made_by(doc: dict) -> str | None:
    """The hash of the code that made a sweep's numbers (``provenance.model_hash``; an
    older sweep's: its whole code's)."""
    prov = (doc or {}).get("provenance") or {}
    return prov.get("model") or prov.get("code")


def variant_dir(base_dir: Path, v: Variant) -> Path:
    return Path(base_dir) / DIRNAME / v.slug


def load(v: Variant, base_dir: Path, base_doc: dict) -> dict | None:
    """A variant's results when they are complete and made by the sweep's code, else None."""
    from emulator.app.scenario import ScenarioError
    from emulator.app.sweep import load_results

    try:
        doc = load_results(variant_dir(base_dir, v))
    except (ScenarioError, OSError, ValueError):
        return None
    if doc is None or _made_by(doc) != _made_by(base_doc):
        return None
    if {p["key"] for p in doc.get("points", [])} != set(v.points):
        return None
    return doc


BATCH = "batch"  # the directory under DIR/sensitivity where missing variants run together


def run_all(variants: list[Variant], base_dir: Path, base_doc: dict,
            watchdog_s: float = 120.0) -> None:
    """Run the missing points of several variants of one scenario as one sweep (one pooled
    job per job size for all of them, not one per variant: a variant is then the cost of
    its points' runs alone), each point with its variant's --set as its own override, then
    write each variant's results as a sweep of its points with that --set writes them (the
    same point records, keyed as the scenario's points, under its header). A point that failed
    leaves its variant incomplete (``load`` then says it is not there)."""
    from emulator.app.scenario import load_scenario
    from emulator.app.sweep import _header, load_results, run_sweep, save

    sc = load_scenario(variants[0].scenario)
    pts = {p.key: p for p in sc.points}
    batch, origin = [], {}
    for v in variants:
        for k in v.points:
            q = dataclasses.replace(pts[k], overrides=tuple(pts[k].overrides)
                                    + ((v.key, v.value),))
            batch.append(q)
            origin[q.key] = (v, k)
    out = Path(base_dir) / DIRNAME / BATCH
    try:
        have = load_results(out)
    except Exception:  # noqa: BLE001 - damaged: made again below
        have = {}
    if have and _made_by(have) != _made_by(base_doc):
        shutil.rmtree(out)  # made by other code: this directory is the batch's own
    run_sweep(dataclasses.replace(sc, points=tuple(batch)), out, True, watchdog_s, (), (),
              False, (), mixed=True)
    got = {p["key"]: p for p in (load_results(out) or {}).get("points", [])}
    for v in variants:
        sub = dataclasses.replace(sc, points=tuple(pts[k] for k in v.points))
        header = _header(sub, True, (), (), False, ((v.key, v.value),))
        done = [{**got[q], "key": k} for q, (w, k) in origin.items() if w == v and q in got]
        d = variant_dir(base_dir, v)
        d.mkdir(parents=True, exist_ok=True)
        save(d, header, done)


def merged(sweeps: Sweeps, v: Variant, doc: dict) -> Sweeps:
    """The paper's sweeps with the variant's points in place of the same points."""
    new = {p["key"]: p for p in doc.get("points", [])}
    base = sweeps[v.scenario]
    out = dict(sweeps)
    out[v.scenario] = {**base, "points": [new.get(p["key"], p) for p in base["points"]]}
    return out


# ---------------------------------------------------------------- one figure's spread
def _status(claim: Claim, out: Outcome) -> str | None:
    if isinstance(out, Measured) and claim.published is not None:
        return "within" if verdict(claim.published, out.lo, out.hi) == "within band" \
            else "outside"
    if isinstance(out, Direction):
        return "holds" if out.holds else "does not hold"
    return None


def _ends(out: Outcome) -> tuple[float, float] | None:
    if isinstance(out, Measured):
        return out.lo, (out.lo if out.hi is None else out.hi)
    return None


def _compute(claim: Claim, sweeps: Sweeps) -> Outcome:
    try:
        return claim.compute(sweeps)
    except (TypeError, KeyError, ZeroDivisionError, ValueError, StopIteration) as exc:
        return NotComputed(f"{type(exc).__name__}")


class _Seen(dict):
    """A point that records being read (``points_read``) in ``log`` as (scenario, key)."""

    log: set
    scenario: str

    def __getitem__(self, k):
        self.log.add((self.scenario, dict.get(self, "key")))
        return dict.__getitem__(self, k)

    def get(self, k, default=None):
        self.log.add((self.scenario, dict.get(self, "key")))
        return dict.get(self, k, default)


def points_read(claim: Claim, sweeps: Sweeps) -> set[tuple[str, str]]:
    """(scenario, point key) of every point ``claim``'s figure reads a field of."""
    log: set = set()
    tracked = {}
    for name, doc in sweeps.items():
        if "points" not in doc:
            tracked[name] = doc
            continue
        pts = []
        for pt in doc["points"]:
            x = _Seen(pt)
            x.log, x.scenario = log, name
            pts.append(x)
        tracked[name] = {**doc, "points": pts}
    _compute(claim, tracked)
    return log


@dataclass
class Spread:
    """A figure's emulated value under the variants that touch its sweeps; ``of``: (points
    varied, points it reads) where a subset was varied."""

    claim: Claim
    base: Outcome
    under: list[tuple[Variant, Outcome]] = field(default_factory=list)
    of: tuple[int, int] | None = None

    @property
    def varied(self) -> bool:
        return bool(self.under)

    def range(self) -> tuple[float, float] | None:
        ends = [e for e in [_ends(self.base), *(_ends(o) for _, o in self.under)] if e]
        if not ends or _ends(self.base) is None:
            return None
        return min(e[0] for e in ends), max(e[1] for e in ends)

    def half_band(self) -> float | None:
        pub = self.claim.published
        if pub is None:
            return None
        lo, hi = pub.edges(pub.lo)
        return (hi - lo) / 2

    def movers(self) -> list[tuple[Variant, float]]:
        """(variant, how far it moves the value) for the variants moving it by more than
        its band's half-width (a range figure: the end that moves most)."""
        base, half = _ends(self.base), self.half_band()
        if base is None or half is None:
            return []
        out = []
        for v, o in self.under:
            e = _ends(o)
            if e is None:
                continue
            shift = max(abs(e[0] - base[0]), abs(e[1] - base[1]))
            if shift > half + 1e-12:
                out.append((v, shift))
        return sorted(out, key=lambda x: -x[1])

    def flips(self) -> list[tuple[Variant, str]]:
        """(variant, the verdict under it) where it differs from the verdict as run."""
        base = _status(self.claim, self.base)
        if base is None:
            return []
        return [(v, s) for v, o in self.under
                if (s := _status(self.claim, o)) is not None and s != base]

    @property
    def decided(self) -> bool:
        """The verdict changes within the assumptions' ranges."""
        return bool(self.flips())


def _point(sweeps: Sweeps, scenario: str, key: str) -> dict:
    return next(p for p in sweeps[scenario]["points"] if p["key"] == key)


def spreads(claims: tuple[Claim, ...], sweeps: Sweeps,
            variants: list[tuple[Variant, Sweeps]], subset: dict | None = None
            ) -> list[Spread]:
    """Each claim's spread: computed on ``sweeps`` and on each variant's merged sweeps that
    touch a scenario it needs (``subset``: as ``plan``'s; a figure reading points outside
    it says how many of its points were varied)."""
    out = []
    for c in claims:
        if any(s not in sweeps for s in c.needs):
            out.append(Spread(c, NotComputed("sweep not given")))
            continue
        sp = Spread(c, _compute(c, sweeps))
        for v, merged_sweeps in variants:
            if v.scenario in c.needs:
                sp.under.append((v, _compute(c, merged_sweeps)))
        if subset:
            read = points_read(c, sweeps)
            varied = {(s, k) for s, k in read
                      if subset.get(s, (lambda pt: True,))[0](_point(sweeps, s, k))}
            if varied != read:
                sp.of = (len(varied), len(read))
        out.append(sp)
    return out


# ---------------------------------------------------------------- the page's section
def _shift_text(claim: Claim, d: float) -> str:
    """How far a variant moves a figure: x for a speedup, points for a share, else the
    ratio's difference."""
    kind = claim.published.kind if claim.published else "ratio"
    return {"speedup": f"{d:.2f}x", "share": f"{d * 100:.0f} points"}.get(kind, f"{d:.3f}")


def _value_text(claim: Claim, x: float) -> str:
    return fmt(x, claim.published.kind) if claim.published else f"{x:.3f}"


def section(spreads_: list[Spread], variants: list[Variant], failed: list[str],
            estimates: list[str], command: str, subset: dict | None = None,
            unvaried: list[str] | None = None) -> list[str]:
    """Markdown: the sensitivity of each figure and the variants that were run."""
    lines = ["## Sensitivity to the assumptions", "",
             "Each figure computed again with each ASSUMPTION parameter its runs read "
             "(`t3emu params --assumptions`) set to the low and then the high end of its "
             "range, one at a time; a variant runs only the points its parameter changes "
             "(the others keep their values exactly). \"Moved beyond band\": the "
             "assumptions that move the value by more than its band's half-width; "
             "\"decided by an assumption\": the verdict changes within the ranges. Made by:",
             "", f"    {command}", ""]
    for s, (_, why) in (subset or {}).items():
        lines += [f"Subset varied in `{s}`: {why}; the other points keep their values as "
                  f"run (a figure reading them says on how many of its points it was "
                  f"varied).", ""]
    if not variants:
        return lines + ["Not computed: run the command above (`--sensitivity`)"
                        + (f"; the assumptions its points read: {', '.join(unvaried)}"
                           if unvaried else "") + ".", ""]
    lines += ["| # | emulator (as run) | range over the assumptions | moved beyond band | "
              "verdict class |", "|---|---|---|---|---|"]
    for i, sp in enumerate(spreads_, 1):
        if isinstance(sp.base, NotComputed) or not sp.varied:
            why = "no assumption varied on its points" if not isinstance(
                sp.base, NotComputed) else "not computed"
            lines.append(f"| {i} | - | - | - | {why} |")
            continue
        r = sp.range()
        base = _ends(sp.base)
        shown = (_value_text(sp.claim, base[0]) if base and base[0] == base[1] else
                 f"{_value_text(sp.claim, base[0])} to {_value_text(sp.claim, base[1])}"
                 if base else ("holds" if getattr(sp.base, "holds", False)
                               else "does not hold"))
        rng = f"{_value_text(sp.claim, r[0])} to {_value_text(sp.claim, r[1])}" if r else \
            ", ".join(sorted({_status(sp.claim, o) or "-" for _, o in sp.under}))
        movers = "; ".join(f"{v.label} (by {_shift_text(sp.claim, d)})"
                           for v, d in sp.movers()[:4]) or "none"
        flips = sp.flips()
        cls = ("**decided by an assumption**: " + "; ".join(f"{v.label} -> {s}"
                                                            for v, s in flips[:3])
               if flips else "holds across the ranges")
        if sp.of:
            cls += f" (varied on {sp.of[0]} of its {sp.of[1]} points)"
        lines.append(f"| {i} | {shown} | {rng} | {movers} | {cls} |")
    decided = sum(sp.decided for sp in spreads_)
    lines += ["", f"{decided} of {len(spreads_)} figures are decided by an assumption.", "",
              "Variants run (parameter, the preset stating it, its value as run, the end "
              "used, the points it changed):", ""]
    seen = {}
    for v in variants:
        seen.setdefault((v.scope, v.key), []).append(v)
    lines += ["| parameter | stated by | as run | low | high | points | reason |",
              "|---|---|---|---|---|---|---|"]
    for (scope, key), vs in seen.items():
        ends = {v.end: f"{v.value:g}" for v in vs}
        pts = sorted({p for v in vs for p in v.points})
        lines.append(f"| `{key}` | {scope} | {vs[0].base} | {ends.get('low', '(as run)')} | "
                     f"{ends.get('high', '(as run)')} | {len(pts)} | "
                     f"{vs[0].reason.replace('|', '/')} |")
    if failed:
        lines += ["", "Variants left out (a run failed): " + "; ".join(failed)]
    if unvaried:
        lines += ["", "Read by these points but not varied here (`--only` left them out, or "
                  "their variants were not run): " + ", ".join(unvaried) + "; the verdicts "
                  "above hold only for the assumptions varied."]
    if estimates:
        lines += ["", "Not varied: the whole-model estimates (" + ", ".join(estimates)
                  + "); their figures keep the value as run."]
    return lines + [""]
