"""`t3emu nccl-tests` as NVIDIA's nccl-tests: its collective names (also taken by `t3emu
run`), its size parsing and per-rank rounding, -d and -o, the all-to-all row and the closing
lines (Out of bounds values, Avg bus bandwidth)."""

import json
import re

import pytest

from emulator import api
from emulator.app import nccl_tests as nt
from tests.conftest import run_cli

SIZE_CASES = [("8", 8), ("1K", 1 << 10), ("1k", 1 << 10), ("128M", 128 << 20), ("1G", 1 << 30),
              ("1.5K", 1536), ("64KB", 64 << 10), ("1e3", 1000), (" 2 M", 2 << 20)]


@pytest.mark.parametrize("text,size", SIZE_CASES)
def test_sizes_parse_as_nccl_tests_parsesize(text, size):
    assert nt.parse_size(text) == size


@pytest.mark.parametrize("text", ["", "K", "1X", "1T", "-8", "1K2", "one"])
def test_a_size_nccl_tests_would_not_read_is_refused(text):
    with pytest.raises(ValueError, match="a size such as"):
        nt.parse_size(text)


def test_b_8_e_1g_gives_nccl_tests_rows():
    rows = nt.sizes(nt.parse_size("8"), nt.parse_size("1G"), 2)
    assert rows[0] == 8 and rows[-1] == 1 << 30 and len(rows) == 28
    assert nt.sizes(nt.parse_size("1K"), nt.parse_size("128M"), 4)[-1] == 64 << 20


@pytest.mark.parametrize("collective,size,e,row", [
    # nccl-tests: per-rank count (count / nranks) & ~(16 / eltSize - 1), 8 ranks
    ("all_gather", 8, 4, (0, 0, 0)),  # 2 floats: nothing per rank
    ("all_gather", 128, 4, (128, 4, 32)),
    ("alltoall", 1000, 2, (896, 56, 448)),  # 500 halves: 62 per rank -> 56
    ("reduce_scatter", 4096, 2, (4096, 256, 2048)),
    ("all_reduce", 8, 4, (8, 2, 8)),  # every element kept; timed as 8 (one per rank)
    ("all_reduce", 1 << 20, 4, (1 << 20, 1 << 18, 1 << 18)),
])
def test_counts_round_as_nccl_tests(collective, size, e, row):
    assert nt.counts(size, 8, collective, e) == row


NAMES = {"all_gather": ["all_gather", "all_gather_perf", "all-gather", "ag", "gemm+ag"],
         "reduce_scatter": ["reduce_scatter", "reduce_scatter_perf", "reduce-scatter", "rs"],
         "all_reduce": ["all_reduce", "all_reduce_perf", "all-reduce", "ar", "gemm+ar"],
         "alltoall": ["alltoall", "alltoall_perf", "all-to-all", "a2a", "gemm+a2a"]}


@pytest.mark.parametrize("collective", list(NAMES))
def test_one_set_of_names_in_run_and_nccl_tests(collective):
    operation = nt.COLLECTIVES[collective][0]
    for name in NAMES[collective]:
        assert nt.resolve(name) == collective
        cfg = api.config(name, ranks=4, modes="sequential", timing_only=True, m=64, n=64,
                         k=64)
        assert cfg.operation.name == operation, name
    with pytest.raises(ValueError, match="alltoall"):
        nt.resolve("ag+gemm")  # an all-gather, but not one nccl-tests times


def test_run_takes_an_nccl_tests_name(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli(["run", "--collective", "reduce_scatter_perf", "-n", "2", "--mode",
                    "sequential", "--m", "64", "--n", "64", "--k", "64", "--timing-only",
                    "--json", str(out)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    runs = json.loads(out.read_text())["runs"]
    assert [list(r["bandwidth"]) for r in runs] == [["rs"]]


def test_the_alltoall_row_follows_nccl_tests_busbw():
    """alltoall_perf: algbw = count x nranks x eltSize / time, busbw = algbw x (n-1)/n;
    count is per peer."""
    n, size = 8, 1 << 20
    r = nt.measure("h800-x8", "alltoall", size, n, dtype="fp32")
    assert (r["size"], r["count"], r["type"], r["redop"], r["root"]) == \
        (size, size // 4 // n, "float", "none", -1)
    algbw = r["count"] * n * 4 / (r["time_us"] * 1e-6) / 1e9
    assert r["algbw"] == pytest.approx(algbw, rel=1e-12)
    assert r["busbw"] == pytest.approx(algbw * (n - 1) / n, rel=1e-12)
    assert r["algorithm"] is None and r["time_us"] > 0  # grouped send/receive: no tuning
    # the same collective phase as the run of its operation
    rows = size // 4 // 256
    seq = api.run("gemm+a2a", m=rows, n=256, k=16, system="h800-x8", ranks=n, dtype="fp32",
                  modes="sequential", timing_only=True)
    assert seq["sequential"].raw["bandwidth"]["a2a"]["bytes"] == size


def _table(stdout: str) -> tuple[list[list[str]], list[str]]:
    rows = [line.split() for line in stdout.splitlines() if line and not line.startswith("#")]
    return rows, [line for line in stdout.splitlines() if line.startswith("# ")]


def test_bfloat16_table_and_its_closing_lines():
    proc = run_cli(["nccl-tests", "h800-x8", "--collective", "all_reduce_perf", "-d",
                    "bfloat16", "-o", "avg", "-b", "1K", "-e", "16K", "-f", "4"], timeout=120)
    assert proc.returncode == 0, proc.stderr
    rows, notes = _table(proc.stdout)
    assert [int(r[0]) for r in rows] == [1 << 10, 4 << 10, 16 << 10]
    assert all(int(r[1]) == int(r[0]) // 2 and r[2:5] == ["bfloat16", "avg", "-1"]
               for r in rows)
    busbw = [float(r[7]) for r in rows]
    for r in rows:  # all_reduce: busbw = algbw x 2(n-1)/n, algbw = size / time
        assert float(r[6]) == pytest.approx(int(r[0]) / float(r[5]) / 1e3, abs=0.006)
        assert float(r[7]) == pytest.approx(int(r[0]) / float(r[5]) / 1e3 * 2 * 7 / 8,
                                            abs=0.006)
    assert "# Out of bounds values : 0 OK" in notes
    avg = [line for line in notes if line.startswith("# Avg bus bandwidth    : ")]
    assert len(avg) == 1
    assert float(avg[0].split(":")[1]) == pytest.approx(sum(busbw) / len(busbw), abs=0.005)
    assert proc.stdout.splitlines()[-1] == "#"


def test_avg_bus_bandwidth_is_the_mean_of_every_row():
    rows = [{"busbw": 1.0}, {"busbw": 0.0}, {"busbw": 5.0}]
    assert nt.footer(rows)[1] == "# Avg bus bandwidth    : 2"


def test_float_and_half_time_the_same_bytes():
    """-d float (nccl-tests' default) and -d half of one size move the same bytes."""
    f = nt.measure("h800-x8", "all_gather", 1 << 16, 8, dtype="fp32")
    h = nt.measure("h800-x8", "all_gather", 1 << 16, 8, dtype="fp16")
    assert (f["size"], f["count"] * 2) == (h["size"], h["count"])
    assert f["time_us"] == pytest.approx(h["time_us"], rel=0.01)


@pytest.mark.parametrize("args,option,value", [
    (["-d", "int8"], "-d/--datatype", "half, bfloat16, float"),
    (["-d", "double"], "-d/--datatype", "half, bfloat16, float"),
    (["-d", "fp16"], "-d/--datatype", "half, bfloat16, float"),
    (["-o", "mulsum"], "-o/--op", "sum, prod, max, min, avg"),
    (["-b", "1X"], "-b/--min-bytes", "1X"),
    (["-e", "8T"], "-e/--max-bytes", "8T"),
    (["--collective", "broadcast"], "--collective", "alltoall"),
])
def test_refused_options_are_one_line(no_launch, args, option, value):
    env, marker = no_launch
    proc = run_cli(["nccl-tests", "h800-x8", *args], timeout=60, env=env)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert re.match(r"t3emu: error: invalid value for ", lines[0]), lines[0]
    assert option in lines[0] and value in lines[0], lines[0]
    assert not proc.stdout and not marker.exists()
