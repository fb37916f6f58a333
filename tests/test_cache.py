"""The L2 a GEMM shares with communication traffic (emulator/model/cache.py), against hand
arithmetic on the toy device (tests/data/event-log.toml, its L2 cut to 128 KiB so that two
fp32 128 x 128 x 64 stages' panels fill it).

Stage 0 computes the tiles (rows 0-128, columns 0-128 and 128-256), stage 1 the tiles of
rows 128-256 over the same columns: both read their A row panel (32 KiB) and the two B
column panels (32 KiB each), and stage 1 shares the B panels with stage 0. The panel model
(cost.py): a stage reads U + max(0, 1 - L2in / W) (R - U) less the panels the previous
stage left, with U = 96 KiB distinct, R = 128 KiB naive, W = U (its K is one K step),
and the previous stage's panels held at min(1, L2in / 96 KiB)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from tests.test_event_log import DEVICE, _close

KIB = 1024.0
U, R = 96 * KIB, 128 * KIB  # a stage's distinct and naive panel bytes
L2 = 128 * KIB


def _model():
    from devices.spec import load_device
    from emulator.model.cost import CostModel

    spec = dataclasses.replace(load_device(str(DEVICE)), l2_bytes=int(L2),
                               comm_through_l2=True)
    return CostModel(spec, "fp32")


STAGE0 = np.array([[0, 128, 0, 128, 0, 64], [0, 128, 128, 256, 0, 64]], np.int64)
STAGE1 = np.array([[128, 256, 0, 128, 0, 64], [128, 256, 128, 256, 0, 64]], np.int64)


def _reads(share: float, held: float = 0.0) -> float:
    """Hand: a stage's DRAM reads when it keeps ``share`` of the L2 and the previous stage
    left ``held`` of its panels (the 64 KiB of B panels are shared)."""
    return U + max(0.0, 1.0 - L2 * share / U) * (R - U) - 64 * KIB * held


def test_a_kernel_alone_keeps_the_whole_cache():
    from emulator.model import cache

    assert cache.share(5e9, 0.0) == 1.0
    assert cache.settle(lambda s: 1e9, 0.0) == 1.0
    assert cache.share(1e9, 3e9) == 0.25  # allocations in proportion: 1 of 4


def test_dma_traffic_through_the_l2_evicts_the_panels_the_next_stage_would_reuse():
    """Stage 0 runs for T = 10 us while a DMA engine's reads of 288 KiB pass through the L2
    (c = 288 KiB / T); the stage's own misses are g(s) = reads(s) / T. From the whole
    cache, three substitutions s <- g(s) / (g(s) + c). Stage 1 then finds only
    min(1, L2 s / U) of the B panels left and re-reads the rest: 64 KiB x (1 - that) more
    than beside no traffic."""
    from emulator.model import cache
    from emulator.model.dram import Dram
    from emulator.model.arbitration import Alone, CommWindow

    m = _model()
    T, D = 10e-6, 288 * KIB
    dram = Dram("hbm", m.spec.hbm_bw, m.spec.dram)
    end = dram.stream(Alone(), 0.0, D, CommWindow(False), "dma reads", D / T)
    assert _close(end, T) and _close(dram.through(0.0, T), D)
    assert _close(dram.through(0.0, T / 4), D / 4)  # served evenly over its service

    s = 1.0  # by hand: the fixed point's iterates
    for _ in range(3):
        g = _reads(s) / T
        s = g / (g + D / T)
    assert 0.28 < s < 0.30  # 0.25 -> 0.2895 -> 0.2865

    def rate_at(share):
        m.l2_share = share
        try:
            return m.gemm_compute(STAGE0)[2] / T
        finally:
            m.l2_share = 1.0
    got = cache.settle(rate_at, dram.through(0.0, T) / T)
    assert _close(got, s)

    # stage 0's reads at that share, then its panels committed at that share
    m.l2_share = got
    assert _close(m.gemm_compute(STAGE0)[2], _reads(s))
    m.l2_commit(STAGE0, False)
    m.l2_share = 1.0
    held = min(1.0, L2 * s / U)
    polluted = m.gemm_compute(STAGE1)[2]
    assert _close(polluted, _reads(1.0, held))

    # beside no traffic the B panels were all still there
    clean = _model()
    clean.gemm_compute(STAGE0)
    clean.l2_commit(STAGE0, False)
    assert _close(clean.gemm_compute(STAGE1)[2], _reads(1.0, 1.0))
    assert _close(polluted - clean.gemm_compute(STAGE1)[2], 64 * KIB * (1.0 - held))


@pytest.mark.parametrize("preset,through", [("mi300x", True), ("h100-sxm", True),
                                            ("a100-sxm", True), ("mi210", False),
                                            ("t3-sim", False)])
def test_which_gpus_send_communication_through_the_cache_the_model_calls_l2(preset, through):
    """A memory-side last level (MI300X's Infinity Cache, NVIDIA's L2 slices in front of
    their memory controllers) sees every DRAM request; MI210's per-die L2 serves its CUs,
    not the copy engines or xGMI peers; T3 allocates the tracked outputs uncached, and its
    DMA engine and updates work at the memory."""
    from devices.spec import load_device

    assert load_device(preset).comm_through_l2 is through


def test_an_owed_commit_is_made_when_the_l2_is_next_read_and_dropped_when_overtaken():
    """A stage taken from the memo leaves its panels' commit owed (``CostModel.l2_defer``):
    stage 1 read after it finds stage 0's B panels as after an eager commit (64 KiB held,
    hand: ``_reads(1, 1)``), at the share stage 1 is costed at (the commit made inside that
    costing leaves it as it was); a reset or another commit drops the owed one unmade."""
    m = _model()
    made = []

    def owed():
        made.append(m.l2_share)
        m.l2_commit(STAGE0, False)
    m.l2_defer(owed)
    assert made == []  # nothing read yet: nothing made
    assert _close(m.gemm_compute(STAGE1)[2], _reads(1.0, 1.0))
    assert made == [1.0]
    m.gemm_compute(STAGE1)
    assert made == [1.0]  # made once

    m.l2_reset()
    m.l2_defer(owed)
    m.l2_reset()  # a new kernel: the owed commit is dropped, nothing is held
    assert _close(m.gemm_compute(STAGE1)[2], _reads(1.0, 0.0)) and made == [1.0]

    m.l2_defer(owed)
    m.l2_commit(STAGE1, False)  # overtaken: STAGE1's own panels are what the L2 holds
    assert _close(m.gemm_compute(STAGE1)[2], U - 96 * KIB) and made == [1.0]
