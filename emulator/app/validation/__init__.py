"""``t3emu validate``: the validation pages, every published figure of the four papers the
emulator is compared with (T3, Flux, the fused computation-collective operators, FiCCO)
beside the emulator's value computed the same way from sweep results.

``read_sweeps(dirs)`` reads each sweep directory's ``results.json`` and refuses a sweep
that is not one of the papers' scenarios or does not hold exactly that scenario's points;
``write(sweeps, out, command)`` writes ``out/index.md`` (per paper: figures within band,
outside band, direction only, not computed) and one page per paper (``t3.md``,
``flux.md``, ``fused-ops.md``, ``ficco.md``). A paper whose sweeps were not given still
gets its page, every figure "not computed" with the command that makes its sweep.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from emulator.app.validation import anchors, ficco, flux, fused_ops, t3
from emulator.app.validation.common import Row, Sweeps, counts, evaluate, page, sweep_command

PAPERS: tuple[ModuleType, ...] = (t3, flux, fused_ops, ficco, anchors)
SCENARIOS = {s: m for m in PAPERS for s in m.PAPER.scenarios}


class ValidationError(ValueError):
    """A sweep directory ``t3emu validate`` cannot use; the message names it and why."""


def read_estimates(path: Path) -> dict:
    """A paper's whole-model scenario (``t3emu model --scenario NAME --out DIR``), checked:
    its scenario is one of the papers' and it holds one estimate per setting of it, in
    order."""
    from emulator.workload import scenarios

    f = Path(path) / "estimates.json"
    try:
        doc = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise ValidationError(f"{path}: estimates.json cannot be read ({exc})") from None
    name = doc.get("scenario") if isinstance(doc, dict) else None
    if name not in SCENARIOS or name not in scenarios.SCENARIOS:
        raise ValidationError(f"{path}: scenario {name!r} is not one of the papers' "
                              f"({', '.join(SCENARIOS)})")
    want = [[s.model.name, s.phase, s.tp, s.pp, s.dp, list(s.designs)]
            for s in scenarios.settings(name, precheck=False)]
    have = [[e.get("setting", {}).get(k) for k in ("model", "phase", "tp", "pp", "dp",
                                                   "designs")]
            for e in doc.get("estimates") or [] if isinstance(e, dict)]
    if have != want:
        raise ValidationError(f"{path}: not the estimates of {name} ({len(have)} of "
                              f"{len(want)}, or another version of it); run "
                              f"`{scenarios.command(name)}` again")
    return doc


def read_sweep(path: Path) -> dict:
    """A paper scenario's sweep results, checked: its scenario is one of the papers' and its
    points are exactly the scenario's (``load_scenario(name).points``); a directory of
    whole-model estimates (``estimates.json``): ``read_estimates``."""
    from emulator.app.scenario import ScenarioError, load_scenario

    if (Path(path) / "estimates.json").is_file():
        return read_estimates(path)
    f = Path(path) / "results.json"
    if not f.is_file():
        raise ValidationError(f"{path}: no results.json (run `t3emu sweep SCENARIO --out "
                              f"{path}` first)")
    from emulator.app.sweep import read_results

    try:
        doc = read_results(f)
    except OSError as exc:
        raise ValidationError(f"{path}: results.json cannot be read ({exc})") from None
    except ScenarioError as exc:
        raise ValidationError(str(exc)) from None
    name = doc.get("scenario")
    if name not in SCENARIOS:
        raise ValidationError(f"{path}: scenario {name!r} is not one of the papers' "
                              f"({', '.join(SCENARIOS)})")
    try:
        want = {p.key for p in load_scenario(name).points}
    except ScenarioError as exc:
        raise ValidationError(f"{path}: scenario {name}: {exc}") from None
    pts = doc.get("points") or []
    have = [p.get("key") for p in pts]
    if None in have:
        raise ValidationError(f"{path}: a point carries no key (results of an older sweep; "
                              f"run `{sweep_command(name)}` again)")
    extra, missing = set(have) - want, want - set(have)
    if extra or missing or len(have) != len(set(have)):
        flag = " --timing-only" if doc.get("timing_only") else ""
        why = (f"{len(missing)} of the scenario's {len(want)} points missing "
               f"(e.g. {sorted(missing)[0]}); finish it with `t3emu sweep {name}{flag} "
               f"--out {path}`" if missing and not extra else
               f"{len(extra)} point(s) not in scenario {name} (e.g. {sorted(extra)[0]}): a "
               f"sweep of another version of it" if extra else "a point appears twice")
        raise ValidationError(f"{path}: not the points of {name}: {why}")
    from emulator.app.sweep import without_failing

    return without_failing(doc)  # failing runs: in no figure (the page lists them)


def read_sweeps(dirs: list[Path]) -> Sweeps:
    """Scenario name -> its checked sweep, for each directory (one sweep per scenario)."""
    return read_dirs(dirs)[0]


def paper_rows(paper: ModuleType, sweeps: Sweeps) -> list[Row]:
    return [evaluate(c, sweeps) for c in paper.CLAIMS]


def index(results: list[tuple[ModuleType, list[Row]]], validate_command: str,
          decided: dict[str, int | None] | None = None) -> str:
    lines = ["# Validation against the papers", "",
             "Generated by `t3emu validate` from sweep results; do not edit by hand:", "",
             f"    {validate_command}", "",
             "Each page lists every published figure of its paper beside the emulator's value computed the same way, "
             "within bands fixed before comparing (a speedup or time ratio scored on its "
             "gain: +-25% of x - 1 or 2 points, whichever is wider; efficiencies and shares "
             "+-0.10 absolute; a published range end by end), with what in the model "
             "decides each figure. A finding without a magnitude holds only when the "
             "causes put it on a cause the paper names.", "",
             "\"Decided by an assumption\": figures whose verdict changes when one "
             "ASSUMPTION parameter moves within its stated range (the page's sensitivity "
             "section; - where it was not computed).", "",
             "| paper | figures | within band | outside band | direction only | holds "
             "(paper's reason) | holds (another reason) | holds (cause not checked) | "
             "not computed | decided by an assumption |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for mod, rows in results:
        c = counts(rows)
        lines.append(f"| [{mod.PAPER.title}]({mod.PAPER.key}.md) | {len(rows)} | "
                     f"{c['within']} | {c['outside']} | {c['direction']} | {c['holds']} | "
                     f"{c['another reason']} | {c['unchecked']} | {c['not computed']} | "
                     f"{'-' if (decided or {}).get(mod.PAPER.key) is None else decided[mod.PAPER.key]} |")
    return "\n".join(lines) + "\n"


def _details(mod, sweeps: Sweeps) -> list[str]:
    """A page's per-case tables; where a run they show failed its numerics check (and so is
    left out), a line saying so instead (a defect of the page's code is never hidden)."""
    try:
        return mod.details(sweeps)
    except (TypeError, KeyError, ZeroDivisionError, ValueError, StopIteration):
        if not any(sweeps[s].get("excluded_failing") for s in mod.PAPER.scenarios
                   if s in sweeps):
            raise
        return ["## Per-case tables", "",
                "Not drawn: a run they show failed the numerics check (listed at the top of "
                "this page); rerun the sweep.", ""]


def paper_sensitivity(mod, sweeps: Sweeps, dirs: dict[str, Path], run_missing: bool,
                only: tuple[str, ...] = (), progress=None) -> tuple[list, list, list, list, list]:
    """(spreads, variants computed, variants failed, whole-model scenarios not varied, the
    assumptions its points read that were not varied) of one paper: each variant's results
    reused when made by the sweep's code, else run when
    ``run_missing``."""
    from emulator.app.sweep import failing_runs
    from emulator.app.validation import sensitivity as sv

    done, failed, used = [], [], []
    subset = getattr(mod, "SENSITIVITY_SUBSET", None)
    planned = sv.plan(sweeps, mod.PAPER.scenarios, only, subset)
    docs = {v: sv.load(v, dirs[v.scenario], sweeps[v.scenario]) for v in planned}
    if run_missing:  # the variants not yet made, each scenario's run as one sweep
        for s in mod.PAPER.scenarios:
            missing = [v for v in planned if v.scenario == s and docs[v] is None]
            if not missing:
                continue
            if progress:
                progress(missing)
            sv.run_all(missing, dirs[s], sweeps[s])
            docs.update({v: sv.load(v, dirs[s], sweeps[s]) for v in missing})
    for v in planned:
        doc = docs[v]
        if doc is None:
            if run_missing:  # run just now, yet incomplete: a point of it failed
                failed.append(v.label)
            continue
        if failing_runs(doc) or {p["key"] for p in doc.get("points", [])} != set(v.points):
            failed.append(v.label)
            continue
        done.append((v, sv.merged(sweeps, v, doc)))
        used.append(v)
    estimates = [s for s in mod.PAPER.scenarios if s in sweeps and "points" not in sweeps[s]]
    ran = {(v.scope, v.key) for v in used} | {(v.scope, v.key) for v in planned
                                              if v.label in failed}
    unvaried = sorted({f"`{v.key}` ({v.scope})" for v in sv.plan(sweeps, mod.PAPER.scenarios,
                                                                 (), subset)
                       if (v.scope, v.key) not in ran})
    return sv.spreads(mod.CLAIMS, sweeps, done, subset), used, failed, estimates, unvaried


def write(sweeps: Sweeps, out: Path, validate_command: str, dirs: dict[str, Path] | None = None,
          run_sensitivity: bool = False, only: tuple[str, ...] = (), progress=None
          ) -> list[Path]:
    """Write the index and the four pages from checked sweeps (``read_sweeps``); returns
    their paths, the index first. ``dirs``: each scenario's results directory, where the
    sensitivity variants live (``sensitivity.py``): reused when present, run first with
    ``run_sensitivity``."""
    from emulator.app.validation import sensitivity as sv

    out = Path(out)
    results, texts, decided = [], {}, {}
    sens_command = validate_command.replace(" --out ", " --sensitivity --out ", 1)
    for mod in PAPERS:
        rows = paper_rows(mod, sweeps)
        results.append((mod, rows))
        details = _details(mod, sweeps)
        if dirs is not None and any(s in sweeps for s in mod.PAPER.scenarios):
            spreads, used, failed, estimates, unvaried = paper_sensitivity(
                mod, sweeps, dirs, run_sensitivity, only, progress)
            details = details + sv.section(spreads, used, failed, estimates, sens_command,
                                           getattr(mod, "SENSITIVITY_SUBSET", None), unvaried)
            decided[mod.PAPER.key] = sum(sp.decided for sp in spreads) if used else None
        texts[f"{mod.PAPER.key}.md"] = page(mod.PAPER, sweeps, rows, details,
                                            validate_command)
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "index.md"]
    written[0].write_text(index(results, validate_command, decided))
    for name, text in texts.items():
        (out / name).write_text(text)
        written.append(out / name)
    return written


def read_dirs(dirs: list[Path]) -> tuple[Sweeps, dict[str, Path]]:
    """``read_sweeps`` and each scenario's directory."""
    sweeps: Sweeps = {}
    where: dict[str, Path] = {}
    for d in dirs:
        doc = read_sweep(d)
        name = doc["scenario"]
        if name in sweeps:
            raise ValidationError(f"{d}: a second sweep of {name} (the first: {where[name]})")
        sweeps[name], where[name] = doc, Path(d)
    return sweeps, where
