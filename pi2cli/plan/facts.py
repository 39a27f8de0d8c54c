"""What the planner and the predictor know of a model (ModelFacts, read from a .pi2 by model_facts) and the
engine's own sizing of it under a budget (`pi2-engine size --facts`). The engine's defaults the facts
depend on (the direct-read unit) come from its `capabilities --json`, never from a copy here."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.builds.capabilities import engine_default, engine_size
from pi2cli.errors import Pi2Error


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


def read_align() -> int:
    """The smallest O_DIRECT unit: the engine rounds its reads and its cold slots to it (its default)."""
    return int(engine_default("read_align"))


@dataclass
class ModelFacts:
    """What the planner needs from a .pi2 file (model_facts() reads them)."""

    name: str
    arch: str
    ffn_act: str
    neuron_type: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    has_predictor: bool
    part_bytes: int  # one gate row / up row / down column of a bundle
    bundle_stride: int  # a bundle in the file, with its alignment padding
    resident_bytes: int  # the resident region (attention, norms, embeddings, predictors, output)
    per_token_resident_bytes: int  # resident bytes one decode step reads (one embedding row)
    other_bytes: int = 0  # tensor table, tokenizer, metadata
    n_expert: int = 0
    n_expert_used: int = 0
    dense_down: bool = False
    measured: dict = field(
        default_factory=dict
    )  # precision, recall, sparsity, hot_coverage, predicted_fraction
    profiled_hot_fraction: float | None = None  # the hot set that hot_coverage was measured for
    synthetic: bool = False
    # the .pi2's size (0: known only by its shapes); a profile's decode calibration matches on it
    file_bytes: int = 0

    @property
    def n_blocks(self) -> int:
        return self.n_layer * (self.n_expert if self.arch == "moe" else 1)

    @property
    def blocks_per_token(self) -> int:
        return self.n_layer * (self.n_expert_used if self.arch == "moe" else 1)

    @property
    def full_len(self) -> int:
        """A whole-bundle read (and a cold cache slot): the bundle without padding, 512-rounded."""
        return round_up(3 * self.part_bytes, read_align())

    @property
    def gate_len(self) -> int:
        return round_up(self.part_bytes, read_align())

    @property
    def rest_len(self) -> int:
        """Two-phase's second read: from the gate's last 512-byte unit to the end of the down column."""
        return self.full_len - self.part_bytes // read_align() * read_align()

    @property
    def ffn_bytes(self) -> int:
        """The FFN's weights without padding (the bytes a dense forward reads)."""
        return 3 * self.part_bytes * self.n_ff * self.n_blocks

    @property
    def two_phase_applies(self) -> bool:
        return self.ffn_act != "swiglu" and self.neuron_type in ("Q4_0", "Q4_1")


def model_facts(path: str | Path) -> ModelFacts:
    from pi2cli.models.pi2file import SEC_RESIDENT, Pi2File, Pi2FormatError

    path = Path(path)
    if not path.is_file():
        raise Pi2Error(f"--model {path}: no such file")
    try:
        f = Pi2File(path, verify=False)
    except (Pi2FormatError, OSError, ValueError) as exc:
        raise Pi2Error(f"--model {path}: {exc}") from None
    h = f.header
    resident = f.sections[SEC_RESIDENT][1]
    embd = f.tensors.get("token_embd.weight")
    per_token = resident - (embd.nbytes - embd.nbytes // max(1, embd.n_rows) if embd else 0)
    meta = f.metadata if isinstance(f.metadata, dict) else {}
    measured = meta.get("measured") if isinstance(meta.get("measured"), dict) else {}
    profile = meta.get("activation_profile") if isinstance(meta.get("activation_profile"), dict) else {}
    hot = profile.get("hot_fraction")
    name = path.parent.name if path.stem == "model" and path.parent.name else path.stem
    return ModelFacts(
        name=name, arch=h.arch, ffn_act=h.ffn_act, neuron_type=h.neuron_type, n_layer=h.n_layer,
        n_embd=h.n_embd, n_ff=h.n_ff, n_head=h.n_head, n_head_kv=h.n_head_kv, head_dim=h.head_dim,
        n_vocab=h.n_vocab, has_predictor=h.has_predictor, part_bytes=h.part_bytes,
        bundle_stride=h.bundle_stride, resident_bytes=resident, per_token_resident_bytes=per_token,
        other_bytes=sum(s[1] for i, s in enumerate(f.sections) if i > SEC_RESIDENT),
        n_expert=h.n_expert, n_expert_used=h.n_expert_used, dense_down=h.dense_down,
        measured={k: float(v) for k, v in measured.items() if isinstance(v, int | float) and not isinstance(v, bool)},
        profiled_hot_fraction=float(hot) if isinstance(hot, int | float) and 0 < hot < 1 else None,
        synthetic=bool(meta.get("synthetic")), file_bytes=path.stat().st_size,
    )  # fmt: skip


def predicted_fraction(m: ModelFacts) -> float:
    """Share of a block's neurons the predictor names per token (measured, else (1 - sparsity) / precision,
    else 25%)."""
    p = m.measured.get("predicted_fraction")
    if p and 0 < p <= 1:
        return p
    s, prec = m.measured.get("sparsity"), m.measured.get("precision")
    if s and prec and 0 < prec <= 1:
        return min(1.0, (1 - s) / prec)
    return 0.25


# ------------------------------------------------------------------------------------------ the budget
def engine_sizing(m: ModelFacts, budget: int, ctx: int, threads: int, **split) -> dict:
    """The engine's own sizing of this model under `budget` (`pi2-engine size --facts`, the host build; a
    budget of 0 or None: the engine's sizing with no budget, the whole model resident):
    fixed region, neuron cache, and with split=(hot_fraction, hot_share, cluster) the hot/cold split it
    would make. The engine is the one authority on these; the planner only chooses the settings."""
    facts = {"n_embd": m.n_embd, "n_layer": m.n_layer, "n_ff": m.n_ff, "n_head": m.n_head,
             "n_head_kv": m.n_head_kv, "head_dim": m.head_dim, "n_vocab": m.n_vocab,
             "n_expert": m.n_expert if m.arch == "moe" else 0, "n_expert_used": m.n_expert_used,
             "neuron_type": m.neuron_type, "bundle_stride": m.bundle_stride,
             "resident_bytes": m.resident_bytes, "tokenizer_bytes": m.other_bytes,
             "read_align": read_align()}  # fmt: skip
    # read_align: full_len's unit, the size of the engine's cold slots too (4096 made them 8192 bytes for
    # a 7168-byte bundle: 14% fewer slots than the open makes)
    flags = ["--policy", "powerinfer2", "--ctx", str(ctx), "--threads", str(threads)]
    if budget and budget > 0:  # none: the engine sizes the whole model resident
        flags += ["--memory-budget", str(int(budget))]
    for key, value in split.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return engine_size(facts, flags)


def fixed_parts(size: dict) -> dict:
    """The fixed region of an engine_sizing answer, by part: total, resident, kv_cache, scratch, margin."""
    fx = size["fixed"]
    return {"total": fx["bytes"], "resident": fx["resident_bytes"], "kv_cache": fx["kv_cache_bytes"],
            "scratch": fx["bytes"] - fx["resident_bytes"] - fx["kv_cache_bytes"] - fx["margin_bytes"],
            "margin": fx["margin_bytes"]}  # fmt: skip


def fixed_region(m: ModelFacts, budget: int, ctx: int, threads: int) -> dict:
    """What the engine holds before any neuron is cached, as the engine sizes it (fixed_parts). A budget
    the engine finds too small has no split: its total is then the smallest budget that works."""
    size = engine_sizing(m, budget, ctx, threads)
    if "error" in size:
        return {"total": int(size.get("min_budget_bytes") or budget), "too_small": size["error"]}
    return fixed_parts(size)
