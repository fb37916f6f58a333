"""The address-space map's routing and the program order derived from it."""

import numpy as np
import pytest

from collectives.ring import RingContext, ring_chunks, t3_rs_map
from emulator.addrmap import AddressMap, MapError, tile_grid
from emulator.producer import GemmJob, program_order


def test_ring_chunks_cover_rows_unevenly():
    assert ring_chunks(10, 4) == [(0, 3), (3, 6), (6, 8), (8, 10)]


def test_t3_map_routes_each_ring_step():
    ctx = RingContext(rank=1, world=4, rows=517, cols=300)
    amap, order = t3_rs_map(ctx, 128, 128)
    compiled = amap.compile()
    tiles = amap.tiles
    chunk_of = lambda t: next(c for c in range(4) if ctx.chunk(c)[0] <= tiles[t][0] < ctx.chunk(c)[1])
    # WG order walks chunks 2, 3, 0, 1 (staggered by rank)
    assert [chunk_of(t) for t in order][:: len(order) // 4] == [2, 3, 0, 1]
    for t, route in enumerate(compiled.routes):
        c = chunk_of(t)
        if c == 2:  # stage 1: remote updates straight into rank 0, nothing written locally
            assert (route.local_op, route.remote_rank, route.remote_op) == ("none", 0, "update")
        else:
            assert route.local_op == "update" and route.tracked and route.remote_rank == -1
    dma = [c for c in compiled.commands if c.src is not None]
    sinks = [c for c in compiled.commands if c.src is None]
    assert all(c.dst_rank == 0 and c.op == "update" for c in dma)
    assert all((c.trigger.thresholds == 2 * np.array(c.dst_elems)).all() for c in dma)
    assert sum(len(c.trigger.slots) for c in sinks) == sum(chunk_of(t) == 1 for t in range(len(tiles)))


def test_map_refuses_double_and_misaligned_regions():
    tiles = tile_grid([(0, 10)], 8, 4, 4)
    amap = AddressMap("C", tiles, rank=0, world=2)
    amap.dma_map((0, 4, 0, 8), 1)
    with pytest.raises(MapError, match="mapped twice"):
        amap.remote_map((0, 4, 0, 4), 1)
    with pytest.raises(MapError, match="whole tiles"):
        amap.track((0, 3, 0, 4))
    with pytest.raises(MapError, match="own rank"):
        amap.remote_map((4, 8, 0, 4), 0)
    with pytest.raises(MapError, match="outside"):
        amap.remote_map((4, 8, 0, 4), 5)


def test_unmapped_tiles_keep_the_producer_op():
    tiles = tile_grid([(0, 8)], 8, 4, 4)
    compiled = AddressMap("C", tiles, 0, 1, "store").compile()
    assert all(r.local_op == "store" and not r.tracked for r in compiled.routes)
    assert compiled.commands == []


def test_program_order_puts_entries_after_the_stage_of_their_last_write():
    tiles = tile_grid([(0, 8)], 8, 4, 4)  # 4 tiles
    amap = AddressMap("C", tiles, 0, 2, "update")
    amap.dma_map((0, 8, 0, 4), 1)  # tiles 0 and 2
    amap.track((0, 4, 4, 8))  # tile 1
    amap.track((4, 8, 4, 8))  # tile 3
    job = GemmJob("A", "B", "C", 1, np.array([0, 1, 2, 3]), stage_size=2)
    stage_index, commands = program_order(job, amap.compile())
    # stage 0 = tiles 0,1 -> track tile 1; stage 1 = tiles 2,3 -> dma (0,2), track tile 3
    assert stage_index == [0, 2]
    assert [(c.order, list(c.trigger.slots)) for c in commands] == [(1, [1]), (3, [0, 2]), (4, [3])]
