"""The numerics check tells right from wrong at every size (collectives/reference.py):
a dropped transfer, an update applied twice, a configuration that forgets its collective
and an all-zero output FAIL with exit 1, and the correct configurations PASS, at 4, 8 and
16 ranks, in fp16, bf16 and fp32, with normal values at K = 1024 and 32768 (integer
values, exact at every size, at 16 ranks and K = 32768). Small M and N keep each run
short; K and the rank count decide the tolerance."""

import json

import numpy as np
import pytest

from collectives.reference import check_against

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


def _plain_check(result, ref, tol):
    """The check written element by element, as the definition check_against's few
    passes must equal: (pass, max error, worst fraction of its tolerance)."""
    res = result.astype(np.float32)
    err = np.abs(res - ref)
    with np.errstate(divide="ignore", invalid="ignore"):
        frac = np.where(tol > 0, err / np.where(tol > 0, tol, 1.0),
                        np.where(err > 0, np.inf, 0.0))
    return (not (err > tol).any(), float(err.max()) if err.size else 0.0,
            float(frac.max()) if frac.size else 0.0)


def test_the_check_equals_its_element_wise_definition():
    rng = np.random.default_rng(7)
    ref32 = rng.standard_normal((37, 29)).astype(np.float32)
    ref64 = ref32.astype(np.float64) + 1e-9
    near = (ref32 + rng.standard_normal(ref32.shape).astype(np.float32) * 1e-3)
    tol = np.abs(rng.standard_normal(ref32.shape)).astype(np.float32) * 2e-3
    mixed = np.where(rng.random(ref32.shape) < 0.3, 0.0, tol).astype(np.float32)
    nan_ref = ref32.copy()
    nan_ref[3, 4] = np.nan
    inf_ref, inf_tol = ref32.copy(), tol.copy()
    inf_ref[5, 6], inf_tol[5, 6] = np.inf, np.inf
    cases = [(near.astype(np.float16), ref32, tol), (near, ref64, tol), (near, ref32, mixed),
             (ref32, ref32, mixed), (near, ref32, np.zeros_like(tol)),
             (ref32, ref32, np.zeros_like(tol)), (near, nan_ref, tol),
             (near, nan_ref, np.zeros_like(tol)), (near, ref32, tol * 1e3),
             (near, inf_ref, inf_tol), (near, ref32, inf_tol), (near, ref32, -tol),
             (near[:0], ref32[:0], tol[:0])]
    for result, ref, t in cases:
        ok, err, worst, note = check_against(result, ref, t)
        want = _plain_check(result, ref, t)
        assert all(a == b or (a != a and b != b) for a, b in zip((ok, err, worst), want)), \
            ((ok, err, worst), want)
        assert (note == "") == ok
    bad = near.copy()
    bad[0, 0], bad[1, 1] = np.nan, np.inf
    ok, err, worst, note = check_against(bad, ref32, tol)
    assert not ok and np.isnan(err) and note == "output has 1 NaN and 1 Inf values"
