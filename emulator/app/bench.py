"""``t3emu bench``: the emulator's own speed and size on this machine, against its floor.

Every figure is measured side by side in one run (``python -m emulator.app.bench`` jobs and
``t3emu`` subprocesses, one after another, each with one BLAS thread per rank):

- ``gemm_vs_numpy_ratio``: the emulator's GEMM stages (operand widening, every stage of
  the plain GEMM's WGs with the device's tiles and stage size) over numpy's ``matmul``,
  same shape, same thread count, as throughput (GFLOP/s); best of several alternating
  repetitions. Also for fp16 (numpy: widen both operands, then fp32 ``matmul``).
- ``overhead_vs_bare_ratio``: wall time of one fused ``t3`` all-reduce run (4 ranks,
  M=N=2048, K=1024 fp32; ``runs.run_mode`` whole: plan, maps, HBM binding, GEMM,
  DMA, the AG kernel) over a bare run of the same arithmetic and data movement (numpy
  ``matmul``, MPI ``Reduce_scatter_block`` and ``Allgather``) on the same ranks, the
  median of alternating repetitions after one warm-up of each. Both results are checked
  against the reference outside the timed region.
- ``startup_s_8`` / ``startup_s_32``: ``t3emu run`` launched (a subprocess) until every
  rank has begun its first GEMM stage (inputs made, the reference computed; a GEMM's
  run imports no numba); ``startup_timing_only_s_8`` / ``_32``: the same run
  timing-only (no inputs, no reference).
- ``rss_mb_per_rank``: peak resident memory per rank of a timing-only 64-rank AR (RSS
  counts shared pages, the MPI shared-memory segments and libraries, in every rank;
  the scale rows add each rank's PSS and how much the host's available memory fell).
- ``timing_only_points_per_min``: ``t3emu sweep t3-paper --timing-only`` throughput
  (pooled jobs); ``sweep_pooled_speedup``: the same sweep with a job per point
  (``T3EMU_NO_POOL=1``) over pooled, run one after the other, their modelled times
  compared.
- ``scale``: timing-only ARs (the default shape, sequential and t3) with 8 to 128 ranks,
  and ``size``: numeric ARs on 4 ranks with M=N from 1024 to 4096: wall time and memory,
  how the cost grows.

- ``papers``: one representative point per paper (``PAPER_POINTS``: the slow kind of each
  paper's sweep), ``t3emu run ... --timing-only`` and again with ``--causes``: wall time
  of the whole job against the figures recorded in docs/bench.json (its ``papers``
  section, written by ``t3emu bench --only papers --record docs/bench.json``) as a ratio,
  and whether the modelled times equal the recorded ones. A change that adds a mechanism
  says how these ratios moved.

``--quick`` runs every part at toy sizes (a smoke test of the bench itself; its figures
say nothing about performance).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

PARTS = ("gemm", "overhead", "startup", "memory", "sweep", "scale", "size", "papers")
# ``papers``: one representative point per paper, the slow kind of its sweep (docs/
# performance.md, "Where a point's time goes"), run as ``t3emu run ... --timing-only`` and
# again with ``--causes``; its wall times are compared with those recorded in
# docs/bench.json (``papers``), its modelled times must equal theirs
_FICCO_MODES = ("ficco-serial,ficco-shard,ficco-uniform-fused-1d,ficco-hetero-fused-1d,"
                "ficco-hetero-unfused-1d,ficco-uniform-fused-2d,ficco-cu-uniform-fused-1d,"
                "ficco-cu-hetero-fused-1d,ficco-cu-hetero-unfused-1d,ficco-cu-uniform-fused-2d,"
                "ficco-cu,ficco-auto,ficco-ideal,ficco-dil,ficco-cil")
PAPER_POINTS = {  # paper -> (what the point is, ``t3emu run`` options): t3-paper's,
    # flux-paper's, fused-ops-paper's and ficco-paper's point of that key, with its modes
    "t3": ("MT-NLG FC-2 TP32 on t3-sim (t3-paper)",
           ["-n", "32", "--device", "t3-sim", "--topology", "ring", "--collective", "ar",
            "--m", "2048", "--n", "20480", "--k", "2560", "--mode", "sequential,t3,t3-mca"]),
    "flux": ("GPT-3 175B AG-GEMM m=8192 on h800-x8 (flux-paper)",
             ["--system", "h800-x8", "--collective", "ag+gemm", "--m", "8192", "--n", "6144",
              "--k", "12288", "--dtype", "bf16", "--mode",
              "sequential,te-best,flux-ag,flux-ag-tile2,flux-ag-tile4,flux-ag-tile8,"
              "flux-ag-pull,flux-ag-pull-tile2,flux-ag-pull-tile4,flux-ag-pull-tile8,"
              "flux-ag-noswizzle,flux-best"]),
    "fused": ("DLRM embedding + A2A B=1024 on mi210-2node (fused-ops-paper)",
              ["--system", "mi210-2node", "--collective", "emb+a2a", "--m", "1024", "--n",
               "256", "--k", "10", "--param", "tables=256", "--mode",
               "sequential,ideal-overlap,fused,fused-oblivious"]),
    "ficco": ("g14 EP Mixtral on mi300x-x8 (ficco-paper)",
              ["--system", "mi300x-x8", "--collective", "a2a+gemm", "--m", "147456", "--n",
               "28672", "--k", "4096", "--mode", _FICCO_MODES]),
}
RECORDED = Path(__file__).resolve().parents[2] / "docs" / "bench.json"  # (a checkout's)
TARGETS = {"gemm_vs_numpy_ratio": (">=", 0.9), "overhead_vs_bare_ratio": ("<=", 1.25),
           # the target for `t3emu run -n 32` on a 2-core machine (docs/performance.md)
           "startup_s_32": ("<=", 8.0), "startup_timing_only_s_32": ("<=", 8.0)}
STEP_TIMEOUT_S = 1200


class BenchError(RuntimeError):
    pass


# ------------------------------------------------------------------ jobs (child side)

def _gemm_job(m: int, n: int, k: int, reps: int) -> dict:
    """In this process (one BLAS thread): emulator GEMM stages vs numpy matmul."""
    import numpy as np

    from collectives.common import Problem, plain_gemm
    from devices import kernels
    from devices.spec import load_device
    from emulator.engine.plan import Slots

    spec = load_device("t3-sim")
    out = {}
    for dtype in ("fp32", "fp16"):
        dt = np.float32 if dtype == "fp32" else np.float16
        p = Problem(0, 1, m, n, k, spec, np.dtype(dt))
        job, _ = plain_gemm(p, Slots())
        stages = [job.wgs[ids] for ids in job.stages()]
        rng = np.random.default_rng(0)
        a = rng.integers(-2, 3, (m, k)).astype(dt)
        b = rng.integers(-2, 3, (k, n)).astype(dt)
        canvas = np.empty((m, n), np.float32)

        def emulator() -> np.ndarray:
            a32, b32 = kernels.widen(a), kernels.widen(b)
            for wgs in stages:
                kernels.gemm_blocks(a32, b32, wgs, canvas)
            return canvas

        def numpy_matmul() -> np.ndarray:
            return a.astype(np.float32) @ b.astype(np.float32) if dt == np.float16 else a @ b

        best = {"emulator": float("inf"), "numpy": float("inf")}
        for rep in range(reps):
            for name, fn in ((("emulator", emulator), ("numpy", numpy_matmul)) if rep % 2 == 0
                             else (("numpy", numpy_matmul), ("emulator", emulator))):
                t0 = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t0)
        if not np.array_equal(emulator(), numpy_matmul()):
            raise BenchError(f"GEMM bench: the emulator's {dtype} product differs from numpy's")
        flop = 2.0 * m * n * k
        out[dtype] = {"emulator_gflops": flop / best["emulator"] / 1e9,
                      "numpy_gflops": flop / best["numpy"] / 1e9,
                      "ratio": best["numpy"] / best["emulator"],
                      "emulator_s": best["emulator"], "numpy_s": best["numpy"],
                      "stages": len(stages), "wgs": int(len(job.wgs))}
    out["blas_threads"] = os.environ.get("OPENBLAS_NUM_THREADS")
    return out


def _overhead_job(m: int, n: int, k: int, reps: int, watchdog_s: float = 60.0) -> dict | None:
    """Under MPI: fused t3 AR runs of the emulator vs bare numpy + MPI collectives."""
    import numpy as np
    from mpi4py import MPI

    from collectives.common import ring_chunks
    from emulator.runtime import watchdog
    from emulator.app.config import RunConfig
    from collectives.reference import check, compute_reference, make_inputs
    from emulator.app.runs import run_mode
    from emulator.engine.runner import DeviceMemory
    from emulator.runtime.process import warm_kernels

    comm = MPI.COMM_WORLD
    world = comm.size
    if m % world:
        raise BenchError(f"overhead bench: M={m} must divide among {world} ranks")
    cfg = RunConfig(ranks=world, collective="ar", mode="t3", m=m, n=n, k=k,
                    dtype="fp32", watchdog_s=watchdog_s).validate()
    watchdog.open_board(comm)
    spec = cfg.load_spec()
    warm_kernels(comm, cfg.watchdog_s, cfg.operation.producer)
    a, b = make_inputs(m, n, k, "fp32", "int", cfg.seed, comm.rank)
    op = cfg.operation
    ref, tol = compute_reference(comm, a, b, "fp32", "int", ring_chunks(m, world), op.reference,
                                 op.parts.consumer, world)
    memory = DeviceMemory(comm)

    def bare() -> np.ndarray:
        c = a @ b
        part = np.empty((m // world, n), np.float32)
        comm.Reduce_scatter_block(c, part, op=MPI.SUM)
        out = np.empty((m, n), np.float32)
        comm.Allgather(part, out)
        return out

    def t3() -> np.ndarray:
        return run_mode(comm, cfg, spec, {"A": a, "B": b}, "t3", memory).result

    wall: dict[str, list[float]] = {"bare": [], "t3": []}
    cpu: dict[str, list[float]] = {"bare": [], "t3": []}
    for rep in range(reps + 1):  # repetition 0 warms both up and is not counted
        for name, fn in ((("bare", bare), ("t3", t3)) if rep % 2 == 0
                         else (("t3", t3), ("bare", bare))):
            comm.Barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            result = fn()
            c1 = time.process_time()
            comm.Barrier()
            t1 = time.perf_counter()
            ok, err, note = check(result, ref, tol)  # not timed
            if not comm.allreduce(ok, MPI.LAND):
                raise BenchError(f"overhead bench: {name} result fails the reference: {note}")
            if rep:
                wall[name].append(t1 - t0)
                cpu[name].append(c1 - c0)
    memory.free()
    watchdog.close_board()
    cpus = comm.gather(cpu, root=0)
    if comm.rank:
        return None
    med = {name: float(np.median(v)) for name, v in wall.items()}
    return {"ranks": world, "m": m, "n": n, "k": k, "dtype": "fp32", "reps": reps,
            "wall_s": wall, "median_s": med, "ratio": med["t3"] / med["bare"],
            "cpu_s_per_rank": {name: [float(np.median(c[name])) for c in cpus]
                               for name in wall}}


def job_main(argv: list[str]) -> int:
    from emulator.runtime.process import install_abort_handlers, pin_threads

    pin_threads()
    kind, args = argv[0], [int(x) for x in argv[1:5]]
    if kind == "gemm":
        print(json.dumps(_gemm_job(*args)), flush=True)
        return 0
    install_abort_handlers()
    doc = _overhead_job(*args, *map(float, argv[5:6]))
    if doc is not None:
        print(json.dumps(doc), flush=True)
    return 0


# ------------------------------------------------------------------ orchestration

def _env() -> dict:
    from emulator.runtime.process import pin_threads

    env = pin_threads(dict(os.environ))
    env.pop("T3EMU_PID_DIR", None)
    return env


def _run(argv: list[str], what: str, timeout: float = STEP_TIMEOUT_S,
         env: dict | None = None) -> tuple[str, float]:
    """Run a step as its own process group (``env``: variables set for it); return
    (stdout, wall s); raise on failure."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env={**_env(), **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise BenchError(f"{what}: no result within {timeout:g} s")
    except BaseException:
        os.killpg(proc.pid, signal.SIGKILL)
        raise
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = "\n".join(err.strip().splitlines()[-8:])
        raise BenchError(f"{what} failed (exit {proc.returncode}):\n{tail}")
    return out, wall


def _last_json(out: str, what: str) -> dict:
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise BenchError(f"{what}: no result printed")


def _mpi_job(ranks: int, argv: list[str], what: str) -> dict:
    import shlex

    from emulator.app.launcher import find_mpiexec

    cmd = [*shlex.split(find_mpiexec()), "-n", str(ranks), sys.executable, "-m", "emulator.app.bench",
           *argv]
    return _last_json(_run(cmd, what)[0], what)


def _mem_available_mb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


class _MemoryWatch(threading.Thread):
    """The host's lowest MemAvailable while a step runs (every 0.2 s)."""

    def __init__(self):
        super().__init__(daemon=True)
        self.before = _mem_available_mb()
        self.lowest = self.before
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(0.2):
            now = _mem_available_mb()
            if now is not None and self.lowest is not None:
                self.lowest = min(self.lowest, now)

    def used_mb(self) -> float | None:
        self.done.set()
        self.join()
        return None if self.before is None else self.before - self.lowest


def _t3emu_run(args: list[str], tmp: Path, what: str,
               watchdog_s: float = 60.0) -> tuple[dict, float, float, float | None]:
    """``t3emu run ARGS --json`` as a user runs it: (its JSON, launch time, wall s, the
    host memory it took at its peak in MB)."""
    path = tmp / f"run-{len(list(tmp.iterdir()))}.json"
    watch = _MemoryWatch()
    watch.start()
    launched = time.time()
    try:
        _, wall = _run([sys.executable, "-m", "emulator.app.cli", "run", *args, "--json", str(path),
                        "--watchdog-s", repr(watchdog_s)], what)
    finally:
        used = watch.used_mb()
    return json.loads(path.read_text()), launched, wall, used


def machine() -> dict:
    import numpy as np

    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        model = platform.processor()
    mem = None
    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        pass
    import mpi4py

    mpi4py.rc.initialize = False  # the library's name only: this process is no MPI rank
    from mpi4py import MPI

    return {"cpu": model or platform.machine(), "cores": os.cpu_count(),
            "memory_gib": round(mem, 1) if mem else None, "os": platform.platform(),
            "python": platform.python_version(), "numpy": np.__version__,
            "mpi": MPI.Get_library_version().splitlines()[0].strip()}


def run_bench(parts: tuple[str, ...], quick: bool, scenario: str, log=print,
              watchdog_s: float = 60.0, against: Path | None = RECORDED,
              papers: tuple[str, ...] = tuple(PAPER_POINTS)) -> dict:
    """Run the chosen parts; return the results document (figures at the top level).
    ``against``: the file of recorded figures the ``papers`` part compares with;
    ``papers``: the papers whose points it runs."""
    from emulator.runtime import numba_cache
    from emulator.runtime.process import pin_threads

    os.environ.update({k: v for k, v in pin_threads(dict(os.environ)).items()
                       if k == "NUMBA_CACHE_DIR"})
    numba_cache.build()  # the loop kernels in numba's cache, once for every job below
    doc: dict = {"machine": machine(), "quick": quick, "parts": list(parts), "details": {}}
    det = doc["details"]
    t_all = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="t3emu-bench-") as tmpdir:
        tmp = Path(tmpdir)
        if "gemm" in parts:
            shape = (512, 512, 256) if quick else (2048, 2048, 1024)
            res = _last_json(_run([sys.executable, "-m", "emulator.app.bench", "gemm", *map(str, shape),
                                   "3" if quick else "7"], "GEMM bench")[0], "GEMM bench")
            det["gemm"] = {"m": shape[0], "n": shape[1], "k": shape[2], **res}
            doc["gemm_vs_numpy_ratio"] = res["fp32"]["ratio"]
            doc["gemm_vs_numpy_ratio_fp16"] = res["fp16"]["ratio"]
            log(f"gemm: {res['fp32']['emulator_gflops']:.1f} vs numpy "
                f"{res['fp32']['numpy_gflops']:.1f} GFLOP/s fp32 (ratio "
                f"{res['fp32']['ratio']:.3f}); fp16 ratio {res['fp16']['ratio']:.3f}")
        if "overhead" in parts:
            shape = (512, 512, 256) if quick else (2048, 2048, 1024)
            res = _mpi_job(4, ["overhead", *map(str, shape), "2" if quick else "7",
                               repr(watchdog_s)], "overhead bench")
            det["overhead"] = res
            doc["overhead_vs_bare_ratio"] = res["ratio"]
            log(f"overhead: t3 {res['median_s']['t3']:.3f} s vs bare "
                f"{res['median_s']['bare']:.3f} s (ratio {res['ratio']:.3f})")
        if "startup" in parts:  # numeric (numba's kernels loaded) and timing-only
            for kind, extra in (("", ["--dtype", "fp32"]), ("timing_only_", ["--timing-only"])):
                for ranks in ((2, 4) if quick else (8, 32)):
                    run, launched, wall, _ = _t3emu_run(
                        ["-n", str(ranks), "--m", "1024", "--n", "1024", "--k", "256",
                         "--mode", "t3", *extra], tmp, f"startup with {ranks} ranks", watchdog_s)
                    first = [t for t in run["first_gemm_stage_unix"] if t is not None]
                    key = f"startup_{kind}s_{ranks}"
                    doc[key] = max(first) - launched
                    det[key] = {"first_rank_s": min(first) - launched, "job_wall_s": wall}
                    log(f"startup ({kind.rstrip('_') or 'numeric'}): {ranks} ranks begin "
                        f"their first GEMM stage {doc[key]:.2f} s after launch (job "
                        f"{wall:.1f} s)")
        mem_ranks = 8 if quick else 64
        counts = sorted(({mem_ranks} if "memory" in parts else set())
                        | (set((2, 4) if quick else (8, 16, 32, 64, 128)) if "scale" in parts
                           else set()))
        for ranks in counts:
            run, _, wall, used = _t3emu_run(
                ["-n", str(ranks), "--timing-only", "--mode", "sequential,t3"], tmp,
                f"timing-only AR with {ranks} ranks", watchdog_s)
            rss = run["peak_rss_mb_per_rank"]
            pss = [x for x in run.get("pss_mb_per_rank") or [] if x is not None]
            entry = {"ranks": ranks, "wall_s": wall, "rss_mb_per_rank_max": max(rss),
                     "rss_mb_per_rank_mean": sum(rss) / len(rss),
                     "pss_mb_per_rank_mean": sum(pss) / len(pss) if pss else None,
                     "host_memory_used_mb": used,
                     "mode_wall_s": {r["mode"]: r["wall_time_s"] for r in run["runs"]},
                     "t3_speedup": run["runs"][1]["speedup_vs_sequential"]}
            det.setdefault("scale", {})[str(ranks)] = entry
            if ranks == mem_ranks and "memory" in parts:
                doc["rss_mb_per_rank"] = max(rss)
                doc["pss_mb_per_rank"] = entry["pss_mb_per_rank_mean"]
            log(f"scale: timing-only AR on {ranks} ranks in {wall:.1f} s, peak RSS "
                f"{max(rss):.0f} MB per rank; the host's memory in use rose by "
                f"{_gb(used)} at the peak")
        if "size" in parts:
            for mn in ((256, 512) if quick else (1024, 2048, 4096)):
                run, _, wall, used = _t3emu_run(
                    ["-n", "4", "--m", str(mn), "--n", str(mn), "--k", "1024", "--dtype", "fp32",
                     "--mode", "sequential,t3"], tmp, f"numeric AR with M=N={mn}", watchdog_s)
                entry = {"m": mn, "n": mn, "k": 1024, "ranks": 4, "wall_s": wall,
                         "mode_wall_s": {r["mode"]: r["wall_time_s"] for r in run["runs"]},
                         "rss_mb_per_rank_max": max(run["peak_rss_mb_per_rank"]),
                         "host_memory_used_mb": used,
                         "numerics": [r["numerics"] for r in run["runs"]]}
                det.setdefault("size", {})[str(mn)] = entry
                log(f"size: numeric AR, 4 ranks, M=N={mn} K=1024 fp32 in {wall:.1f} s (t3 run "
                    f"{entry['mode_wall_s']['t3']:.2f} s), peak RSS "
                    f"{entry['rss_mb_per_rank_max']:.0f} MB per rank")
        if "sweep" in parts:  # pooled jobs (the default) and a job per point, one after other
            walls, times = {}, {}
            for how, off in (("separate", "1"), ("pooled", "0")):
                out = tmp / f"sweep-{how}"
                _, walls[how] = _run([sys.executable, "-m", "emulator.app.cli", "sweep",
                                      scenario, "--timing-only", "--out", str(out),
                                      "--watchdog-s", repr(watchdog_s)],
                                     f"sweep {scenario} ({how} jobs)",
                                     env={"T3EMU_NO_POOL": off})
                pts = json.loads((out / "results.json").read_text())["points"]
                times[how] = [[r["modelled_time_s"] for r in p["runs"]] for p in pts]
            points = len(times["pooled"])
            doc["timing_only_points_per_min"] = points / (walls["pooled"] / 60)
            doc["sweep_pooled_speedup"] = walls["separate"] / walls["pooled"]
            det["sweep"] = {"scenario": scenario, "points": points, "wall_s": walls["pooled"],
                            "separate_wall_s": walls["separate"],
                            "same_modelled_times": times["pooled"] == times["separate"]}
            log(f"sweep: {scenario} --timing-only, {points} points in {walls['pooled']:.0f} s "
                f"pooled, {walls['separate']:.0f} s with a job per point (same modelled "
                f"times: {det['sweep']['same_modelled_times']})")
        if "papers" in parts:
            doc["papers"] = _papers(tmp, quick, watchdog_s, log, against, papers)
    doc["bench_wall_s"] = time.perf_counter() - t_all
    doc["targets"] = {key: {"want": f"{op} {value}", "met": _met(doc.get(key), op, value)}
                      for key, (op, value) in TARGETS.items() if key in doc}
    return doc


def _modelled(run: dict) -> dict:
    """A ``t3emu run --json`` document's modelled results: each configuration's time and,
    with causes, its counterfactual steps' times."""
    return {r["mode"]: [r["modelled_time_s"], *[st["time_s"] for st in
                                                (r.get("causes") or {}).get("steps", [])]]
            for r in run["runs"]}


def recorded_papers(against: Path | None) -> dict:
    """The ``papers`` section of a bench document (docs/bench.json), {} if none."""
    if against is None or not Path(against).is_file():
        return {}
    try:
        return json.loads(Path(against).read_text()).get("papers") or {}
    except (OSError, ValueError) as exc:
        raise BenchError(f"{against}: not a bench document ({exc})") from None


def _papers(tmp: Path, quick: bool, watchdog_s: float, log, against: Path | None,
            papers: tuple[str, ...] = tuple(PAPER_POINTS)) -> dict:
    """Each paper's point timing-only, then with ``--causes``: wall time (the whole job,
    start-up included) against the recorded one, and whether the modelled times equal the
    recorded ones (they must: the same model gives the same numbers)."""
    before = recorded_papers(against)
    out: dict = {}
    for paper in papers:
        label, args = PAPER_POINTS[paper]
        if quick:  # a toy point of the same operation and system: the bench's own test
            args = _toy(args)
        entry: dict = {"point": label, "args": args}
        for kind, extra in (("timing_only", []), ("causes", ["--causes"])):
            run, _, wall, _ = _t3emu_run([*args, "--timing-only", *extra], tmp,
                                         f"{paper} point ({kind})", watchdog_s)
            entry[f"{kind}_wall_s"] = wall
            entry[f"{kind}_modelled"] = _modelled(run)
            old = before.get(paper) or {}  # (a point measured with the same options only)
            if old.get(f"{kind}_wall_s") and old.get("args") == args:
                entry[f"{kind}_ratio"] = wall / old[f"{kind}_wall_s"]
                entry[f"{kind}_same_modelled"] = old.get(f"{kind}_modelled") == \
                    entry[f"{kind}_modelled"]
            ratio = entry.get(f"{kind}_ratio")
            log(f"papers: {paper} ({label}), {kind.replace('_', '-')}: {wall:.1f} s"
                + ("" if ratio is None else f", {ratio:.2f}x the recorded "
                   f"{old[f'{kind}_wall_s']:.1f} s (same modelled times: "
                   f"{entry[f'{kind}_same_modelled']})"))
        out[paper] = entry
    return out


def record(doc: dict, path: Path) -> None:
    """Write ``doc``'s ``papers`` figures, with the machine and commit they were measured
    on, into the bench document at ``path`` (created if absent), keeping its other figures."""
    from emulator.app.files import write_json_atomic
    from emulator.app.provenance import git

    try:
        old = json.loads(path.read_text()) if path.is_file() else {}
    except (OSError, ValueError) as exc:
        raise BenchError(f"{path}: not a bench document ({exc})") from None
    if set(doc["papers"]) != set(PAPER_POINTS):
        raise BenchError(f"--record needs every paper's point ({', '.join(PAPER_POINTS)})")
    old["papers"] = doc["papers"]
    old["papers_measured_on"] = {"machine": doc["machine"], "commit": git()[0]}
    write_json_atomic(path, old)


def _toy(args: list[str]) -> list[str]:
    """A paper point's options at toy sizes (``--quick``): M, N, K at most 512, 256, 256,
    at most 4 ranks where the point names them and 8 embedding tables, its first three
    configurations (the baseline first), the same operation and system."""
    out, i = [], 0
    caps = {"--m": 512, "--n": 256, "--k": 256, "-n": 4}  # not a parameter: toy sizes
    while i < len(args):
        a = args[i]
        if a in caps:
            out += [a, str(min(int(args[i + 1]), caps[a]))]
            i += 2
            continue
        if a == "--mode":
            out += [a, ",".join(args[i + 1].split(",")[:3])]  # not a parameter: toy size
            i += 2
            continue
        if a == "--param" and args[i + 1].startswith("tables="):
            out += [a, f"tables={min(int(args[i + 1].split('=')[1]), 8)}"]
            i += 2
            continue
        out.append(a)
        i += 1
    return out


def _gb(mb: float | None) -> str:
    return "?" if mb is None else f"{mb / 1024:.1f} GB"


def _met(x, op: str, value: float) -> bool | None:
    if x is None:
        return None
    return x >= value if op == ">=" else x <= value


def table(doc: dict) -> str:
    m = doc["machine"]
    det = doc["details"]
    lines = [f"t3emu bench{' (--quick: toy sizes, not performance figures)' if doc['quick'] else ''}"
             f" on {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python "
             f"{m['python']}, numpy {m['numpy']}, {m['mpi']}"]
    rows: list[dict] = []

    def row(key: str, fmt: str, note: str) -> None:
        if key not in doc:
            return
        t = doc["targets"].get(key)
        mark = "" if t is None else f"{t['want']}{'' if t['met'] else ' MISSED'}"
        rows.append({"figure": key, "value": format(doc[key], fmt), "target": mark,
                     "notes": note})

    if "gemm" in det:
        g = det["gemm"]
        shape = f"M={g['m']} N={g['n']} K={g['k']}"
        row("gemm_vs_numpy_ratio", ".3f", f"fp32 {shape}: {g['fp32']['emulator_gflops']:.1f} vs "
            f"{g['fp32']['numpy_gflops']:.1f} GFLOP/s, 1 BLAS thread")
        row("gemm_vs_numpy_ratio_fp16", ".3f", f"fp16 {shape}: {g['fp16']['emulator_gflops']:.1f}"
            f" vs {g['fp16']['numpy_gflops']:.1f} GFLOP/s (numpy: widen, fp32 matmul)")
    if "overhead" in det:
        o = det["overhead"]
        row("overhead_vs_bare_ratio", ".3f", f"t3 AR, {o['ranks']} ranks, M=N={o['m']} K={o['k']}"
            f" fp32: {o['median_s']['t3']:.3f} s vs bare {o['median_s']['bare']:.3f} s "
            f"(median of {o['reps']})")
    for key in sorted((k for k in doc if k.startswith("startup_")),
                      key=lambda k: ("timing" in k, int(k.rsplit("_", 1)[1]))):
        row(key, ".2f", f"launch -> every rank in its first GEMM stage (first rank "
            f"{det[key]['first_rank_s']:.2f} s){', timing-only' if 'timing' in key else ''}")
    if "rss_mb_per_rank" in doc:
        pss = doc.get("pss_mb_per_rank")
        row("rss_mb_per_rank", ".0f", f"peak RSS per rank, timing-only AR, "
            f"{8 if doc['quick'] else 64} ranks (PSS {'-' if pss is None else f'{pss:.0f}'} MB: "
            f"shared pages counted once)")
    if "sweep" in det:
        s = det["sweep"]
        row("timing_only_points_per_min", ".1f", f"sweep {s['scenario']} --timing-only: "
            f"{s['points']} points in {s['wall_s']:.0f} s (pooled jobs)")
        row("sweep_pooled_speedup", ".2f", f"the same sweep with a job per point over pooled: "
            f"{s['separate_wall_s']:.0f} / {s['wall_s']:.0f} s; same modelled times: "
            f"{s['same_modelled_times']}")
    for paper, e in (doc.get("papers") or {}).items():
        for kind in ("timing_only", "causes"):
            ratio = e.get(f"{kind}_ratio")
            same = e.get(f"{kind}_same_modelled")
            rows.append({"figure": f"papers: {paper}, {kind.replace('_', '-')}",
                         "value": f"{e[f'{kind}_wall_s']:.1f}s",
                         "target": "" if ratio is None else f"{ratio:.2f}x recorded",
                         "notes": f"{e['point']}; `t3emu run ... --timing-only"
                                  f"{' --causes' if kind == 'causes' else ''}`"
                                  + ("" if same is None else
                                     f"; modelled times {'equal' if same else 'DIFFER from'}"
                                     f" the recorded")})
    for ranks, e in sorted(det.get("scale", {}).items(), key=lambda kv: int(kv[0])):
        pss = e["pss_mb_per_rank_mean"]
        rows.append({"figure": f"scale: {ranks} ranks", "value": f"{e['wall_s']:.1f}s",
                     "target": "", "notes": f"timing-only AR (sequential, t3): peak RSS "
                     f"{e['rss_mb_per_rank_max']:.0f} MB/rank (PSS "
                     f"{'-' if pss is None else f'{pss:.0f}'} MB), host memory "
                     f"+{_gb(e['host_memory_used_mb'])}; t3 {e['t3_speedup']:.3f}x"})
    for mn, e in sorted(det.get("size", {}).items(), key=lambda kv: int(kv[0])):
        rows.append({"figure": f"size: M=N={mn}", "value": f"{e['wall_s']:.1f}s", "target": "",
                     "notes": f"numeric AR, 4 ranks, K=1024 fp32 (sequential, t3; t3 run "
                     f"{e['mode_wall_s']['t3']:.2f} s): peak RSS "
                     f"{e['rss_mb_per_rank_max']:.0f} MB/rank, "
                     f"{'/'.join(e['numerics'])}"})
    from emulator.app.tables import render

    lines.append(render(rows, ["figure", "value", "target", "notes"], align={"value": "right"},
                        wrap=["notes"]))
    lines.append(f"bench wall time {doc['bench_wall_s']:.0f} s")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(job_main(sys.argv[1:]))
