"""Divergence of a sparse run from the dense model, from the two runs' logits on the same tokens.

Per scored position i (logits row i predicts token i+1): KL(dense || sparse) in nats, whether the two
argmaxes agree, and each run's negative log-likelihood of the real next token. Summaries are means
over the scored positions; the perplexity ratio is exp(mean NLL sparse - mean NLL dense).

Intervals are 95% percentile bootstraps over blocks of consecutive scored positions (neighbouring
tokens' errors are correlated, so resampling single tokens would understate the spread); the ratio's
interval resamples the same blocks for both runs, which is what makes it tight: the runs see the
same text.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLOCK = 16  # scored positions per bootstrap block
RESAMPLES = 2000
SEED = 19


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = np.asarray(logits, dtype=np.float64)
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


@dataclass
class TokenScores:
    """Per scored position: kl (nats), top1 (bool), nll_dense, nll_sparse (nats)."""

    kl: np.ndarray
    top1: np.ndarray
    nll_dense: np.ndarray
    nll_sparse: np.ndarray

    @staticmethod
    def concat(parts: list[TokenScores]) -> TokenScores:
        return TokenScores(*(np.concatenate([getattr(p, f) for p in parts]) for f in
                             ("kl", "top1", "nll_dense", "nll_sparse")))  # fmt: skip


def score_positions(dense: np.ndarray, sparse: np.ndarray, targets: np.ndarray) -> TokenScores:
    """dense, sparse: (n, vocab) logits of the same positions; targets: (n,) the real next tokens."""
    dense, sparse = np.asarray(dense), np.asarray(sparse)
    if dense.shape != sparse.shape or dense.ndim != 2 or len(targets) != dense.shape[0]:
        raise ValueError(f"logits {dense.shape} / {sparse.shape} and {len(targets)} targets do not line up")
    lp, lq = log_softmax(dense), log_softmax(sparse)
    kl = (np.exp(lp) * (lp - lq)).sum(axis=1)
    rows = np.arange(len(targets))
    t = np.asarray(targets, dtype=np.int64)
    return TokenScores(
        kl=np.maximum(kl, 0.0),  # rounding can leave -1e-16 where the two agree
        top1=dense.argmax(axis=1) == sparse.argmax(axis=1),
        nll_dense=-lp[rows, t],
        nll_sparse=-lq[rows, t],
    )


def _block_means(values: np.ndarray, block: int) -> tuple[np.ndarray, np.ndarray]:
    """(sum per block, count per block) over consecutive blocks (the last may be shorter)."""
    starts = np.arange(0, len(values), block)
    sums = np.add.reduceat(values.astype(np.float64), starts)
    counts = np.diff(np.append(starts, len(values)))
    return sums, counts


def summarize(s: TokenScores, block: int = BLOCK, resamples: int = RESAMPLES, seed: int = SEED) -> dict:
    """The quality fields of a result: point values and [low, high] 95% intervals."""
    n = len(s.kl)
    if n == 0:
        raise ValueError("no scored positions")
    rng = np.random.default_rng(seed)
    n_blocks = -(-n // block)
    picks = rng.integers(0, n_blocks, size=(resamples, n_blocks)) if n_blocks > 1 else None

    def mean_ci(values: np.ndarray) -> tuple[float, list[float] | None]:
        point = float(np.mean(values))
        if picks is None:
            return point, None
        sums, counts = _block_means(values, block)
        boot = sums[picks].sum(axis=1) / counts[picks].sum(axis=1)
        return point, [float(x) for x in np.percentile(boot, [2.5, 97.5])]

    kl, kl_ci = mean_ci(s.kl)
    top1, top1_ci = mean_ci(s.top1.astype(np.float64))
    nd, ns = float(np.mean(s.nll_dense)), float(np.mean(s.nll_sparse))
    ratio_ci = None
    if picks is not None:
        sd, counts = _block_means(s.nll_dense, block)
        ss, _ = _block_means(s.nll_sparse, block)
        c = counts[picks].sum(axis=1)
        boot = np.exp(ss[picks].sum(axis=1) / c - sd[picks].sum(axis=1) / c)
        ratio_ci = [float(x) for x in np.percentile(boot, [2.5, 97.5])]
    return {
        "tokens_scored": n,
        "kl_nats": kl,
        "kl_nats_ci": kl_ci,
        "top1_agreement": top1,
        "top1_agreement_ci": top1_ci,
        "ppl_dense": float(np.exp(nd)),
        "ppl_sparse": float(np.exp(ns)),
        "ppl_ratio": float(np.exp(ns - nd)),
        "ppl_ratio_ci": ratio_ci,
    }
