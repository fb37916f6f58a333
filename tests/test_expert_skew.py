"""Uneven expert loads (``--param expert_skew``, collectives/common.py ``expert_chunks``): the
all-to-all's chunk c, the rows bound for rank c's expert, follows Zipf's law over the
experts. Its split, numerics against numpy + MPI's ``Alltoallv`` on 2, 3, 4 and 8 ranks
with every configuration, and where the time goes: the hot expert's GPU receives most.
Both all-to-alls: the combine after the experts (``gemm+a2a``) and the dispatch before
them (``a2a+gemm``, ``dispatch_rows``: each expert's GEMM then has rows of its own)."""

import numpy as np
import pytest

from collectives.common import dispatch_rows, expert_chunks, ring_chunks
from tests.conftest import run_cli, run_pooled
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


def test_the_dispatch_routes_every_senders_tokens_by_the_same_zipf_split():
    rows, world = 1001, 4
    balanced = dispatch_rows(rows, world, 0.0)
    for s, (a, b) in enumerate(ring_chunks(rows, world)):  # one block of its chunk each
        assert (balanced[s] == b - a).all()
    assert (balanced.sum(axis=0) == rows).all()  # every expert receives M rows
    skewed = dispatch_rows(rows, world, 1.0)
    assert (skewed.sum(axis=1) == balanced.sum(axis=1)).all()  # the same tokens leave
    for s in range(world):
        assert [int(x) for x in skewed[s]] == [b - a for a, b in
                                               expert_chunks(int(skewed[s].sum()), world, 1.0)]
    received = skewed.sum(axis=0)
    assert list(received) == sorted(received, reverse=True) and received[0] > rows


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_skewed_dispatch_passes_numerics_with_every_configuration(emulate, ranks):
    """Each rank's expert GEMM has its own rows; FiCCO's schedules address a peer's
    pieces where they land in that peer's input. The loss runs (ficco-dil, ficco-cil)
    need one GEMM shape and are left out of --mode all."""
    base = ["-n", str(ranks), "--device", "mi300x", "--topology", "full-mesh",
            "--collective", "a2a+gemm", "--mode", "all", "--m", "517", "--n", "64", "--k",
            "96", "--param", "expert_skew=1.5"]
    doc = check_numerics_and_timing_only(emulate, base)
    modes = {r["mode"] for r in doc["runs"]}
    assert {"sequential", "ficco-shard", "ficco-uniform-fused-2d", "ficco-cu-hetero-fused-1d",
            "ficco-auto"} <= modes and not {"ficco-dil", "ficco-cil"} & modes


def test_a_dispatch_that_leaves_experts_without_tokens_still_runs(emulate):
    """m = ranks, skew 4: every token goes to rank 0's expert, the others' GEMMs are
    empty."""
    assert (dispatch_rows(4, 4, 4.0)[:, 1:] == 0).all()
    base = ["-n", "4", "--device", "mi300x", "--topology", "full-mesh", "--collective",
            "a2a+gemm", "--mode", "all", "--m", "4", "--n", "30", "--k", "20", "--param",
            "expert_skew=4"]
    check_numerics_and_timing_only(emulate, base)


def test_the_loss_runs_are_refused_with_uneven_experts():
    proc = run_pooled(["run", "-n", "2", "--collective", "a2a+gemm", "--mode", "ficco-dil",
                       "--param", "expert_skew=1"], timeout=60)
    assert proc.returncode == 2 and "needs the same GEMM on every rank" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_hot_expert_slows_the_dispatch_and_its_gemm(emulate):
    """The same tokens leave every GPU; with skew rank 0 receives most of them (its
    ingress ports take the dispatch's bytes) and its expert GEMM grows with them: the
    library all-to-all and the GEMM's critical path both get slower with the skew, and
    FiCCO's ideal (max of the two) follows its slowest rank."""
    t, ideal = {}, {}
    for skew in (0, 1, 2):
        doc = emulate(["--system", "mi300x-x8", "--collective", "a2a+gemm", "--mode",
                       "ficco-serial,ficco-ideal", "--m", "8192", "--n", "4096", "--k",
                       "4096", "--timing-only", "--param", f"expert_skew={skew}"])
        runs = {r["mode"]: r for r in doc["runs"]}
        t[skew] = runs["ficco-serial"]["phases"]["a2a"]
        ideal[skew] = runs["ficco-ideal"]["phases"]["gemm"]
    assert t[0] < t[1] < t[2]
    assert ideal[0] < ideal[1] < ideal[2]
    rows = dispatch_rows(8192, 8, 1.0).sum(axis=0)
    # compute-bound: the GEMM grows with the hot expert's rows, give or take the tile and
    # wave quantisation of the kernels the heuristic picks for each (64 x 64 tiles for
    # 8192 rows, 256 x 256 for the hot expert's 24112, tiled over all its rows as the
    # serial baseline's GEMM)
    assert rows[0] / 8192 * 0.9 <= ideal[1] / ideal[0] <= rows[0] / 8192 * 1.1
    assert np.all(rows[:-1] >= rows[1:])


def test_ficco_ideal_runs_the_serial_baselines_gemm(emulate):
    """FiCCO's ideal is the whole GEMM alone: on every rank, with a hot expert too, its GEMM
    takes exactly the serial baseline's GEMM time (one GEMM over all the received rows,
    not one tile grid per sender's block)."""
    doc = emulate(["--system", "mi300x-x8", "--collective", "a2a+gemm", "--mode",
                   "ficco-serial,ficco-ideal", "--m", "8192", "--n", "4096", "--k", "4096",
                   "--timing-only", "--param", "expert_skew=1"])
    runs = {r["mode"]: r for r in doc["runs"]}

    def gemm(mode: str) -> list[float]:
        return [ph["gemm"][1] - ph["gemm"][0] for ph in runs[mode]["rank_phases_s"]]

    assert gemm("ficco-ideal") == pytest.approx(gemm("ficco-serial"), rel=1e-9)
    assert gemm("ficco-ideal")[0] > 2 * gemm("ficco-ideal")[-1]  # the hot expert's
