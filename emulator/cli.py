"""The ``t3emu`` command line.

Exit codes: 0 success; 1 a run failed or a numerics check failed; 2 bad usage.
``t3emu run`` starts ``mpiexec`` itself unless it already runs under MPI (as in
``mpiexec -n 8 t3emu run ...``). MPI and numba are imported only inside
commands, so ``--help`` is instant and needs no MPI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import click

from collectives import ALGORITHMS, COLLECTIVES, MODES, TOPOLOGIES
from emulator.config import VALUES, ConfigError, RunConfig

_MPI_ENV = ("PMI_RANK", "PMI_SIZE", "PMIX_RANK", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALRANKID",
            "MV2_COMM_WORLD_SIZE")
_DEFAULT = RunConfig()


def under_mpi() -> bool:
    return any(k in os.environ for k in _MPI_ENV)


def find_mpiexec() -> str:
    """``$T3EMU_MPIEXEC``, else the mpiexec next to this Python (the mpich wheel), else PATH."""
    override = os.environ.get("T3EMU_MPIEXEC")
    if override:
        return override
    local = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(local):
        return local
    found = shutil.which("mpiexec") or shutil.which("mpirun")
    if not found:
        raise click.ClickException("no mpiexec found: install the 'mpich' wheel or set "
                                   "T3EMU_MPIEXEC to your MPI launcher")
    return found


def _fail_usage(exc: ConfigError) -> None:
    click.echo(f"t3emu: error: {exc}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="t3emu")
def main() -> None:
    """Distributed emulator of multi-GPU systems: one emulated GPU per MPI rank."""


@main.command()
@click.option("-n", "--ranks", type=int, default=_DEFAULT.ranks, show_default=True,
              help="Emulated GPUs (MPI ranks) to launch.")
@click.option("--collective", type=str, default=_DEFAULT.collective, show_default=True,
              help=f"{', '.join(COLLECTIVES)} (ag-gemm: all-gather feeding a GEMM).")
@click.option("--topology", type=str, default=_DEFAULT.topology, show_default=True,
              help=f"Interconnect: {', '.join(TOPOLOGIES)}.")
@click.option("--algorithm", type=str, default=None,
              help=f"{' or '.join(ALGORITHMS)}; default: ring on a ring, direct otherwise "
                   f"(a2a is direct only).")
@click.option("--mode", type=str, default=_DEFAULT.mode, show_default=True,
              help=f"{', '.join(MODES)}, or all (ideal-rs-nmc: rs and ar only).")
@click.option("--m", "m", type=int, default=_DEFAULT.m, show_default=True,
              help="Rows of each device's GEMM output (tokens).")
@click.option("--n", "n", type=int, default=_DEFAULT.n, show_default=True,
              help="Columns of each device's GEMM output.")
@click.option("--k", "k", type=int, default=_DEFAULT.k, show_default=True,
              help="Each device's slice of the dot-product dimension.")
@click.option("--dtype", type=str, default=_DEFAULT.dtype, show_default=True,
              help="fp16 (stored fp16, fp32 accumulate) or fp32.")
@click.option("--device", type=str, default=_DEFAULT.device, show_default=True,
              help="Device preset name (see `t3emu devices`) or a TOML file.")
@click.option("--split-k", type=int, default=_DEFAULT.split_k, show_default=True,
              help="WGs per output tile, each over a K slice (split-K GEMM).")
@click.option("--seed", type=int, default=_DEFAULT.seed, show_default=True)
@click.option("--values", type=str, default=_DEFAULT.values, show_default=True,
              help=f"Input values: {' or '.join(VALUES)} (int gives bit-exact fp32 checks).")
@click.option("--watchdog-s", type=float, default=_DEFAULT.watchdog_s, show_default=True,
              help="Abort the job if a wait sees no completion for this long (wall seconds).")
@click.option("--json", "json_path", type=click.Path(dir_okay=False), default=None,
              help="Write the results as JSON here.")
@click.option("--record-wall", is_flag=True, hidden=True,
              help="Include wall-clock stage/DMA events and modelled events in the JSON.")
@click.option("--inject-fault", type=str, default=None, hidden=True,
              help="Test hook: raise@RANK raises an exception in a GEMM stage of RANK.")
def run(ranks, collective, topology, algorithm, mode, m, n, k, dtype, device, split_k, seed,
        values, watchdog_s, json_path, record_wall, inject_fault) -> None:
    """Run a GEMM fused (or not) with its collective; check numerics; report modelled time."""
    cfg = RunConfig(ranks=ranks, collective=collective, topology=topology, algorithm=algorithm,
                    mode=mode, m=m, n=n, k=k, dtype=dtype, device=device, seed=seed,
                    values=values, split_k=split_k, watchdog_s=watchdog_s, json=json_path,
                    record_wall=record_wall, inject_fault=inject_fault)
    try:
        cfg = cfg.validate()
        from devices.spec import SpecError, load_device

        try:
            load_device(device)
        except SpecError as exc:
            raise ConfigError("--device", device, str(exc)) from None
    except ConfigError as exc:
        _fail_usage(exc)
    if under_mpi():
        from emulator.worker import main as worker_main

        sys.exit(worker_main(cfg))
    from emulator.runtime import pin_threads

    env = pin_threads(dict(os.environ))
    # compile the kernels once here, so ranks only load numba's cache
    os.environ.update({k: env[k] for k in ("NUMBA_CACHE_DIR",)})
    from devices import kernels

    kernels.warm_up()
    argv = [find_mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m",
            "emulator.cli", "run", *_cfg_args(cfg)]
    proc = subprocess.run(argv, env=env)
    sys.exit(0 if proc.returncode == 0 else 1)


def _cfg_args(cfg: RunConfig) -> list[str]:
    args = ["-n", str(cfg.ranks), "--collective", cfg.collective, "--topology", cfg.topology,
            "--algorithm", cfg.algorithm, "--mode", cfg.mode, "--split-k", str(cfg.split_k), "--m", str(cfg.m), "--n", str(cfg.n), "--k", str(cfg.k),
            "--dtype", cfg.dtype, "--device", cfg.device, "--seed", str(cfg.seed),
            "--values", cfg.values, "--watchdog-s", str(cfg.watchdog_s)]
    if cfg.json:
        args += ["--json", cfg.json]
    if cfg.record_wall:
        args.append("--record-wall")
    if cfg.inject_fault:
        args += ["--inject-fault", cfg.inject_fault]
    return args


@main.command()
def devices() -> None:
    """List device presets."""
    from devices.spec import list_presets, load_device

    for name in list_presets():
        spec = load_device(name)
        ic = spec.interconnect
        click.echo(f"{name:<16} {spec.cus} CUs @ {spec.clock_hz / 1e9:g} GHz, "
                   f"{spec.peak_flops('fp16') / 1e12:.1f} TFLOP/s fp16, "
                   f"HBM {spec.hbm_bw / 1e9:g} GB/s, L2 {spec.l2_bytes >> 20} MB, "
                   f"{ic.topology} links {ic.link_bw / 1e9:g} GB/s/dir, "
                   f"{ic.link_latency_s * 1e9:g} ns")
        click.echo(f"{'':<16} {spec.description}")


if __name__ == "__main__":
    main()
