"""Flux (Chang et al., Flux, arXiv:2406.06858): communication fused into the GEMM kernel, as
configurations of the same mechanism as T3's. The forms are in ``flux_rs.py`` (GEMM +
reduce-scatter in the epilogue) and ``flux_ag.py`` (AllGather + GEMM in the prologue);
this module names the knob settings the registry exposes (Flux's tuning space):

- GEMM + RS: RS-W vs RS-A (switch or full mesh; on several nodes RS-A is Flux's
  two-node form), the Hopper variant (sm90 only: local stores, fetch and reduce warps;
  on several nodes with the fused all-to-all across nodes), tile swizzle on/off; the PCIe
  ring forms, 1D or 2D over the sockets, also across PCIe nodes (``algorithm="ring"``);
- AG + GEMM: push vs pull, communication tile m/N, m/2N, m/4N, m/8N (never below the
  GEMM's tile height, Flux's tuning range), swizzle on/off (switch
  or full mesh; on several nodes the two-node form); ring pushes with forwarding, 1D
  or inter-socket first, on PCIe (``algorithm="ring"``).
"""

from __future__ import annotations

from functools import partial

from collectives import flux_ag, flux_rs

rs_write = flux_rs.rs_write
rs_atomic = flux_rs.rs_atomic
rs_write_unswizzled = partial(flux_rs.rs_write, swizzle=False)
rs_atomic_unswizzled = partial(flux_rs.rs_atomic, swizzle=False)
rs_pull = flux_rs.rs_pull
rs_ring = flux_rs.rs_ring
rs_ring2d = partial(flux_rs.rs_ring, two_d=True)
wide_reduction = flux_rs.wide_reduction

ag_gemm = flux_ag.ag_gemm
ag_gemm_tile2 = partial(flux_ag.ag_gemm, halvings=1)
ag_gemm_tile4 = partial(flux_ag.ag_gemm, halvings=2)
ag_gemm_tile8 = partial(flux_ag.ag_gemm, halvings=3)  # not a parameter: tile / 2^3
ag_gemm_unswizzled = partial(flux_ag.ag_gemm, swizzle=False)
ag_gemm_pull = partial(flux_ag.ag_gemm, pull=True)
ag_gemm_pull_tile2 = partial(flux_ag.ag_gemm, pull=True, halvings=1)
ag_gemm_pull_tile4 = partial(flux_ag.ag_gemm, pull=True, halvings=2)
ag_gemm_pull_tile8 = partial(flux_ag.ag_gemm, pull=True, halvings=3)  # not a parameter: tile / 8


def ag_ring(p, op, algorithm):
    return flux_ag.ring_push(p, op, algorithm, p.max_chunk)


def ag_ring2d(p, op, algorithm):
    return flux_ag.ring_push(p, op, algorithm, p.max_chunk, two_d=True)


def hopper_refusal(spec, ranks: int) -> str:
    """Flux's Hopper RS variant runs on sm90 (its kernel is the TMA warp-specialized one)."""
    return "" if spec.arch == "sm90" else (
        f"Flux's Hopper RS variant is an sm90 kernel (TMA, warp-specialized); device "
        f"{spec.name} is {spec.arch or 'of no vendor architecture'}")
