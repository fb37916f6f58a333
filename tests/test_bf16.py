"""bf16 as a real dtype: stored as 2-byte bfloat16 (``ml_dtypes``), widened exactly for the
matrix units, accumulated in fp32, rounded once per write or add; every operation passes
numerics against numpy + MPI (tolerance with bf16's unit roundoff 2^-8) on 2, 3, 4 and 8
ranks in every configuration the device runs; RS-A is refused for bf16 on A100 and H800
(no native bf16 atomic add), as Flux reports."""

import ml_dtypes
import numpy as np
import pytest

from tests.conftest import run_cli, run_pooled
from tests.conftest import run_mpi_script
from tests.ops import modes_for

OPERATIONS = ("gemm+rs", "gemm+ag", "gemm+ar", "gemm+a2a", "ag+gemm", "gemv+ar", "emb+a2a",
              "a2a+gemm")


@pytest.mark.parametrize("ranks", [2, 3, 4, 8])
def test_every_operation_passes_in_bf16(ranks):
    """tests/mpi/bf16.py: every operation with --mode all on A100s behind a switch, normal
    values (the K-sum order differs from numpy's; bf16's tolerance)."""
    from collectives import default_algorithm
    from devices.spec import load_device
    from emulator.app.catalog import registry

    proc = run_mpi_script("bf16.py", ranks, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"BF16 OK {len(OPERATIONS)} operations on {ranks} ranks" in proc.stdout
    reg, spec = registry(), load_device("a100-sxm")
    expected = 0
    for op in OPERATIONS:
        algo = default_algorithm(reg.operation(op).algorithms, "switch")
        expected += len([m for m in modes_for(op, algo)
                         if not reg.refusal(m, spec, "bf16", ranks)])
    passes = [line for line in proc.stdout.splitlines() if "PASS (max err" in line]
    assert len(passes) == expected and "FAIL" not in proc.stdout


@pytest.mark.parametrize("device", ["a100-sxm", "h800"])
def test_rs_a_is_refused_for_bf16_on_a100_and_h800(device):
    proc = run_pooled(["run", "-n", "2", "--device", device, "--topology", "switch",
                       "--collective", "rs", "--dtype", "bf16", "--mode", "flux-rs-a",
                       "--timing-only"], timeout=120)
    assert proc.returncode == 2
    assert "no native bf16 atomics" in proc.stderr and "--mode" in proc.stderr


def test_a_device_without_a_bf16_rate_refuses_bf16():
    proc = run_pooled(["run", "-n", "2", "--collective", "rs", "--dtype", "bf16",
                       "--timing-only"], timeout=120)
    assert proc.returncode == 2 and "gives no bf16 matrix rate" in proc.stderr


def test_bf16_storage_rounds_to_nearest_even_and_widens_exactly():
    from devices import kernels

    f = np.array([1.0, 1 + 2**-8, 1 + 3 * 2**-8, -2.5, 3.0e38, 1e-40], np.float32)
    b = kernels.narrow(f, ml_dtypes.bfloat16)
    assert b.dtype == np.dtype(ml_dtypes.bfloat16)
    # ties to even: 1 + 2^-8 -> 1, 1 + 3 x 2^-8 -> 1 + 2^-6 (the even neighbour)
    assert kernels.widen(b.reshape(2, 3)).ravel()[:3].tolist() == [1.0, 1.0, 1 + 2**-6]
    assert kernels.bf16_to_f32(b)[3] == -2.5
    # an add of two bf16 copies is done in fp32 and rounded once
    x = kernels.narrow(np.full(4, 1.0, np.float32), ml_dtypes.bfloat16)
    y = kernels.narrow(np.full(4, 2**-8, np.float32), ml_dtypes.bfloat16)
    assert kernels.bf16_to_f32(kernels.add(x, y)).tolist() == [1.0] * 4
