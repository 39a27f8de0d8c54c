"""The llama-family forward pass in numpy: the pieces the synthetic generator and the activation
profiler use, and the engine's correctness oracle over a .pi2 file (Reference).

Conventions match llama.cpp on GGUF tensors and the .pi2 engine: RMSNorm, "normal" RoPE rotating
adjacent pairs (x[2i], x[2i+1]) by pos * theta^(-2i/head_dim), grouped-query causal attention.
Rows of every matrix are output features (numpy shape = reversed ggml shape).

The pieces (rms_norm ... ffn_activation) work in float32 over whole batches of sequences: the
generator runs them over thousands of tokens. Reference is written for clarity, straight from the
math (llama-family attention with RoPE and GQA, RMSNorm, SwiGLU / ReLU / dReLU FFN, Mixtral-style
top-k routing), in float64, reading the weights through the Python reader (pi2cli.models.pi2file),
never through the engine. Its FFN uses the bundles' gate/up rows and, like the engine, the dense down
copy when the file has one, else the bundles' down columns.

`Reference.forward(tokens, record=...)` calls `record(layer, expert, rows, act)` with each FFN block's
activations (bundle order) and the token rows that reached it: the activation profiler
(pi2cli/models/profile.py) counts with it instead of a forward of its own.

`emulate_rounding=True` applies the engine's (and llama.cpp's) intermediate roundings: activations are
rounded to the type a weight pairs with (Q8 blocks for Q4_0/Q4_1/Q8_0 weights, F16 for F16 weights)
before each matrix product, and q/K/V pass through F16 as in the F16 KV cache. What remains between
engine and reference is float summation order, so the tolerance can be tight.
"""

from __future__ import annotations

import numpy as np

from pi2cli.models.pi2file import Pi2File, bundle_suffix, decode_rows, encode_rows


# ------------------------------------------------------------------ batch pieces (float32)
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


# ------------------------------------------------ the oracle over a .pi2 file (float64)
def _q8_quantize(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows of x as Q8 blocks the way ggml's x86 path makes them (float32 math, 127/amax, round half
    to even): (q as float32 (..., blocks, 32), d float32 (..., blocks))."""
    blocks = x.reshape(*x.shape[:-1], -1, 32).astype(np.float32)
    amax = np.abs(blocks).max(axis=-1)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = np.where(amax > 0, np.float32(127.0) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.round(blocks * inv[..., None]).astype(np.float32)
    return q, d


def _q8_roundtrip(x: np.ndarray) -> np.ndarray:
    """Round rows of x to Q8 blocks (the values Q8_0 and Q8_1 both hold) and back."""
    q, d = _q8_quantize(x)
    d16 = d.astype(np.float16).astype(np.float32)
    return (q * d16[..., None]).reshape(x.shape).astype(np.float32)


def _q8_1_sums(x: np.ndarray) -> np.ndarray:
    """Per 32-block of x, the F16 `s = d * sum(q)` a Q8_1 block carries (ggml's rounding)."""
    q, d = _q8_quantize(x)
    return (q.sum(axis=-1) * d).astype(np.float16).astype(np.float32)


def q4_1_split(raw: np.ndarray, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Q4_1 rows -> (scaled nibbles d*q per element, per-block minimum m): value = d*q + m."""
    blocks = raw.reshape(raw.shape[0], -1, 20)
    d = blocks[..., 0:2].copy().view(np.float16).astype(np.float32)
    m = blocks[..., 2:4].copy().view(np.float16).astype(np.float32)[..., 0]
    qs = blocks[..., 4:]
    q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.float32)
    return (q * d).reshape(raw.shape[0], n), m


def round_activation(x: np.ndarray, weight_type: str) -> np.ndarray:
    if weight_type in ("Q4_0", "Q4_1", "Q8_0"):
        return _q8_roundtrip(x)
    if weight_type == "F16":
        return x.astype(np.float16).astype(np.float32)
    return x.astype(np.float32)


class Reference:
    def __init__(self, path, emulate_rounding: bool = True):
        self.f = path if isinstance(path, Pi2File) else Pi2File(path)
        self.h = self.f.header
        self.emulate = emulate_rounding
        self._cache: dict[str, tuple[np.ndarray, str]] = {}
        self._parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._record = None

    # -- weights ---------------------------------------------------------------------------------
    def _mat(self, name: str) -> tuple[np.ndarray, str]:
        """(float32 matrix rows x cols, type) of a resident tensor."""
        if name not in self._cache:
            e = self.f.tensors[name]
            mat = self.f.tensor(name).reshape(e.shape[1], e.shape[0])
            self._cache[name] = (mat, e.type)
            if e.type == "Q4_1":
                self._parts[id(mat)] = q4_1_split(np.asarray(self.f.raw(name)), mat.shape[1])
        return self._cache[name]

    def _q4_1_parts(self, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        key = id(w)
        if key not in self._parts:
            self._parts[key] = q4_1_split(encode_rows(w, "Q4_1"), w.shape[1])
        return self._parts[key]

    def _ffn(self, layer: int, expert: int | None):
        key = f"ffn{layer}.{expert}"
        if key not in self._cache:
            b = self.f.ffn(layer, expert)
            self._cache[key] = (b, "")
            if self.h.neuron_type == "Q4_1":
                raw = np.asarray(self.f.raw(f"blk.{layer}.ffn_bundles{bundle_suffix(self.h, expert)}"))
                p = self.h.part_bytes
                self._parts[id(b["gate"])] = q4_1_split(np.ascontiguousarray(raw[:, :p]), self.h.n_embd)
                self._parts[id(b["up"])] = q4_1_split(np.ascontiguousarray(raw[:, p : 2 * p]), self.h.n_embd)
        return self._cache[key][0]

    def _mm(self, x: np.ndarray, w: np.ndarray, wtype: str) -> np.ndarray:
        if self.emulate and wtype == "Q4_1":
            # Q4_1 x Q8_1 as ggml computes it: d*q part on the rounded activations, plus each
            # block's minimum times the activation block's F16 sum s.
            scaled, mins = self._q4_1_parts(w)
            xr = round_activation(x, wtype).astype(np.float64)
            return (xr @ scaled.T.astype(np.float64) + _q8_1_sums(x).astype(np.float64) @ mins.T).astype(
                np.float32
            )
        if self.emulate:
            x = round_activation(x, wtype)
        return (x.astype(np.float64) @ w.T.astype(np.float64)).astype(np.float32)

    # -- pieces ------------------------------------------------------------------------------------
    def _rmsnorm(self, x: np.ndarray, w: np.ndarray) -> np.ndarray:
        ms = np.mean(x.astype(np.float64) ** 2, axis=-1, keepdims=True)
        return (x / np.sqrt(ms + self.h.rms_eps)).astype(np.float32) * w

    def _rope(self, x: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """x: (tokens, heads, head_dim); rotates adjacent pairs (llama.cpp 'normal' RoPE)."""
        hd = self.h.head_dim
        inv = self.h.rope_theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = positions[:, None].astype(np.float64) * inv[None, :]  # (tokens, hd/2)
        cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
        x0, x1 = x[..., 0::2].astype(np.float64), x[..., 1::2].astype(np.float64)
        out = np.empty_like(x, dtype=np.float64)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out.astype(np.float32)

    def _f16(self, x: np.ndarray) -> np.ndarray:
        return x.astype(np.float16).astype(np.float32) if self.emulate else x

    def _ffn_block(self, x: np.ndarray, layer: int, expert: int | None, rows=None) -> np.ndarray:
        """x: the rows (of the pass's tokens: `rows`, all when None) that reach this block."""
        h = self.h
        b = self._ffn(layer, expert)
        t = h.neuron_type
        g = self._mm(x, b["gate"], t)
        u = self._mm(x, b["up"], t)
        if h.ffn_act == "swiglu":
            a = g / (1.0 + np.exp(-g.astype(np.float64))).astype(np.float32) * u
        elif h.ffn_act == "relu":
            a = np.maximum(g, 0) * u
        else:
            a = np.maximum(g, 0) * np.maximum(u, 0)
        a = a.astype(np.float32)
        if self._record is not None:
            self._record(layer, expert, np.arange(len(x)) if rows is None else rows, a)
        if h.dense_down:
            orig = np.empty_like(a)
            orig[:, b["order"]] = a  # bundle order -> original neuron order
            w, wt = self._mat(f"blk.{layer}.ffn_down.weight{bundle_suffix(h, expert)}")
            return self._mm(orig, w, wt)
        return (a.astype(np.float64) @ b["down_cols"].astype(np.float64)).astype(np.float32)

    # -- the pass ----------------------------------------------------------------------------------
    def forward(self, tokens: list[int], record=None, logits: bool = True) -> np.ndarray | None:
        """Logits (len(tokens), n_vocab) for a fresh context. record(layer, expert, rows, act): called with
        each FFN block's activations (expert None for a dense FFN). logits=False: skip the output matrix
        (a profile needs none), return None."""
        self._record = record
        try:
            return self._forward(tokens, logits)
        finally:
            self._record = None

    def _forward(self, tokens: list[int], logits: bool) -> np.ndarray | None:
        h = self.h
        n = len(tokens)
        emb, et = self._mat("token_embd.weight")
        x = emb[np.asarray(tokens)].astype(np.float32)
        pos = np.arange(n)
        hd, nh, nkv = h.head_dim, h.n_head, h.n_head_kv
        for layer in range(h.n_layer):
            p = f"blk.{layer}."
            xn = self._rmsnorm(x, self.f.tensor(p + "attn_norm.weight"))
            q = self._mm(xn, *self._mat(p + "attn_q.weight")).reshape(n, nh, hd)
            k = self._mm(xn, *self._mat(p + "attn_k.weight")).reshape(n, nkv, hd)
            v = self._mm(xn, *self._mat(p + "attn_v.weight")).reshape(n, nkv, hd)
            q, k = self._f16(self._rope(q, pos)), self._f16(self._rope(k, pos))
            v = self._f16(v)
            group = nh // nkv
            kv_of_head = np.arange(nh) // group
            out = np.empty((n, nh, hd), dtype=np.float32)
            for t in range(n):
                out[t] = self._attend(q[t], k[: t + 1, kv_of_head, :], v[: t + 1, kv_of_head, :])
            x = x + self._mm(out.reshape(n, nh * hd), *self._mat(p + "attn_output.weight"))
            xn = self._rmsnorm(x, self.f.tensor(p + "ffn_norm.weight"))
            x = x + (self._moe(xn, layer) if h.arch == "moe" else self._ffn_block(xn, layer, None))
        if not logits:
            return None
        xn = self._rmsnorm(x, self.f.tensor("output_norm.weight"))
        out_w = "token_embd.weight" if h.tied_embeddings else "output.weight"
        return self._mm(xn, *self._mat(out_w))

    def _attend(self, q: np.ndarray, k: np.ndarray, v: np.ndarray) -> np.ndarray:
        """One query position, all heads: q (heads, hd), k/v (positions, heads, hd)."""
        hd = self.h.head_dim
        scale = np.float32(1.0) / np.sqrt(np.float32(hd))
        # q, k and v come rounded to F16 when emulating (the engine's KV cache and query); the engine
        # then takes the exact softmax in float (kernels_att.h), as this does in double.
        s = np.einsum("hd,phd->hp", q.astype(np.float64), k.astype(np.float64)) * scale
        s = np.exp(s - s.max(axis=1, keepdims=True))
        s /= s.sum(axis=1, keepdims=True)
        return np.einsum("hp,phd->hd", s, v.astype(np.float64)).astype(np.float32)

    def _moe(self, xn: np.ndarray, layer: int) -> np.ndarray:
        """Mixtral routing: each token's top n_expert_used experts, softmax-weighted. Each expert runs once
        over the rows routed to it (a row's result does not depend on the other rows)."""
        h = self.h
        logits = self._mm(xn, *self._mat(f"blk.{layer}.ffn_gate_inp.weight")).astype(np.float64)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs /= probs.sum(axis=1, keepdims=True)
        top = np.argsort(-probs, axis=1, kind="stable")[:, : h.n_expert_used]
        w = np.take_along_axis(probs, top, axis=1)
        w = (w / w.sum(axis=1, keepdims=True)).astype(np.float32)
        out = np.zeros_like(xn)
        for slot in range(h.n_expert_used):  # in each token's rank order, as the sum was taken per token
            for e in np.unique(top[:, slot]):
                rows = np.flatnonzero(top[:, slot] == e)
                out[rows] += w[rows, slot, None] * self._ffn_block(xn[rows], layer, int(e), rows)
        return out


def quantize_roundtrip(values: np.ndarray, type_name: str) -> np.ndarray:
    """values as they come back after storing them in `type_name` (for building test models)."""
    n = values.shape[-1]
    return decode_rows(encode_rows(values, type_name), type_name, n)
