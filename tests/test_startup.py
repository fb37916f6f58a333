"""Start-up: numba's cache is built once per install, with a line saying so."""

from __future__ import annotations

from emulator.runtime import numba_cache


def test_the_numba_cache_is_built_once_with_a_line(tmp_path, monkeypatch):
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    from devices import kernels

    warmed = []
    monkeypatch.setattr(kernels, "warm_up", lambda dtypes: warmed.append(dtypes))
    said = []
    assert not numba_cache.built()
    numba_cache.build(said.append)
    assert numba_cache.built() and warmed == [("fp16", "fp32")]
    assert len(said) == 1 and "once for this install" in said[0] and str(tmp_path) in said[0]
    numba_cache.build(said.append)  # built: no line
    assert len(said) == 1
    # another place of the kernels' source (another checkout) has a cache of its own
    monkeypatch.setattr(numba_cache, "__file__", str(tmp_path / "elsewhere" / "emulator" /
                                                     "runtime" / "numba_cache.py"))
    kernels_src = tmp_path / "elsewhere" / "devices" / "kernels.py"
    kernels_src.parent.mkdir(parents=True)
    kernels_src.write_text((numba_cache.Path(kernels.__file__)).read_text())
    assert not numba_cache.built()

