"""The address-space map's routing, the collectives' maps and the program order."""

import numpy as np
import pytest

from collectives import direct, ring
from collectives.common import Problem, ring_chunks
from devices.spec import load_device
from emulator.engine.addrmap import AddressMap, MapError, TileSpace, tile_grid
from emulator.engine.plan import Slots
from emulator.engine.kernel import Kernel, make_wgs
from emulator.engine.producers import TiledGemm
from emulator.engine.program import program_order

SPEC = load_device("t3-sim")


def problem(rank, world, m=517, n=300, k=129, split=1):
    return Problem(rank, world, m, n, k, SPEC, np.dtype(np.float16), split)


def test_ring_chunks_cover_rows_unevenly():
    assert ring_chunks(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def _chunk_of(p, space, t):
    return next(c for c in range(p.world) if p.chunk(c)[0] <= space.tiles[t][0] < p.chunk(c)[1])


@pytest.mark.parametrize("split", [1, 3])
def test_ring_rs_map_routes_each_ring_step(split):
    p = problem(1, 4, split=split)
    job, amap = ring.rs_map(p, Slots())
    compiled = amap.compile()
    space = amap.space
    chunks = [_chunk_of(p, space, t) for t in job.wg_tile]
    # WG order walks chunks 2, 3, 0, 1 (staggered by rank), split WGs per tile
    assert chunks[:: len(chunks) // 4] == [2, 3, 0, 1]
    assert (np.bincount(job.wg_tile) == split).all()
    for t, route in compiled.routes.items():
        if _chunk_of(p, space, t) == 2:  # stage 1: remote updates into rank 0 only
            assert route.local_op == "none" and [(g.rank, g.op) for g in route.targets] == \
                [(0, "update")]
        else:
            assert route.local_op == "update" and route.slot >= 0 and not route.targets
    dma = [c for c in compiled.commands if c.src is not None]
    # thresholds follow from the split degree: S local WGs + S remote WGs (stage 2) or 1 DMA
    for c in dma:
        chunk = _chunk_of(p, space, int(c.trigger.slots[0]))
        after = 2 * split if chunk == 3 else split + 1
        assert c.dst_rank == 0 and c.op == "update"
        assert (c.trigger.thresholds == after * np.array(c.dst_elems)).all()
        assert compiled.incoming[id(c.trigger)][0] == after - split


def test_direct_maps_send_every_slice_to_its_owner():
    p = problem(0, 3)
    job, amap = direct.rs_map(p, Slots())
    compiled = amap.compile()
    for t, route in compiled.routes.items():
        owner = _chunk_of(p, amap.space, t)
        assert [g.rank for g in route.targets] == ([] if owner == 0 else [owner])
    (sink,) = compiled.commands
    assert sink.src is None and compiled.incoming[id(sink.trigger)][0] == 2
    # direct AG: stored locally and multicast to every peer
    job, amap = direct.ag_map(p, Slots())
    routes = amap.compile().routes
    assert {r.local_op for r in routes.values()} == {"store"}
    assert all([g.rank for g in r.targets] == [1, 2] for r in routes.values())


def test_a2a_map_writes_nothing_locally_but_into_the_receive_blocks():
    p = problem(1, 3)
    job, (amap, xmap) = direct.a2a_map(p, Slots())
    for t, route in amap.compile().routes.items():
        owner = _chunk_of(p, amap.space, t)
        (g,) = route.targets
        assert route.local_op == "none" and g.rank == owner and g.buffer == "X"
        assert p.slot_region(1, owner)[0] <= g.region[0] < p.slot_region(1, owner)[1]
    assert len(xmap.compile().commands) > 0  # receivers track the peers' blocks


def _space(rows=10, cols=8, tm=4, tn=4):
    return TileSpace("C", tile_grid([(0, rows)], cols, tm, tn), 0)


def test_map_refuses_wrong_maps_when_built():
    amap = AddressMap(_space(), rank=0, world=2)
    amap.dma_map((0, 4, 0, 8), 1)
    with pytest.raises(MapError, match="mapped twice"):
        amap.remote_map((0, 4, 0, 4), 1)
    with pytest.raises(MapError, match="whole tiles"):
        amap.track((0, 3, 0, 4))
    with pytest.raises(MapError, match="onto itself"):
        amap.remote_map((4, 8, 0, 4), 0)
    with pytest.raises(MapError, match="outside"):
        amap.remote_map((4, 8, 0, 4), 5)
    with pytest.raises(MapError, match="shape"):
        amap.remote_map((4, 8, 0, 4), 1, to=_space(), to_region=(0, 4, 0, 8))
    split = AddressMap(_space(), 0, 2, "update", np.full(6, 2))
    with pytest.raises(MapError, match="below the producer's own 2 writes"):
        split.dma_map((4, 8, 0, 8), 1, after=1)


def test_unmapped_tiles_keep_the_producer_op_only_where_allowed():
    compiled = AddressMap(_space(8), 0, 1, "store", local_ok=True).compile()
    assert all(r.local_op == "store" and r.slot < 0 for r in compiled.routes.values())
    assert compiled.commands == []
    # a collective's map that forgets a region is refused when it is built
    amap = AddressMap(_space(8), 0, 2, "update")
    amap.dma_map((0, 4, 0, 8), 1)
    with pytest.raises(MapError, match=r"2 tile\(s\) of C never mapped, e.g. \(4, 8, 0, 4\)"):
        amap.compile()
    amap.track((4, 8, 0, 8))
    assert len(amap.compile().commands) == 2


@pytest.mark.parametrize("split", [1, 2])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_collective_map_places_every_tile_once(world, split):
    """Each built-in plan compiles (a tile never mapped or mapped twice would raise)."""
    from emulator.app.catalog import registry
    from emulator.engine.plan import KernelPhase

    reg = registry()
    for op in reg.operations.values():
        for algo in op.algorithms:
            for mode in reg.configurations_for(op, algo):
                spec = problem(0, world, split=split).spec
                if reg.refusal(mode, spec, "fp16", world):  # not built where it is refused
                    continue
                for rank in range(world):
                    plan = reg.configuration(mode).build(problem(rank, world, split=split), op,
                                                         algo)
                    for ph in plan.phases:
                        if isinstance(ph, KernelPhase):
                            for m in ph.maps:
                                m.compile()


def test_program_order_places_entries_by_last_write_and_by_gate():
    space = _space(8)  # 4 tiles
    amap = AddressMap(space, 0, 2, "update")
    amap.dma_map((0, 8, 0, 4), 1)  # tiles 0 and 2
    amap.track((0, 4, 4, 8))  # tile 1
    amap.track((4, 8, 4, 8))  # tile 3
    wgs, wg_tile = make_wgs(space, [0, 1, 2, 3], 5, 1)
    job = Kernel(TiledGemm(), space, wgs, wg_tile, np.arange(4), stage_size=2)
    stage_index, commands = program_order(job, amap.compile().commands, 0, 4)
    # stage 0 = tiles 0,1; stage 1 = tiles 2,3 -> the dma of (0,2) after stage 1; the
    # tracks are sinks (their regions may need peers' writes that come after this
    # rank's later stages): after the last stage
    assert stage_index == [0, 1]
    assert [(c.order, list(c.trigger.slots)) for c in commands] == [(2, [0, 2]), (3, [1]), (4, [3])]
    assert [c.compute_after for c in commands] == [False, False, False]
    # a consumer gate pulls its entry before the stage that needs it
    gated = job.with_stage_gates({1: (commands[2].trigger,)})
    stage_index, commands = program_order(gated, amap.compile().commands, 0, 4)
    assert [c.order for c in commands if list(c.trigger.slots) == [3]] == [1]
    assert stage_index == [0, 2]


@pytest.mark.parametrize("stage_size", [1, 3, 7, 40])
def test_program_order_of_launch_items_equals_the_items_one_by_one(stage_size):
    """The latest stage of each slot, taken for all the stages of a ``LaunchItems`` kernel
    at once (``program._spanned``), gives the program order the loop over its rows gives:
    runs over two K slices (so later stages write the tiles again), stages that cross a
    run (no span), a map that tracks a region whole (``slot_of``) and slots past the
    tracker's end."""
    from devices.regions import RegularGrid
    from emulator.engine.kernel import LaunchItems

    grid = RegularGrid([(0, 16), (16, 24)], 16, 4, 4)  # 4 x 4 tiles, then 2 x 4
    space = TileSpace("C", grid, 0)
    amap = AddressMap(space, 0, 2, "update", local_ok=True)
    for r0, c0 in [(r, c) for r in (0, 4) for c in (0, 4, 8, 12)] + [(16, 0), (16, 4)]:
        amap.dma_map((r0, r0 + 4, c0, c0 + 4), 1)  # tiles 0-7, 16 and 17: one each
    whole = amap.track((8, 16, 0, 16), whole=True)  # tiles 8-15 counted into one slot,
    copies = TileSpace("D", RegularGrid([(0, 8)], 16, 4, 4), 100)  # copied out once done
    amap.copy_map((8, 16, 0, 16), copies, (0, 8, 0, 16), whole)
    amap.track((20, 24, 8, 16))
    runs = [(0, len(grid), 0, 16), (0, 10, 16, 32), (12, len(grid), 16, 32)]
    items = LaunchItems(grid, runs)
    rows = np.asarray(items)
    compiled = amap.compile()
    slot_of = compiled.routes.slot
    assert (slot_of[8:16] == slot_of[8]).all() and slot_of[8] >= 0  # (tracked whole)
    need = 1 + max(int(c.trigger.slots.max()) for c in compiled.commands)
    answers = []
    for wgs in (items, rows):
        job = Kernel(TiledGemm(), space, wgs, np.asarray(items.tiles), np.arange(len(rows)),
                     stage_size=stage_size)
        for nslots, mapped in ((need, slot_of), (need + 5, slot_of), (need, None)):
            stage_index, commands = program_order(job, compiled.commands, 0, nslots, mapped)
            answers.append((stage_index, [(c.order, c.compute_after) for c in commands]))
    assert answers[:3] == answers[3:]


@pytest.mark.parametrize("lazy", [False, True])
def test_tiles_at_finds_every_tile_and_refuses_a_cut_region(lazy):
    """The vectorised lookup a map's destination tiles use: the same ids as ``tile_at`` on
    uneven row blocks and ragged edges, on an array grid and on a lazy ``RegularGrid``."""
    from devices.regions import RegularGrid

    blocks = [(0, 130), (130, 517)]
    tiles = (RegularGrid(blocks, 300, 64, 128) if lazy
             else tile_grid(blocks, 300, 64, 128, 1))
    space = TileSpace("C", tiles, 0)
    ids = np.arange(len(space))[::-1]
    regions = np.asarray(space.tiles[ids], np.int64)
    assert space.tiles_at(regions).tolist() == [space.tile_at(tuple(r)) for r in regions]
    for cut in ([0, 64, 0, 100], [0, 64, 128, 256 + 1], [130, 194, 300, 428], [-64, 0, 0, 128]):
        with pytest.raises(MapError, match="is not a tile of C"):
            space.tiles_at(np.array([regions[0], cut]))


def test_launch_items_stage_shapes_match_their_rows():
    """A stage's ``stage_shape`` signature fixes its rows relative to its first row (the
    timing-only memo relies on it) and ``item_elems`` equals the rows' areas; stages that
    cross a block or a short tile row, or are not consecutive, have no shape."""
    from devices.regions import RegularGrid
    from emulator.engine.kernel import LaunchItems

    grid = RegularGrid([(0, 300), (300, 640)], 200, 64, 48)  # short rows at 300 and 640
    items = LaunchItems(grid, [(0, len(grid), 0, 32), (3, 40, 32, 64)])
    seen: dict = {}
    shaped = unshaped = 0
    for size in (1, 4, 5, 11):
        for a in range(0, len(items) - size + 1):
            ids = np.arange(a, a + size)
            rows = items[ids]
            shape = items.stage_shape(ids)
            if shape is None:
                unshaped += 1
                continue
            shaped += 1
            sig, r0, height = shape
            assert r0 == rows[0, 0] and rows[:, 1].max() - r0 <= height
            assert (rows[:, 1] - rows[:, 0] == 64).all()
            rel = rows - np.array([r0, r0, 0, 0, 0, 0])
            if sig in seen:
                assert np.array_equal(seen[sig], rel), sig
            seen[sig] = rel
            assert np.array_equal(items.item_elems(ids),
                                  (rows[:, 1] - rows[:, 0]) * (rows[:, 3] - rows[:, 2]))
            assert np.array_equal(items.tile_ids(ids), items.tiles[ids.tolist()])
    assert shaped and unshaped
    assert items.stage_shape(np.array([0, 2, 3])) is None


@pytest.mark.parametrize("plain", [False, True])
def test_the_consumer_gemm_gates_each_wg_on_the_input_tiles_its_rows_read(plain):
    """T3's consumer GEMM (chunk-aligned tiles) and Flux's (the GEMM's own tiles, which may
    span chunks): every WG waits on exactly the arrivals of the input tiles its rows
    overlap, not on every tile its stage reads, so a stage whose WGs read different tiles
    is split into groups that start at their own tiles' arrivals."""
    from collectives import consumer

    p = problem(0, 4, m=1030, n=700, k=129)
    slots = Slots()
    aspace = p.space(slots, "AG", p.chunks, cols=p.k, tile_n=p.k)
    signal = {aspace.region(t): object() for t in range(len(aspace))}
    kernel, _ = consumer.gated_gemm(p, slots, signal, list(range(p.world)), plain=plain)
    for w, (r0, r1) in enumerate(np.asarray(kernel.wgs[:, :2]).tolist()):
        want = {id(s) for reg, s in signal.items() if reg[0] < r1 and r0 < reg[1]}
        assert {id(g) for g in kernel.gates[w]} == want, (w, r0, r1)
    split = [ids for ids in kernel.stages() if len(kernel.groups(ids)) > 1]
    assert split  # some stage's WGs read different input tiles


def test_a_stage_splits_into_groups_by_gates_in_order_of_first_appearance():
    """Hand-derived: items 0..5 with gates (a), (), (b, a), (a), (a, b), none make, in
    dispatch order [5, 2, 0, 4, 3, 1], the groups [5, 1] (no gates), [2], [0, 3], [4] (the
    same signals in another order is another set), and the stage waits on b then a
    (first seen in item 2's gates)."""
    a, b = object(), object()
    space = TileSpace("C", tile_grid([(0, 6)], 1, 1, 1), 0)
    wgs = np.array([[i, i + 1, 0, 1, 0, 1] for i in range(6)], np.int64)
    order = np.array([5, 2, 0, 4, 3, 1], np.int64)
    kernel = Kernel(None, space, wgs, np.arange(6), order, 6,
                    gates={0: (a,), 1: (), 2: (b, a), 3: (a,), 4: (a, b)})
    groups = kernel.groups(kernel.stages()[0])
    assert [g.tolist() for g in groups] == [[5, 1], [2], [0, 3], [4]]
    assert [id(g) for g in kernel.gates_of(order)] == [id(b), id(a)]
    assert kernel.gates_of(np.array([5, 1])) == ()
    assert [g.tolist() for g in kernel.groups(np.array([3, 0]))] == [[3, 0]]


def _tiles_by_loops(row_blocks, ncols, tm, tn, group):
    """``tile_grid`` written as its docstring says, tile by tile."""
    out, g = [], max(1, group)
    for r0, r1 in row_blocks:
        rows = list(range(r0, r1, tm))
        for band in range(0, len(rows), g):
            for c in range(0, ncols, tn):
                for a in rows[band : band + g]:
                    out.append((a, min(a + tm, r1), c, min(c + tn, ncols)))
    return out


def test_tile_grid_is_the_tile_by_tile_order_on_random_shapes():
    rng = np.random.default_rng(7)
    for _ in range(300):
        edges = sorted(rng.integers(0, 700, 2 * int(rng.integers(0, 4))).tolist())
        blocks = list(zip(edges[::2], edges[1::2]))
        args = (blocks, int(rng.integers(0, 500)), int(rng.integers(1, 90)),
                int(rng.integers(1, 90)), int(rng.integers(0, 9)))
        got = tile_grid(*args)
        assert got.dtype == np.int64 and got.shape[1] == 4
        assert [tuple(t) for t in got.tolist()] == _tiles_by_loops(*args), args


def test_a_regular_grid_s_one_tile_is_its_row_of_the_tile_by_tile_order():
    """``RegularGrid.row`` (one tile by integer arithmetic, what a route asks for) is the
    grid's row of ``tile_grid`` with group 1, and refuses ids outside the grid."""
    from devices.regions import RegularGrid

    rng = np.random.default_rng(11)
    for _ in range(200):
        edges = sorted(rng.integers(0, 700, 2 * int(rng.integers(0, 4))).tolist())
        blocks = list(zip(edges[::2], edges[1::2]))
        args = (blocks, int(rng.integers(0, 500)), int(rng.integers(1, 90)),
                int(rng.integers(1, 90)))
        grid, want = RegularGrid(*args), _tiles_by_loops(*args, 1)
        assert [grid.row(t) for t in range(len(grid))] == want, args
        for t in (-1, len(grid)):
            with pytest.raises(IndexError):
                grid.row(t)
