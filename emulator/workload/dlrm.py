"""What a DLRM training iteration runs on one GPU of a system (``t3emu model`` of a
``kind = "dlrm"`` model file).

Hybrid parallelism (Naumov et al. 2019, the public DLRM code): every one of the P GPUs
holds ``tables_per_gpu`` embedding tables whole and a replica of the MLPs; the global
batch B is split into P local batches of b = B / P samples. Symbols: D the embedding
dimension, L the pooling factor (rows per bag), n = P x tables + 1 the vectors of a
sample's interaction (every table's pooled embedding and the bottom MLP's output), e
bytes per element.

Forward, one stream:
- the bottom MLP on the local batch: per layer a GEMM alone (M = b, N = its width, K = the
  previous width; the first reads the dense features) and its activation (ReLU: reads and
  writes b x width);
- the embedding pooling of this GPU's tables for the whole batch and the all-to-all that
  sends each GPU its samples' pooled vectors: the registry's ``emb+a2a`` (M = B, N = D,
  K = L, tables per GPU; every bag exactly L rows: ``fixed_lookups``), run on every GPU
  of the system (the fused operators' case);
- the interaction: the dot products of a sample's n vectors (a batched product of 2 n^2 D
  FLOPs per sample at the matrix efficiency of the attention core), reading b n D and
  writing b x its width (D + n (n - 1) / 2, or the file's ``interaction_width``);
- the top MLP as the bottom one (its last layer's sigmoid an elementwise kernel too) and
  the loss (binary cross-entropy: reads and writes b).

Backward: the top MLP in reverse (per layer the activation's backward, reading two and
writing one, then the input gradient GEMM (M = b, N = the layer's input width, K = its
width) and the weight gradient GEMM (M = its input width, N = its width, K = b)); the
interaction's backward (dX = (dZ + dZ^T) X: the same FLOPs, reading the gradient and X,
writing dX); the all-to-all of the pooled vectors' gradients back to their tables' GPUs
(the same collective as the forward's, every pair the same bytes the other way: timed as
the baseline's all-to-all phase of the ``emb+a2a`` run plus a launch, for every design:
the fused operators fuse the forward); the embedding backward with its sparse update
(one kernel per table, as the public code's per-table EmbeddingBag: the B bags' gradients
read, each added into its L rows: read and written); the bottom MLP in reverse (no input
gradient for the first layer: the dense features).

Then the MLPs' gradient all-reduce over the P replicas (``estimate.dp_allreduce``'s ring
in PyTorch DistributedDataParallel's buckets of 25 MiB, the public code's DDP; every
bucket but the last hidden behind the backward pass) and the optimizer: SGD (the public
code's ``torch.optim.SGD``) reading each MLP parameter and its gradient and writing the
parameter (3 e bytes), one launch; the embedding rows' update is in their backward.
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.workload.layers import Gemm, Kernel
from emulator.workload.spec import DlrmSpec

DDP_BUCKET_BYTES = 25 * 2 ** 20  # torch.nn.parallel.DistributedDataParallel bucket_cap_mb=25
SGD_ELEMENTS = 3  # SGD reads the parameter and its gradient and writes the parameter


def local_batch(model: DlrmSpec, gpus: int) -> int:
    if model.batch % gpus:
        raise ValueError(f"the global batch {model.batch} of {model.name} is not divisible "
                         f"by the {gpus} GPUs (each takes an equal local batch)")
    return model.batch // gpus


def interaction(model: DlrmSpec, gpus: int) -> tuple[int, int]:
    """(n: the vectors of a sample's interaction, the width it feeds the top MLP)."""
    n = gpus * model.tables_per_gpu + 1
    return n, model.interaction_width or model.dim + n * (n - 1) // 2


def _layers(widths: list[int]) -> list[tuple[int, int, int]]:
    """(input width, width, repeat) of runs of equal consecutive layers."""
    out: list[tuple[int, int, int]] = []
    for k, n in zip(widths, widths[1:]):
        if out and out[-1][:2] == (k, n):
            out[-1] = (k, n, out[-1][2] + 1)
        else:
            out.append((k, n, 1))
    return out


def _label(which: str, first: int, repeat: int) -> str:
    return f"{which} {first}" if repeat == 1 else f"{which} {first}-{first + repeat - 1}"


def _mlp(which: str, widths: list[int], b: int, e: int, backward: bool,
         input_grad: bool) -> list:
    out: list = []
    first = 1
    runs = []
    for k, n, r in _layers(widths):
        runs.append((first, k, n, r))
        first += r
    if not backward:
        for first, k, n, r in runs:
            name = _label(which, first, r)
            out += [Gemm(f"{name} fwd", None, b, n, k, repeat=r),
                    Kernel(f"{name} activation fwd", 2 * b * n * e, repeat=r)]
        return out
    for first, k, n, r in reversed(runs):
        name = _label(which, first, r)
        # the first layer of a run whose input is data has no input gradient
        skip = not input_grad and first == 1
        out.append(Kernel(f"{name} activation bwd", 3 * b * n * e, repeat=r))
        if skip and r > 1:  # the later layers of the run do
            out.append(Gemm(f"{name} dgrad", None, b, k, n, repeat=r - 1))
        elif not skip:
            out.append(Gemm(f"{name} dgrad", None, b, k, n, repeat=r))
        out.append(Gemm(f"{name} wgrad", None, k, n, b, repeat=r))
    return out


def items(model: DlrmSpec, gpus: int, e: int) -> tuple[list, list, Gemm]:
    """(forward items, backward items, the embedding + all-to-all item) on one GPU of
    ``gpus``."""
    b = local_batch(model, gpus)
    D, L = model.dim, model.pooling
    n, width = interaction(model, gpus)
    emb = Gemm("embedding + all-to-all", "emb+a2a", model.batch, D, L,
               params=(("fixed_lookups", 1), ("tables", model.tables_per_gpu)))
    bottom = [model.dense_features, *model.bottom_mlp]
    top = [width, *model.top_mlp]
    inter_flops = 2.0 * b * n * n * D
    fwd: list = [
        *_mlp("bottom", bottom, b, e, False, False),
        emb,
        Kernel("interaction fwd", (b * n * D + b * width) * e, inter_flops),
        *_mlp("top", top, b, e, False, True),
        Kernel("loss fwd+bwd", 3 * b * e),
    ]
    bwd: list = [
        *_mlp("top", top, b, e, True, True),
        Kernel("interaction bwd", (b * width + 2 * b * n * D) * e, inter_flops),
        # (the all-to-all's backward: ``Exchange``, timed from the emb+a2a run)
        Exchange("all-to-all bwd", emb),
        Kernel("embedding bwd + sparse update", model.batch * (D + 2 * L * D) * e,
               repeat=model.tables_per_gpu),
        *_mlp("bottom", bottom, b, e, True, False),
    ]
    return fwd, bwd, emb


@dataclass(frozen=True)
class Exchange:
    """The collective of an operation's baseline run (its collective phases and one
    launch), on its own: the DLRM's backward all-to-all."""

    name: str
    of: Gemm
    repeat: int = 1


Item = Gemm | Kernel | Exchange


def mlp_parameters(model: DlrmSpec, gpus: int) -> int:
    """The MLPs' weights (every GPU's replica; biases negligible)."""
    _, width = interaction(model, gpus)
    return sum(k * n * r for widths in ([model.dense_features, *model.bottom_mlp],
                                        [width, *model.top_mlp])
               for k, n, r in _layers(widths))
