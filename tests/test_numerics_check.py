"""The numerics check tells right from wrong at every size (collectives/reference.py):
a dropped transfer, an update applied twice, a configuration that forgets its collective
and an all-zero output FAIL with exit 1, and the correct configurations PASS, at 4, 8 and
16 ranks, in fp16, bf16 and fp32, with normal values at K = 1024 and 32768 (integer
values, exact at every size, at 16 ranks and K = 32768). Small M and N keep each run
short; K and the rank count decide the tolerance."""

import json

import pytest

from tests.conftest import ROOT, run_pooled

PLUGIN = str(ROOT / "tests" / "data" / "no_collective.py")
CASES = ([(r, d, "normal", k) for r in (4, 8, 16) for d in ("fp16", "bf16", "fp32")
          for k in (1024, 32768)]
         + [(16, d, "int", 32768) for d in ("fp16", "bf16", "fp32")])
FAULTS = (("drop-dma@1", "t3"), ("double-dma@1", "t3"), ("zero-output@1", "sequential"))


def _run(tmp_path, args: list[str]) -> tuple[int, dict, str]:
    out = tmp_path / f"r{len(list(tmp_path.iterdir()))}.json"
    proc = run_pooled(["run", *args, "--json", str(out)], timeout=300)
    doc = json.loads(out.read_text()) if out.exists() else {}
    return proc.returncode, doc, proc.stdout + proc.stderr


@pytest.mark.parametrize("ranks,dtype,values,k", CASES,
                         ids=[f"{r}r-{d}-{v}-k{k}" for r, d, v, k in CASES])
def test_injected_faults_fail_and_correct_runs_pass(tmp_path, ranks, dtype, values, k):
    base = ["-n", str(ranks), "--device", "mi210", "--m", "64", "--n", "32", "--k", str(k),
            "--dtype", dtype, "--values", values]
    rc, doc, out = _run(tmp_path, base + ["--configs", PLUGIN, "--mode",
                                          "sequential,t3,no-collective"])
    runs = {r["mode"]: r for r in doc["runs"]}
    assert rc == 1, out
    assert runs["sequential"]["numerics"] == runs["t3"]["numerics"] == "pass", out
    assert runs["no-collective"]["numerics"] == "fail", out
    for mode in ("sequential", "t3"):  # the errors are well inside the tolerance
        assert runs[mode]["max_error_vs_tolerance"] < 1.0
    assert runs["no-collective"]["max_error_vs_tolerance"] > 1.0
    for fault, mode in FAULTS:
        rc, doc, out = _run(tmp_path, base + ["--mode", mode, "--inject-fault", fault])
        assert rc == 1 and doc["runs"][0]["numerics"] == "fail", (fault, out)
        assert "never fired" not in out, (fault, out)
