"""The modelled clock: timelines, serial resources and the program-order turnstile."""

import random
import threading
import time

import pytest

from emulator.model.clock import BandwidthTimeline, ProgramOrder, ProgramOrderTimeout, SerialResource


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
    with pytest.raises(ProgramOrderTimeout, match="waited 0.2 s for op 0"):
        with order.turn(1, "DMA entry x"):
            pass
