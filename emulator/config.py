"""The run configuration: every option of ``t3emu run``, validated before any MPI launch."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from collectives import COLLECTIVES, MODES, TOPOLOGY_ALGORITHMS
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
    mode: str = "all"
    m: int = 8192
    n: int = 3072
    k: int = 768
    dtype: str = "fp16"
    device: str = "t3-sim"
    seed: int = 0
    values: str = "int"
    watchdog_s: float = 60.0
    json: str | None = None
    record_wall: bool = False
    inject_fault: str | None = None  # test hook: "raise@RANK"

    @property
    def modes(self) -> tuple[str, ...]:
        return MODES if self.mode == "all" else (self.mode,)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def validate(self) -> RunConfig:
        if not 1 <= self.ranks <= 4096:
            raise ConfigError("-n/--ranks", self.ranks, "an integer from 1 to 4096")
        for opt, val, allowed in (("--collective", self.collective, COLLECTIVES),
                                  ("--topology", self.topology, tuple(TOPOLOGY_ALGORITHMS)),
                                  ("--mode", self.mode, MODES + ("all",)),
                                  ("--dtype", self.dtype, DTYPES),
                                  ("--values", self.values, VALUES)):
            if val not in allowed:
                raise ConfigError(opt, val, f"allowed: {', '.join(allowed)}")
        for opt, val in (("--m", self.m), ("--n", self.n), ("--k", self.k)):
            if not 1 <= val <= MAX_DIM:
                raise ConfigError(opt, val, f"an integer from 1 to {MAX_DIM}")
        if self.m < self.ranks:
            raise ConfigError("--m", self.m, f"needs at least one row per rank (>= {self.ranks})")
        if not self.watchdog_s > 0:
            raise ConfigError("--watchdog-s", self.watchdog_s, "a number of seconds > 0")
        if self.inject_fault is not None:
            kind, _, rank = self.inject_fault.partition("@")
            if kind != "raise" or not rank.isdigit():
                raise ConfigError("--inject-fault", self.inject_fault, "form raise@RANK")
        return self
