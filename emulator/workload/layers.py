"""What one transformer layer runs on one GPU of a tensor-parallel group, by phase.

A layer is a list of ``Gemm`` items (a GEMM with the collective the parallelism puts
next to it: an operation of the registry, run by the emulator) and ``Kernel`` items
(the rest: norms, activations, residual adds, the attention core), in the order one
stream runs them. Symbols: T tokens of the micro-batch (sequence x batch; decode: the
batch, one token each), t the TP degree, H hidden, F the FFN width, q = heads x head
size, kv = key/value heads x head size, e bytes per element.

Tensor parallelism (Megatron-LM, Shoeybi et al. 2019): QKV and FC-1 column-parallel
(each GPU q/t + 2 kv/t, or F/t columns; SwiGLU's gate and up 2F/t), OP and FC-2
row-parallel (K = q/t or F/t). With sequence parallelism (``sp``; Korthikanti et al.
2022) the norms and residuals run on T/t tokens, an all-gather feeds each
column-parallel GEMM (``ag+gemm``, M = T gathered rows) and a reduce-scatter follows
each row-parallel one (``gemm+rs``); without it the row-parallel GEMMs end in an
all-reduce (``gemm+ar``; a decode step of fewer tokens than GPUs: a GEMV, ``gemv+ar``)
and the others are GEMMs alone.

Backward (training): every GEMM Y = X W has an input gradient dX = dY W^T (M = T, N =
its K, K = its N) and a weight gradient dW = X^T dY (M = its K, N = its N, K = T). The
input gradient of a column-parallel GEMM is partial on every GPU: reduce-scattered
(SP) or all-reduced; a row-parallel GEMM's input gradient needs dY whole: gathered (SP,
``ag+gemm``) or already there. Weight gradients are GEMMs alone. ASSUMPTION: with SP
the gathered input of a column-parallel GEMM is kept from the forward for its weight
gradient (Megatron-LM gathers it again, overlapped with the input gradient's GEMM;
keeping it costs memory, not time, the same for every design).

Kernels (``Kernel``; timed in ``estimate.kernel_time``): a norm reads and writes its
rows (backward: reads x and dy, writes dx); a residual add reads two and writes one;
GeLU reads and writes T x F/t (backward 3x), SwiGLU reads 2 and writes 1 (backward
reads 3, writes 2); the attention core is FlashAttention (Dao 2023): forward 4 T s d
FLOPs per query head of a causal sequence halved (QK^T and PV), backward 2.5x (five
matrix products against two), reading Q, K, V and writing O (backward: reading Q, K, V,
O, dO and writing dQ, dK, dV); decode reads the key/value cache of its context once.
``attention = "unfused"`` (Megatron-LM's core attention before FlashAttention, which
T3's per-layer breakdown measured) runs it as three kernels of T = b s tokens over h
heads of size d (q = h d): the scores Q K^T (2 T s q FLOPs over the whole s x s matrix,
reading Q and K, writing b h s^2), the fused scale-mask-softmax and, in training, the
attention dropout (reading the scores, writing the probabilities and the dropout's byte
mask) and the context P V (2 T s q FLOPs, reading P and V, writing O); backward, dV and
dP (reading dO, P, V, writing dV and dP), the dropout's and softmax's backward (reading
dP, the mask and P, writing dS) and dQ, dK (reading dS, Q, K, writing dQ, dK). Matrix
FLOPs at the attention core's efficiency (an ASSUMPTION: cuBLAS's batched GEMMs of the
unfused form are not measured here); decode is the same in both forms.

Mixture of experts (``[moe]``: E experts, top-k routing, an expert's FFN width F_e):
expert parallelism over the TP group's GPUs (Megatron-core's MoE parallel folding with
expert TP 1: each GPU holds E / ep experts whole; Megatron-LM requires sequence
parallelism when EP and TP are both on). Each GPU routes its T/t tokens (a router GEMM
T/t x E x H, softmax/top-k and a permutation copying R = k T/t rows), the all-to-all
dispatch feeds its experts' FC-1 (``a2a+gemm``, M = R rows received with balanced
routing, N = the expert's up width, K = H), the activation, then FC-2's output rows go
back to their tokens' GPUs (``gemm+a2a``, M = R, N = H, K = F_e: the combine), where the
k rows of each token are weighted and summed. Backward mirrors it: the combine's
gradient is dispatched to the experts feeding FC-2's input gradient (``a2a+gemm``, M = R,
N = F_e, K = H), FC-1's input gradient returns to the tokens' GPUs (``gemm+a2a``, M = R,
N = H, K = up), weight gradients are GEMMs alone over the R rows. ASSUMPTIONS: routing is
balanced (the registry's ``expert_skew`` is 0); a GPU's E / ep experts run as one GEMM
over its R rows (a grouped GEMM: the same FLOPs, one launch).
"""

from __future__ import annotations

from dataclasses import dataclass

from emulator.workload.spec import TransformerSpec

PHASES = ("training", "prefill", "decode")
ATTENTION_BWD_FLOPS = 2.5  # FlashAttention-2's backward: 5 matrix products to 2 forward
ATTENTION_FORMS = ("flash", "unfused")
DROPOUT_MASK_BYTES = 1  # PyTorch's dropout keeps a byte mask per element (torch.bool)


@dataclass(frozen=True)
class Gemm:
    name: str  # e.g. "FC-2 fwd", "QKV dgrad"
    op: str | None  # the registry's operation (a GEMM with its collective); None: alone
    m: int
    n: int
    k: int
    params: tuple = ()  # the operation's --param pairs (the DLRM's embedding tables)
    repeat: int = 1  # identical items in a row (a DLRM's MLP layers of one width)

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


@dataclass(frozen=True)
class Kernel:
    name: str
    bytes: float  # HBM bytes read and written
    flops: float = 0.0  # matrix FLOPs (the attention core)
    repeat: int = 1  # identical kernels in a row (one launch each)


Item = Gemm | Kernel


def _div(a: int, t: int, what: str) -> int:
    if a % t:
        raise ValueError(f"{what} = {a} is not divisible by the TP degree {t}")
    return a // t


def check_tp(model: TransformerSpec, tp: int, split_heads: bool = False) -> None:
    """Refuse a TP degree that does not split the model evenly (heads, key/value heads,
    the FFN), as Megatron-LM does; ``split_heads``: only the attention's width, as T3
    sizes its GEMMs (H / TP columns per GPU)."""
    d = model.head_dim
    if split_heads:
        _div(model.heads * d, tp, f"{model.name}'s attention width (heads x head size)")
        if model.kv_heads >= tp:
            _div(model.kv_heads * d, tp, f"{model.name}'s key/value width")
    else:
        if model.heads % tp:
            raise ValueError(f"TP {tp} does not divide the {model.heads} attention heads of "
                             f"{model.name} (--split-heads sizes them by width, as T3 did)")
        if model.kv_heads % tp and tp % model.kv_heads:
            raise ValueError(f"TP {tp} and the {model.kv_heads} key/value heads of "
                             f"{model.name} do not divide one another")
    if model.moe is None:  # (experts are whole on their GPUs)
        _div(model.ffn_hidden, tp, f"{model.name}'s FFN width")


def attention_widths(model: TransformerSpec, tp: int) -> tuple[int, int]:
    """(q, kv): one GPU's query and key/value widths (heads x head size / TP; fewer
    key/value heads than GPUs: one head kept whole on each, or, split by width with as
    many key/value heads as query heads, the query's width)."""
    d = model.head_dim
    q = model.heads * d // tp
    return q, max(model.kv_heads * d // tp, min(d, q))


def check_ep(model: TransformerSpec, tp: int, ep: int, sp: bool) -> None:
    """Refuse an expert-parallel degree the estimate cannot place: EP runs over the TP
    group's GPUs (ep = tp), dividing the experts, with sequence parallelism; a model
    without experts takes ep = 1."""
    if model.moe is None:
        if ep != 1:
            raise ValueError(f"--ep {ep}: {model.name} has no experts ([moe])")
        return
    if ep != tp:
        raise ValueError(f"--ep {ep}: expert parallelism runs over the tensor-parallel "
                         f"group's GPUs here (ep = tp = {tp}; experts placed over other "
                         f"GPUs are not emulated)")
    if model.moe.experts % ep:
        raise ValueError(f"EP {ep} does not divide the {model.moe.experts} experts of "
                         f"{model.name}")
    if tp > 1 and not sp:
        raise ValueError("--no-sp with experts: Megatron-LM requires sequence parallelism "
                         "when expert and tensor parallelism are both on")


def layer(model: TransformerSpec, tp: int, phase: str, sp: bool, tokens: int,
          context: int, e: int, ep: int = 1, split_heads: bool = False,
          attention_form: str = "flash") -> tuple[list[Item], list[Item]]:
    """(forward items, backward items) of one layer on one GPU: ``tokens`` T of the
    micro-batch (decode: the batch), ``context`` the sequence (decode: the tokens attended
    to), ``ep`` the expert-parallel degree (a ``[moe]`` model), ``split_heads`` (TP need
    not divide the heads: ``check_tp``), ``attention_form`` the attention core's (module
    docstring); the backward list is empty outside training."""
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r}; allowed: {', '.join(PHASES)}")
    if attention_form not in ATTENTION_FORMS:
        raise ValueError(f"attention {attention_form!r}; allowed: {', '.join(ATTENTION_FORMS)}")
    core = dict(d=model.head_dim, form=attention_form)
    check_tp(model, tp, split_heads)
    check_ep(model, tp, ep, sp)
    H, T = model.hidden, tokens
    q, kv = attention_widths(model, tp)
    F = model.ffn_hidden // tp
    up = 2 * F if model.ffn == "swiglu" else F
    rows = _div(T, tp, "the tokens") if sp else T  # the norms' and residuals' rows
    col, row = ("ag+gemm", "gemm+rs") if sp else (None, "gemm+ar")

    def row_parallel(name: str, k: int) -> Gemm:
        if not sp and T < tp:  # decode at a batch below the GPUs: a GEMV (output rows
            return Gemm(name, "gemv+ar", H, T, k)  # M = H, right-hand sides N = T, K = k)
        return Gemm(name, row, T, H, k)

    attention: list[Item] = [
        Kernel("norm-1 fwd", 2 * rows * H * e),
        Gemm("QKV fwd", col, T, q + 2 * kv, H),
        *_attention("attention fwd", phase, T, context, q, kv, e, **core),
        row_parallel("OP fwd", q),
        Kernel("residual+norm-2 fwd", (3 + 2) * rows * H * e),
    ]
    if model.moe is not None:
        ffn_fwd, ffn_bwd = _experts(model, rows, e)
        fwd = attention + ffn_fwd + [Kernel("residual fwd", 3 * rows * H * e)]
        if phase != "training":
            return fwd, []
        bwd = [Kernel("residual bwd", 3 * rows * H * e), *ffn_bwd]
        return fwd, bwd + _attention_bwd(model, phase, sp, T, rows, context, q, kv, e, core)
    fwd = attention + [
        Gemm("FC-1 fwd", col, T, up, H),
        Kernel("activation fwd", (up + F) * T * e),
        row_parallel("FC-2 fwd", F),
        Kernel("residual fwd", 3 * rows * H * e),
    ]
    if phase != "training":
        return fwd, []
    dcol = "gemm+rs" if sp else "gemm+ar"  # a column-parallel GEMM's input gradient
    drow = "ag+gemm" if sp else None  # a row-parallel one's (dY gathered first)
    # (the FFN's; the attention block's in ``_attention_bwd``)
    act_bwd = (3 + 2) * F * T * e if model.ffn == "swiglu" else 3 * F * T * e
    bwd: list[Item] = [
        Kernel("residual bwd", 3 * rows * H * e),
        Gemm("FC-2 dgrad", drow, T, F, H),
        Gemm("FC-2 wgrad", None, F, H, T),
        Kernel("activation bwd", act_bwd),
        Gemm("FC-1 dgrad", dcol, T, H, up),
        Gemm("FC-1 wgrad", None, H, up, T),
    ]
    return fwd, bwd + _attention_bwd(model, phase, sp, T, rows, context, q, kv, e, core)


def _attention_bwd(model: TransformerSpec, phase: str, sp: bool, T: int, rows: int,
                   context: int, q: int, kv: int, e: int, core: dict) -> list[Item]:
    """The attention block's backward (from the second norm's backward on)."""
    H = model.hidden
    dcol, drow = ("gemm+rs", "ag+gemm") if sp else ("gemm+ar", None)
    return [
        Kernel("norm-2+residual bwd", (3 + 3) * rows * H * e),
        Gemm("OP dgrad", drow, T, q, H),
        Gemm("OP wgrad", None, q, H, T),
        *_attention("attention bwd", phase, T, context, q, kv, e, True, **core),
        Gemm("QKV dgrad", dcol, T, H, q + 2 * kv),
        Gemm("QKV wgrad", None, H, q + 2 * kv, T),
        Kernel("norm-1 bwd", 3 * rows * H * e),
    ]


def expert_width(model: TransformerSpec) -> tuple[int, int]:
    """(an expert's FFN width F_e, its up projection's width: 2 F_e for SwiGLU)."""
    f = model.moe.expert_ffn_hidden
    return f, 2 * f if model.ffn == "swiglu" else f


def _experts(model: TransformerSpec, rows: int, e: int) -> tuple[list[Item], list[Item]]:
    """The mixture-of-experts FFN on one GPU of ``rows`` tokens (module docstring)."""
    H, E, top = model.hidden, model.moe.experts, model.moe.top_k
    F, up = expert_width(model)
    R = rows * top  # rows this GPU dispatches, and (balanced) its experts receive
    act = (up + F) * R * e
    act_bwd = (3 + 2) * F * R * e if model.ffn == "swiglu" else 3 * F * R * e
    route = 2 * rows * E * e + 2 * R * H * e  # softmax/top-k over E logits; permute R rows
    fwd: list[Item] = [
        Gemm("router fwd", None, rows, E, H),
        Kernel("route+permute fwd", route),
        Gemm("experts FC-1 fwd", "a2a+gemm", R, up, H),
        Kernel("activation fwd", act),
        Gemm("experts FC-2 fwd", "gemm+a2a", R, H, F),
        Kernel("unpermute+combine fwd", (R + rows) * H * e),
    ]
    bwd: list[Item] = [
        Kernel("unpermute+combine bwd", (rows + R) * H * e),
        Gemm("experts FC-2 dgrad", "a2a+gemm", R, F, H),
        Gemm("experts FC-2 wgrad", None, F, H, R),
        Kernel("activation bwd", act_bwd),
        Gemm("experts FC-1 dgrad", "gemm+a2a", R, H, up),
        Gemm("experts FC-1 wgrad", None, H, up, R),
        Kernel("route+permute bwd", route),
        Gemm("router dgrad", None, rows, H, E),
        Gemm("router wgrad", None, H, E, rows),
    ]
    return fwd, bwd


def _attention(name: str, phase: str, T: int, context: int, q: int, kv: int, e: int,
               backward: bool = False, d: int = 128, form: str = "flash") -> list[Kernel]:
    """The attention core of one GPU's query width q and key/value width kv (head size
    d), in ``form`` (module docstring)."""
    if phase == "decode":  # one query per sequence against its key/value cache
        flops = 4.0 * T * context * q
        cache = 2 * T * context * kv * e
        return [Kernel(name, cache + 2 * T * q * e, flops)]
    if form == "unfused":
        return _unfused(name, phase, T, context, q, kv, e, backward, d)
    flops = 4.0 * T * context * q * 0.5  # causal: half the score matrix
    io = (2 * q + 2 * kv) * T * e
    if backward:
        return [Kernel(name, 2 * io, flops * ATTENTION_BWD_FLOPS)]
    return [Kernel(name, io, flops)]


def _unfused(name: str, phase: str, T: int, s: int, q: int, kv: int, e: int,
             backward: bool, d: int) -> list[Kernel]:
    """The unfused attention core (module docstring): T = b s tokens, q / d heads."""
    base = name.removesuffix(" fwd").removesuffix(" bwd")
    scores = T * s * (q // d)  # b h s^2 elements
    mm = 2.0 * T * s * q  # one of its matrix products: the whole s x s matrix
    drop = phase == "training"
    mask = DROPOUT_MASK_BYTES * scores if drop else 0
    if not backward:
        return [Kernel(f"{base} scores fwd", (q + kv) * T * e + scores * e, mm),
                Kernel(f"{base} softmax fwd", 2 * scores * e + mask),
                Kernel(f"{base} context fwd", scores * e + kv * T * e + q * T * e, mm)]
    return [Kernel(f"{base} context bwd", q * T * e + scores * e + kv * T * e
                   + kv * T * e + scores * e, 2 * mm),  # dV = P^T dO, dP = dO V^T
            Kernel(f"{base} softmax bwd", 3 * scores * e + mask),  # dP, P (mask) -> dS
            Kernel(f"{base} scores bwd", scores * e + (q + kv) * T * e
                   + (q + kv) * T * e, 2 * mm)]  # dQ = dS K, dK = dS^T Q
