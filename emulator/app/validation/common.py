"""What every validation page shares: the bands a published figure is compared within,
the verdicts, the rows (a published figure, the emulator's value computed the same
way, the band, the verdict and the command that made it), the causes table and the
page's scaffolding.

Bands are fixed here, before any comparison, and score a speedup or time ratio by its
gain (x - 1, or the cut): within +-25% of the published gain or +-2 points, whichever is
wider; efficiencies and shares within +-0.10 absolute. A published range is matched when
each of its ends is matched by the emulated range's end; a one-sided figure ("more
than") when the emulated value lies beyond its bound's band. Verdicts are exactly one of
"within band", "outside band by X", "direction only: holds" / "direction only: does not
hold" (the paper gives no magnitude) and "not computed (reason)".
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from emulator.app.catalog import registry
from emulator.app.causes import columns

GAIN = 0.25  # speedups and time ratios: +-25% of the published gain (x - 1) ...
GAIN_POINTS = 0.02  # ... or +-2 points of it, whichever is wider
ABSOLUTE = 0.10  # efficiencies and shares: +-0.10 (10 percentage points)
KINDS = ("speedup", "ratio", "share")  # how a figure is banded and its distance printed
CAUSES_FLAG = "--causes"
BANDS_TEXT = (f"Bands, fixed before comparing: a speedup or time ratio is scored by its gain "
              f"(x - 1, or the cut), within +-{GAIN:.0%} of the published gain or "
              f"+-{GAIN_POINTS * 100:.0f} points, whichever is wider (1.30x: 1.225x to "
              f"1.375x; 1.09x: 1.07x to 1.11x, so a band never holds no gain for a gain "
              f"above 2 points); efficiencies and shares within +-{ABSOLUTE:.2f} absolute. A "
              f"published range is matched when each of its ends is matched by the emulated "
              f"range's end (its band printed end by end); a one-sided figure (\"more "
              f"than\") when the emulated value lies beyond its bound's band. \"Outside band "
              f"by X\": how far the emulated value (or the end that misses most) lies beyond "
              f"the nearest band edge: in x for speedups, in percent of the edge for time "
              f"ratios, in percentage points for efficiencies and shares (printed in "
              f"percent). A figure the paper states without a magnitude is compared in "
              f"direction only; the emulator's value is printed beside every verdict.")


# ---------------------------------------------------------------- published figures
@dataclass(frozen=True)
class Published:
    """A published figure: a value (lo == hi), a range, or a one-sided bound (hi = inf:
    "more than lo")."""

    lo: float
    hi: float
    kind: str  # one of KINDS
    text: str  # as the paper states it, e.g. "1.35x", "41% to 57%"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind {self.kind!r}: one of {', '.join(KINDS)}")

    @classmethod
    def value(cls, x: float, kind: str, text: str) -> Published:
        return cls(x, x, kind, text)

    @classmethod
    def more_than(cls, x: float, kind: str, text: str) -> Published:
        return cls(x, math.inf, kind, text)

    def edges(self, x: float) -> tuple[float, float]:
        """The band of one published value ``x`` of this kind: +-ABSOLUTE for a share,
        else x - 1 (the gain) +- max(GAIN x |gain|, GAIN_POINTS)."""
        if self.kind == "share":
            return x - ABSOLUTE, x + ABSOLUTE
        w = max(GAIN * abs(x - 1.0), GAIN_POINTS)
        return x - w, x + w

    @property
    def is_range(self) -> bool:
        return self.hi != self.lo and not math.isinf(self.hi)

    def band(self) -> tuple[float, float]:
        """The outer edges: the low end's band's low edge and the high end's band's high
        edge (inf for a one-sided figure)."""
        lo = self.edges(self.lo)[0]
        return lo, (math.inf if math.isinf(self.hi) else self.edges(self.hi)[1])

    def band_text(self) -> str:
        lo, hi = self.band()
        if math.isinf(hi):
            return f"> {fmt(lo, self.kind)}"
        if self.is_range:
            (a, b), (c, d) = self.edges(self.lo), self.edges(self.hi)
            return (f"low end {fmt(a, self.kind)} to {fmt(b, self.kind)}, high end "
                    f"{fmt(c, self.kind)} to {fmt(d, self.kind)}")
        return f"{fmt(lo, self.kind)} to {fmt(hi, self.kind)}"


def fmt(x: float, kind: str) -> str:
    """A value of ``kind`` as the pages print it."""
    if kind == "speedup":
        return f"{x:.2f}x"
    if kind == "share":
        return f"{x * 100:.0f}%"
    return f"{x:.3f}"


def _distance(d: float, digits: int = 2) -> str:
    """A positive distance, never printed as zero."""
    text = f"{d:.{digits}f}"
    return text if float(text) > 0 else f"{d:.1g}"


def verdict(pub: Published, lo: float, hi: float | None = None) -> str:
    """"within band" or "outside band by X" for an emulated value (or range lo..hi): a
    published value's band must hold the whole emulated range; a published range's low
    end is matched by the emulated low end and its high end by the emulated high end; a
    one-sided figure by the emulated low end."""
    hi = lo if hi is None else hi
    eps = 1e-12
    if math.isinf(pub.hi):
        checks = [(lo, pub.edges(pub.lo)[0], math.inf)]
    elif pub.is_range:
        checks = [(lo, *pub.edges(pub.lo)), (hi, *pub.edges(pub.hi))]
    else:
        checks = [(lo, *pub.edges(pub.lo)), (hi, *pub.edges(pub.lo))]
    worst, rel = 0.0, 0.0
    for x, blo, bhi in checks:
        below, above = blo - x, x - bhi
        if below > eps:
            worst, rel = max(worst, below), max(rel, below / abs(blo) if blo else below)
        if above > eps:
            worst, rel = max(worst, above), max(rel, above / abs(bhi) if bhi else above)
    if worst <= eps:
        return "within band"
    if pub.kind == "ratio":  # in percent of the edge it misses
        return f"outside band by {_distance(100 * rel, 0)}%"
    if pub.kind == "share":  # in percentage points
        return f"outside band by {_distance(100 * worst, 0)} percentage points"
    return f"outside band by {_distance(worst)}x"


# ---------------------------------------------------------------- outcomes of a claim
@dataclass(frozen=True)
class Measured:
    """The emulator's value (or range lo..hi) of a published figure, and how it reads."""

    lo: float
    hi: float | None = None
    text: str = ""


@dataclass(frozen=True)
class Direction:
    """Whether a finding stated without a magnitude holds in the emulator, and (``cause``)
    the emulator's cause that carries it: the largest part, from ``--causes``, of the
    gain the finding rests on (None: not computed, the sweep has no causes)."""

    holds: bool
    text: str
    cause: str | None = None


@dataclass(frozen=True)
class NotComputed:
    reason: str
    text: str = "-"


Outcome = Measured | Direction | NotComputed
Sweeps = dict[str, dict]  # scenario name -> its results.json


@dataclass(frozen=True)
class Claim:
    """A published figure or finding and how the emulator's value is computed."""

    figure: str  # what the paper states
    where: str  # where the paper states it (section, figure or table)
    published: Published | None  # None: no magnitude (compared in direction only)
    needs: tuple[str, ...]  # the scenarios whose sweeps it is computed from
    compute: Callable[[Sweeps], Outcome]
    named: tuple[str, ...] = ()  # a direction-only finding: the causes the paper gives for
    # it, as the emulator's cause names (``emulator/model/ablation.py``; () : the paper's
    # cause has no counterpart there, so its cause is not checked)


@dataclass(frozen=True)
class Row:
    figure: str
    where: str
    published: str
    emulator: str
    band: str
    verdict: str
    command: str

    @property
    def status(self) -> str:
        """within, outside, direction or not computed (the index's columns)."""
        for prefix, status in (("within band", "within"), ("outside band", "outside"),
                               ("direction only", "direction"),
                               ("not computed", "not computed")):
            if self.verdict.startswith(prefix):
                return status
        raise ValueError(f"verdict {self.verdict!r}")

    @property
    def holds(self) -> bool:
        """Holds for the paper's reason (its cause checked against the causes table)."""
        return self.verdict == "direction only: holds"

    @property
    def another_reason(self) -> bool:
        return self.verdict.startswith("direction only: holds for another reason")

    @property
    def unchecked(self) -> bool:
        return self.verdict.startswith("direction only: holds, cause not checked")


def sweep_command(scenario: str, doc: dict | None = None, causes: bool | None = None) -> str:
    """The command that makes a scenario's sweep, as a user types it (``results/NAME``); a
    whole-model scenario's: ``t3emu model --scenario``."""
    from emulator.workload import scenarios

    if scenario in scenarios.SCENARIOS:
        return scenarios.command(scenario)
    timing = doc.get("timing_only", True) if doc is not None else True
    with_causes = bool(doc.get("causes")) if causes is None and doc is not None else bool(causes)
    return (f"t3emu sweep {scenario}" + (" --timing-only" if timing else "")
            + (f" {CAUSES_FLAG}" if with_causes else "") + f" --out results/{scenario}")


def evaluate(claim: Claim, sweeps: Sweeps) -> Row:
    """A claim's row: its published figure beside the emulator's, the band and verdict."""
    pub = claim.published
    published = pub.text if pub else "no magnitude"
    band = pub.band_text() if pub else "-"
    missing = [s for s in claim.needs if s not in sweeps]
    command = "; ".join(f"`{sweep_command(s, sweeps.get(s))}`" for s in claim.needs)
    if missing:
        needs = "; ".join(f"`{sweep_command(s)}`" for s in missing)
        return Row(claim.figure, claim.where, published, "-", band,
                   f"not computed (needs {needs})", command)
    failing = [s for s in claim.needs if (sweeps[s].get("excluded_failing") or [])]
    try:
        out = claim.compute(sweeps)
    except (TypeError, KeyError, ZeroDivisionError, ValueError, StopIteration):
        if not failing:  # a defect of the page's code: never hidden
            raise
        out = NotComputed("a run it needs failed the numerics check (listed above the "
                          "table); rerun the sweep")
    if isinstance(out, NotComputed):
        return Row(claim.figure, claim.where, published, out.text, band,
                   f"not computed ({out.reason})", command)
    if isinstance(out, Direction):
        return Row(claim.figure, claim.where, published, out.text, band,
                   direction_verdict(claim, out), command)
    if pub is None:
        raise ValueError(f"{claim.figure}: a measured value needs a published figure")
    text = out.text or (fmt(out.lo, pub.kind) if out.hi is None
                        else f"{fmt(out.lo, pub.kind)} to {fmt(out.hi, pub.kind)}")
    return Row(claim.figure, claim.where, published, text, band,
               verdict(pub, out.lo, out.hi), command)


def direction_verdict(claim: Claim, out: Direction) -> str:
    """A finding without a magnitude "holds" only when the emulator's cause of it is one
    the paper names; else it "holds for another reason" (naming the emulator's), or, where
    the cause could not be checked (the paper's has no counterpart among the emulator's
    causes, or the sweep ran without ``--causes``), "holds, cause not checked"."""
    if not out.holds:
        return "direction only: does not hold"
    if not claim.named:
        return ("direction only: holds, cause not checked (the paper's cause has no "
                "counterpart among the emulator's causes)")
    if out.cause is None:
        return ("direction only: holds, cause not checked (needs the sweep with "
                f"{CAUSES_FLAG})")
    if out.cause in claim.named:
        return "direction only: holds"
    return (f"direction only: holds for another reason ({out.cause}; the paper's: "
            f"{', '.join(claim.named)})")


def gain_cause(pt: dict, mode: str, against: str | None = None) -> str | None:
    """The cause carrying ``mode``'s gain on a point (the largest part of its gain over its
    baseline, overlap included, from ``--causes``); with ``against`` (a bound run with
    causes over the same baseline), the cause of its gain beyond that run's: the largest
    difference of their parts. None without causes."""
    return pooled_cause([pt], mode, against)


def pooled_cause(pts: list[dict], mode: str, against: str | None = None,
                 loss: bool = False) -> str | None:
    """The cause carrying ``mode``'s gain (``loss``: its loss, the most negative part)
    summed over ``pts``, each part as ``gain_cause`` takes it (``against``: beyond that
    run's parts). None where any point lacks causes."""
    total: dict[str, float] = {}
    for pt in pts:
        mine = (runs(pt).get(mode) or {}).get("causes")
        theirs = (runs(pt).get(against) or {}).get("causes") if against else None
        if not mine or (against and (not theirs or theirs["baseline"] != mine["baseline"])):
            return None
        for k, v in mine["parts_s"].items():
            total[k] = total.get(k, 0.0) + v - (theirs["parts_s"].get(k, 0.0) if theirs else 0)
    if not total:
        return None
    return (min if loss else max)(total, key=total.get)


def counts(rows: list[Row]) -> dict[str, int]:
    out = {"within": 0, "outside": 0, "direction": 0, "holds": 0, "another reason": 0,
           "unchecked": 0, "not computed": 0}
    for r in rows:
        out[r.status] += 1
        out["holds"] += r.holds
        out["another reason"] += r.another_reason
        out["unchecked"] += r.unchecked
    return out


# ---------------------------------------------------------------- numbers of the sweeps
def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def runs(pt: dict) -> dict[str, dict]:
    return {r["mode"]: r for r in pt["runs"]}


def time_of(pt: dict, mode: str) -> float | None:
    r = runs(pt).get(mode)
    return r["modelled_time_s"] if r else None


def baseline_of(run: dict) -> str | None:
    """The configuration a run's gain is over: its own record, else the registry's."""
    if "baseline" in run:
        return run["baseline"]
    reg = registry()
    return reg.baseline_of(run["mode"]) if run["mode"] in reg.configurations else None


def speedup(pt: dict, mode: str, over: str | None = None) -> float | None:
    """The speedup of ``mode`` over ``over`` (default: its own baseline) at ``pt``."""
    rs = runs(pt)
    r = rs.get(mode)
    if r is None:
        return None
    base = over or baseline_of(r)
    if base is None or base not in rs:
        return None
    return rs[base]["modelled_time_s"] / r["modelled_time_s"]


def label(pt: dict) -> str:
    if pt.get("system"):
        return f"{pt['model']} {pt['sublayer']} m={pt['m']} {pt['system']}"
    return f"{pt['model']} {pt['sublayer']} TP{pt['tp']}"


# ---------------------------------------------------------------- causes of the gains
@dataclass
class CauseGroup:
    """The configurations a paper's figures are about, over the same cases."""

    title: str  # e.g. "T3's 16 cases"
    points: list[dict]
    modes: list[str]


@dataclass
class _Sum:
    speedups: list[float] = field(default_factory=list)
    cuts: list[float] = field(default_factory=list)
    parts: dict[str, list[float]] = field(default_factory=dict)
    baseline: str = ""
    order: list[str] = field(default_factory=list)


def causes_section(groups: list[CauseGroup], scenarios: list[str]) -> list[str]:
    """Markdown: per group and configuration, the geomean speedup over its baseline and
    each cause's part of the cut in points of the baseline's time (means over the
    cases); or one line saying causes were not computed and the command that computes
    them."""
    lines = ["## Causes of the gains", ""]
    found = False
    for g in groups:
        sums: dict[str, _Sum] = {}
        for pt in g.points:
            for m in g.modes:
                r = runs(pt).get(m)
                c = (r or {}).get("causes")
                if not c:
                    continue
                s = sums.setdefault(m, _Sum(baseline=c["baseline"],
                                            order=list(c.get("order", []))))
                base = c["baseline_s"]
                s.speedups.append(base / c["time_s"])
                s.cuts.append(c["gain_s"] / base * 100)
                for k, v in c["parts_s"].items():
                    s.parts.setdefault(k, []).append(v / base * 100)
        if not sums:
            continue
        found = True
        keys = columns([{"order": s.order, "parts_s": s.parts} for s in sums.values()])
        lines += [f"{g.title}: mean over the cases of each cause's part of the cut, in "
                  f"points of the baseline's time (the parts add up to the cut).", "",
                  "| configuration | over | cases | geomean speedup | mean cut | "
                  + " | ".join(keys) + " |", "|---|---|---|---|---|" + "---|" * len(keys)]
        prose = []
        for m, s in sums.items():
            # the mean over every case: a case without the cause (a sweep written before
            # it was one, its other causes holding its part) counts 0, so the parts add up
            part = lambda k: sum(s.parts[k]) / len(s.cuts)  # noqa: E731
            lines.append(f"| {m} | {s.baseline} | {len(s.cuts)} | {geomean(s.speedups):.3f}x"
                         f" | {mean(s.cuts):.1f}% | "
                         + " | ".join(f"{part(k):+.1f}" if k in s.parts else "-"
                                      for k in keys) + " |")
            top = max(s.parts, key=lambda k: abs(part(k)))
            prose.append(f"- {m}: of the {mean(s.cuts):.1f}% cut of {s.baseline}'s time, "
                         f"{part(top):+.1f} points come from {top}.")
        lines += [""] + prose + [""]
    if not found:
        cmds = "; ".join(f"`{sweep_command(s, causes=True)}`" for s in scenarios)
        lines += [f"Causes were not computed for these sweeps (their runs carry no `causes`); "
                  f"{cmds} computes them.", ""]
    return lines


# ---------------------------------------------------------------- the page
@dataclass(frozen=True)
class Paper:
    key: str  # the page's name: docs/validation/KEY.md
    title: str
    citation: str
    scenarios: tuple[str, ...]  # the sweeps its figures come from
    digest: str  # the paper's sections the figures come from


def table(rows: list[Row]) -> list[str]:
    out = ["| # | published figure | where | published | emulator | band | verdict | "
           "made by |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        cells = (str(i), r.figure, r.where, r.published, r.emulator, r.band,
                 f"**{r.verdict}**" if r.status == "outside" else r.verdict, r.command)
        out.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return out


def page(paper: Paper, sweeps: Sweeps, rows: list[Row], details: list[str],
         validate_command: str) -> str:
    """A paper's page: citation, commands, bands, the figures' table, then ``details``
    (markdown lines: per-case tables, causes, what decides each figure)."""
    lines = [f"# Validation against {paper.title}", "",
             f"Paper: {paper.citation}", "",
             "Published figures as the paper states them (the column \"where\" names the "
             "section, figure or table); they are a yardstick, not a target: no model "
             "parameter was fitted to them.", "",
             "Generated by `t3emu validate` from sweep results; do not edit by hand. "
             "Commands that made the numbers:", ""]
    for s in paper.scenarios:
        lines.append(f"    {sweep_command(s, sweeps.get(s))}" if s in sweeps
                     else f"    # not given: {sweep_command(s)}")
    lines += [f"    {validate_command}", "", BANDS_TEXT, ""]
    for s in paper.scenarios:
        bad = (sweeps.get(s) or {}).get("excluded_failing") or []
        if bad:
            lines += [f"**{len(bad)} run(s) of `{s}` failed the numerics check and are left "
                      f"out of every figure below:** " + "; ".join(f"{k} {m}" for k, m in bad),
                      ""]
    c = counts(rows)
    lines += [f"Of {len(rows)} figures: {c['within']} within band, {c['outside']} outside "
              f"band, {c['direction']} direction only ({c['holds']} hold for the paper's "
              f"reason, {c['another reason']} for another, {c['unchecked']} with the cause "
              f"not checked), {c['not computed']} not computed.", "",
              "## Published figures", ""]
    lines += table(rows) + [""]
    lines += details
    return "\n".join(lines).rstrip() + "\n"


def end_to_end(sweeps: Sweeps, scenario: str) -> list[str]:
    """A page's whole-model section: every estimate of a ``t3emu model --scenario`` (each
    design's iteration and layer speedups over the baseline, the baseline's communication
    share and exposed communication), or the command that makes them."""
    from emulator.workload import scenarios

    lines = ["## End to end: whole-model estimates", "",
             f"Setting: {scenarios.get(scenario).help}. Each estimate emulates one "
             "tensor-parallel group's operations (a DLRM's all-to-all on every GPU) and "
             "composes the rest ([models](../models.md)); speedups are over the baseline, per iteration and "
             "per layer (a DLRM: its forward and backward passes).", ""]
    if scenario not in sweeps:
        return lines + [f"Not computed: run `{scenarios.command(scenario)}` and give "
                        f"`results/{scenario}` to `t3emu validate`.", ""]
    lines += ["| model | phase | system | parallelism | tokens | design | iteration speedup "
              "| layer speedup | baseline's communication share | exposed communication "
              "(ms) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for e in sweeps[scenario]["estimates"]:
        st = e["setting"]
        par = ("data-parallel MLPs" if st.get("kind") == "dlrm" else
               f"TP {st['tp']} x PP {st['pp']} x DP {st['dp']}"
               + (", SP" if st["sp"] else ", AR") + (f", EP {st['ep']}" if st["ep"] > 1 else "")
               + (", split heads" if st.get("split_heads") else "")
               + (", unfused attention" if st.get("attention") == "unfused" else "")
               + f", {st.get('dtype', 'fp16')}")
        tokens = st["batch"] if st.get("kind") == "dlrm" else st["tokens"]
        for d, v in e["designs"].items():
            lines.append(f"| {st['model']} | {st['phase']} | {st['system']} | {par} | "
                         f"{tokens} | {d} | {v['speedup']:.3f}x | {v['layer_speedup']:.3f}x | "
                         f"{e['comm_share'] * 100:.1f}% | {v['exposed_comm_s'] * 1e3:.2f} |")
    return lines + [""]
