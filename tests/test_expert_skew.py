"""Uneven expert loads (``--param expert_skew``, collectives/common.py ``expert_chunks``): the
all-to-all's chunk c, the rows bound for rank c's expert, follows Zipf's law over the
experts. Its split, numerics against numpy + MPI's ``Alltoallv`` on 2, 3, 4 and 8 ranks
with every configuration, and where the time goes: the hot expert's GPU receives most."""

import pytest

from collectives.common import expert_chunks, ring_chunks
from tests.ops import check_numerics_and_timing_only


@pytest.mark.parametrize("world", [2, 3, 8])
def test_the_split_is_zipf_over_the_experts_and_zero_is_balanced(world):
    rows = 1001
    assert expert_chunks(rows, world, 0.0) == ring_chunks(rows, world)
    for skew in (0.5, 1.0, 2.0):
        chunks = expert_chunks(rows, world, skew)
        sizes = [b - a for a, b in chunks]
        assert chunks[0][0] == 0 and chunks[-1][1] == rows
        assert all(a[1] == b[0] for a, b in zip(chunks, chunks[1:]))
        assert sizes == sorted(sizes, reverse=True)  # rank 0's expert is the hottest
        total = sum((c + 1) ** -skew for c in range(world))
        for c, size in enumerate(sizes):  # largest-remainder rounding: within one row
            assert abs(size - rows * (c + 1) ** -skew / total) < 1


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_skewed_all_to_all_passes_numerics_with_every_configuration(emulate, ranks):
    base = ["-n", str(ranks), "--device", "mi300x", "--topology", "switch", "--collective",
            "a2a", "--mode", "all", "--m", "517", "--n", "64", "--k", "96", "--param",
            "expert_skew=1.5"]
    doc = check_numerics_and_timing_only(emulate, base)
    assert {"sequential", "t3", "fused"} <= {r["mode"] for r in doc["runs"]}


def test_the_hot_expert_slows_the_all_to_all_of_the_same_bytes(emulate):
    """The same rows leave every GPU; with skew most of them go to rank 0, whose ingress
    port then takes (N-1) x its chunk: the library all-to-all gets slower with the skew,
    the GEMM before it does not change."""
    times = {}
    for skew in (0, 1, 2):
        doc = emulate(["--system", "mi300x-x8", "--collective", "a2a", "--mode", "sequential",
                       "--m", "8192", "--n", "4096", "--k", "4096", "--timing-only",
                       "--param", f"expert_skew={skew}"])
        phases = doc["runs"][0]["phases"]
        times[skew] = (phases["gemm"], phases["a2a"])
    assert times[0][0] == times[1][0] == times[2][0]
    assert times[0][1] < times[1][1] < times[2][1]
