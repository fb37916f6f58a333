"""``t3emu sweep``: run every point of a scenario, keep every finished point.

Each point is one ``t3emu run`` (TP ranks, the scenario's modes) writing its JSON to
``DIR/points/``; its output goes to ``DIR/logs/``. The points of one job size run in one
pooled MPI job (``app.pool``: started once, not per point; a point that ends the job is
reported and the next point starts a new one), in the scenario's order within a size.
After each point ``results.csv`` is rewritten, and ``results.json`` (which holds every
point's whole document: tens of MB for a paper's sweep, seconds to write) at most every
``JSON_EVERY_S`` and when the sweep ends, however it ends; both atomically (temporary
file + rename), so an interrupted sweep (Ctrl-C, a crash) leaves complete files holding
every point finished so far, and a killed one complete files a few points behind its
point JSONs. Rerunning the same command skips the points already in ``results.json`` or
whose point JSON was written before the interruption, and runs the rest.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import sys
import time
from pathlib import Path

import click

from emulator.app import provenance
from emulator.app.config import ConfigError, RunConfig
from emulator.app.files import write_json_atomic, write_text_atomic
from emulator.app.scenario import Point, Scenario, ScenarioError
from devices.overrides import describe
from emulator.model.ablation import ORDER

CATEGORIES = ("gemm_read", "gemm_write", "rs_read", "rs_write", "ag_read", "ag_write",
              "a2a_read", "a2a_write")
CSV_COLUMNS = ("model", "sublayer", "direction", "tp", "m", "n", "k", "device", "collective",
               "topology", "dtype", "mode", "modelled_time_s", "speedup_vs_sequential",
               "dram_bytes_total", *(f"dram_{c}" for c in CATEGORIES), "numerics",
               "max_abs_error", "wall_time_s", "ect_s", "overlap_efficiency", "system",
               "speedups_vs_baselines", "search_chosen", "params", "max_rank_skew", "baseline",
               "speedup", *(f"cause_{c}_s" for c in (*ORDER, "overlap")), "set",
               "t3emu_version", "commit", "code_hash")
RUN_KEYS = ("mode", "modelled_time_s", "speedup_vs_sequential", "phases", "phase_windows_s",
            "rank_phases_s", "dram_bytes", "numerics", "max_abs_error", "arbitration",
            "wall_time_s", "stage_profile", "gemm_alone_s", "ect_s", "overlap_efficiency",
            "search", "speedup_vs", "rank_kernel_end_s", "rank_skew", "baseline", "speedup",
            "causes")


_OLD = {"ablate": [], "causes": False, "set": []}  # what a results.json written before these keys held


def _file_key(point: Point) -> str:
    return point.key.replace("/", "__")


def point_config(sc: Scenario, p: Point, out: Path, timing_only: bool,
                 watchdog_s: float, configs: tuple[str, ...] = (), ablate: tuple[str, ...] = (),
                 causes: bool = False, overrides: tuple = ()) -> RunConfig:
    """The run of one point (on a system: in the system's own topology); ``overrides``:
    the command line's ``--set``, besides the scenario's ``set`` (a key in both is refused:
    the point's label and key name the scenario's value)."""
    from devices.overrides import check
    from devices.spec import SpecError

    merged = tuple(p.overrides) + tuple(overrides)
    try:
        check(merged, bool(p.system))
    except SpecError as exc:
        raise ScenarioError(f"--set: {exc} (the scenario's set gives {p.set_text}; drop the "
                            f"--set of that key or change the scenario)") from None
    return RunConfig(ranks=p.tp, collective=p.collective, topology=p.topology,
                     mode=",".join(p.modes), m=p.m, n=p.n, k=p.k, dtype=sc.dtype,
                     device=p.device, watchdog_s=watchdog_s,
                     json=str(out / "points" / f"{_file_key(p)}.json"),
                     timing_only=timing_only, configs=configs,
                     system=p.system or None, params=p.params, ablate=ablate,
                     causes=causes, overrides=merged).validate()


def _header(sc: Scenario, timing_only: bool, configs: tuple[str, ...] = (),
            ablate: tuple[str, ...] = (), causes: bool = False, overrides: tuple = ()) -> dict:
    head = {"scenario": sc.name, "description": sc.description,
            "scenario_file": provenance.display_name(sc.path),
            "timing_only": timing_only, "device": _named(sc.device),
            "collective": sc.collective,
            "topology": sc.topology, "dtype": sc.dtype, "modes": list(sc.modes),
            "ablate": list(ablate), "causes": causes, "set": [list(o) for o in overrides]}
    if configs:  # configurations of one's own the modes may name
        head["configs"] = [provenance.display_name(c) for c in configs]
    # what made the points: version, commit, code hash, and every file they read
    files = [("scenario", sc.path)] + [("configs", c) for c in configs]
    for p in sc.points:
        files.append(("system", provenance.preset_file(p.system, "system")) if p.system
                     else ("device", provenance.preset_file(p.device, "device")))
    head["provenance"] = provenance.record(files)
    return head


def _named(devices: str) -> str:
    """A scenario's device(s) as results name them: presets by name, files by their stem."""
    return ",".join(Path(d).stem if d.endswith(".toml") else d for d in devices.split(","))


def _record(p: Point, doc: dict) -> dict:
    return {"key": p.key, "model": p.model, "sublayer": p.sublayer, "direction": p.direction,
            "tp": p.tp, "m": p.m, "n": p.n, "k": p.k, "device": p.device_name,
            "layers": p.layers,
            "collective": p.collective, "topology": p.topology, "system": p.system_name,
            "params": dict(p.params), "set": dict(doc["config"].get("overrides") or ()),
            "algorithm": doc["config"]["algorithm"], "device_spec": doc["device"],
            "lower_bounds_s": doc["lower_bounds_s"],
            "model_params_read": doc.get("model_params_read"),
            "gemm_kernel": doc.get("gemm_kernel"),  # the kernel the point's GEMMs ran
            "provenance": doc.get("provenance"),  # the code and files that made it
            "runs": [{k: r.get(k) for k in RUN_KEYS} for r in doc["runs"]]}


def _point_file(path: Path) -> dict | None:
    """A point's JSON left by an earlier run, or None when it is damaged (not JSON, not a
    run's document): the point then runs again, and the sweep says so."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        doc = None
    if (not isinstance(doc, dict) or not isinstance(doc.get("config"), dict)
            or results_problem({"points": [{"key": "", "runs": doc.get("runs")}]})):
        click.echo(f"t3emu: {path} is damaged; its point runs again", err=True)
        return None
    return doc


def _matches(p: Point, cfg: RunConfig, doc: dict) -> bool:
    """A point JSON left by an earlier run of the same point (same shape, modes, kind)."""
    c = doc.get("config", {})
    keys = ("ranks", "collective", "topology", "mode", "m", "n", "k", "dtype", "timing_only",
            "system", "causes") + (() if cfg.system else ("device",))  # a system's job is
    # launched without --device (the system names its GPU)
    def want(k):  # (a file the run read is shown as ``provenance.shown`` shows it)
        v = getattr(cfg, k)
        return provenance.shown(v) if k in provenance.PATH_KEYS and isinstance(v, str) else v
    return (all(c.get(k) == want(k) for k in keys)
            and tuple(c.get("ablate", ())) == cfg.ablate
            and [tuple(x) for x in c.get("params", ())] == list(cfg.params)
            and [tuple(x) for x in c.get("overrides", ())] == list(cfg.overrides)
            and len(doc.get("runs", [])) == len(cfg.modes))


def csv_text(header: dict, points: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for pt in points:
        for r in pt["runs"]:
            dram = r["dram_bytes"]
            parts = (r.get("causes") or {}).get("parts_s") or {}  # (older sweeps: fewer causes)
            w.writerow([pt["model"], pt["sublayer"], pt["direction"], pt["tp"], pt["m"], pt["n"],
                        pt["k"], pt["device"],
                        pt.get("collective", header["collective"]),
                        pt.get("topology", header["topology"]),
                        header["dtype"], r["mode"], repr(r["modelled_time_s"]),
                        "" if r["speedup_vs_sequential"] is None
                        else repr(r["speedup_vs_sequential"]),
                        sum(dram.values()), *(dram.get(c, 0) for c in CATEGORIES),
                        r["numerics"], "" if r["max_abs_error"] is None else r["max_abs_error"],
                        f"{r['wall_time_s']:.3f}",
                        *("" if r.get(k) is None else repr(r[k])
                          for k in ("ect_s", "overlap_efficiency")),
                        pt.get("system", ""),
                        ";".join(f"{b}={v!r}" for b, v in (r.get("speedup_vs") or {}).items()),
                        (r.get("search") or {}).get("chosen", ""),
                        ";".join(f"{n}={v!r}" for n, v in (pt.get("params") or {}).items()),
                        repr(max(r["rank_skew"])) if r.get("rank_skew") else "",
                        r.get("baseline") or "",
                        "" if r.get("speedup") is None else repr(r["speedup"]),
                        *(repr(parts[c]) if c in parts else "" for c in (*ORDER, "overlap")),
                        describe(tuple((pt.get("set") or {}).items())),
                        *_made_by(pt, header)])
    return buf.getvalue()


def _made_by(pt: dict, header: dict) -> tuple[str, str, str]:
    """A CSV row's version, commit (+ "-dirty" from a modified checkout) and code hash: its
    point's own, else the sweep's."""
    pv = pt.get("provenance") or header.get("provenance") or {}
    commit = pv.get("commit") or ""
    if commit and pv.get("clean") is False:
        commit += "-dirty"
    return pv.get("t3emu", ""), commit, pv.get("code", "")


def load_results(out: Path) -> dict | None:
    path = out / "results.json"
    if not path.exists():
        return None
    return read_results(path)


def read_results(path: Path) -> dict:
    """A sweep's ``results.json``, its structure checked: a file that is not JSON, or whose
    points and runs are not what a sweep writes (edited, truncated by hand, another tool's)
    raises ScenarioError naming the file and what is wrong."""
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:  # atomic writes: only if edited
        raise ScenarioError(f"{path} is not valid JSON ({exc}); rerun the sweep into its "
                            f"directory (finished point files are kept)")
    problem = results_problem(doc)
    if problem:
        raise ScenarioError(f"{path} is damaged: {problem}; rerun the sweep into its "
                            f"directory (finished point files are kept)")
    return doc


def results_problem(doc) -> str:
    """What is wrong with a results document's structure ("" if nothing)."""
    if not isinstance(doc, dict):
        return f"a JSON {type(doc).__name__}, not an object"
    points = doc.get("points", [])
    if not isinstance(points, list):
        return "'points' is not a list"
    for i, pt in enumerate(points):
        if not isinstance(pt, dict) or not isinstance(pt.get("key"), str):
            return f"point {i} is not an object with a 'key'"
        runs = pt.get("runs")
        if not isinstance(runs, list):
            return f"point {pt['key']!r} has no list of 'runs'"
        for r in runs:
            if not isinstance(r, dict) or not isinstance(r.get("mode"), str):
                return f"a run of point {pt['key']!r} is not an object with a 'mode'"
            t = r.get("modelled_time_s")
            if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float))):
                return f"run {r['mode']!r} of point {pt['key']!r} has a non-numeric time"
    return ""


def failing_runs(doc: dict) -> list[tuple[str, str]]:
    """(point key, configuration) of every run of a sweep whose numerics check failed."""
    return [(p["key"], r["mode"]) for p in doc.get("points") or []
            for r in p.get("runs") or [] if r.get("numerics") == "fail"]


def without_failing(doc: dict) -> dict:
    """The sweep with every run whose numerics check failed left out of its point (a wrong
    result has no time worth reporting: no table, figure, geomean or verdict uses it;
    a configuration whose baseline failed then has no speedup there), and the runs left
    out listed under ``excluded_failing``."""
    bad = failing_runs(doc)
    if not bad:
        return doc
    pts = [{**p, "runs": [r for r in p["runs"] if r.get("numerics") != "fail"]}
           for p in doc["points"]]
    return {**doc, "points": pts, "excluded_failing": bad}


def _failed_point(pt: dict) -> bool:
    return any(r.get("numerics") == "fail" for r in pt.get("runs") or [])


JSON_EVERY_S = 20.0  # results.json rewritten at most this often while a sweep runs


def save(out: Path, header: dict, points: list[dict], whole: bool = True) -> None:
    """results.csv, and with ``whole`` results.json (every point's document)."""
    if whole:
        write_json_atomic(out / "results.json", {**header, "points": points})
    write_text_atomic(out / "results.csv", csv_text(header, points))


def _progress(todo: list, tty: bool):
    """A progress bar on a terminal; without one (a log, a pipe) the points as they are and
    the loop prints a line per point."""
    import contextlib

    if not tty:
        return contextlib.nullcontext(todo)
    return click.progressbar(todo, label="points", file=sys.stderr, show_pos=True,
                             show_eta=True, item_show_func=lambda x: x[0].label() if x else "",
                             width=24)


def _to_run(sc: Scenario, out: Path, done: dict, timing_only: bool, watchdog_s: float,
            configs, ablate, causes, overrides, mixed: bool = False) -> list:
    """The points still to run, each with its configuration, every one checked (options,
    device, memory) before the first job; a point file finished just before an
    interruption joins ``done`` instead."""
    from emulator.app.files import OutputError
    from emulator.app.launcher import LauncherError, preflight

    todo = []
    code = provenance.code_hash()
    for p in sc.points:
        if p.key in done:
            continue
        cfg = point_config(sc, p, out, timing_only, watchdog_s, configs, ablate, causes,
                           overrides)
        path = Path(cfg.json)
        if path.exists():  # finished just before an interruption: keep it
            doc = _point_file(path)
            if doc is not None and _matches(p, cfg, doc) and not _failed_point(doc):
                made_by = (doc.get("provenance") or {}).get("code")
                if made_by != code and not mixed:
                    raise ScenarioError(
                        f"{path} was made by other code (code {made_by}, this is {code}); "
                        f"use another --out directory, or --mixed to keep it, marked")
                done[p.key] = _record(p, doc)
                continue
        todo.append((p, cfg))
    for p, cfg in todo:
        try:
            preflight(cfg, cfg.ranks)
        except (ConfigError, OutputError) as exc:
            raise ScenarioError(f"{sc.path}: point {p.label()}: {exc}") from None
        except LauncherError as exc:  # (not the point's: every point's)
            raise ScenarioError(exc.message) from None
    return todo


def run_sweep(sc: Scenario, out: Path, timing_only: bool, watchdog_s: float,
              configs: tuple[str, ...] = (), ablate: tuple[str, ...] = (),
              causes: bool = False, overrides: tuple = (), mixed: bool = False) -> int:
    """Run the scenario's missing points; return 0 if every point finished and passed.
    ``configs``: configuration files to register in every point's job (``--configs``).
    ``mixed``: keep points made by other code or files (``provenance.mismatch``) instead
    of refusing them; the results then say ``mixed_provenance`` and each point its own."""
    header = _header(sc, timing_only, configs, ablate, causes, overrides)
    try:
        prior = load_results(out)
    except ScenarioError as exc:  # rebuilt from the point files, the sweep's own record
        click.echo(f"t3emu: {exc}; it is rebuilt from the point files", err=True)
        prior = None
    done: dict[str, dict] = {}
    if prior is not None:
        for key in ("scenario", "timing_only", "collective", "topology", "dtype", "modes",
                    "configs", "ablate", "causes", "set"):
            if prior.get(key, _OLD.get(key)) != header.get(key):
                raise ScenarioError(f"{out} holds a sweep with {key} = {prior.get(key)!r}, not "
                                    f"{header.get(key)!r}; use another --out directory")
        done = {pt["key"]: pt for pt in prior.get("points", []) if not _failed_point(pt)}
        # (a point whose numerics failed stays failed until a rerun passes: it runs again)
        differs = provenance.mismatch(prior.get("provenance"), header["provenance"]) \
            if done else ""
        if differs and not mixed:
            raise ScenarioError(f"{out} holds points made by other code or files ({differs}); "
                                f"use another --out directory, or --mixed to keep them, "
                                f"each marked with what made it")
        if differs or prior.get("mixed_provenance"):
            header["mixed_provenance"] = True
    made = [d for d in (out / "points", out / "logs") if not d.exists()]
    for d in made:
        d.mkdir(parents=True)
    try:
        todo = _to_run(sc, out, done, timing_only, watchdog_s, configs, ablate, causes,
                       overrides, mixed)
    except BaseException:  # a refusal leaves nothing it made behind
        for d in made:
            with contextlib.suppress(OSError):
                d.rmdir()  # (only if still empty)
        raise

    def ordered() -> list[dict]:
        return [done[p.key] for p in sc.points if p.key in done]

    save(out, header, ordered())
    kind = "timing-only" if timing_only else "numeric"
    runs = sum(len(p.modes) for p in sc.points)
    click.echo(f"sweep {sc.name}: {len(sc.points)} points, {runs} runs of {len(sc.modes)} "
               f"configurations ({kind}); {len(sc.points) - len(todo)} already done in {out}",
               err=True)
    failed: list[str] = []
    t0 = time.monotonic()
    tty = sys.stderr.isatty()
    from emulator.app.pool import Pool

    todo.sort(key=lambda pc: Pool.key_of(pc[1]))  # (stable) one pooled job per job size
    saved = [time.monotonic(), True]  # when results.json was last written; is it current
    try:
        _run_points(sc, out, todo, tty, header, done, ordered, failed, saved)
    finally:  # however the loop ends (Ctrl-C, an error): results.json holds every point
        if not saved[1]:
            save(out, header, ordered())
    return _finish(sc, out, done, todo, failed, t0)


def _run_points(sc: Scenario, out: Path, todo: list, tty: bool, header: dict, done: dict,
                ordered, failed: list[str], saved: list) -> None:
    from emulator.app.launcher import launch
    from emulator.app.pool import pooled

    with pooled(), _progress(todo, tty) as bar:
        for i, (p, cfg) in enumerate(bar):
            path = Path(cfg.json)
            path.unlink(missing_ok=True)
            log = out / "logs" / f"{_file_key(p)}.log"
            t_point = time.monotonic()
            with open(log, "w") as fh:
                rc = launch(cfg, stdout=fh, stderr=fh)
            if not tty:  # a log file or a pipe: a line per point
                click.echo(f"sweep {sc.name}: [{i + 1}/{len(todo)}] {p.label()}: "
                           f"{'done' if path.exists() else f'FAILED (exit {rc})'} in "
                           f"{time.monotonic() - t_point:.0f} s", err=True)
            if not path.exists():
                failed.append(f"{p.label()}: the job failed (exit {rc}), see {log}")
                continue
            doc = json.loads(path.read_text())
            done[p.key] = _record(p, doc)
            whole = time.monotonic() - saved[0] >= JSON_EVERY_S
            save(out, header, ordered(), whole)
            saved[:] = [time.monotonic(), True] if whole else [saved[0], False]
            bad = [r["mode"] for r in doc["runs"] if r["numerics"] == "fail"]
            if bad:
                failed.append(f"{p.label()}: numerics FAIL in {', '.join(bad)}, see {log}")


def _finish(sc: Scenario, out: Path, done: dict, todo: list, failed: list[str],
            t0: float) -> int:
    wall = time.monotonic() - t0
    click.echo(f"sweep {sc.name}: {len(done)}/{len(sc.points)} points in {out / 'results.csv'}"
               f" ({len(todo)} run now in {wall:.0f} s)", err=True)
    for line in failed:
        click.echo(f"t3emu: {line}", err=True)
    return 1 if failed else 0
