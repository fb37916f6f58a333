"""The operations T3 runs (a GEMM fused with its collective, or an all-gather feeding a
GEMM), as the parts their configurations compose.

Each operation gives, for a rank's ``Problem`` and an algorithm (``ring`` or
``direct``): the HBM layout, its baseline producer (the plain GEMM and its map),
its collective as a CU-driven kernel (``steps``; ``nmc``: updates reduced by
near-memory compute), its fused form (the staggered GEMM, its maps and the
inputs resident before it starts), and whether an AG follows (all-reduce).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from collectives import direct, embedding, ficco, fused_ops, ring
from collectives.common import Problem, plain_gemm
from collectives.consumer import ag_gemm
from emulator.engine.plan import Credit, Slots

ALGORITHMS = {"ring": ring, "direct": direct}


@dataclass(frozen=True)
class OperationParts:
    stream: str  # traffic category and the name of its collective kernel's phase
    fused_name: str  # the fused kernel's phase name
    layout: Callable  # (p, algorithm, recv_buffer=False) -> (layout, inputs, result regions);
    # recv_buffer: add the buffer the collective run as a kernel receives into
    producer: Callable  # (p, slots) -> (kernel, map): the baseline producer
    steps: Callable  # (p, slots, algorithm, nmc) -> [CuStep]: the collective as a kernel
    fused: Callable  # (p, slots, algorithm) -> (kernel, maps, preload)
    consumer: bool = False  # the collective feeds the GEMM (it runs first)
    then_ag: bool = False  # an all-gather follows (all-reduce = RS + AG)

    def ag_after(self, p: Problem, slots: Slots, algorithm: str):
        """AR's AG kernel and its credit (it overwrites peers' C chunks: wait until they
        finished their RS)."""
        steps = ALGORITHMS[algorithm].ag_steps(p, slots)
        base = slots.alloc("ag credit", 1)
        notify = [p.right] if algorithm == "ring" else p.others
        credit = Credit(notify, slots.region("ag credit", [base], [len(notify)],
                                             "ranks written into have finished their RS"))
        return steps, credit


def _layout(extra: Callable, own_rows: bool, result: Callable, recv: Callable | None = None):
    """``extra``: arrays every configuration uses; ``recv``: the receive buffer only the
    collective run as a CU kernel needs (``layout(..., recv=True)``)."""
    def layout(p: Problem, algorithm: str, recv_buffer: bool = False):
        dt = p.dtype
        r0 = p.chunk(p.rank)[0]
        arrays = [("B", (p.k, p.n), dt), ("C", (p.m, p.n), dt), ("A", (p.m, p.k), dt)]
        arrays += extra(p, algorithm)
        if recv_buffer and recv is not None:
            arrays += recv(p, algorithm)
        return arrays, {"B": ("B", 0), "A": ("A", r0 if own_rows else 0)}, result(p)
    return layout


def _own_chunk(p: Problem):
    r0, r1 = p.chunk(p.rank)
    return [("C", (r0, r1, 0, p.n))]


def _whole(p: Problem):
    return [("C", (0, p.m, 0, p.n))]


def _none(p: Problem, algorithm: str):
    return []


def _recv(p: Problem, algorithm: str):
    return [("R", ((p.world * p.max_chunk) if algorithm == "direct" else p.m, p.n), p.dtype)]


def _one_map(builder_name: str):
    def fused(p: Problem, slots: Slots, algorithm: str):
        kernel, amap = getattr(ALGORITHMS[algorithm], builder_name)(p, slots)
        return kernel, [amap], []
    return fused


def _rs_steps(p, slots, algorithm, nmc):
    return ALGORITHMS[algorithm].rs_steps(p, slots, nmc=nmc)


REDUCE_SCATTER = OperationParts(
    "rs", "gemm+rs", _layout(_none, False, _own_chunk, _recv), lambda p, s: plain_gemm(p, s),
    _rs_steps, _one_map("rs_map"))

ALL_REDUCE = OperationParts(
    "rs", "gemm+rs", _layout(_none, False, _whole, _recv), lambda p, s: plain_gemm(p, s),
    _rs_steps, _one_map("rs_map"), then_ag=True)

ALL_GATHER = OperationParts(
    "ag", "gemm+ag", _layout(_none, True, _whole),
    lambda p, s: plain_gemm(p, s, rows=[p.chunk(p.rank)]),
    lambda p, s, a, nmc: ALGORITHMS[a].ag_steps(p, s), _one_map("ag_map"))


def _a2a_fused(p: Problem, slots: Slots, algorithm: str):
    kernel, maps = direct.a2a_map(p, slots)
    return kernel, maps, []


ALL_TO_ALL = OperationParts(
    "a2a", "gemm+a2a",
    _layout(lambda p, a: [("X", (p.world * p.max_chunk, p.n), p.dtype)], False,
            lambda p: [("X", p.slot_region(s, p.rank)) for s in range(p.world)]),
    lambda p, s: plain_gemm(p, s), lambda p, s, a, nmc: direct.a2a_steps(p, s), _a2a_fused)


def _ag_gemm_layout(p: Problem, algorithm: str, recv_buffer: bool = False):
    dt = p.dtype
    arrays = [("B", (p.k, p.n), dt), ("C", (p.m, p.n), dt), ("AG", (p.m, p.k), dt)]
    return arrays, {"B": ("B", 0), "A": ("AG", p.chunk(p.rank)[0])}, _whole(p)


AG_GEMM = OperationParts(
    "ag", "ag+gemm", _ag_gemm_layout, lambda p, s: plain_gemm(p, s, a="AG"),
    lambda p, s, a, nmc: ALGORITHMS[a].ag_steps(p, s, "AG", p.k), ag_gemm, consumer=True)


GEMV_ALL_REDUCE = OperationParts(
    "rs", "gemv+ar", _layout(_none, False, _whole, _recv), fused_ops.plain_gemv,
    _rs_steps, _one_map("rs_map"), then_ag=True)


@dataclass(frozen=True)
class PhaseParts:
    """An operation whose baseline phases are its own (``phases(p, slots, algorithm,
    iso)`` -> (layout, inputs, result regions, phases); ``iso(name)``: the clock of an
    isolated run)."""

    phases: Callable
    consumer: bool = False


EMBEDDING_ALL_TO_ALL = PhaseParts(embedding.phases)


def _no_fused(p, slots, algorithm):
    raise ValueError("a2a+gemm has no fused form of T3's; its overlapped forms are FiCCO's")


A2A_GEMM = OperationParts(
    "a2a", "a2a+gemm", ficco.dispatch_layout, lambda p, s: plain_gemm(p, s, a="AG"),
    ficco.dispatch_steps, _no_fused, consumer=True)
