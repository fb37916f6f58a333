"""The modelled clock: timelines, serial resources and the program-order turnstile."""

import random
import threading
import time

import pytest

from emulator.model.clock import (BandwidthTimeline, ProgramOrder, ProgramOrderTimeout,
                                  SerialResource, reserve_together)


def test_bandwidth_timeline_serialises_full_rate_transfers():
    link = BandwidthTimeline("link", 100.0)
    log = [("a", link.reserve(0.0, 100)), ("b", link.reserve(0.0, 50)), ("c", link.reserve(5.0, 100))]
    assert log == [("a", (0.0, 1.0)), ("b", (1.0, 1.5)), ("c", (5.0, 6.0))]


def test_bandwidth_timeline_shares_rate_by_cap():
    hbm = BandwidthTimeline("hbm", 100.0)
    # a compute stream at 60 B/s for 1 s leaves 40 B/s to a capped communication stream
    assert hbm.reserve(0.0, 60, cap=60) == (0.0, 1.0)
    assert hbm.reserve(0.0, 60, cap=50) == (0.0, pytest.approx(1.4))  # 40 B in 1 s, 20 B at 50 B/s
    # a later full-rate transfer fills what is left: nothing until 1 s, 50 B/s until 1.4 s
    # (20 B), then the full 100 B/s (10 B in 0.1 s)
    assert hbm.reserve(0.0, 30) == (1.0, pytest.approx(1.5))


@pytest.mark.parametrize("share,end,displaced,held_from,held", [
    (0.5, 11.0, 100.0, 0.0, 50.0),  # communication up to half: 10 B/s of compute's 60 for
    # 10 s, then the free HBM (100 B in 1 s); compute keeps 50 B/s
    (1.0, 200 / 60, 200.0, 200 / 60, 60.0),  # all of compute's 60 B/s: 200 B in 3.33 s
    (0.0, 12.0, 0.0, 0.0, 60.0)])  # none (compute first): the free HBM after 10 s
def test_communication_takes_its_share_from_compute_reserved_before_it(
        share, end, displaced, held_from, held):
    """HBM of 100 B/s: compute at 60 B/s and other communication at 40 B/s over [0, 10 s),
    both reserved first; then 200 B of communication from 0. It takes the free rate (none
    before 10 s), then from compute as much as brings communication to ``share`` of the
    rate (the 40 already there count), and returns compute's bytes it took. A last byte
    that may take all of compute's rate finds what compute still holds."""
    hbm = BandwidthTimeline("hbm", 100.0, kinds=True)
    assert hbm.fill(0.0, 600, cap=60, compute=True)[:2] == (0.0, 10.0)
    assert hbm.reserve(0.0, 400, cap=40) == (0.0, 10.0)
    start, stop, took = hbm.preempt(0.0, 200, None, share)
    assert (start, stop, took) == (pytest.approx(0.0 if share else 10.0), pytest.approx(end),
                                   pytest.approx(displaced))
    assert hbm.preempt(0.0, 1, None, 1.0) == (pytest.approx(held_from),
                                              pytest.approx(held_from + 1 / held),
                                              pytest.approx(1.0))


def test_a_route_s_ports_carry_a_transfer_in_the_same_intervals():
    """Port a is full over [0, 1), port b free (rates 1): a byte through both waits for a
    and takes [1, 2) on both; b stays free over [0, 1) (a hop is not held while another
    stalls the transfer). Then 0.7 of a's rate is taken over [2.3, 2.89) and all of it
    over [2.89, 3.0): the bytes the 0.3 left holds from 2.3 end by 2.89, as ``fill`` on a
    alone finds (not pushed past the full window by a rounding leftover)."""
    a, b = BandwidthTimeline("a", 1.0), BandwidthTimeline("b", 1.0)
    a.reserve(0.0, 1.0)
    assert reserve_together([a, b], 0.0, 1.0, 1.0) == (1.0, 2.0)
    assert b.reserve(0.0, 1.0) == (0.0, 1.0)  # b was free over [0, 1)
    for line in (a, alone := BandwidthTimeline("a2", 1.0)):
        line.fill(2.3, 1.0, 0.7, until=2.89)  # 0.7 of the rate over [2.3, 2.89)
        line.fill(2.89, 1.0, until=3.0)  # all of it over [2.89, 3.0)
    nbytes = 0.3 * (2.89 - 2.3)  # what the 0.3 left holds, to the last bit
    _, end = reserve_together([a, BandwidthTimeline("c", 1.0)], 2.3, nbytes, 1.0)
    assert end == alone.fill(2.3, nbytes)[1] and end < 2.9
    assert reserve_together([a, b], 5.0, 0.0, 1.0) == (5.0, 5.0)


def test_bandwidth_timeline_rejects_bad_arguments():
    with pytest.raises(ValueError):
        BandwidthTimeline("x", 0.0)
    with pytest.raises(ValueError):
        BandwidthTimeline("x", 1.0).reserve(-1.0, 5)


def test_serial_resource():
    cu = SerialResource("cu")
    assert cu.reserve(2.0, 1.0) == (2.0, 3.0)
    assert cu.reserve(0.0, 1.0) == (3.0, 4.0)


def _threaded_run(jitter_seed: int) -> list:
    """Two threads reserving one timeline through the turnstile with random host delays."""
    rng = random.Random(jitter_seed)
    delays = [rng.random() * 2e-3 for _ in range(40)]
    order = ProgramOrder("test", 10.0)
    hbm = BandwidthTimeline("hbm", 10.0)
    log = []

    def worker(indices):
        for i in indices:
            time.sleep(delays[i])
            with order.turn(i, f"op {i}"):
                log.append((i, hbm.reserve(i * 0.1, 1 + i % 3, cap=5 + i % 4)))

    threads = [threading.Thread(target=worker, args=(range(p, 40, 2),)) for p in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return log


def test_program_order_makes_timing_independent_of_host_scheduling():
    runs = [_threaded_run(seed) for seed in range(3)]
    assert runs[0] == runs[1] == runs[2]
    assert [i for i, _ in runs[0]] == list(range(40))


def test_program_order_times_out_with_a_message():
    order = ProgramOrder("rank 0 program order", 0.2)
    with pytest.raises(ProgramOrderTimeout,
                       match=r"waited 0.2 s \(without progress on any rank\) for op 0"):
        with order.turn(1, "DMA entry x"):
            pass
