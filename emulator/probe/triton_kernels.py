"""The probe's kernels that no library has, in Triton (shipped with PyTorch's CUDA and ROCm
wheels): a dependent pointer chase (memory latency), a copy on a chosen number of CTAs (a
streaming load of a given intensity, a communication kernel's footprint) and an
embedding-bag on a chosen grid (occupancy). Imported only when Triton is; the same
kernels run on the host under ``TRITON_INTERPRET=1`` (tests)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _chase_kernel(nxt_ptr, out_ptr, hops):
    p = tl.load(nxt_ptr)
    for _ in range(hops):
        p = tl.load(nxt_ptr + p)  # each load's address is the previous load's value
    tl.store(out_ptr, p)


def chase(nxt: torch.Tensor, hops: int) -> torch.Tensor:
    """``hops`` dependent loads by one thread (time / hops: the latency of one)."""
    out = torch.empty(1, dtype=nxt.dtype, device=nxt.device)
    _chase_kernel[(1,)](nxt, out, hops)
    return out


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    step = tl.num_programs(0) * BLOCK
    for start in range(pid * BLOCK, n, step):
        offs = start + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


def copy(dst: torch.Tensor, src: torch.Tensor, ctas: int) -> None:
    """``dst[:] = src`` by exactly ``ctas`` CTAs (each strides over the buffer)."""
    _copy_kernel[(ctas,)](src, dst, src.numel(), BLOCK=1024)


@triton.jit
def _bag_kernel(table_ptr, idx_ptr, out_ptr, bags, pooling, dim, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0)
    for bag in range(pid, bags, tl.num_programs(0)):
        for d0 in range(0, dim, BLOCK_D):
            offs = d0 + tl.arange(0, BLOCK_D)
            mask = offs < dim
            acc = tl.zeros((BLOCK_D,), dtype=tl.float32)
            for j in range(pooling):
                row = tl.load(idx_ptr + bag * pooling + j)
                acc += tl.load(table_ptr + row * dim + offs, mask=mask, other=0.0).to(tl.float32)
            tl.store(out_ptr + bag * dim + offs, acc, mask=mask)


def embedding_bag(table: torch.Tensor, idx: torch.Tensor, pooling: int,
                  ctas: int) -> torch.Tensor:
    """Sum-pooled bags of ``pooling`` rows of ``table`` each, by ``ctas`` CTAs."""
    bags, dim = idx.numel() // pooling, table.shape[1]
    out = torch.empty((bags, dim), dtype=torch.float32, device=table.device)
    _bag_kernel[(ctas,)](table, idx, out, bags, pooling, dim,
                         BLOCK_D=min(256, triton.next_power_of_2(dim)))
    return out
