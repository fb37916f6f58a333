"""The run configuration: every option of ``t3emu run``, validated before any MPI launch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from collectives import (ALGORITHMS, COLLECTIVE_ALGORITHMS, COLLECTIVES, MODES, TOPOLOGIES,
                         TOPOLOGY_ALGORITHMS, default_algorithm, modes_for)
from devices.spec import DTYPES

MAX_DIM = 1 << 20
VALUES = ("int", "normal")


class ConfigError(ValueError):
    """Bad usage: names the option, the value and what is allowed."""

    def __init__(self, option: str, value: object, allowed: str):
        super().__init__(f"invalid value for {option}: {value!r} ({allowed})")
        self.option = option


@dataclass(frozen=True)
class RunConfig:
    ranks: int = 4
    collective: str = "ar"
    topology: str = "ring"
    algorithm: str | None = None  # None: the topology's default for the collective
    mode: str = "all"
    m: int = 8192
    n: int = 3072
    k: int = 768
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
    inject_fault: str | None = None  # test hook: "raise@RANK"

    @property
    def modes(self) -> tuple[str, ...]:
        if self.mode == "all":
            return modes_for(self.collective)
        return tuple(m.strip() for m in self.mode.split(","))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> RunConfig:
        """Check every option; return the config with the algorithm resolved."""
        if not 1 <= self.ranks <= 4096:
            raise ConfigError("-n/--ranks", self.ranks, "an integer from 1 to 4096")
        for opt, val, allowed in (("--collective", self.collective, COLLECTIVES),
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
        if not any(a in TOPOLOGY_ALGORITHMS[self.topology]
                   for a in COLLECTIVE_ALGORITHMS[self.collective]):
            fits = [t for t in TOPOLOGIES if any(a in TOPOLOGY_ALGORITHMS[t] for a in
                                                 COLLECTIVE_ALGORITHMS[self.collective])]
            raise ConfigError("--topology", self.topology, f"--collective {self.collective} "
                              f"needs --topology {' or '.join(fits)}")
        algo = self.algorithm or default_algorithm(self.collective, self.topology)
        if algo not in ALGORITHMS:
            raise ConfigError("--algorithm", algo, f"allowed: {', '.join(ALGORITHMS)}")
        if algo not in COLLECTIVE_ALGORITHMS[self.collective]:
            raise ConfigError("--algorithm", algo, f"--collective {self.collective} runs "
                              f"{' or '.join(COLLECTIVE_ALGORITHMS[self.collective])}")
        if algo not in TOPOLOGY_ALGORITHMS[self.topology]:
            fits = [t for t in TOPOLOGIES if algo in TOPOLOGY_ALGORITHMS[t]]
            raise ConfigError("--algorithm", algo, f"a {self.topology} topology runs "
                              f"{' or '.join(TOPOLOGY_ALGORITHMS[self.topology])}; {algo} needs "
                              f"--topology {' or '.join(fits)}")
        if self.mode != "all":
            modes = self.modes
            for mode in modes:
                if mode not in MODES:
                    raise ConfigError("--mode", self.mode, f"allowed: {', '.join(MODES)}, all, "
                                      f"or a comma-separated list")
                if mode not in modes_for(self.collective):
                    raise ConfigError("--mode", self.mode, f"--collective {self.collective} has "
                                      f"{', '.join(modes_for(self.collective))} (NMC-assisted "
                                      f"RS needs a reduction)")
            if len(set(modes)) != len(modes):
                raise ConfigError("--mode", self.mode, "a mode is listed twice")
        if not 1 <= self.split_k <= min(self.k, 64):
            raise ConfigError("--split-k", self.split_k,
                              f"an integer from 1 to min(K, 64) = {min(self.k, 64)}")
        if not self.watchdog_s > 0:
            raise ConfigError("--watchdog-s", self.watchdog_s, "a number of seconds > 0")
        if self.inject_fault is not None:
            kind, _, rank = self.inject_fault.partition("@")
            if kind != "raise" or not rank.isdigit():
                raise ConfigError("--inject-fault", self.inject_fault, "form raise@RANK")
        return dataclasses.replace(self, algorithm=algo)
