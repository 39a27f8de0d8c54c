"""Q4_0 encode/decode for the synthesizer: the same bytes and floats as gguf's reference
(gguf.quants.Q4_0), faster and without full-size temporaries.

At the 47B shape the synthesizer quantizes 4 and dequantizes 2 matrices of 4096 x 14336 per expert,
256 experts in all. gguf's numpy reference allocates several matrix-sized temporaries per call, and
fresh pages cost the kernel's page faults every time (a third of a full-width layer's CPU time went
to the kernel). These work through cache-sized slices into caller-given buffers (the synthesizer
reuses them from one expert to the next): on one core here ~0.19 s against gguf's ~0.28 s to encode
such a matrix, ~0.18 s against 0.3-0.8 s to decode it. Only Q4_0 (the default, and the full-size
models' type) has a fast path; the other types go through gguf_twin unchanged.
tests/test_models_synth_fast.py checks both against gguf on values with ties, zeros and both signs.
"""

from __future__ import annotations

import numpy as np

from pi2cli.models import gguf_twin

QK = 32  # values per Q4_0 block
BLOCK_BYTES = 18  # f16 scale + 16 bytes of nibbles
SLICE = 1 << 13  # blocks per slice: 1 MiB of floats, one core's L2 here

# nibble byte -> its low / high value minus 8, as float32 (gguf: (q & 15) - 8, then * d in float32)
_LO = ((np.arange(256) & 15) - 8).astype(np.float32)
_HI = ((np.arange(256) >> 4) - 8).astype(np.float32)


def encode(values: np.ndarray, quant: str, out: np.ndarray | None = None) -> np.ndarray:
    """gguf_twin.encode, bit for bit; Q4_0 fast and written into `out` when given."""
    if quant != "q4_0":
        raw = gguf_twin.encode(values, quant)
        if out is None:
            return raw
        out[...] = raw
        return out
    values = np.ascontiguousarray(values, dtype=np.float32)
    n = values.shape[-1]
    if n % QK:
        return gguf_twin.encode(values, quant)  # gguf raises its own error
    shape = (*values.shape[:-1], n // QK * BLOCK_BYTES)
    if out is None:
        out = np.empty(shape, np.uint8)
    blocks = values.reshape(-1, QK)
    dst = out.reshape(-1, BLOCK_BYTES)
    for s in range(0, blocks.shape[0], SLICE):
        _encode_blocks(blocks[s : s + SLICE], dst[s : s + SLICE])
    return out


def _encode_blocks(b: np.ndarray, dst: np.ndarray) -> None:
    """gguf's Q4_0: the value of largest magnitude (its first occurrence) m, d = m / -8,
    q = min(trunc(x / d + 8.5), 15), two nibbles a byte. Worked on the transposed slice (32, k), where
    every step runs along k contiguous values; along the 32-wide axis numpy pays per block."""
    bt = np.ascontiguousarray(b.T)
    mx, mn = bt[0].copy(), bt[0].copy()
    for i in range(1, QK):
        np.maximum(mx, bt[i], out=mx)
        np.minimum(mn, bt[i], out=mn)
    peak = np.where(-mn > mx, mn, mx)
    tie = (-mn == mx) & (mx != 0)  # +m and -m both present: the first one wins, as in argmax
    if tie.any():
        rows = b[tie]
        peak[tie] = np.take_along_axis(rows, np.abs(rows).argmax(axis=1)[:, None], axis=1)[:, 0]
    d = peak / np.float32(-8)
    with np.errstate(divide="ignore"):
        inv = np.where(d == 0, np.float32(0), np.float32(1) / d)
    np.multiply(bt, inv, out=bt)
    bt += np.float32(8.5)
    u = bt.astype(np.uint8)  # float -> uint8 truncates, as gguf's trunc then astype
    np.minimum(u, np.uint8(15), out=u)
    hi = u[QK // 2 :]
    np.left_shift(hi, np.uint8(4), out=hi)
    np.bitwise_or(u[: QK // 2], hi, out=hi)
    dst[:, :2] = d.astype(np.float16).view(np.uint8).reshape(-1, 2)
    dst[:, 2:] = hi.T


def decode(raw: np.ndarray, quant: str, n: int, out: np.ndarray | None = None) -> np.ndarray:
    """gguf_twin.decode, bit for bit; Q4_0 fast and written into `out` when given."""
    if quant != "q4_0":
        vals = gguf_twin.decode(raw, quant, n)
        if out is None:
            return vals
        out[...] = vals
        return out
    raw = np.ascontiguousarray(raw, dtype=np.uint8)
    if out is None:
        out = np.empty((*raw.shape[:-1], n), np.float32)
    src = raw.reshape(-1, BLOCK_BYTES)
    dst = out.reshape(-1, QK)
    for s in range(0, src.shape[0], SLICE):
        blk, vals = src[s : s + SLICE], dst[s : s + SLICE]
        d = blk[:, :2].copy().view(np.float16).astype(np.float32)  # (k, 1)
        nib = blk[:, 2:]
        np.multiply(_LO[nib], d, out=vals[:, :16])
        np.multiply(_HI[nib], d, out=vals[:, 16:])
    return out
