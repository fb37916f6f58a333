"""TransformerEngine's comm+GEMM overlap as TE runs it (collectives/transformer_engine.py):
numerics against numpy + MPI on 2, 3, 4 and 8 ranks, timing-only equal to numeric runs,
chunk GEMMs and transfers at once in the trace, te-best as the fastest of TE's forms,
and TE refused where TE does not run (across nodes; the aggregate form on odd sizes)."""

import json

import pytest

from tests.conftest import run_cli, run_pooled

AG = ("te-ring", "te-ring-aggregate")
RS = ("te-pipeline", "te-p2p")
SAME = ("modelled_time_s", "phases", "dram_bytes")


def _modes(collective: str, ranks: int) -> tuple[str, ...]:
    forms = AG if collective == "ag-gemm" else RS
    return tuple(m for m in forms if not (m == "te-ring-aggregate" and ranks % 2))


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
@pytest.mark.parametrize("collective", ["ag-gemm", "rs"])
def test_te_forms_pass_numerics_and_time_alike(emulate, ranks, collective):
    """fp32 with split-K 2 for the RS (the partials are updates): every TE form and te-best
    pass against numpy + MPI; timing-only gives the same modelled times."""
    modes = (*_modes(collective, ranks), "te-best")
    args = ["-n", str(ranks), "--device", "a100-sxm", "--topology", "switch", "--collective",
            collective, "--m", str(96 * ranks + 8), "--n", "384", "--k", "256", "--dtype",
            "fp32", "--mode", ",".join(modes)] + (["--split-k", "2"] if collective == "rs"
                                                  else [])
    numeric = emulate(args)
    assert [r["mode"] for r in numeric["runs"]] == list(modes)
    assert {r["numerics"] for r in numeric["runs"]} == {"pass"}
    timing = emulate(args + ["--timing-only"])
    for a, b in zip(numeric["runs"], timing["runs"], strict=True):
        for key in SAME:
            assert a[key] == b[key], (a["mode"], key)
    # te-best: the fastest of TE's forms, and it says which
    t = {r["mode"]: r["modelled_time_s"] for r in numeric["runs"]}
    best = next(r for r in numeric["runs"] if r["mode"] == "te-best")
    assert best["search"]["chosen"] == min(_modes(collective, ranks), key=lambda m: t[m])
    assert t["te-best"] == min(t[m] for m in _modes(collective, ranks))


@pytest.mark.parametrize("mode,mover", [("te-ring", "dma"), ("te-ring-aggregate", "dma"),
                                        ("te-pipeline", "cu-kernel"), ("te-p2p", "dma")])
def test_chunk_gemms_and_transfers_run_at_once(tmp_path, mode, mover):
    """The trace of every TE form shows a chunk GEMM and a transfer (copy engine, or the RS
    kernel on its own SMs) running at the same time on a rank."""
    collective = "ag-gemm" if mode in AG else "rs"
    path = tmp_path / "trace.json"
    proc = run_pooled(["run", "-n", "4", "--device", "a100-sxm", "--topology", "switch",
                       "--collective", collective, "--m", "4096", "--n", "2048", "--k", "2048",
                       "--timing-only", "--mode", mode, "--trace", str(path)], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    events = [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    for pid in {e["pid"] for e in events}:
        gemms = [(e["ts"], e["ts"] + e["dur"]) for e in events
                 if e["pid"] == pid and e.get("cat") == "gemm"]
        moves = [(e["ts"], e["ts"] + e["dur"]) for e in events
                 if e["pid"] == pid and e.get("cat") == mover]
        overlap = max((min(g1, m1) - max(g0, m0) for g0, g1 in gemms for m0, m1 in moves),
                      default=0.0)
        assert overlap > 0, (mode, pid)


@pytest.mark.parametrize("mode", ["te-best", "te-ring", "te-pipeline"])
def test_te_is_refused_across_nodes(mode):
    """TE's userbuffers run tensor parallelism within one node: a job over two nodes is
    refused with exit 2 and the reason."""
    collective = "ag-gemm" if mode in AG else "rs"
    proc = run_pooled(["run", "--system", "a100-sxm-2x8", "--collective", collective,
                       "--mode", mode, "--timing-only"], timeout=120)
    assert proc.returncode == 2
    assert "within one node" in proc.stderr and "2 nodes of 8" in proc.stderr


def test_te_aggregate_is_refused_on_an_odd_size_and_left_out_of_all(emulate):
    base = ["-n", "3", "--device", "a100-sxm", "--topology", "switch", "--collective",
            "ag-gemm", "--m", "96", "--n", "128", "--k", "64", "--timing-only"]
    proc = run_pooled(["run", *base, "--mode", "te-ring-aggregate"], timeout=120)
    assert proc.returncode == 2 and "pairs ranks" in proc.stderr
    modes = {r["mode"] for r in emulate([*base, "--mode", "all"])["runs"]}
    assert {"te-ring", "te-best"} <= modes and "te-ring-aggregate" not in modes
