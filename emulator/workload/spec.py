"""Model descriptions: the whole models a design's operations serve (``t3emu model``).

A model file (TOML; the shipped ones in ``emulator/workload/models``, a user's by path)
describes one model and its default run:

- ``kind = "transformer"``: ``[transformer]`` hidden size, attention heads, key/value
  heads (grouped-query or multi-query attention when fewer), head size (default hidden /
  heads), the FFN's kind (``gelu``: FC-1 H -> F, FC-2 F -> H; ``swiglu``: gate and up
  projections H -> F each, then down F -> H) and width F, layers, vocabulary; an
  optional ``[moe]`` (experts, top-k, an expert's FFN width, default F) makes every
  layer's FFN a mixture of experts;
- ``kind = "dlrm"``: ``[dlrm]`` embedding tables per GPU, rows per table, embedding
  dimension, pooling factor (rows per bag), dense features, bottom and top MLP widths,
  the interaction (``dot``: the pairwise dot products of the bottom MLP's output and
  every table's pooled embedding, with that output, feed the top MLP; optional
  ``interaction_width``: the features it feeds the top MLP where a study fixes them);
- ``[run]``: sequence length and batch (sequences; a DLRM's global batch of samples).

A bad file is refused with one line naming the file and the key (``ModelError``, a
``SpecError``: the command line's exit 2), before anything is launched.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devices.schema import OMIT, REQUIRED, Key, Table, check
from devices.spec import SpecError, read_toml

MODEL_DIR = Path(__file__).resolve().parent / "models"
FFN_KINDS = ("gelu", "swiglu")
INTERACTIONS = ("dot",)


class ModelError(SpecError):
    """A model file is malformed or describes an impossible model."""


@dataclass(frozen=True)
class MoeSpec:
    experts: int
    top_k: int  # experts each token is routed to
    expert_ffn_hidden: int  # an expert's FFN width


@dataclass(frozen=True)
class TransformerSpec:
    name: str
    source: str  # the file it came from
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: str  # "gelu" or "swiglu"
    ffn_hidden: int
    layers: int
    vocab: int
    seq: int
    batch: int
    moe: MoeSpec | None = None
    kind: str = "transformer"

    @property
    def tokens(self) -> int:
        """Tokens per iteration of the run (sequence x batch)."""
        return self.seq * self.batch


@dataclass(frozen=True)
class DlrmSpec:
    name: str
    source: str
    tables_per_gpu: int
    rows_per_table: int
    dim: int  # embedding dimension D
    pooling: int  # rows looked up per bag (L)
    dense_features: int
    bottom_mlp: tuple[int, ...]  # output widths, the last = dim
    top_mlp: tuple[int, ...]
    interaction: str
    batch: int  # global batch of samples
    kind: str = "dlrm"
    interaction_width: int = 0  # features the interaction feeds the top MLP (0: the dot's)


ModelSpec = TransformerSpec | DlrmSpec

def _count(doc: str = "", default=REQUIRED) -> Key:
    return Key(int, doc=doc, default=default, minimum=1)


_WIDTHS = Key(list, items=int, minimum=1, nonempty=True, doc="output widths of its layers")
_TOP = {"name": Key(str, default=OMIT, doc="default: the file's name"),
        "description": Key(str, default=OMIT)}
# A model file's schema (``devices/schema.py``), one per kind
TABLES: dict[str, Table] = {
    "transformer": Table({
        **_TOP, "kind": Key(str, choices=("transformer",)),
        "transformer": Table({
            "hidden": _count("hidden size H"), "heads": _count("attention heads"),
            "kv_heads": _count("key/value heads (default: heads)", OMIT),
            "head_dim": _count("default: hidden / heads", OMIT),
            "ffn": Key(str, choices=FFN_KINDS), "ffn_hidden": _count("the FFN's width F"),
            "layers": _count(), "vocab": _count()}),
        "moe": Table({"experts": _count(), "top_k": _count("experts each token is routed to"),
                      "expert_ffn_hidden": _count("an expert's FFN width (default F)", OMIT)},
                     required=False, doc="every layer's FFN a mixture of experts"),
        "run": Table({"seq": _count("sequence length"), "batch": _count("sequences")}),
    }, doc="A transformer model (t3emu model)"),
    "dlrm": Table({
        **_TOP, "kind": Key(str, choices=("dlrm",)),
        "dlrm": Table({
            "tables_per_gpu": _count(), "rows_per_table": _count(),
            "dim": _count("embedding dimension D"), "pooling": _count("rows per bag L"),
            "dense_features": _count(), "bottom_mlp": _WIDTHS, "top_mlp": _WIDTHS,
            "interaction": Key(str, choices=INTERACTIONS),
            "interaction_width": _count("features the interaction feeds the top MLP", OMIT)}),
        "run": Table({"batch": _count("global batch of samples")}),
    }, doc="A DLRM model (t3emu model)"),
}


def list_models() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.toml"))


def parse_model(data: dict[str, Any], source: str) -> ModelSpec:
    """Validate a parsed model file; return its spec."""
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in TABLES:
        raise ModelError(f"{source}: kind = {kind!r}; allowed: {', '.join(TABLES)}")
    table = TABLES[kind]
    for section in data:
        if isinstance(data[section], dict) and section not in table.sections():
            raise ModelError(f"{source}: section [{section}] does not apply to a {kind} model; "
                             f"allowed: {', '.join(table.sections())}")
    try:
        sections = check(data, table, source)
    except SpecError as exc:
        raise ModelError(str(exc)) from None
    name = sections.get("name", Path(source).stem)
    run = sections["run"]
    if kind == "dlrm":
        d = sections["dlrm"]
        if d["bottom_mlp"][-1] != d["dim"]:
            raise ModelError(f"{source}: [dlrm] bottom_mlp ends at {d['bottom_mlp'][-1]}, but "
                             f"the dot interaction needs the embedding dimension {d['dim']}")
        return DlrmSpec(name, source, d["tables_per_gpu"], d["rows_per_table"], d["dim"],
                        d["pooling"], d["dense_features"], d["bottom_mlp"], d["top_mlp"],
                        d["interaction"], run["batch"], "dlrm",
                        d.get("interaction_width", 0))
    t = sections["transformer"]
    kv = t.get("kv_heads", t["heads"])
    if t["heads"] % kv:
        raise ModelError(f"{source}: [transformer] kv_heads = {kv} must divide heads = "
                         f"{t['heads']} (each key/value head serves a group of query heads)")
    head_dim = t.get("head_dim")
    if head_dim is None:
        if t["hidden"] % t["heads"]:
            raise ModelError(f"{source}: [transformer] heads = {t['heads']} does not divide "
                             f"hidden = {t['hidden']}; give head_dim")
        head_dim = t["hidden"] // t["heads"]
    moe = None
    if "moe" in sections:
        m = sections["moe"]
        if m["top_k"] > m["experts"]:
            raise ModelError(f"{source}: [moe] top_k = {m['top_k']} exceeds experts = "
                             f"{m['experts']}")
        moe = MoeSpec(m["experts"], m["top_k"], m.get("expert_ffn_hidden", t["ffn_hidden"]))
    return TransformerSpec(name, source, t["hidden"], t["heads"], kv, head_dim, t["ffn"],
                           t["ffn_hidden"], t["layers"], t["vocab"], run["seq"], run["batch"],
                           moe)


def load_model(name_or_path: str) -> ModelSpec:
    """A shipped model (``t3emu model --list``) by name, or a model file by path."""
    try:
        data, path = read_toml(name_or_path, MODEL_DIR, "model", list_models())
        return parse_model(data, path.stem if path.parent == MODEL_DIR else str(path))
    except ModelError:
        raise
    except SpecError as exc:  # (an unknown name, malformed TOML)
        raise ModelError(str(exc)) from None
