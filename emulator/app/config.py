"""The run configuration: every option of ``t3emu run``, validated before any MPI launch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from collectives import (ALGORITHMS, TOPOLOGIES, TOPOLOGY_ALGORITHMS, default_algorithm,
                         default_topology)
from devices.spec import DTYPES
from emulator.model.cost import DTYPE_BYTES
from emulator.app.catalog import registry
from emulator.engine.registry import RegistryError, param_conflict

MAX_DIM = 1 << 22  # FiCCO's largest GEMM has 1,607,680 rows
MAX_SEED = 2**63 - 1
MAX_WATCHDOG_S = 86400.0
VALUES = ("int", "normal")
# test hooks of --inject-fault KIND@RANK (the reliability tests; table in docs/reliability.md)
FAULTS = {
    "raise": "an exception in a GEMM stage",
    "raise-dma": "an exception in the DMA engine thread",
    "kill": "SIGKILL of the rank's own process in a GEMM stage",
    "stall": "the rank stops making progress in a GEMM stage",
    "busy": "the rank computes for 6 s (CPU time, no post) before its first run: a slow start, "
            "not a stall",
    "freeze": "the rank stops itself (SIGSTOP) while it waits at the first results barrier",
    "drop-dma": "the first DMA transfer carrying data is not written (its signal still is)",
    "double-dma": "the first DMA update is applied twice",
    "nan-input": "a NaN in the rank's input A",
    "overflow": "the first row of the rank's A at half the dtype's largest value (outputs "
                "overflow to Inf)",
    "zero-output": "every configuration's result on the rank reads back as zeros (a kernel "
                   "that never wrote it)",
}
NEEDS_NUMERICS = ("drop-dma", "double-dma", "nan-input", "overflow", "zero-output")  # only the numerics check sees them


class ConfigError(ValueError):
    """Bad usage: names the option, the value and what is allowed."""

    def __init__(self, option: str, value: object, allowed: str):
        super().__init__(f"invalid value for {option}: {value!r} ({allowed})")
        self.option = option


@dataclass(frozen=True)
class RunConfig:
    ranks: int = 4
    collective: str = "ar"
    topology: str = ""  # "": the operation's (collectives.default_topology), set by validate
    algorithm: str | None = None  # None: the topology's default for the collective
    mode: str = "all"
    m: int | None = None  # None: the operation's default shape (Operation.shape), set by
    n: int | None = None  # validate
    k: int | None = None
    dtype: str = "fp16"
    device: str = "t3-sim"
    seed: int = 0
    values: str = "int"
    split_k: int = 1
    watchdog_s: float = 60.0
    json: str | None = None
    timing_only: bool = False  # same schedule and protocol, no payload, no numerics check
    trace: str | None = None  # Chrome/Perfetto trace JSON path
    record_wall: bool = False
    inject_fault: str | None = None  # test hook "KIND@RANK", see FAULTS
    configs: tuple[str, ...] = ()  # configuration files to register (--configs)
    hosts: tuple[str, ...] = ()  # hosts the launcher spreads the ranks over (--hosts)
    same_machine: bool = False  # every "host" runs on this machine (--same-machine)
    system: str | None = None  # a system preset or file (--system): GPU, topology, nodes
    params: tuple[tuple[str, float], ...] = ()  # --param NAME=VALUE: an operation's shapes
    # beyond M, N, K and the configurations' knobs (defaults from the registry)
    ablate: tuple[str, ...] = ()  # --ablate: costs removed from every run (a counterfactual;
    # emulator/model/ablation.py)
    causes: bool = False  # --causes: split each gain into causes by counterfactual runs
    overrides: tuple[tuple[str, object], ...] = ()  # --set KEY=VALUE: preset and system keys
    # changed without editing files (devices/overrides.py)

    def load_spec(self):
        """The device of the run: the system's GPU in the system's interconnect (--system),
        or the GPU file (--device) in --topology. Raises ConfigError naming the option."""
        from devices.spec import SpecError, load_device, with_topology
        from devices.system import load_system

        from devices.overrides import check

        from emulator.model import params

        try:
            check(self.overrides, bool(self.system))
            for key, value in self.overrides:
                if key.startswith("model."):
                    params.check(key, value)
        except (SpecError, params.ParamError) as exc:
            raise ConfigError("--set", set_text(self.overrides), str(exc)) from None
        params.activate(self.overrides)  # this process's runs read them (every rank)
        try:
            if self.system:
                return load_system(self.system, self.overrides)
            spec = load_device(self.device, self.overrides)
        except SpecError as exc:
            raise ConfigError("--system" if self.system else "--device",
                              self.system or self.device, str(exc)) from None
        return with_topology(spec, self.topology)

    @property
    def operation(self):
        """The registry entry of ``collective`` (an operation name or its alias)."""
        return registry(self.configs).operation(self.collective)

    @property
    def modes(self) -> tuple[str, ...]:
        if self.mode == "all":
            reg = registry(self.configs)
            op = reg.operation(self.collective)
            algo = self.algorithm or default_algorithm(op.algorithms, self.topology)
            return reg.configurations_for(op, algo)
        return tuple(m.strip() for m in self.mode.split(","))

    def param_specs(self) -> dict:
        """name -> Param this run takes (its operation's and its modes' configurations')."""
        reg = registry(self.configs)
        return reg.params_for(reg.operation(self.collective), self.modes)

    def param(self, name: str) -> float:
        """The run's value of parameter ``name`` (given, or the registry's default)."""
        given = dict(self.params)
        if name in given:
            return given[name]
        specs = self.param_specs()
        if name not in specs:
            raise KeyError(f"no parameter {name!r} in this run ({', '.join(specs) or 'none'})")
        return specs[name].default

    def resolved_params(self) -> tuple[tuple[str, float], ...]:
        """Every parameter of the run with its value, sorted by name."""
        given = dict(self.params)
        return tuple(sorted((n, given.get(n, p.default)) for n, p in self.param_specs().items()))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> RunConfig:
        """Check every option; return the config with the topology and algorithm resolved."""
        try:
            reg = registry(self.configs)
        except RegistryError as exc:
            raise ConfigError("--configs", ",".join(self.configs), str(exc)) from None
        if self.collective in reg.names() and (not self.topology or None in (self.m, self.n,
                                                                               self.k)):
            op = reg.operation(self.collective)  # the operation's defaults
            shape = {d: v if getattr(self, d) is None else getattr(self, d)
                     for d, v in zip("mnk", op.shape)}
            return dataclasses.replace(self, topology=self.topology or default_topology(
                op.algorithms), **shape).validate()
        if not 1 <= self.ranks <= 4096:
            raise ConfigError("-n/--ranks", self.ranks, "an integer from 1 to 4096")
        if self.hosts and (len(set(self.hosts)) != len(self.hosts) or len(self.hosts) > self.ranks
                           or not all(h and h.replace("-", "").replace(".", "").replace("_", "")
                                      .isalnum() for h in self.hosts)):
            raise ConfigError("--hosts", ",".join(self.hosts),
                              f"distinct host names, at most one per rank ({self.ranks})")
        if self.same_machine and not self.hosts:
            raise ConfigError("--same-machine", "set", "needs --hosts (the emulated hosts)")
        for opt, val, allowed in (("--collective", self.collective, tuple(reg.names())),
                                  ("--topology", self.topology, TOPOLOGIES),
                                  ("--dtype", self.dtype, DTYPES),
                                  ("--values", self.values, VALUES)):
            if val not in allowed:
                raise ConfigError(opt, val, f"allowed: {', '.join(allowed)}")
        for opt, val in (("--m", self.m), ("--n", self.n), ("--k", self.k)):
            if not 1 <= val <= MAX_DIM:
                raise ConfigError(opt, val, f"an integer from 1 to {MAX_DIM}")
        if self.m < self.ranks:
            raise ConfigError("--m", self.m, f"needs at least one row per rank (>= {self.ranks})")
        op = reg.operation(self.collective)
        if not any(a in TOPOLOGY_ALGORITHMS[self.topology] for a in op.algorithms):
            fits = [t for t in TOPOLOGIES if any(a in TOPOLOGY_ALGORITHMS[t] for a in
                                                 op.algorithms)]
            raise ConfigError("--topology", self.topology, f"--collective {self.collective} "
                              f"needs --topology {' or '.join(fits)}")
        algo = self.algorithm or default_algorithm(op.algorithms, self.topology)
        if algo not in ALGORITHMS:
            raise ConfigError("--algorithm", algo, f"allowed: {', '.join(ALGORITHMS)}")
        if algo not in op.algorithms:
            raise ConfigError("--algorithm", algo, f"--collective {self.collective} runs "
                              f"{' or '.join(op.algorithms)}")
        if algo not in TOPOLOGY_ALGORITHMS[self.topology]:
            fits = [t for t in TOPOLOGIES if algo in TOPOLOGY_ALGORITHMS[t]]
            raise ConfigError("--algorithm", algo, f"a {self.topology} topology runs "
                              f"{' or '.join(TOPOLOGY_ALGORITHMS[self.topology])}; {algo} needs "
                              f"--topology {' or '.join(fits)}")
        if self.mode != "all":
            modes = self.modes
            applies = reg.configurations_for(op, algo)
            for mode in modes:
                if mode not in reg.configurations:
                    raise ConfigError("--mode", self.mode, f"allowed: "
                                      f"{', '.join(reg.configurations)}, all, or a "
                                      f"comma-separated list")
                if mode not in applies:
                    runs = reg.configuration(mode).algorithms
                    why = (f"; it runs --algorithm {' or '.join(runs)}"
                           if runs and algo not in runs else "")
                    raise ConfigError("--mode", self.mode, f"--collective {self.collective} "
                                      f"with --algorithm {algo} has {', '.join(applies)} "
                                      f"({mode}: {reg.configuration(mode).help}{why})")
            if len(set(modes)) != len(modes):
                raise ConfigError("--mode", self.mode, "a mode is listed twice")
        specs = reg.params_for(op, self.modes)
        names = [n for n, _ in self.params]
        if len(set(names)) != len(names):
            raise ConfigError("--param", ",".join(names), "a parameter is given twice")
        for name, value in self.params:
            if name not in specs:
                raise ConfigError("--param", f"{name}={value:g}", f"--collective "
                                  f"{self.collective} with these modes takes "
                                  + (", ".join(f"{n} ({p.help})" for n, p in specs.items())
                                     or "no parameters"))
            why = specs[name].check(name, value)
            if why:
                raise ConfigError("--param", f"{name}={value:g}", why)
        shown, why = param_conflict(specs, dict(self.params))
        if why:
            raise ConfigError("--param", shown, why)
        uneven = [m for m in self.modes if self._unbalanced(reg, m)]
        if uneven and self.mode != "all":
            raise ConfigError("--mode", ",".join(uneven), f"needs the same GEMM on every rank "
                              f"(expert_skew=0); expert_skew={self._skew:g} gives each rank "
                              f"its own")
        from emulator.model.ablation import AblationError, check

        try:
            check(self.ablate)
        except AblationError as exc:
            raise ConfigError("--ablate", ",".join(self.ablate), str(exc).split(": ", 1)[1]) \
                from None
        if self.causes and self.ablate:
            raise ConfigError("--causes", "set", "--causes runs its own counterfactuals; drop "
                              "--ablate")
        if self.split_k > 1 and not op.split_k:
            raise ConfigError("--split-k", self.split_k, f"--collective {self.collective} "
                              f"does not split K over several WGs (give 1)")
        if not 1 <= self.split_k <= min(self.k, 64):
            raise ConfigError("--split-k", self.split_k,
                              f"an integer from 1 to min(K, 64) = {min(self.k, 64)}")
        if not 0 <= self.seed <= MAX_SEED:
            raise ConfigError("--seed", self.seed, f"an integer from 0 to {MAX_SEED}")
        if not 0 < self.watchdog_s <= MAX_WATCHDOG_S:  # also refuses nan and inf
            raise ConfigError("--watchdog-s", self.watchdog_s,
                              f"seconds, more than 0 and at most {MAX_WATCHDOG_S:g}")
        if self.inject_fault is not None:
            kind, rank = self.fault
            if kind not in FAULTS or not 0 <= rank < self.ranks:
                raise ConfigError("--inject-fault", self.inject_fault,
                                  f"KIND@RANK with KIND one of {', '.join(FAULTS)} and RANK "
                                  f"from 0 to {self.ranks - 1}")
            if kind in NEEDS_NUMERICS and self.timing_only:
                raise ConfigError("--inject-fault", self.inject_fault,
                                  "corrupts data, which only a numeric run checks; drop "
                                  "--timing-only")
        return dataclasses.replace(self, algorithm=algo)

    @property
    def fault(self) -> tuple[str, int]:
        """(kind, rank) of ``--inject-fault``; ("", -1) without one."""
        if not self.inject_fault:
            return "", -1
        kind, _, rank = self.inject_fault.partition("@")
        return kind, int(rank) if rank.isdigit() else -1

    def check_device(self, spec) -> None:
        """The options against the device: enough links for the topology at this size, and
        a system's GPU count."""
        ic = spec.interconnect
        size = ic.gpus_per_node * ic.nodes
        if spec.dtype_refusal(self.dtype):
            raise ConfigError("--dtype", self.dtype, spec.dtype_refusal(self.dtype))
        if size and self.ranks != size:
            raise ConfigError("-n/--ranks", self.ranks,
                              f"system {spec.system} has {size} GPUs ({ic.nodes} node(s) x "
                              f"{ic.gpus_per_node}); leave -n out or give -n {size}")
        reg = registry(self.configs)
        for mode in self.modes if self.mode != "all" else ():
            why = reg.refusal(mode, spec, self.dtype, self.ranks, self.collective)
            if why:
                raise ConfigError("--mode", self.mode, why)
        if size:
            return  # the system file's links were checked when it loaded
        need = ic.links_needed(self.ranks)
        if need > ic.links:
            most = ic.links + 1 if self.topology == "full-mesh" else 1
            raise ConfigError("-n/--ranks", self.ranks,
                              f"a {self.topology} of {self.ranks} GPUs needs {need} links per "
                              f"GPU; device {spec.name} has {ic.links}, so at most {most} "
                              f"GPUs (use --topology switch or ring, or a device file with "
                              f"more links)")

    @property
    def _skew(self) -> float:
        return dict(self.params).get("expert_skew", 0.0)

    def _unbalanced(self, reg, mode: str) -> bool:
        """``mode`` needs the same GEMM on every rank and the run's experts are uneven."""
        return bool(self._skew) and reg.configuration(mode).balanced

    def runnable(self, spec, ranks: int | None = None) -> RunConfig:
        """``--mode all`` as the configurations the device can run in this dtype with
        ``ranks`` GPUs (default: ``--ranks``)."""
        if self.mode != "all":
            return self
        reg = registry(self.configs)
        ranks = self.ranks if ranks is None else ranks
        keep = [m for m in self.modes
                if not reg.refusal(m, spec, self.dtype, ranks, self.collective)
                and not self._unbalanced(reg, m)]
        return self if len(keep) == len(self.modes) else dataclasses.replace(
            self, mode=",".join(keep))

    def memory_per_rank(self, spec) -> int:
        """A conservative estimate of one rank's peak host memory in bytes (measured: a
        numeric rank holds its inputs, the HBM buffers, the reference and tolerance; a
        timing-only rank about 6 KB of plan and tracker state per output tile)."""
        if self.operation.host_memory is not None:
            return int(self.operation.host_memory(self, spec))
        if self.timing_only:
            tiles = -(-self.m // spec.wg_tile_m) * -(-self.n // spec.wg_tile_n)
            if self.operation.parts.consumer:  # the gathered input has tiles too
                tiles += -(-self.m // spec.wg_tile_m) * -(-self.k // spec.wg_tile_n)
            reg = registry(self.configs)
            per_tile = max((c.tile_bytes * c.tiles for c in
                            (reg.configuration(m) for m in self.modes)), default=8192)
            return (64 << 20) + int(per_tile * tiles)
        e = DTYPE_BYTES[self.dtype]
        op = self.operation
        out = self.m * self.n + (self.m * self.k if op.parts.consumer else 0)
        rows = -(-self.m // self.ranks) if op.a_rows == "own" else self.m
        return (200 << 20) + out * (24 + 4 * e) + 3 * e * (rows * self.k + self.k * self.n)

    def check_memory(self, spec, ranks_here: int, available: int | None) -> None:
        """Refuse a run whose ``ranks_here`` ranks on this host would not fit in memory."""
        if available is None:
            return
        per_rank = self.memory_per_rank(spec)
        need = per_rank * ranks_here
        if need > available:
            sizes = per_rank > available // 4  # the shape, not the rank count, is too big
            what, value = (("--m/--n/--k", f"{self.m}/{self.n}/{self.k}") if sizes
                           else ("-n/--ranks", self.ranks))
            hint = "" if self.timing_only else "; --timing-only needs far less"
            raise ConfigError(what, value,
                              f"{ranks_here} ranks need about {need / 2**30:.1f} GiB of host "
                              f"memory, this host has {available / 2**30:.1f} GiB available"
                              f"{hint}")


def set_text(overrides) -> str:
    from devices.overrides import describe

    return describe(tuple(overrides)).replace(";", " ")


def available_memory() -> int | None:
    """Bytes of memory this host can still give (Linux MemAvailable), None if unknown."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
