"""The few llama-family forward pieces the synthetic generator needs, in numpy (float32).

Conventions match llama.cpp on GGUF tensors and the .pi2 engine: RMSNorm, "normal" RoPE rotating
adjacent pairs (x[2i], x[2i+1]) by pos * theta^(-2i/head_dim), grouped-query causal attention.
Rows of every matrix are output features (numpy shape = reversed ggml shape).
"""

from __future__ import annotations

import numpy as np


def rms_norm(x: np.ndarray, eps: float) -> np.ndarray:
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * scale).astype(np.float32)


def rope_normal(x: np.ndarray, positions: np.ndarray, theta: float) -> np.ndarray:
    """x: (tokens, heads, head_dim); rotates adjacent pairs like LLAMA_ROPE_TYPE_NORM."""
    hd = x.shape[-1]
    inv = theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    cos = np.cos(ang).astype(np.float32)[:, None, :]
    sin = np.sin(ang).astype(np.float32)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * cos - x1 * sin
    out[..., 1::2] = x0 * sin + x1 * cos
    return out


def attention(
    xn: np.ndarray,
    wq: np.ndarray,
    wk: np.ndarray,
    wv: np.ndarray,
    n_head: int,
    n_kv_head: int,
    seq_len: int,
    theta: float,
) -> np.ndarray:
    """Causal GQA self-attention over independent sequences of `seq_len` rows each (before W_o)."""
    n, _ = xn.shape
    hd = wq.shape[0] // n_head
    q = (xn @ wq.T).reshape(n, n_head, hd)
    k = (xn @ wk.T).reshape(n, n_kv_head, hd)
    v = (xn @ wv.T).reshape(n, n_kv_head, hd)
    pos = np.tile(np.arange(seq_len), n // seq_len)
    q, k = rope_normal(q, pos, theta), rope_normal(k, pos, theta)
    group = n_head // n_kv_head
    out = np.empty((n, n_head, hd), dtype=np.float32)
    mask = np.triu(np.full((seq_len, seq_len), -np.inf, dtype=np.float32), 1)
    for s in range(n // seq_len):
        rows = slice(s * seq_len, (s + 1) * seq_len)
        qs = q[rows].transpose(1, 0, 2)  # heads, T, hd
        ks = np.repeat(k[rows].transpose(1, 0, 2), group, axis=0)
        vs = np.repeat(v[rows].transpose(1, 0, 2), group, axis=0)
        scores = qs @ ks.transpose(0, 2, 1) / np.sqrt(hd) + mask
        scores -= scores.max(axis=-1, keepdims=True)
        p = np.exp(scores)
        p /= p.sum(axis=-1, keepdims=True)
        out[rows] = (p @ vs).transpose(1, 0, 2)
    return out.reshape(n, n_head * hd)


def ffn_activation(g: np.ndarray, u: np.ndarray, activation: str) -> np.ndarray:
    """The FFN's hidden activations: silu = SwiGLU, relu = ReLU(gate)*up, drelu = ReLU(gate)*ReLU(up)."""
    if activation == "drelu":
        return np.maximum(g, 0) * np.maximum(u, 0)
    if activation == "relu":
        return np.maximum(g, 0) * u
    if activation == "silu":
        return g / (1.0 + np.exp(-g)) * u
    raise ValueError(f"unknown activation {activation!r}")
