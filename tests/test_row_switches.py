"""Row switches between two streams interleaving at the HBM (emulator/model/dram.py,
"Row switches between streams"), against hand arithmetic on a toy DRAM: 1,000 bytes/s,
2 channels x 8 queue entries over 4 banks, so a bank's share of a full queue is
k = 2 x 8 / 4 = 4 requests, and a row switch costs m = 3 hits (m - 1 = 2 extra).

Bytes T served together at shares s and 1 - s take T x p(s) x (m - 1) / k more channel
time, p(s) = 1 - s^k - (1 - s)^k: the chance a bank's k queued requests hold both
streams' rows (FR-FCFS then switches rows once more per batch)."""

from __future__ import annotations

import dataclasses

import pytest

from devices.spec import DramSpec, load_device
from emulator.model.arbitration import CommWindow, policy_named
from emulator.model.dram import Dram

RATE = 1000.0
SPEC = DramSpec(channels=2, queue_depth=8, banks=4, row_miss_cost=3.0)


def _p(s: float, k: int = 4) -> float:
    return 1.0 - s ** k - (1.0 - s) ** k


def test_a_stream_alone_keeps_its_rows_open():
    dram = Dram("toy", RATE, SPEC)
    assert dram.bank_requests == 4 and dram.switch_cost == 2.0
    assert dram.reserve(0.0, 4000.0, 400.0, compute=True) == (0.0, 10.0)
    # communication after the GEMM's reads, never beside them: no switch
    assert dram.reserve(10.0, 2000.0) == (10.0, 12.0)
    assert dram.switched == 0.0


def test_communication_beside_gemm_reads_pays_the_row_switches():
    dram = Dram("toy", RATE, dataclasses.replace(SPEC), record=True)
    dram.reserve(0.0, 4000.0, 400.0, compute=True)  # the GEMM reads at 400 B/s over [0, 10)
    # communication at 200 B/s over [0, 10): shares 1/3 and 2/3 of 600 B/s
    start, end = dram.reserve(0.0, 2000.0, 200.0)
    extra = 6000.0 * _p(1 / 3) * 2 / 4  # 6000 x 64/81 x 1/2 = 2370.37 bytes
    assert dram.switched == pytest.approx(extra)
    assert (start, end) == (0.0, 10.0)  # 400 B/s stayed free: the switches fit under it
    switches = [(s, e, b) for name, s, e, b in dram.log if name == "row switches"]
    assert switches == [(0.0, pytest.approx(extra / 400.0), pytest.approx(extra))]


def test_communication_pays_its_switches_under_its_policy():
    dram = Dram("toy", RATE, SPEC)
    # communication first, uncapped from 0: 2000 bytes at the whole rate, [0, 2)
    assert dram.reserve(0.0, 2000.0) == (0.0, 2.0)
    # then the GEMM's 4000 bytes at 400 B/s: they start at 2 (the HBM was full), [2, 12);
    # no overlap, no switch
    assert dram.reserve(0.0, 4000.0, 400.0, compute=True) == (2.0, 12.0)
    assert dram.switched == 0.0
    # a DMA stream offered at 300 B/s beside the reads: [2, 12) at 300 B/s
    end = dram.stream(policy_named("fr-fcfs"), 2.0, 3000.0, CommWindow(True), "dma reads",
                      300.0)
    extra = 7000.0 * _p(3 / 7) * 2 / 4  # 3008.7 bytes
    assert dram.switched == pytest.approx(extra)
    # FR-FCFS serves communication ahead of the GEMM's requests: the switches take the
    # 700 B/s the stream leaves from 2 (300 free + the GEMM's 400), so they end at
    # 2 + extra / 700 = 6.30, inside the stream, and the GEMM is owed 4/7 of them
    assert end == 12.0
    assert dram.displaced == pytest.approx(extra * 4 / 7)


def test_gemm_reads_reserved_after_the_communication_pay_its_switches():
    dram = Dram("toy", RATE, SPEC)
    dram.stream(policy_named("fr-fcfs"), 0.0, 3000.0, CommWindow(True), "dma reads", 300.0)
    assert dram.switched == 0.0  # nothing beside it yet
    dram.reserve(0.0, 4000.0, 400.0, compute=True)
    assert dram.switched == pytest.approx(7000.0 * _p(4 / 7) * 2 / 4)


def test_off_without_banks_and_in_the_contention_counterfactual():
    plain = Dram("toy", RATE, DramSpec(channels=2, queue_depth=8))
    plain.reserve(0.0, 4000.0, 400.0, compute=True)
    plain.reserve(0.0, 2000.0, 200.0)
    assert plain.switched == 0.0
    apart = Dram("toy", RATE, dataclasses.replace(SPEC, shared=False))
    apart.reserve(0.0, 4000.0, 400.0, compute=True)
    apart.comm(policy_named("fr-fcfs"), 0.0, 2000.0, CommWindow(True))
    assert apart.switched == 0.0 and apart.apart.switched == 0.0


@pytest.mark.parametrize("name,banks", [("t3-sim", 512), ("a100-sxm", 640),
                                        ("h100-sxm", 1280), ("mi210", 512),
                                        ("mi300x", 2048)])
def test_every_preset_gives_its_banks_and_a_switch_cost(name, banks):
    spec = load_device(name)
    assert spec.dram.banks == banks and spec.dram.row_miss_cost == 2.0


def test_the_concepts_page_gives_mi300x_even_mix_as_the_model_computes_it():
    """docs/concepts.md's MI300X figures (k and an even mix's extra channel time), from the
    preset rather than typed by hand."""
    import re
    from pathlib import Path

    spec = load_device("mi300x")
    hbm = Dram("hbm", spec.hbm_bw, spec.dram)
    k, m = hbm.bank_requests, spec.dram.row_miss_cost
    even = _p(0.5, k) * (m - 1.0) / k
    text = " ".join((Path(__file__).parents[1] / "docs" / "concepts.md").read_text().split())
    found = re.search(r"\(k = ([\d.]+), m = ([\d.]+)\) an even mix costs (\d+)% more", text)
    assert found, "docs/concepts.md no longer states MI300X's even-mix cost"
    assert found.groups() == (f"{k:.1f}", f"{m:g}", f"{even * 100:.0f}")
