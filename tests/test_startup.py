"""Start-up: numba's cache is built once per install, with a line saying so."""

from __future__ import annotations

from emulator.runtime import numba_cache


def test_the_numba_cache_is_built_once_with_a_line(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    from devices import loop_kernels

    warmed = []
    monkeypatch.setattr(loop_kernels, "warm_up", lambda: warmed.append(1))
    said = []
    assert not numba_cache.built()
    numba_cache.build(said.append)
    assert numba_cache.built() and warmed == [1]
    assert len(said) == 1 and "once for this install" in said[0] and str(tmp_path) in said[0]
    numba_cache.build(said.append)  # built: no line
    assert len(said) == 1
    # another place of the kernels' source (another checkout) has a cache of its own
    monkeypatch.setattr(numba_cache, "__file__", str(tmp_path / "elsewhere" / "emulator" /
                                                     "runtime" / "numba_cache.py"))
    kernels_src = tmp_path / "elsewhere" / "devices" / "loop_kernels.py"
    kernels_src.parent.mkdir(parents=True)
    kernels_src.write_text((numba_cache.Path(loop_kernels.__file__)).read_text())
    assert not numba_cache.built()



def test_a_gemm_and_copy_rank_imports_no_numba():
    """The GEMM stages, copies, adds and roundings are numpy's; only the GEMV and
    embedding-bag producers load numba (``process.warm_kernels``)."""
    code = """
import sys
import numpy as np
from devices import kernels
from emulator.runtime.process import warm_kernels
a = kernels.widen(np.ones((8, 4), np.float16))
b = kernels.widen(np.ones((4, 6), np.float16))
out = np.empty((8, 6), np.float32)
kernels.gemm_blocks(a, b, np.array([[0, 8, 0, 6, 0, 4]], np.int64), out)
kernels.add(kernels.narrow(out, np.float16), kernels.narrow(out, np.float16))
warm_kernels(None, 1.0, "gemm")
assert "numba" not in sys.modules, "numba imported"
kernels.gemv_rows(a, b, np.array([[0, 8, 0, 6, 0, 4]], np.int64), out)
assert "numba" in sys.modules
assert (out == 4).all()
"""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
