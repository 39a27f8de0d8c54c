"""Did last night get slower? Per series, the newest night against earlier nights, from raw token times.

Two questions, both from the per-token times (TBT samples), and a series is flagged only when both say so:

1. Is there a change at all, or is this noise? A change-point test over the nightly medians (log scale)
   of the newest `window + 1` nights: every split point k (nights after k include the newest) gets a
   one-sided pooled-variance t-test of "after is slower than before"; the smallest p-value, Bonferroni
   corrected for the number of splits, is the series' p. Night-to-night spread is the noise here, so
   one odd night in the middle of the history has no split that explains it, and a newest night that is
   off by no more than nights usually are is not significant.
2. How large is it, and how sure? The ratio of the geometric mean of nightly medians after the change
   point to the one before, with a two-level bootstrap interval: nights are resampled within each side
   (night-to-night spread) and, within each night, tokens are resampled for its median (token noise).

Flagged: p < alpha, the interval's low end above 1, and the ratio at least 1 + min_effect. The false
alarm and detection rates of these defaults on simulated histories are measured in
tests/test_farm_regressions.py and quoted in docs/FARM.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import stats

DEFAULT_WINDOW = 7
DEFAULT_ALPHA = 0.05
DEFAULT_MIN_EFFECT = 0.02
DEFAULT_RESAMPLES = 1000
DEFAULT_CONFIDENCE = 0.95
MIN_NIGHTS = 3  # the change-point test needs a degree of freedom left for the night-to-night spread


@dataclass
class Verdict:
    key: tuple
    newest: str
    nights: int  # nights looked at (the newest included)
    flagged: bool
    reason: str
    change_night: str | None = None  # first night of the slower stretch
    ratio: float | None = None  # > 1: slower (time per token after / before)
    low: float | None = None
    high: float | None = None
    p_value: float | None = None

    @property
    def tested(self) -> bool:
        """False when the series had too few nights for a test: "not flagged" then means "not tested"."""
        return self.nights >= MIN_NIGHTS

    def to_json(self) -> dict:
        return {"series": list(self.key), "newest": self.newest, "nights": self.nights, "tested": self.tested,
                "flagged": self.flagged, "reason": self.reason, "change_night": self.change_night,
                "ratio": self.ratio, "low": self.low, "high": self.high, "p_value": self.p_value}  # fmt: skip


def change_point(log_medians: np.ndarray) -> tuple[int, float]:
    """(k, p): the split (nights k.. are the slower stretch, the newest included) whose one-sided pooled
    t-test gives the smallest p, and that p times the number of splits tried (Bonferroni), at most 1."""
    n = len(log_medians)
    best_k, best_p, tried = 0, 1.0, 0
    for k in range(1, n):
        before, after = log_medians[:k], log_medians[k:]
        if len(before) + len(after) < 3:
            continue  # no degree of freedom left for the spread
        tried += 1
        if np.ptp(log_medians) == 0:
            p = 1.0
        else:
            p = float(stats.ttest_ind(after, before, equal_var=True, alternative="greater").pvalue)
            p = 1.0 if np.isnan(p) else p
        if p < best_p:
            best_k, best_p = k, p
    return best_k, min(1.0, best_p * max(tried, 1))


def _night_medians(samples: np.ndarray, resamples: int, rng: np.random.Generator) -> np.ndarray:
    """`resamples` bootstrap medians of one night's token times (resampled with replacement)."""
    idx = rng.integers(0, len(samples), size=(resamples, len(samples)))
    return np.median(samples[idx], axis=1)


def bootstrap_ratio(before: list[np.ndarray], after: list[np.ndarray], resamples: int = DEFAULT_RESAMPLES,
                    confidence: float = DEFAULT_CONFIDENCE, seed: int = 0) -> tuple[float, float, float]:  # fmt: skip
    """(ratio, low, high) of geometric-mean nightly median after / before, two-level bootstrap."""
    rng = np.random.default_rng(seed)

    def side(nights: list[np.ndarray]) -> tuple[float, np.ndarray]:
        point = float(np.mean([np.log(np.median(s)) for s in nights]))
        boot = np.log(np.stack([_night_medians(s, resamples, rng) for s in nights]))  # nights x resamples
        pick = rng.integers(0, len(nights), size=(resamples, len(nights)))
        return point, boot[pick, np.arange(resamples)[:, None]].mean(axis=1)

    p_before, b_before = side(before)
    p_after, b_after = side(after)
    ratios = np.exp(b_after - b_before)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return float(np.exp(p_after - p_before)), float(low), float(high)


def assess(key: tuple, nights: list[str], samples: dict[str, np.ndarray], *, window: int = DEFAULT_WINDOW,
           alpha: float = DEFAULT_ALPHA, min_effect: float = DEFAULT_MIN_EFFECT,
           resamples: int = DEFAULT_RESAMPLES, seed: int = 0) -> Verdict:  # fmt: skip
    """The verdict on one series' newest night (nights sorted oldest first)."""
    nights = [n for n in nights if len(samples.get(n, ())) > 0][-(window + 1) :]
    newest = nights[-1] if nights else "-"
    if len(nights) < MIN_NIGHTS:
        return Verdict(key, newest, len(nights), False,
                       f"not tested: {len(nights)} night(s), needs at least {MIN_NIGHTS}")  # fmt: skip
    log_medians = np.log([np.median(samples[n]) for n in nights])
    k, p = change_point(log_medians)
    ratio, low, high = bootstrap_ratio([samples[n] for n in nights[:k]], [samples[n] for n in nights[k:]],
                                       resamples, seed=seed)  # fmt: skip
    flagged = p < alpha and low > 1 and ratio >= 1 + min_effect
    if flagged:
        reason = f"slower since {nights[k]}"
    elif p >= alpha:
        reason = "no change beyond night-to-night noise"
    elif low <= 1:
        reason = "interval includes no change"
    else:
        reason = f"below the {min_effect:.0%} minimum effect"
    return Verdict(key, newest, len(nights), flagged, reason, nights[k], round(ratio, 4), round(low, 4),
                   round(high, 4), round(p, 5))  # fmt: skip


def assess_all(series: list, **kwargs) -> list[Verdict]:
    """A verdict per pi2cli.farm.history.Series."""
    return [assess(s.key, s.nights, s.samples, **kwargs) for s in series]


def summary_line(verdicts: list[Verdict]) -> str:
    """The last line of `pi2 farm regressions`: how many series were flagged out of how many could be
    tested, and plainly when none could be (no series had MIN_NIGHTS nights): never a bare "0 flagged"."""
    tested = [v for v in verdicts if v.tested]
    flagged = [v for v in tested if v.flagged]
    newest = max((v.newest for v in verdicts), default="-")
    untested = len(verdicts) - len(tested)
    if not tested:
        return (f"nothing could be tested: none of {len(verdicts)} series has the {MIN_NIGHTS} nights of ok runs "
                f"a test needs (newest night {newest}); no regression can be ruled out yet")  # fmt: skip
    line = f"{len(flagged)} of {len(tested)} tested series flagged (newest night {newest})"
    if untested:
        line += f"; {untested} series not tested (fewer than {MIN_NIGHTS} nights: --json lists them)"
    return line
