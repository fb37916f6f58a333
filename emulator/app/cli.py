"""The ``t3emu`` command line.

Exit codes: 0 success; 1 a run failed or a numerics check failed; 2 bad usage.
``t3emu run`` starts ``mpiexec`` itself unless it already runs under MPI (as in
``mpiexec -n 8 t3emu run ...``). MPI and numba are imported only inside
commands, so ``--help`` is instant and needs no MPI.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from pathlib import Path


def _interrupted_early(signum, frame) -> None:
    """Ctrl-C while the command line loads (``_Cli.main`` then installs the handler of the
    whole run): one line (none from a rank of a job: its launcher says it), exit 130."""
    if not any(k.startswith(("PMI_", "PMIX_", "OMPI_")) for k in os.environ):
        sys.stderr.write("t3emu: interrupted\n")
        sys.stderr.flush()
    os._exit(130)


if (threading.current_thread() is threading.main_thread()  # first: before the imports,
        and os.path.basename(sys.argv[0]) in ("t3emu", "cli.py")):  # in the program only
    signal.signal(signal.SIGINT, _interrupted_early)

import click  # noqa: E402

from collectives import ALGORITHMS, TOPOLOGIES
from emulator.app import nccl_tests as nt
from emulator.app.catalog import registry
from emulator.app.config import VALUES, ConfigError, RunConfig
from emulator.app.launcher import under_mpi
from emulator.model.ablation import ORDER

_DEFAULT = RunConfig()
_REG = registry()
_OPS = ", ".join(_REG.names())
_CONFIGS = ", ".join(_REG.configurations)


def _what_ifs(command):
    """``--set KEY=VALUE`` (``run`` and ``sweep``)."""
    return click.option(
        "--set", "overrides", type=str, multiple=True, metavar="KEY=VALUE",
        help="Change a GPU preset or system key without editing files, e.g. --set gpu.cus=160 "
             "--set intra.link_gb_per_s_per_direction=300 (repeatable; keys: gpu.KEY, nodes, "
             "gpus_per_node, intra.KEY, network.KEY; see docs/what-ifs.md).")(command)


def _watchdog(command):
    """``--watchdog-s``, for every command that launches ranks."""
    return click.option(
        "--watchdog-s", type=float, default=_DEFAULT.watchdog_s, show_default=True,
        help="Abort a job when a rank has waited on a peer and no rank has made progress "
             "(a post, or CPU time of a busy thread) for this many wall seconds; raise it "
             "for a slow host.")(command)


def _check_watchdog(value: float) -> None:
    """One line and exit 2 for a --watchdog-s out of range (before any job)."""
    from emulator.app.config import MAX_WATCHDOG_S

    if not 0 < value <= MAX_WATCHDOG_S:  # also nan and inf
        _fail_usage(ConfigError("--watchdog-s", value,
                                f"seconds, more than 0 and at most {MAX_WATCHDOG_S:g}"))


def _overrides(items: tuple[str, ...]) -> tuple:
    """``--set`` items as (key, value) pairs; a malformed one is a usage error naming it."""
    from devices.overrides import parse
    from devices.spec import SpecError

    out = []
    for item in items:
        try:
            out.append(parse(item))
        except SpecError as exc:
            _fail_usage(ConfigError("--set", item, str(exc)))
    return tuple(out)


def _counterfactuals(command):
    """``--ablate`` and ``--causes`` (``run`` and ``sweep``)."""
    command = click.option(
        "--causes", is_flag=True,
        help="Split each configuration's gain over its baseline into causes by "
             f"counterfactual runs (up to {len(ORDER) - 1} more timing-only runs of each "
             "configuration).")(command)
    return click.option(
        "--ablate", type=str, default="",
        help="Remove these costs from every run (a counterfactual): comma-separated from "
             f"{', '.join(ORDER)} (see docs/concepts.md, 'Causes of a gain').")(command)


def _fail_usage(exc: Exception) -> None:
    click.echo(f"t3emu: error: {exc}", err=True)
    sys.exit(2)


class _Cli(click.Group):
    """click's usage errors as one line on stderr (exit 2), like the emulator's own checks;
    Ctrl-C exits 130 without a traceback."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        from emulator.runtime.process import Interrupted, on_interrupt

        before = signal.getsignal(signal.SIGINT)
        on_interrupt(rank=under_mpi())  # Ctrl-C: one line from the launcher, exit 130
        try:
            rc = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except Interrupted:
            click.echo("t3emu: interrupted", err=True)
            sys.exit(130)
        except click.exceptions.NoArgsIsHelpError as exc:  # bare `t3emu`: the help
            click.echo(exc.ctx.get_help())
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            msg = " ".join(exc.format_message().split())
            click.echo(f"t3emu: error: {msg[0].lower() + msg[1:] if msg else msg}", err=True)
            sys.exit(exc.exit_code)
        except click.exceptions.Abort:
            click.echo("t3emu: interrupted", err=True)
            sys.exit(130)
        finally:  # (a caller in this process, as the tests' runner, gets its own back)
            if threading.current_thread() is threading.main_thread() and before is not None:
                signal.signal(signal.SIGINT, before)
        sys.exit(rc if isinstance(rc, int) else 0)


@click.group(cls=_Cli, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="t3emu")
def main() -> None:
    """Distributed emulator of multi-GPU systems: one emulated GPU per MPI rank."""


def _params(items: tuple[str, ...]) -> tuple[tuple[str, float], ...]:
    """``--param NAME=VALUE`` options as (name, number) pairs; a malformed one is a usage
    error naming it."""
    out = []
    for item in items:
        name, sep, value = item.partition("=")
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if not sep or not name.strip() or number != number:
            _fail_usage(ConfigError("--param", item, "NAME=VALUE with a number, e.g. "
                                    "tables=256"))
        out.append((name.strip(), number))
    return tuple(out)


@main.command()
@click.option("-n", "--ranks", type=int, default=_DEFAULT.ranks, show_default=True,
              help="Emulated GPUs (MPI ranks) to launch.")
@click.option("--collective", "--operation", "collective", type=str,
              default=_DEFAULT.collective, show_default=True,
              help=f"The operation: {_OPS} (rs = gemm+rs, ag-gemm = ag+gemm, ...; "
                   f"see `t3emu configs`).")
@click.option("--topology", type=str, default="",
              help=f"Interconnect: {', '.join(TOPOLOGIES)}; default: ring for an operation "
                   f"a ring runs, full-mesh for the direct-only ones (the all-to-alls).")
@click.option("--algorithm", type=str, default=None,
              help=f"{' or '.join(ALGORITHMS)}; default: ring on a ring, direct otherwise "
                   f"(a2a is direct only).")
@click.option("--mode", type=str, default=_DEFAULT.mode, show_default=True,
              help=f"Configurations: {_CONFIGS}, all (every one that applies to the "
                   f"operation), or a comma-separated list.")
@click.option("--m", "m", type=int, default=None,
              help="Rows of each device's GEMM output (tokens); default: the operation's "
                   "(8192 for the GEMM operations; `t3emu configs` says what M, N and K mean "
                   "for the others).")
@click.option("--n", "n", type=int, default=None,
              help="Columns of each device's GEMM output; default: the operation's (3072).")
@click.option("--k", "k", type=int, default=None,
              help="Each device's slice of the dot-product dimension; default: the "
                   "operation's (768).")
@click.option("--dtype", type=str, default=_DEFAULT.dtype, show_default=True,
              help="fp16 or bf16 (stored 2 bytes, fp32 accumulate, rounded once per write "
                   "or add) or fp32.")
@click.option("--device", type=str, default=_DEFAULT.device, show_default=True,
              help="Device preset name (see `t3emu devices`) or a TOML file.")
@click.option("--system", type=str, default=None,
              help="A system preset (see `t3emu devices`) or a system TOML file: its GPU, "
                   "topology and nodes (instead of --device and --topology; -n defaults to its "
                   "GPU count).")
@click.option("--split-k", type=int, default=_DEFAULT.split_k, show_default=True,
              help="WGs per output tile, each over a K slice (split-K GEMM).")
@click.option("--seed", type=int, default=_DEFAULT.seed, show_default=True)
@click.option("--values", type=str, default=_DEFAULT.values, show_default=True,
              help=f"Input values: {' or '.join(VALUES)} (int gives bit-exact fp32 checks).")
@_watchdog
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the results as JSON here (-: on standard output, the summary then "
                   "on standard error).")
@click.option("--timing-only", is_flag=True,
              help="Run the same schedule, maps, tracker and DMA protocol without payloads "
                   "(no numerics check): paper-scale shapes in seconds, same modelled times.")
@click.option("--trace", "trace_path", type=click.Path(dir_okay=False), default=None,
              help="Write a Chrome/Perfetto trace (modelled time, one process per rank) here.")
@click.option("--record-wall", is_flag=True, hidden=True,
              help="Include wall-clock stage/DMA events and modelled events in the JSON.")
@click.option("--configs", "configs", type=click.Path(dir_okay=False), multiple=True,
              help="A Python file that registers configurations of one's own (repeatable; "
                   "see docs/reference.md, 'Plugin files').")
@click.option("--hosts", type=str, default=None,
              help="Comma-separated hosts to spread the ranks over in blocks (MPICH's Hydra "
                   "mpiexec: -hosts, -ppn); see docs/clusters.md, 'Several hosts'.")
@click.option("--same-machine", is_flag=True,
              help="With --hosts: start every host's ranks on this machine, as separate nodes "
                   "to MPI (Hydra -launcher fork): tests the multi-node paths on one host.")
@click.option("--param", "params", type=str, multiple=True, metavar="NAME=VALUE",
              help="An operation's shape beyond M, N, K or a configuration's knob, e.g. "
                   "--param tables=256 --param occupancy=0.5 (repeatable; `t3emu configs` "
                   "names each operation's and configuration's parameters).")
@_what_ifs
@_counterfactuals
@click.option("--inject-fault", type=str, default=None, hidden=True,
              help="Test hook KIND@RANK, KIND one of: raise, raise-dma, kill, stall, drop-dma, "
                   "double-dma, nan-input, overflow (see emulator/app/config.py FAULTS).")
def run(ranks, collective, topology, algorithm, mode, m, n, k, dtype, device, system, split_k,
        seed, values, watchdog_s, json_path, timing_only, trace_path, record_wall,
        configs, hosts, same_machine, params, overrides, ablate, causes, inject_fault) -> None:
    """Run a GEMM fused (or not) with its collective; check numerics; report modelled time."""
    from emulator import api
    from emulator.app.files import OutputError

    ctx = click.get_current_context()
    given = {p: ctx.get_parameter_source(p) == click.core.ParameterSource.COMMANDLINE
             for p in ("ranks", "device")}
    mpi = under_mpi()
    if mpi:  # first: a rank that ends while loading a --configs file is then named
        from emulator.runtime.process import mark_rank

        mark_rank("pid")
    try:  # under mpiexec every rank checks the same options; memory is checked per node
        cfg = api.config(
            collective, ranks=ranks if given["ranks"] or not system else None, system=system,
            device=device if given["device"] or not system else None, topology=topology,
            algorithm=algorithm, modes=mode, m=m, n=n, k=k, dtype=dtype,
            params=_params(params), set=_overrides(overrides), timing_only=timing_only,
            seed=seed, values=values, split_k=split_k, causes=causes, ablate=ablate,
            configs=configs, watchdog_s=watchdog_s, json_path=json_path, trace=trace_path,
            hosts=tuple(h.strip() for h in hosts.split(",")) if hosts else (),
            same_machine=same_machine, ranks_here=0 if mpi else None,
            record_wall=record_wall, inject_fault=inject_fault)
    except (ConfigError, OutputError) as exc:
        if not mpi or os.environ.get("PMI_RANK", "0") == "0":
            _fail_usage(exc)
        sys.exit(2)
    if mpi:
        from emulator.app.worker import main as worker_main

        sys.exit(worker_main(cfg))
    rc = api.execute(cfg)
    sys.exit(rc if rc in (0, 2) else 1)  # 2: refused inside the job (memory of a node)


def _names(text: str) -> tuple[str, ...]:
    return tuple(x.strip() for x in text.split(",") if x.strip())


@main.command()
@click.argument("scenario")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True,
              help="Results directory (results.csv, results.json, points/, logs/); rerun with "
                   "the same directory to resume.")
@click.option("--timing-only", is_flag=True,
              help="Timing-only runs (same modelled times, no numerics): paper scale in minutes.")
@_watchdog
@click.option("--configs", "configs", type=click.Path(dir_okay=False), multiple=True,
              help="A Python file that registers configurations of one's own, which the "
                   "scenario's modes may name (repeatable; resume with the same files).")
@_what_ifs
@_counterfactuals
@click.option("--mixed", is_flag=True,
              help="Resume with points made by other code or files (another version, "
                   "commit or preset) kept, each marked with what made it, instead of "
                   "refusing them.")
def sweep(scenario, out_dir, timing_only, watchdog_s, configs, overrides, ablate, causes,
          mixed) -> None:
    """Run every point of SCENARIO (a .toml path, or a shipped scenario's name: example,
    t3-paper, t3-2x-cu, flux-paper, fused-ops-paper, ficco-paper, anchors) in its
    configurations."""
    from pathlib import Path

    from emulator.api import sweep as run_sweep
    from emulator.app.files import OutputError
    from emulator.app.scenario import ScenarioError
    from emulator.runtime.process import Interrupted

    out = Path(out_dir)
    try:
        rc = run_sweep(scenario, out, timing_only=timing_only, watchdog_s=watchdog_s,
                       configs=configs, ablate=_names(ablate), causes=causes,
                       set=_overrides(overrides), mixed=mixed).exit_code
    except (ConfigError, ScenarioError, OutputError) as exc:
        _fail_usage(exc)
    except (KeyboardInterrupt, Interrupted):
        click.echo(f"t3emu: sweep interrupted; finished points are in {out}; rerun the same "
                   f"command to resume", err=True)
        sys.exit(130)
    sys.exit(rc)


@main.command()
@click.argument("spec", required=False)
@click.option("--system", type=str, default=None,
              help="The system (a preset of `t3emu devices` or a system TOML file) one "
                   "tensor-parallel group runs on.")
@click.option("--device", type=str, default=None,
              help="Instead of --system: a GPU preset (or file) whose --tp GPUs sit on "
                   "--topology (T3's simulated system: --device t3-sim).")
@click.option("--topology", type=str, default=None,
              help="With --device: ring, full-mesh, switch or pcie (default: ring).")
@click.option("--phase", type=click.Choice(["training", "prefill", "decode"]),
              default="training", show_default=True)
@click.option("--tp", type=int, default=None,
              help="Tensor-parallel degree (default: the system's GPUs / (PP x DP)).")
@click.option("--pp", type=int, default=1, show_default=True, help="Pipeline stages (1F1B).")
@click.option("--dp", type=int, default=1, show_default=True, help="Data-parallel replicas.")
@click.option("--ep", type=int, default=None,
              help="Expert-parallel degree of a model with experts (over the TP group's "
                   "GPUs: default and only value, --tp).")
@click.option("--microbatches", type=int, default=None,
              help="Micro-batches per iteration and replica (default: 1, or 4 x PP with "
                   "pipeline stages).")
@click.option("--sp/--no-sp", default=True, show_default=True,
              help="Megatron's sequence parallelism (all-gather before the column-parallel "
                   "GEMMs, reduce-scatter after the row-parallel ones) or plain all-reduce.")
@click.option("--split-heads", is_flag=True,
              help="Let TP not divide the attention heads: each GPU takes heads x head size "
                   "/ TP columns (T3's sizing of T-NLG and PaLM).")
@click.option("--attention", type=click.Choice(["flash", "unfused"]), default="flash",
              show_default=True,
              help="The attention core: FlashAttention, or the unfused scores, softmax and "
                   "context kernels of Megatron-LM before it (T3's per-layer breakdown).")
@click.option("--designs", type=str, default=None,
              help="Comma-separated designs to compare with the baseline (`--list`; "
                   "default: t3,flux,te for a transformer, fused for a DLRM).")
@click.option("--seq", type=int, default=None, help="Sequence length (default: the file's).")
@click.option("--batch", type=int, default=None,
              help="Sequences per micro-batch (decode: the batch of one-token steps; a "
                   "DLRM: the global batch of samples; default: the file's).")
@click.option("--dtype", type=click.Choice(["fp16", "bf16"]), default="fp16",
              show_default=True)
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the estimate as JSON here (-: on standard output, the text then on "
                   "standard error).")
@click.option("--cache", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="Where the emulated operations' results are kept (default: "
                   "$XDG_CACHE_HOME/t3emu/ops or ~/.cache/t3emu/ops).")
@click.option("--no-cache", is_flag=True, help="Run every operation again; keep nothing.")
@click.option("--figure", "figure_path", type=click.Path(dir_okay=False), default=None,
              help="Write a PNG here: where a layer's and the iteration's time goes per "
                   "design.")
@click.option("--scenario", type=str, default=None,
              help="Instead of SPEC and its options: a paper's whole-model setting, every "
                   "estimate of it (`--list`).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="With --scenario: write DIR/estimates.json (for `t3emu validate`).")
@click.option("--list", "list_", is_flag=True,
              help="List the shipped models, designs and scenarios.")
@_watchdog
@_what_ifs
def model(spec, system, device, topology, phase, tp, pp, dp, ep, microbatches, sp, split_heads,
          attention, designs, seq, batch, dtype, json_path, cache_dir, no_cache, figure_path, scenario,
          out_dir, list_, watchdog_s, overrides) -> None:
    """Estimate what each design buys a whole model (SPEC: a shipped model's name or a model
    TOML file): its layers' GEMMs and collectives emulated on one tensor-parallel group,
    the rest composed (docs/models.md)."""
    from pathlib import Path

    from devices.spec import SpecError
    from emulator.api import RunError
    from emulator.app.catalog import registry
    from emulator.app.files import (OutputError, check_output_dir, check_output_file,
                                    write_json_atomic)
    from emulator.engine.registry import RegistryError
    from emulator.workload import estimate as est
    from emulator.workload import scenarios
    from emulator.workload.report import figure, text
    from emulator.workload.spec import list_models, load_model

    reg = registry()
    if list_:
        click.echo("models:")
        for name in list_models():
            m = load_model(name)
            click.echo(f"  {name:14s} {m.name} ({m.kind})")
        click.echo("designs (the configuration each runs; the baseline elsewhere):")
        for d in reg.designs.values():
            uses = ", ".join(f"{cfg} on {op}" for op, cfg in d.uses.items())
            click.echo(f"  {d.name:8s} {d.help} ({uses})")
        click.echo("scenarios (--scenario NAME: the papers' settings, docs/models.md):")
        for sc in scenarios.SCENARIOS.values():
            click.echo(f"  {sc.name:14s} {len(sc.runs):2d} estimates: {sc.help}")
        return
    _check_watchdog(watchdog_s)
    cache = None if no_cache else Path(cache_dir) if cache_dir else est.default_cache()
    if scenario:
        _model_scenario(scenario, spec, out_dir, cache, click.get_current_context(), watchdog_s)
        return
    if out_dir:
        _fail_usage(click.UsageError("--out goes with --scenario (one estimate: --json)"))
    if not spec:
        _fail_usage(click.UsageError("give a model (SPEC; `t3emu model --list`)"))
    sets = _overrides(overrides)
    try:
        setting = est.setting(spec, system=system, device=device, topology=topology,
                              phase=phase, tp=tp, pp=pp, dp=dp, microbatches=microbatches,
                              sp=sp, designs=designs.split(",") if designs else None,
                              seq=seq, batch=batch, dtype=dtype, overrides=sets, ep=ep,
                              split_heads=split_heads, attention=attention)
        for opt, path in (("--json", json_path), ("--figure", figure_path)):
            if path and path != "-":  # (--json -: standard output)
                if not Path(path).resolve().parent.is_dir():
                    raise ValueError(f"{opt} {path}: its directory does not exist")
                check_output_file(path, opt, 1 << 20)  # writable, with room: before any job
        if cache is not None:
            check_output_dir(cache, "--cache", 1 << 20)
        est.precheck(setting)  # every job as `t3emu run` checks it, before any runs
    except (SpecError, RegistryError, ValueError, OutputError) as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)
    try:
        doc = est.estimate(setting, cache, watchdog_s=watchdog_s)
    except ConfigError as exc:  # an operation of the model the emulator refuses
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)
    except RunError as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(1)
    click.echo(text(doc), err=json_path == "-")  # (--json -: the document alone on stdout)
    if json_path == "-":
        import json

        click.echo(json.dumps(doc, indent=1))
    elif json_path:
        write_json_atomic(json_path, doc, indent=1)  # a failed write keeps the old file
        click.echo(f"json: {json_path}")
    if figure_path:
        click.echo(f"figure: {figure(doc, figure_path)}")


# the options of one estimate, which a scenario sets itself
_ESTIMATE_OPTIONS = ("system", "device", "topology", "phase", "tp", "pp", "dp", "ep",
                     "microbatches", "sp", "split_heads", "attention", "designs", "seq", "batch", "dtype",
                     "json_path", "figure_path", "overrides")


def _model_scenario(name, spec, out_dir, cache, ctx, watchdog_s: float) -> None:
    """``t3emu model --scenario NAME``: every estimate of a paper's setting."""
    from pathlib import Path

    from click.core import ParameterSource

    from devices.spec import SpecError
    from emulator.api import RunError
    from emulator.app.files import OutputError, check_output_dir
    from emulator.engine.registry import RegistryError
    from emulator.workload import scenarios

    given = [p for p in _ESTIMATE_OPTIONS
             if ctx.get_parameter_source(p) not in (ParameterSource.DEFAULT, None)]
    try:
        if spec or given:
            opt = {"json_path": "json", "figure_path": "figure", "overrides": "set",
                   "sp": "sp/--no-sp"}.get(given[0], given[0]) if given else ""
            raise ValueError(f"--scenario {name} sets its own models and options; drop "
                             f"{spec or '--' + opt.replace('_', '-')}")
        if out_dir and not Path(out_dir).resolve().parent.is_dir():
            raise ValueError(f"--out {out_dir}: its parent directory does not exist")
        if out_dir:
            check_output_dir(out_dir, "--out", 1 << 20)  # writable, with room: before any job
        if cache is not None:
            check_output_dir(cache, "--cache", 1 << 20)
        checked = scenarios.settings(name)  # every estimate checked before any runs
    except (SpecError, RegistryError, ValueError, OutputError) as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)
    try:
        doc = scenarios.run(name, Path(out_dir) if out_dir else None, cache,
                            lambda msg: click.echo(msg, err=True), checked, watchdog_s)
    except (ConfigError, RunError) as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2 if isinstance(exc, ConfigError) else 1)
    click.echo(scenarios.summary(doc))
    if out_dir:
        click.echo(f"estimates: {Path(out_dir) / 'estimates.json'}")


@main.command()
@click.argument("out_dir", type=click.Path(file_okay=False))
@click.option("--timeline", type=str, default=None,
              help="Point for the per-rank timeline figure, by its label or key, e.g. "
                   "'T-NLG FC-2 TP8' (a what-if's label ends in its set values, "
                   "'... [gpu.cus=160]'; a name several points fit is refused; default: "
                   "the first point with the fewest ranks).")
@click.option("--timeline-modes", type=str, default=None,
              help="Comma-separated configurations the timeline draws (default: all of "
                   "the point's, up to 6; else its baselines, tuners, heuristics and the "
                   "fastest other).")
@click.option("--no-figures", is_flag=True, help="Print the tables only.")
def report(out_dir, timeline, timeline_modes, no_figures) -> None:
    """Print a sweep's tables (speedups over each configuration's baseline, the views of
    the designs it ran, DRAM traffic, causes, T3's end-to-end) and write PNG figures."""
    from pathlib import Path

    from emulator.app.report import _timeline_point, figures, load, text_report
    from emulator.app.scenario import ScenarioError

    modes = [m.strip() for m in timeline_modes.split(",") if m.strip()] if timeline_modes \
        else None
    try:
        doc = load(Path(out_dir))
        try:
            if timeline and not no_figures:
                _timeline_point(doc, timeline)  # an unknown or ambiguous name: before the tables
            click.echo(text_report(doc))
            if not no_figures:
                for path in figures(doc, Path(out_dir), timeline, modes):
                    click.echo(f"figure: {path}")
        except (KeyError, TypeError, AttributeError, IndexError) as exc:  # a field missing or
            # of another type than a sweep writes: the file, not the report, is at fault
            raise ScenarioError(f"{Path(out_dir) / 'results.json'} is damaged or written by "
                                f"another version of t3emu ({type(exc).__name__}: {exc}); "
                                f"rerun the sweep into its directory") from None
    except ScenarioError as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)


@main.command()
@click.argument("results", nargs=-1, type=click.Path(file_okay=False))
@click.option("--2x-cu", "results2x", type=click.Path(file_okay=False), default=None,
              help="Results of t3-2x-cu (the same as giving the directory as an argument).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default="docs/validation",
              show_default=True, help="Directory of the pages (index.md and one per paper).")
@click.option("--sensitivity", "run_sensitivity", is_flag=True,
              help="First run each figure's points again with each ASSUMPTION parameter "
                   "they read at the low and the high end of its range (timing-only, into "
                   "RESULTS/sensitivity/; reused while made by the same code); without it, "
                   "variants already there are shown.")
@click.option("--only", "only", type=str, default="",
              help="With --sensitivity: vary only these --set keys (comma-separated; "
                   "t3emu params --assumptions lists them).")
def validate(results, results2x, out_dir, run_sensitivity, only) -> None:
    """Write the validation pages: every published figure of T3, Flux, the fused operators
    and FiCCO beside the emulator's from sweeps of their scenarios (t3-paper, t3-2x-cu,
    flux-paper, fused-ops-paper, ficco-paper; each RESULTS directory's scenario is read from
    its results.json) and from their whole-model estimates (`t3emu model --scenario NAME
    --out DIR`: DIR/estimates.json), and the contention anchors from a sweep of anchors."""
    from pathlib import Path

    from emulator.app.validation import SCENARIOS, ValidationError, read_dirs, write

    dirs = [*results, *([results2x] if results2x else [])]
    if not dirs:
        _fail_usage(click.UsageError("give at least one sweep directory (RESULTS), e.g. "
                                     "results/t3-paper"))
    try:
        sweeps, where = read_dirs([Path(d) for d in dirs])
        # the pages show the commands as a user types them: results/SCENARIO
        shown = " ".join(f"results/{n}" for n in SCENARIOS if n in sweeps)
        keys = _names(only)
        pages = write(sweeps, Path(out_dir), f"t3emu validate {shown} --out {out_dir}",
                      where, run_sensitivity, keys,
                      lambda vs: click.echo(
                          f"t3emu: sensitivity: {vs[0].scenario}: {len(vs)} variant(s) on "
                          f"{sum(len(v.points) for v in vs)} point run(s), as one sweep",
                          err=True))
    except ValidationError as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)
    except OSError as exc:
        click.echo(f"t3emu: error: invalid value for --out: {out_dir!r} ({exc.strerror or exc})",
                   err=True)
        sys.exit(2)
    for page in pages:
        click.echo(f"validation page: {page}")


@main.command()
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the figures (and how each was measured) as JSON here.")
@click.option("--only", type=str, default="all", show_default=True,
              help="Comma-separated parts: gemm, overhead, startup, memory, sweep, scale, size, "
                   "papers.")
@click.option("--scenario", type=str, default="t3-paper", show_default=True,
              help="Scenario the sweep part runs timing-only.")
@click.option("--quick", is_flag=True,
              help="Toy sizes: checks the bench runs, its figures mean nothing.")
@click.option("--against", type=click.Path(dir_okay=False), default=None,
              help="The bench document whose recorded paper points the papers part compares "
                   "with (default: the checkout's docs/bench.json).")
@click.option("--papers", type=str, default="all", show_default=True,
              help="The papers part's points: all, or a comma-separated list of t3, flux, "
                   "fused, ficco.")
@click.option("--record", "record_path", type=click.Path(dir_okay=False), default=None,
              help="Write the papers part's figures into this bench document's papers "
                   "section, keeping the rest (docs/bench.json: the recorded figures).")
@_watchdog
def bench(json_path, only, scenario, quick, against, papers, record_path, watchdog_s) -> None:
    """Measure the emulator itself: GEMM speed, overhead, start-up, memory, sweep rate, and
    one point per paper against its recorded wall time."""
    from emulator.app.bench import (PAPER_POINTS, PARTS, RECORDED, BenchError, record,
                                    run_bench, table)
    from emulator.app.files import OutputError, check_output_file, write_json_atomic
    from emulator.app.scenario import ScenarioError, load_scenario

    _check_watchdog(watchdog_s)
    parts = PARTS if only == "all" else tuple(p.strip() for p in only.split(","))
    bad = [p for p in parts if p not in PARTS]
    if bad or not parts:
        _fail_usage(ConfigError("--only", only, f"all or a comma-separated list of "
                                                f"{', '.join(PARTS)}"))
    chosen = tuple(PAPER_POINTS) if papers == "all" else tuple(
        p.strip() for p in papers.split(","))
    if not chosen or any(p not in PAPER_POINTS for p in chosen):
        _fail_usage(ConfigError("--papers", papers, f"all or a comma-separated list of "
                                                    f"{', '.join(PAPER_POINTS)}"))
    if record_path and ("papers" not in parts or quick or papers != "all"):
        _fail_usage(ConfigError("--record", record_path, "needs the papers part of every "
                                                         "paper, at full size (not --quick)"))
    if against is not None and not Path(against).is_file():
        _fail_usage(ConfigError("--against", against, "no such file"))
    try:
        if json_path:
            check_output_file(json_path, "--json", 1 << 20)
        if record_path:
            check_output_file(record_path, "--record", 1 << 20)
        if "sweep" in parts:
            load_scenario(scenario)
    except (OutputError, ScenarioError) as exc:
        _fail_usage(exc)
    try:
        doc = run_bench(parts, quick, scenario, log=lambda msg: click.echo(msg, err=True),
                        watchdog_s=watchdog_s,
                        against=Path(against) if against is not None else RECORDED,
                        papers=chosen)
        if record_path:
            record(doc, Path(record_path))
    except BenchError as exc:
        click.echo(f"t3emu: bench error: {exc}", err=True)
        sys.exit(1)
    click.echo(table(doc))
    if json_path:
        write_json_atomic(json_path, doc)
        click.echo(f"json: {json_path}")
    if record_path:
        click.echo(f"recorded: {record_path} (papers)")


def _table_format(f):
    """``--format`` (and ``--json``, its json form) of a command that prints tables."""
    f = click.option("--json", "as_json", is_flag=True,
                     help="The rows as JSON (the same as --format json).")(f)
    return click.option("--format", "fmt", type=click.Choice(["table", "csv", "json",
                                                              "markdown"]),
                        default="table", show_default=True,
                        help="table: fitted to the terminal's width; csv, json, markdown: "
                             "the same rows for a spreadsheet, a script or a page.")(f)


LABELS = {"cus": "CUs", "clock_ghz": "GHz", "fp16_tflops": "fp16 TFLOP/s",
          "hbm_gb_per_s": "HBM GB/s", "hbm_datasheet_gb_per_s": "datasheet GB/s",
          "l2_mb": "L2 MB", "dma_engines": "DMA", "launch_us": "launch us",
          "link_gb_per_s": "link GB/s/dir", "link_latency_ns": "link ns"}


def _emit(tables: list[tuple[str, str, list[dict], list[str]]], fmt: str) -> None:
    """Print (key, title, rows, columns) tables in ``fmt`` (json: one object by key)."""
    import json

    from emulator.app.tables import render

    if fmt == "json":
        click.echo(json.dumps({key: [{c: r.get(c) for c in cols} for r in rows]
                              for key, _, rows, cols in tables}, indent=1))
        return
    for i, (key, title, rows, cols) in enumerate(tables):
        if fmt == "csv":  # one CSV per table, each after a "# key" line
            click.echo(f"# {key}")
        elif fmt == "markdown":
            click.echo(f"{'' if i == 0 else chr(10)}### {title}{chr(10)}")
        else:
            click.echo(f"{'' if i == 0 else chr(10)}{title}")
        click.echo(render(rows, cols, fmt, labels=LABELS))


@main.command()
@click.option("--configs", "configs", type=click.Path(dir_okay=False), multiple=True,
              help="Also list the configurations these files register.")
@_table_format
def configs(configs, fmt, as_json) -> None:
    """List operations and configurations (the registry), with the parameters each takes."""
    from emulator.engine.registry import RegistryError

    fmt = "json" if as_json else fmt
    try:
        reg = registry(configs)
    except RegistryError as exc:
        _fail_usage(exc)
    ops, cfgs, params = [], [], []
    for op in reg.operations.values():
        ops.append({"name": op.name, "aliases": ", ".join(op.aliases), "help": op.help,
                    "algorithms": ", ".join(op.algorithms), "design": op.design,
                    "dims": op.dims,
                    "default": f"M={op.shape[0]} N={op.shape[1]} K={op.shape[2]}"})
        params += [{"of": op.name, "param": n, "default": f"{prm.default:g}", "help": prm.help}
                   for n, prm in op.params.items()]
    for name, c in reg.configurations.items():
        cfgs.append({"name": name, "design": c.design, "help": c.help,
                     "operations": ", ".join(op.name for op in reg.operations.values()
                                             if c.applies(op)),
                     "algorithms": " or ".join(c.algorithms)})
        params += [{"of": name, "param": n, "default": f"{prm.default:g}", "help": prm.help}
                   for n, prm in c.params.items()]
    _emit([("operations", "operations:", ops, list(ops[0])),
           ("configurations", "configurations:", cfgs, list(cfgs[0])),
           ("params", "parameters (--param NAME=VALUE):", params,
            ["of", "param", "default", "help"])], fmt)


@main.command("nccl-tests")
@click.argument("system")
@click.option("--collective", "collective", default="all_gather", show_default=True,
              help="all_gather, reduce_scatter, all_reduce or alltoall (nccl-tests' names, "
                   "with or without _perf), or any name `t3emu run` takes for their "
                   "operations (all-gather, ag, gemm+ag, ...).")
@click.option("-b", "--minbytes", "--min-bytes", "lo", default="1K", show_default=True,
              help="Smallest size, as nccl-tests: a number with an optional K, M or G "
                   "(powers of 1024), e.g. 8, 1K, 1.5M.")
@click.option("-e", "--maxbytes", "--max-bytes", "hi", default="1G", show_default=True,
              help="Largest size (as -b).")
@click.option("-f", "--stepfactor", "--factor", "factor", default=4, show_default=True,
              type=click.IntRange(2, 1024), help="Size multiplier between rows.")
@click.option("-d", "--datatype", "datatype", default="float", show_default=True,
              help=f"nccl-tests' type: {', '.join(nt.DATATYPES)} (the emulator's "
                   f"{', '.join(nt.DATATYPES.values())}); its integer types and double "
                   f"are refused.")
@click.option("-o", "--op", "op", default="sum", show_default=True,
              help=f"Reduction: {', '.join(nt.OPS)}; {nt.OPS_HELP}. all_gather and "
                   f"alltoall show none, as nccl-tests.")
@click.option("-n", "--ranks", type=click.IntRange(1, 4096), default=None,
              help="GPUs (default: the whole system; a system of any size: 8). Not "
                   "nccl-tests' -n (iterations): the emulation times one call.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Change a key of the system or its GPU for this table (as t3emu run).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the rows as JSON (-: on standard output, the table then on "
                   "standard error).")
@_watchdog
def nccl_tests(system, collective, lo, hi, factor, datatype, op, ranks, overrides, json_path,
               watchdog_s) -> None:
    """The library collective of SYSTEM over sizes, as nccl-tests prints it: each row an
    emulated timing-only run of the library's schedule (its algorithm, protocol and
    channels from NCCL's or RCCL's tuning model, whose prediction is the last column).
    Counts as nccl-tests rounds them: all_gather, reduce_scatter and alltoall a whole 16
    bytes per rank (the size printed is what is moved, 0 where nothing is left)."""
    from devices.spec import SpecError
    from devices.system import load_system, system_size
    from emulator.app.files import OutputError, check_output_file, write_json_atomic

    _check_watchdog(watchdog_s)
    try:
        name = nt.resolve(collective)
    except ValueError as exc:
        _fail_usage(ConfigError("--collective", collective, str(exc)))
    try:
        dtype = nt.datatype(datatype)
    except ValueError as exc:
        _fail_usage(ConfigError("-d/--datatype", datatype, str(exc)))
    if op not in nt.OPS:
        _fail_usage(ConfigError("-o/--op", op, f"supported: {', '.join(nt.OPS)}"))
    sizes_b = []
    for opt, text in (("-b/--min-bytes", lo), ("-e/--max-bytes", hi)):
        try:
            sizes_b.append(nt.parse_size(text))
        except ValueError as exc:
            _fail_usage(ConfigError(opt, text, str(exc).partition(": ")[2]))
    lo_b, hi_b = sizes_b
    if lo_b < 1:
        _fail_usage(ConfigError("-b/--min-bytes", lo, "a size of at least 1 byte"))
    if lo_b > hi_b:
        _fail_usage(ValueError(f"-b/--min-bytes {lo} is larger than -e/--max-bytes {hi}"))
    sets = _overrides(overrides)
    try:
        spec = load_system(system, sets)
    except SpecError as exc:
        _fail_usage(exc)
    if not spec.interconnect.library:
        _fail_usage(ValueError(f"system {system!r} names no collective library ([interconnect] "
                               f"library in its GPU file): its collectives are T3's own "
                               f"ring kernels, not a library's"))
    ranks = ranks if ranks is not None else system_size(spec) or 8
    from emulator import api

    sizes = nt.sizes(lo_b, hi_b, factor)
    e = nt.element_bytes(dtype)
    try:
        if json_path and json_path != "-":  # (-: standard output)
            check_output_file(json_path, "--json", 1 << 20)
        elems = [n for n in (nt.counts(s, ranks, name, e)[2] for s in sizes) if n]
        for n in {elems[0], elems[-1]} if elems else {ranks}:  # as each row's run checks
            api.config(nt.COLLECTIVES[name][0], system=system, ranks=ranks, dtype=dtype,
                       set=dict(sets), timing_only=True, watchdog_s=watchdog_s,
                       modes="sequential", **nt.dims(n, ranks))
    except (ValueError, OutputError) as exc:
        _fail_usage(exc)
    to_stdout = json_path == "-"  # the table then goes to stderr, the document to stdout
    rows = nt.table(system, name, ranks, sizes, tuple(sets),
                    echo=(lambda line: click.echo(line, err=True)) if to_stdout else click.echo,
                    watchdog_s=watchdog_s, dtype=dtype, op=op)
    doc = {"system": system, "collective": name, "ranks": ranks, "type": datatype,
           "redop": rows[0]["redop"], "rows": rows, "avg_busbw": nt.avg_busbw(rows)}
    if to_stdout:
        import json

        click.echo(json.dumps(doc, indent=1))
    elif json_path:
        write_json_atomic(json_path, doc, indent=1)


def _library(ic) -> str:
    """The collective library a system's collectives are timed as."""
    from emulator.model.library import LIBRARIES

    if not ic.library:
        return "collectives: own ring kernels (no library model) at"
    return f"collectives: {LIBRARIES[ic.library].name}, Simple at"


def _movers(spec) -> list[dict]:
    """A GPU's data movers (each one's share of the port's peak and fixed costs), GEMM
    kernels and launch: what each is and its source."""
    ex, ic = spec.executors, spec.interconnect
    lib = (f"{ic.library_fraction:g} of the link's peak x its protocol's share; base and "
           f"per-step latencies from its tuning model" if ic.library else
           f"{ic.library_fraction:g} of the link's peak (own ring kernels, no fixed cost)")
    rows = [
        ("SM stores", f"{ex.store_fraction:g} of the link's peak; no fixed cost beyond the "
                      f"link latency", ex.sources.get("store")),
        ("copy engine", f"{ex.copy_fraction:g} of the link's peak; {spec.dma_setup_s * 1e6:g} "
                        f"us set-up per copy or flag write", ex.sources.get("copy")),
        ("NIC put", f"{ex.put_fraction:g} of the NIC's line rate; {spec.nic_issue_s * 1e9:g} "
                    f"ns issue per put and per flag put, {ex.put_fence_s * 1e9:g} ns fence",
         ex.sources.get("put")),
        ("library", lib, ex.sources.get("library")),
        ("GEMM", *_gemm_parts(spec)),
        ("launch", f"{spec.launch_s * 1e6:g} us per kernel, before it starts on the GPU",
         spec.launch_source),
    ]
    return [{"part": part, "what": what, "source": src or "no source given"}
            for part, what, src in rows]


def _gemm_parts(spec) -> tuple[str, str | None]:
    """The GPU's GEMM kernels (the library's tiles and main-loop efficiency, or the fixed
    tile at the peak) and their source."""
    g = spec.gemm
    if g is None:
        return (f"one {spec.wg_tile_m}x{spec.wg_tile_n} tile, {spec.wgs_per_cu} WG/CU, at the "
                f"matrix peak (no [gemm] section)", None)
    tiles = ", ".join(f"{t}/{t.stages}s/{t.per_cu}" for t in g.tiles)
    extra = "".join([f", L2 {spec.l2_bw / 1e12:g} TB/s" if spec.l2_bw else "",
                     f", latency {spec.mem_latency_s * 1e9:g} ns" if spec.mem_latency_s else ""])
    off = ("" if g.enabled else f"; not used by runs (enabled = false: one {spec.wg_tile_m}x"
           f"{spec.wg_tile_n} tile at the peak; --set gpu.gemm.enabled=true runs it)")
    return (f"tiles (MxNxK/stages/WGs per CU) {tiles}; main loop at "
            f"{g.mainloop_efficiency:.1%} of peak{extra}{off}", g.source)


def _gemm_line(spec) -> str:
    """The GEMM kernels as ``t3emu gemm`` prints them (with their source, if any)."""
    what, src = _gemm_parts(spec)
    return f"{'GEMM':<12} {what}" + (f" [{src}]" if src else "")


@main.command()
@click.option("--device", type=str, default=_DEFAULT.device, show_default=True,
              help="A GPU preset or file (or --system).")
@click.option("--system", type=str, default=None, help="A system preset or file: its GPU.")
@click.option("--m", "m", type=click.IntRange(1), required=True, help="Rows of the output.")
@click.option("--n", "n", type=click.IntRange(1), required=True, help="Columns of the output.")
@click.option("--k", "k", type=click.IntRange(1), required=True, help="The inner dimension.")
@click.option("--dtype", type=click.Choice(["fp16", "bf16", "fp32"]), default="fp16",
              show_default=True)
@click.option("--split-k", type=click.IntRange(1, 64), default=1, show_default=True,
              help="WGs per output tile, each over a K slice.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Change a key of the GPU (or system) for this table (as t3emu run).")
@_table_format
def gemm(device, system, m, n, k, dtype, split_k, overrides, fmt, as_json) -> None:
    """The GEMM kernel the library's heuristic picks for an M x N x K GEMM on a GPU, with
    every tile of its catalogue at its best K decomposition (data-parallel, split-K, or
    stream-K): WGs, waves, predicted time and throughput (emulator/model/gemm.py; what
    `t3emu run` records as its gemm_kernel)."""
    from devices.spec import SpecError, load_device
    from devices.system import load_system
    from emulator.model.gemm import candidates, choose

    sets = _overrides(overrides)
    try:
        spec = load_system(system, sets) if system else load_device(device, sets)
    except SpecError as exc:
        _fail_usage(exc)
    if spec.dtype_refusal(dtype):
        _fail_usage(ValueError(spec.dtype_refusal(dtype)))
    flops = 2.0 * m * n * k
    peak = spec.peak_flops(dtype)
    fmt = "json" if as_json else fmt
    if fmt in ("table", "markdown"):  # (csv and json: the rows alone)
        click.echo(f"t3emu: GEMM {m} x {n} x {k} {dtype}" + (f", split-K {split_k}"
                   if split_k > 1 else "") + f" on {spec.name}: {flops / peak * 1e6:.1f} us "
                   f"at the peak ({peak / 1e12:.1f} TFLOP/s)")
        if fmt == "table":  # the GEMM line wrapped to the terminal's width
            import textwrap

            click.echo(textwrap.fill(_gemm_line(spec), max(40, _width()),
                                     initial_indent="  ", subsequent_indent=" " * 15,
                                     break_long_words=False, break_on_hyphens=False))
        else:
            click.echo(f"\n{_gemm_line(spec)}\n")
    rows = [choose(spec, m, n, k, split_k, dtype)]
    if spec.gemm:  # each tile's best K decomposition (data-parallel, split-K, stream-K)
        rows, seen = [], set()
        for kern in candidates(spec, m, n, k, split_k, dtype):
            if (kern.tile_m, kern.tile_n, kern.tile_k, kern.per_cu) not in seen:
                seen.add((kern.tile_m, kern.tile_n, kern.tile_k, kern.per_cu))
                rows.append(kern)
    table = []
    for i, kern in enumerate(rows):
        items = -(-m // kern.tile_m) * -(-n // kern.tile_n) * split_k
        per = kern.items(spec.cus)
        wgs = items // per * per * kern.split_k + (
            kern.stage_wgs(items % per, -(-k // split_k), spec.cus)[0] if items % per else 0)
        t = kern.predicted_s
        table.append({"kernel": kern.name, "wgs_per_cu": kern.per_cu, "wgs": wgs,
                      "waves": f"{items / per:.2f}",
                      "predicted_us": f"{t * 1e6:.1f}" if t else "- (fixed tile)",
                      "tflops": f"{flops / t / 1e12:.1f}" if t else "-",
                      "of_peak": f"{flops / t / peak:.1%}" if t else "-",
                      "pick": "<- the heuristic's pick" if i == 0 else ""})
    from emulator.app.tables import render

    cols = list(GEMM_LABELS)
    if fmt == "table":
        click.echo("\n".join("  " + line for line in render(
            table, cols, limit=_width() - 2, labels=GEMM_LABELS, align=GEMM_RIGHT,
            wrap=["pick"]).splitlines()))
    else:
        click.echo(render(table, cols, fmt, labels=GEMM_LABELS, align=GEMM_RIGHT))


# t3emu gemm's columns (keys: their headers) and those aligned right
GEMM_LABELS = {"kernel": "kernel", "wgs_per_cu": "WGs/CU", "wgs": "WGs", "waves": "waves",
               "predicted_us": "predicted us", "tflops": "TFLOP/s", "of_peak": "of peak",
               "pick": ""}
GEMM_RIGHT = {c: "right" for c in ("wgs_per_cu", "wgs", "waves", "predicted_us", "tflops",
                                   "of_peak")}


def _width() -> int:
    from emulator.app.tables import width

    return width()


@main.group(invoke_without_command=True)
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default="probe.json",
              show_default=True, help="The JSON file of the measurements.")
@click.option("--backend", type=click.Choice(["auto", "torch", "numpy"]), default="auto",
              show_default=True,
              help="auto: PyTorch on its GPU if it finds one (CUDA or ROCm), else numpy on "
                   "the host (toy sizes: the plumbing, not a GPU's figures).")
@click.option("--quick", is_flag=True, help="Toy sizes (the numpy backend always runs them).")
@click.option("--warmup", type=click.IntRange(0, 100), default=3, show_default=True)
@click.option("--repeats", type=click.IntRange(1, 1000), default=10, show_default=True)
@click.option("--budget-s", type=click.FloatRange(1, 86400), default=280.0, show_default=True,
              help="Wall seconds after which the cases left are recorded as skipped.")
@click.pass_context
def probe(ctx, out_path, backend, quick, warmup, repeats, budget_s) -> None:
    """Microbenchmarks on the real GPU this machine has (GEMMs of the papers' shapes, HBM and
    L2 rates, latency alone and loaded, a GEMM beside a copy, atomics, GEMV, embedding-bag),
    written to one JSON file; `t3emu probe compare` sets them beside the model
    (docs/validation/hardware.md)."""
    if ctx.invoked_subcommand is not None:
        return
    from emulator.app.files import OutputError, check_output_file
    from emulator.probe import backends, cases
    from emulator.probe.run import probe as run_probe
    from pathlib import Path

    try:
        check_output_file(out_path, "--out", 16 << 20)
        be = backends.find(backend)
    except (OutputError, backends.Skip) as exc:
        _fail_usage(exc if isinstance(exc, OutputError) else ValueError(f"--backend {backend}: {exc}"))
    quick = quick or be.name == "numpy"
    click.echo(f"t3emu probe: {be.info()['name']} ({be.name}{', toy sizes' if quick else ''})",
               err=True)
    doc = run_probe(be, cases.build(quick), Path(out_path), warmup, repeats, budget_s,
                    log=lambda msg: click.echo(msg, err=True))
    done = sum("median_s" in c for c in doc["cases"])
    click.echo(f"probe: {done} of {len(doc['cases'])} cases measured in {doc['wall_s']:.0f} s; "
               f"{out_path}")


def _probe_doc(path: str) -> dict:
    """A probe file, checked (one line and exit 2 if it is not one)."""
    import json

    try:
        doc = json.loads(open(path).read())
        if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list) or \
                doc.get("probe_version") is None:
            raise ValueError("not a `t3emu probe` file (no probe_version or cases)")
    except (OSError, ValueError) as exc:
        _fail_usage(ConfigError("FILE", path, str(exc)))
    return doc


def _probe_inputs(file: str, option: str, preset: str, out_path: str, room: int) -> dict:
    """The probe file, the preset and the output checked before anything is computed."""
    from devices.spec import SpecError, load_device
    from emulator.app.files import OutputError, check_output_file

    doc = _probe_doc(file)
    try:
        load_device(preset)
        check_output_file(out_path, "--out", room)
    except OutputError as exc:
        _fail_usage(exc)
    except SpecError as exc:
        _fail_usage(ConfigError(option, preset, str(exc)))
    return doc


@probe.command("compare")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--device", "preset", required=True,
              help="The GPU preset whose model predicts every case (e.g. h100-sxm).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False),
              default="docs/validation/hardware.md", show_default=True, help="The page.")
def probe_compare(file, preset, out_path) -> None:
    """Every case of a probe FILE beside the model of a preset: the page (measured and
    modelled, the error per case and per mechanism) and its figure (log-log)."""
    from pathlib import Path

    from emulator.app.files import write_text_atomic
    from emulator.probe import compare as cmp

    doc = _probe_inputs(file, "--device", preset, out_path, 4 << 20)
    rows = cmp.compare(doc, preset)
    out = Path(out_path)
    # the validation pages keep their figures in figures/; elsewhere beside the page
    fig = cmp.figure(rows, (out.parent / "figures" / f"{out.stem}.png"
                            if out.parent.name == "validation" else out.with_suffix(".png")),
                     f"{doc.get('gpu', {}).get('name', '?')} against {preset}")
    rel = None if fig is None else os.path.relpath(fig, out.parent)
    write_text_atomic(out, cmp.page(doc, preset, rows, file, rel))
    for mech, st in cmp.by_mechanism(rows).items():
        ef = f"{st['error_factor']:.3f}" if st["error_factor"] else "-"
        click.echo(f"{mech:16s} {st['predicted']:3d} of {st['cases']:3d} predicted; "
                   f"geomean error factor {ef}")
    click.echo(f"page: {out}" + (f"; figure: {fig}" if fig else ""))


@probe.command("preset")
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--base", required=True, help="The preset standing in for the probed GPU "
              "(its file is copied; the measured values replace its own).")
@click.option("--name", default=None, help="The new preset's name (default: BASE-probed).")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), required=True,
              help="The preset TOML to write (use it as --device FILE).")
def probe_preset(file, base, name, out_path) -> None:
    """A GPU preset from a probe FILE: sustained HBM and L2 rates, latency, the GEMM main
    loop's efficiency, the copy engine's set-up, each citing the case that set it."""
    from pathlib import Path

    from devices.spec import SpecError
    from emulator.probe.preset import write

    doc = _probe_inputs(file, "--base", base, out_path, 1 << 20)
    try:
        values = write(doc, base, file, name or f"{base}-probed", Path(out_path))
    except SpecError as exc:  # a measured value the checks refuse (a host's probe, say)
        _fail_usage(ConfigError("FILE", file, f"the preset it gives is refused: {exc}"))
    for key, value in values.items():
        click.echo(f"{key} = {value}")
    click.echo(f"preset: {out_path}")


@main.command()
@click.option("--device", type=str, default=None, help="One GPU preset (or a GPU file).")
@click.option("--system", type=str, default=None,
              help="One system preset: its keys, then its GPU's.")
@click.option("--model", "model_only", is_flag=True,
              help="Only the model's code parameters and the configurations' knobs.")
@click.option("--assumptions", "only_assumptions", is_flag=True,
              help="Only the ASSUMPTION parameters (each with its range).")
@click.option("--json", "as_json", is_flag=True, help="JSON on stdout instead of a table.")
def params(device, system, model_only, only_assumptions, as_json) -> None:
    """Every parameter the clock reads, with its provenance (datasheet, measured, library
    code, paper, derived, ASSUMPTION with its range, or off) and where it is read: a GPU
    preset's keys (--device), a system's and its GPU's (--system), the model's code and
    the configurations' knobs (--model); with no option, all of them."""
    import json

    from devices.spec import SpecError
    from emulator.app.params import model_rows, rows_for
    from emulator.app.tables import render

    if sum(map(bool, (device, system, model_only))) > 1:
        _fail_usage(click.UsageError("give at most one of --device, --system and --model"))
    try:
        rows = model_rows() if model_only else rows_for(device, system)
    except SpecError as exc:
        click.echo(f"t3emu: error: {exc}", err=True)
        sys.exit(2)
    if only_assumptions:
        rows = [r for r in rows if r.source.kind == "assumption"]
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in rows], indent=1))
        return
    table = [{"scope": r.scope, "key": r.key, "value": _shown(r.value), "unit": r.unit,
              "source": r.source.text(), "--set": r.set_key, "read in": r.where}
             for r in rows]
    click.echo(render(table, list(table[0]) if table else ["key"],
                      wrap=["source", "read in"]))
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r.source.kind] = kinds.get(r.source.kind, 0) + 1
    click.echo(f"{len(rows)} parameters: " + ", ".join(f"{n} {k}" for k, n in
                                                     sorted(kinds.items())))
    if kinds.get("missing"):
        click.echo(f"t3emu: warning: {kinds['missing']} parameter(s) have no source", err=True)


def _shown(value) -> str:
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return f"{len(value)} tiles"
    if isinstance(value, float):
        return f"{value:g}"
    return "" if value is None else str(value)


@main.command()
@click.argument("kind", required=False, type=click.Choice(("device", "system", "scenario",
                                                          "model")))
@click.option("--out", "out_dir", type=click.Path(file_okay=False),
              help="Write every kind's schema as DIR/KIND.schema.json.")
def schema(kind, out_dir) -> None:
    """The JSON Schema of a kind of file t3emu reads (GPU and system presets, scenarios,
    model files), for an editor's TOML support (Taplo: a '#:schema PATH' line at the top
    of the file). Without KIND: --out DIR writes all four."""
    from emulator.app import schemas

    if out_dir:
        for path in schemas.write(out_dir, (kind,) if kind else schemas.KINDS):
            click.echo(str(path))
        return
    if kind is None:
        raise click.UsageError("give KIND (device, system, scenario or model) or --out DIR")
    click.echo(schemas.text(kind), nl=False)


@main.command()
@_table_format
@click.option("--details", is_flag=True,
              help="Also each GPU's data movers, GEMM kernels and launch, with sources.")
def devices(fmt, as_json, details) -> None:
    """List GPU presets (--device) and system presets (--system) with their key figures;
    --details adds each GPU's data movers (SM stores, copy engine, NIC put, library kernel:
    the share of the port's peak each achieves, its fixed costs), its GEMM kernels and its
    launch, each with its source."""
    from devices.spec import list_presets, load_device
    from devices.system import list_systems, load_system
    from emulator.model.topology import Topology

    fmt = "json" if as_json else fmt
    gpus, movers, systems = [], [], []
    for name in list_presets():
        spec = load_device(name)
        ic = spec.interconnect
        gpus.append({
            "name": name, "cus": spec.cus, "clock_ghz": round(spec.clock_hz / 1e9, 4),
            "fp16_tflops": round(spec.peak_flops("fp16") / 1e12, 1),
            "hbm_gb_per_s": round(spec.hbm_bw / 1e9),
            "hbm_datasheet_gb_per_s": round(spec.hbm_datasheet / 1e9),
            "l2_mb": spec.l2_bytes >> 20, "dma_engines": spec.dma_engines,
            "launch_us": round(spec.launch_s * 1e6, 3), "links": ic.links,
            "link_gb_per_s": round(ic.link_bw / 1e9, 3), "topology": ic.topology,
            "description": spec.description})
        if details or fmt == "json":
            movers += [{"gpu": name, **m} for m in _movers(spec)]
    for name in list_systems():
        spec = load_system(name)
        ic = spec.interconnect
        size = ic.gpus_per_node * ic.nodes
        topo = Topology(ic, size or 8)
        systems.append({
            "name": name, "gpus": size or "any", "gpu": spec.name,
            "topology": topo.describe(), "link_gb_per_s": round(ic.link_bw / 1e9, 3),
            "link_latency_ns": round(ic.link_latency_s * 1e9, 3),
            "network": (f"{ic.nics_per_node} NICs/node x {ic.nic_bw / 1e9:g} GB/s/dir "
                        f"({ic.network}, {ic.nic_latency_s * 1e9:g} ns)" if ic.network
                        else ""),
            "library": (f"{_library(ic)} {ic.library_fraction:g}"
                        + (f"/{ic.library_fraction_network:g}" if ic.network else "")
                        + " of peak"),
            "description": spec.description})
    brief = fmt in ("table", "markdown") and not details  # (descriptions: --details)
    extra = ("description", "hbm_datasheet_gb_per_s", "launch_us")  # (--details)
    tables = [("gpus", "GPUs (--device NAME or FILE):", gpus,
               [c for c in gpus[0] if not (brief and c in extra)]),
              ("systems", "systems (--system NAME or FILE):", systems,
               [c for c in systems[0] if not (brief and c == "description")])]
    if movers:
        tables.insert(1, ("movers", "each GPU's data movers, GEMM kernels and launch:",
                          movers, ["gpu", "part", "what", "source"]))
    _emit(tables, fmt)


if __name__ == "__main__":
    main()
