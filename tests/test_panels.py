"""The panel model's sets of operand panels (``emulator/model/cost.py``, ``Panels``),
checked against a plain Python set of (side, start, end, k0, k1) tuples built here."""

import numpy as np
import pytest

from emulator.model.cost import Panels


def _tuples(wgs):
    return ({("A", int(r0), int(r1), int(k0), int(k1)) for r0, r1, _, _, k0, k1 in wgs}
            | {("B", int(c0), int(c1), int(k0), int(k1)) for _, _, c0, c1, k0, k1 in wgs})


def _elements(panels):
    return sum((p[2] - p[1]) * (p[4] - p[3]) for p in panels)


def _tiles(rng, n, slices):
    """n tiles of a 4096 x 4096 output at 128 x 128 (some repeated) over ``slices`` K
    slices of 1024."""
    r = rng.integers(0, 32, n) * 128
    c = rng.integers(0, 32, n) * 128
    k = rng.integers(0, slices, n) * 1024
    return np.stack([r, r + 128, c, c + 128, k, k + 1024], axis=1).astype(np.int64)


@pytest.mark.parametrize("slices", [1, 3])
def test_panels_and_their_shared_elements_match_a_set_of_tuples(slices):
    rng = np.random.default_rng(7)
    for _ in range(20):
        a, b = _tiles(rng, 40, slices), _tiles(rng, 40, slices)
        pa, pb = Panels.of(a), Panels.of(b)
        ta, tb = _tuples(a), _tuples(b)
        assert len(pa) == len(ta) and pa.elements() == _elements(ta)
        assert pa.shared(pb) == pb.shared(pa) == _elements(ta & tb)


def test_a_row_panel_and_a_column_panel_with_the_same_bounds_are_different_panels():
    wgs = np.array([[0, 128, 0, 128, 0, 64]], np.int64)  # A rows 0:128, B columns 0:128
    p = Panels.of(wgs)
    assert len(p) == 2 and p.elements() == 2 * 128 * 64
    assert p.shared(Panels.of(wgs)) == 2 * 128 * 64
    assert p.shared(Panels.of(np.array([[0, 128, 128, 256, 0, 64]], np.int64))) == 128 * 64


def test_no_tiles_hold_no_panels_and_bounds_beyond_the_key_are_refused():
    empty = Panels.of(np.zeros((0, 6), np.int64))
    assert len(empty) == 0 and empty.elements() == 0
    assert empty.shared(Panels.of(np.array([[0, 1, 0, 1, 0, 1]], np.int64))) == 0
    with pytest.raises(ValueError, match="2\\*\\*30"):
        Panels.of(np.array([[0, 1 << 30, 0, 1, 0, 1]], np.int64))
