"""Test hooks of ``--inject-fault KIND@RANK`` (see ``config.FAULTS``): real faults, injected
on one rank, that the reliability tests expect the emulator to catch and report."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Callable

from emulator.runtime import watchdog
from emulator.runtime.rank import RANK


def announce(rank: int, what: str) -> None:
    RANK.faults_fired.append(what)
    sys.stderr.write(f"[t3emu rank {rank}] injected fault: {what} at unix time {time.time():.3f}\n")
    sys.stderr.flush()


def in_stage(kind: str, where: str, rank: int) -> None:
    """A fault of the compute thread (in a GEMM stage)."""
    if kind == "raise":
        raise RuntimeError(f"injected fault: exception in {where} on rank {rank}")
    if kind == "kill":
        announce(rank, f"SIGKILL in {where}")
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "stall":
        announce(rank, f"stall in {where}")
        watchdog.post("compute", f"{where} (stalled by an injected fault)")
        while True:  # no progress, no exit: only the peers' watchdogs can end the job
            time.sleep(1.0)


def busy(fault: tuple[str, int] | None, rank: int) -> None:
    """The "busy" fault: 6 s of computation without a post (as a slow start-up on a loaded
    host); the watchdog must see the CPU time as progress."""
    if fault == ("busy", rank):
        announce(rank, "6 s of computation")
        end, x = time.monotonic() + 6.0, 0
        while time.monotonic() < end:
            x = (x * 31 + 7) % 1000003


def freeze(fault: tuple[str, int] | None, rank: int, what: str) -> None:
    """The "freeze" fault: this rank posts a wait at ``what`` and stops its own process
    (SIGSTOP, as a debugger or a job-control stop does); only its frozen heartbeat tells."""
    if fault == ("freeze", rank):
        announce(rank, f"SIGSTOP while waiting at {what}")
        watchdog.post("compute", f"waiting at {what}", waiting=True)
        os.kill(os.getpid(), signal.SIGSTOP)


def in_inputs(fault: tuple[str, int], rank: int, a) -> None:
    """Faults of the input data, written into this rank's A before the run."""
    import numpy as np

    if fault == ("nan-input", rank):
        a[0, 0] = np.nan
        announce(rank, "NaN written into A[0, 0]")
    elif fault == ("overflow", rank):
        a[0, :] = np.finfo(a.dtype).max / 2
        announce(rank, f"A[0, :] set to {np.finfo(a.dtype).max / 2:g}")


def in_result(fault: tuple[str, int] | None, rank: int, result) -> None:
    """The result faults: zeros where a configuration's output should be."""
    if fault == ("zero-output", rank) and result is not None:
        result[...] = 0
        announce(rank, "the result zeroed before the check")


def for_dma(kind: str, rank: int, mode: str) -> Callable | None:
    """The DMA engine's fault callback (command -> "drop", "double" or ""), fired once."""
    if kind not in ("raise-dma", "drop-dma", "double-dma"):
        return None
    fired = []

    def fault(cmd) -> str:
        if fired or (kind == "double-dma" and cmd.op != "update"):
            return ""
        fired.append(cmd)
        where = f"{mode}: DMA of {cmd.trigger.name} to rank {cmd.dst_rank} ({cmd.op})"
        if kind == "raise-dma":
            raise RuntimeError(f"injected fault: exception in the DMA engine, {where}")
        announce(rank, f"{'dropped' if kind == 'drop-dma' else 'doubled'} {where}")
        return "drop" if kind == "drop-dma" else "double"

    return fault
