"""Small random models in .pi2 form, for checking the engine against the numpy reference."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from pi2cli.models.pi2file import Pi2Header, Pi2Writer


def write_random_model(
    path: str | Path,
    arch: str = "llama",
    ffn_act: str = "swiglu",
    wtype: str = "Q4_0",
    n_vocab: int = 96,
    n_embd: int = 64,
    n_layer: int = 2,
    n_head: int = 4,
    n_head_kv: int = 2,
    n_ff: int = 128,
    n_expert: int = 0,
    n_expert_used: int = 0,
    tied: bool = False,
    dense_down: bool = True,
    permute: bool = True,
    seed: int = 0,
    extra_tensors: dict[str, np.ndarray] | None = None,
) -> Path:
    """A random model (weights ~ N(0, 1/sqrt(n_in))) with every tensor in `wtype` except norms (F32)
    and the MoE router (F32). permute: store the bundles in a random neuron order. extra_tensors: more
    resident F32 tensors the engine does not bind (name -> values), e.g. for crafting bad files."""
    rng = np.random.default_rng(seed)
    h = Pi2Header(arch=arch, ffn_act=ffn_act, n_vocab=n_vocab, n_embd=n_embd, n_layer=n_layer, n_head=n_head,
                  n_head_kv=n_head_kv, n_ff=n_ff, n_expert=n_expert, n_expert_used=n_expert_used,
                  tied_embeddings=tied, dense_down=dense_down, neuron_type=wtype, rope_theta=10000.0)  # fmt: skip
    q_dim, kv_dim = n_head * h.head_dim, n_head_kv * h.head_dim

    def mat(rows, cols, scale=None):
        return (rng.standard_normal((rows, cols)) * (scale or 1 / np.sqrt(cols))).astype(np.float32)

    with Pi2Writer(path, h, metadata={"synthetic": True, "random_seed": seed}) as w:
        w.add_tensor("token_embd.weight", mat(n_vocab, n_embd, 1.0), wtype)
        w.add_tensor("output_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32), "F32")
        if not tied:
            w.add_tensor("output.weight", mat(n_vocab, n_embd), wtype)
        for layer in range(n_layer):
            p = f"blk.{layer}."
            w.add_tensor(
                p + "attn_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32), "F32"
            )
            w.add_tensor(
                p + "ffn_norm.weight", (1 + 0.1 * rng.standard_normal(n_embd)).astype(np.float32), "F32"
            )
            w.add_tensor(p + "attn_q.weight", mat(q_dim, n_embd), wtype)
            w.add_tensor(p + "attn_k.weight", mat(kv_dim, n_embd), wtype)
            w.add_tensor(p + "attn_v.weight", mat(kv_dim, n_embd), wtype)
            w.add_tensor(p + "attn_output.weight", mat(n_embd, q_dim), wtype)
            experts = range(n_expert) if arch == "moe" else [None]
            if arch == "moe":
                w.add_tensor(p + "ffn_gate_inp.weight", mat(n_expert, n_embd), "F32")
            for e in experts:
                order = rng.permutation(n_ff) if permute else None
                w.add_ffn(
                    layer, mat(n_ff, n_embd), mat(n_ff, n_embd), mat(n_embd, n_ff), expert=e, order=order
                )
        for name, values in (extra_tensors or {}).items():
            w.add_tensor(name, np.asarray(values, dtype=np.float32), "F32")
    return Path(path)
