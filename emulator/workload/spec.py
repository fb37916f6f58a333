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

from devices.spec import SpecError, checked_value, read_toml

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

# section -> key -> (type, required); "" is the top level
_KEYS: dict[str, dict[str, dict[str, tuple[type, bool]]]] = {
    "transformer": {
        "": {"name": (str, False), "kind": (str, True), "description": (str, False)},
        "transformer": {"hidden": (int, True), "heads": (int, True), "kv_heads": (int, False),
                        "head_dim": (int, False), "ffn": (str, True),
                        "ffn_hidden": (int, True), "layers": (int, True),
                        "vocab": (int, True)},
        "moe": {"experts": (int, True), "top_k": (int, True),
                "expert_ffn_hidden": (int, False)},
        "run": {"seq": (int, True), "batch": (int, True)},
    },
    "dlrm": {
        "": {"name": (str, False), "kind": (str, True), "description": (str, False)},
        "dlrm": {"tables_per_gpu": (int, True), "rows_per_table": (int, True),
                 "dim": (int, True), "pooling": (int, True), "dense_features": (int, True),
                 "bottom_mlp": (list, True), "top_mlp": (list, True),
                 "interaction": (str, True), "interaction_width": (int, False)},
        "run": {"batch": (int, True)},
    },
}
_OPTIONAL_SECTIONS = {"moe"}


def list_models() -> list[str]:
    return sorted(p.stem for p in MODEL_DIR.glob("*.toml"))


def _checked(source: str, section: str, data: dict[str, Any],
             keys: dict[str, tuple[type, bool]]) -> dict[str, Any]:
    where = f"{source}: [{section}]" if section else f"{source}:"
    extra = set(data) - set(keys) - ({"transformer", "dlrm", "moe", "run"} if not section
                                     else set())
    if extra:
        raise ModelError(f"{where} unknown key(s) {sorted(extra)}; allowed: {sorted(keys)}")
    out = {}
    for key, (typ, required) in keys.items():
        if key not in data:
            if required:
                raise ModelError(f"{where} missing key '{key}'")
            continue
        value = data[key]
        if typ is list:
            if (not isinstance(value, list) or not value
                    or any(isinstance(v, bool) or not isinstance(v, int) or v <= 0
                           for v in value)):
                raise ModelError(f"{where} {key} must be a non-empty list of positive "
                                 f"integers, got {value!r}")
            out[key] = tuple(value)
        else:
            out[key] = checked_value(f"{where} {key}", value, typ, 1, False)
    return out


def parse_model(data: dict[str, Any], source: str) -> ModelSpec:
    """Validate a parsed model file; return its spec."""
    kind = data.get("kind")
    if not isinstance(kind, str) or kind not in _KEYS:
        raise ModelError(f"{source}: kind = {kind!r}; allowed: {', '.join(_KEYS)}")
    schema = _KEYS[kind]
    top = _checked(source, "", data, schema[""])
    for section in data:
        if isinstance(data[section], dict) and section not in schema:
            raise ModelError(f"{source}: section [{section}] does not apply to a {kind} model; "
                             f"allowed: {', '.join(s for s in schema if s)}")
    sections = {}
    for section, keys in schema.items():
        if not section:
            continue
        if section not in data:
            if section in _OPTIONAL_SECTIONS:
                continue
            raise ModelError(f"{source}: missing section [{section}]")
        if not isinstance(data[section], dict):
            raise ModelError(f"{source}: [{section}] must be a table")
        sections[section] = _checked(source, section, data[section], keys)
    name = top.get("name", Path(source).stem)
    run = sections["run"]
    if kind == "dlrm":
        d = sections["dlrm"]
        if d["interaction"] not in INTERACTIONS:
            raise ModelError(f"{source}: [dlrm] interaction = {d['interaction']!r}; allowed: "
                             f"{', '.join(INTERACTIONS)}")
        if d["bottom_mlp"][-1] != d["dim"]:
            raise ModelError(f"{source}: [dlrm] bottom_mlp ends at {d['bottom_mlp'][-1]}, but "
                             f"the dot interaction needs the embedding dimension {d['dim']}")
        return DlrmSpec(name, source, d["tables_per_gpu"], d["rows_per_table"], d["dim"],
                        d["pooling"], d["dense_features"], d["bottom_mlp"], d["top_mlp"],
                        d["interaction"], run["batch"], "dlrm",
                        d.get("interaction_width", 0))
    t = sections["transformer"]
    if t["ffn"] not in FFN_KINDS:
        raise ModelError(f"{source}: [transformer] ffn = {t['ffn']!r}; allowed: "
                         f"{', '.join(FFN_KINDS)}")
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
    except SpecError as exc:  # (an unknown name, malformed TOML, checked_value's message)
        raise ModelError(str(exc)) from None
