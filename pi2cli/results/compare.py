"""Side-by-side comparison of runs: speedups over a baseline engine with bootstrap confidence intervals.

Runs are grouped by (model, workload, memory budget). In each group every run is compared with the
baseline run, and each ratio is a speedup (above 1: faster than the baseline):

    decode   mean TBT(baseline) / mean TBT(engine)    (= pooled decode tok/s ratio)
    tbt_p50  median TBT(baseline) / median TBT(engine)
    ttft     mean TTFT(baseline) / mean TTFT(engine)

The interval is a percentile bootstrap: both sample sets are resampled with replacement, independently,
`resamples` times, from numpy's default_rng(seed) started afresh for every ratio, so an interval depends
only on the two runs and the settings, never on what else is being compared.
"""

import csv
import io
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from pi2cli.results import columns, schema

DEFAULT_RESAMPLES = 2000
DEFAULT_SEED = 0
DEFAULT_CONFIDENCE = 0.95
DEFAULT_BASELINE = "llama.cpp"

# Resample in batches so memory stays bounded whatever the sample count (elements per batch).
_BATCH_ELEMENTS = 2_000_000


@dataclass
class Ratio:
    ratio: float
    ci_low: float | None
    ci_high: float | None

    def text(self) -> str:
        if self.ci_low is None or self.ci_high is None:
            return f"{self.ratio:.2f}x"
        return f"{self.ratio:.2f}x [{self.ci_low:.2f}, {self.ci_high:.2f}]"


def _batched_stat(values: np.ndarray, stat: Callable, rng: np.random.Generator, resamples: int) -> np.ndarray:
    """stat over `resamples` resamples (with replacement) of `values`.

    Resampling draws indices into the sorted values, so a resample's order statistics are the values
    at its order-statistic indices: the median needs only a partition of small integers, several times
    faster than np.median over the gathered floats (20k tokens x 2000 resamples: ~1 s, not ~5 s)."""
    n = values.size
    ordered = np.sort(values)
    out = np.empty(resamples)
    batch = max(1, _BATCH_ELEMENTS // max(n, 1))
    mids = [n // 2] if n % 2 else [n // 2 - 1, n // 2]
    for start in range(0, resamples, batch):
        k = min(batch, resamples - start)
        picks = rng.integers(0, n, size=(k, n), dtype=np.int32 if n < 2**31 else np.int64)
        if stat is np.median:
            part = np.partition(picks, mids, axis=1)
            out[start : start + k] = ordered[part[:, mids]].mean(axis=1)
        else:
            out[start : start + k] = stat(ordered[picks], axis=1)
    return out


def bootstrap_speedup(
    baseline: Sequence[float] | np.ndarray,
    candidate: Sequence[float] | np.ndarray,
    stat: Callable = np.mean,
    *,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Ratio | None:
    """stat(baseline) / stat(candidate) for times (above 1: the candidate is faster), with a percentile
    bootstrap interval. None when either side has no samples or a zero statistic; no interval when a
    side has a single sample (nothing to resample)."""
    base = np.asarray(baseline, dtype=np.float64)
    cand = np.asarray(candidate, dtype=np.float64)
    if base.size == 0 or cand.size == 0:
        return None
    point_base, point_cand = float(stat(base)), float(stat(cand))
    if point_base <= 0 or point_cand <= 0:
        return None
    point = point_base / point_cand
    if base.size < 2 or cand.size < 2 or resamples < 1:
        return Ratio(point, None, None)
    rng = np.random.default_rng(seed)
    base_stats = _batched_stat(base, stat, rng, resamples)
    cand_stats = _batched_stat(cand, stat, rng, resamples)
    valid = cand_stats > 0
    ratios = base_stats[valid] / cand_stats[valid]
    if ratios.size == 0:
        return Ratio(point, None, None)
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(ratios, [tail, 100 - tail])
    return Ratio(point, float(low), float(high))


@dataclass
class Row:
    model: str
    workload: str
    budget_bytes: int | None
    engine: str
    run_id: str
    created_at: str
    synthetic: bool
    is_baseline: bool
    baseline: str | None
    baseline_run_id: str | None
    n_turns: int
    decode_ts: float | None  # pooled
    avg_ts: float | None
    stddev_ts: float | None
    tbt_p50_ms: float | None
    tbt_p90_ms: float | None
    tbt_p99_ms: float | None
    ttft_ms: float | None
    peak_rss_mib: float | None
    decode_speedup: Ratio | None = None
    tbt_p50_speedup: Ratio | None = None
    ttft_speedup: Ratio | None = None
    quality: dict | None = None  # the run's divergence from the dense model (pi2 bench --quality)


@dataclass
class Comparison:
    rows: list[Row]
    baseline: str
    resamples: int
    seed: int
    confidence: float
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "baseline": self.baseline,
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "metrics": {
                "decode_speedup": "mean TBT(baseline) / mean TBT(engine): the decode tok/s ratio",
                "tbt_p50_speedup": "median TBT(baseline) / median TBT(engine)",
                "ttft_speedup": "mean TTFT(baseline) / mean TTFT(engine)",
            },
            "rows": [asdict(row) for row in self.rows],
            "notes": self.notes,
        }


def _ms(ns: int | float | None) -> float | None:
    return None if ns is None else ns / 1e6


def _pick_baseline(runs: list[dict], baseline: str) -> dict | None:
    """The first run (in the order given) of the baseline engine, by label or name."""
    return next((r for r in runs if baseline in (schema.engine_label(r), r["engine"]["name"])), None)


def compare_runs(
    runs: Sequence[dict],
    *,
    baseline: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Comparison:
    """Group the runs and compare each with its group's baseline run (see the module doc).

    The baseline of a group is its first run (in the order given) of the baseline engine; a group
    without that engine is compared with its first run, and a note says so. Failed runs are left out
    with a note."""
    wanted = baseline or DEFAULT_BASELINE
    for run in runs:
        if not run.get("summary"):
            schema.summarize(run)
    notes: list[str] = []
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        if run["status"] != schema.STATUS_OK:
            notes.append(f"{run['run_id']}: left out ({run['status']}: {run['error']})")
            continue
        groups.setdefault(schema.group_key(run), []).append(run)

    rows: list[Row] = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], -1 if k[2] is None else k[2])):
        model, workload, budget = key
        given = groups[key]  # in the order the runs were given: that order decides the baseline
        members = sorted(given, key=lambda r: (schema.engine_label(r), r["created_at"], r["run_id"]))
        base_run = _pick_baseline(given, wanted)
        if base_run is None:
            base_run = given[0]
            if len(members) > 1:
                where = f"{model} / {workload} / {schema.budget_label(budget)}"
                notes.append(f"{where}: no {wanted} run; compared with {schema.engine_label(base_run)} "
                             f"({base_run['run_id']})")  # fmt: skip
        base_tbt = schema.tbt_samples_ns(base_run)
        base_ttft = schema.ttft_samples_ns(base_run)
        for run in members:
            summary = run["summary"]
            is_base = run is base_run
            row = Row(
                model=model,
                workload=workload,
                budget_bytes=budget,
                engine=schema.engine_label(run),
                run_id=run["run_id"],
                created_at=run["created_at"],
                synthetic=bool(run["model"]["synthetic"]),
                is_baseline=is_base,
                baseline=schema.engine_label(base_run),
                baseline_run_id=base_run["run_id"],
                n_turns=summary["n_turns"],
                decode_ts=summary["pooled_ts"] if summary["pooled_ts"] is not None else summary["avg_ts"],
                avg_ts=summary["avg_ts"],
                stddev_ts=summary["stddev_ts"],
                tbt_p50_ms=_ms(summary["tbt_p50_ns"]),
                tbt_p90_ms=_ms(summary["tbt_p90_ns"]),
                tbt_p99_ms=_ms(summary["tbt_p99_ns"]),
                ttft_ms=_ms(summary["ttft_avg_ns"]),
                peak_rss_mib=None if summary["peak_rss_bytes"] is None else summary["peak_rss_bytes"] / 2**20,
                quality=run.get("quality"),
            )
            if not is_base:
                tbt = schema.tbt_samples_ns(run)
                opts = {"resamples": resamples, "seed": seed, "confidence": confidence}
                row.decode_speedup = bootstrap_speedup(base_tbt, tbt, np.mean, **opts)
                row.tbt_p50_speedup = bootstrap_speedup(base_tbt, tbt, np.median, **opts)
                row.ttft_speedup = bootstrap_speedup(base_ttft, schema.ttft_samples_ns(run), np.mean, **opts)
                if row.decode_speedup is None and base_run["summary"]["avg_ts"] and summary["avg_ts"]:
                    # An engine that reports only rates: the plain ratio, no interval.
                    row.decode_speedup = Ratio(summary["avg_ts"] / base_run["summary"]["avg_ts"], None, None)
            rows.append(row)
    return Comparison(rows, wanted, resamples, seed, confidence, notes)


# ---------------------------------------------------------------------------------------------------
# Rendering.

# The columns (header and formatting) are declared once in pi2cli.results.columns; these pick compare's.
TABLE_COLUMNS = columns.select("model", "workload", "budget_bytes", "engine", "decode_pooled", "decode_speedup",
                               "tbt_p50_ms", "tbt_p50_speedup", "tbt_p90_p99_ms", "ttft_ms", "ttft_speedup",
                               "quality", "run_id")  # fmt: skip
HEADERS = columns.headers(TABLE_COLUMNS)

# CSV: the columns' machine names, then each ratio and quality score with its interval ends
CSV_COLUMNS = columns.select("model", "workload", "budget_bytes", "engine", "synthetic", "run_id", "baseline",
                             "n_turns", "decode_ts", "stddev_ts", "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms",
                             "ttft_ms")  # fmt: skip
CSV_HEADERS = [c.name for c in CSV_COLUMNS] + [
    f"{name}{end}" for name in ("decode", "tbt_p50", "ttft") for end in ("_speedup", "_ci_low", "_ci_high")
] + ["kl_nats", "kl_ci_low", "kl_ci_high", "top1_agreement", "top1_ci_low", "top1_ci_high", "ppl_ratio",
     "ppl_ratio_ci_low", "ppl_ratio_ci_high"]  # fmt: skip
QUALITY_KEYS = ("kl_nats", "top1_agreement", "ppl_ratio")


def quality_text(q: dict | None) -> str:
    """KL, top-1 agreement and perplexity ratio with their intervals, or '-' for a run without them."""
    if not q:
        return "-"

    def ci(key: str, fmt: str) -> str:
        c = q.get(f"{key}_ci")
        return f" [{format(c[0], fmt)}, {format(c[1], fmt)}]" if c else ""

    return (f"KL {q['kl_nats']:.4f}{ci('kl_nats', '.4f')}, top-1 {q['top1_agreement']:.1%}"
            f"{ci('top1_agreement', '.1%')}, ppl x{q['ppl_ratio']:.3f}{ci('ppl_ratio', '.3f')}")  # fmt: skip


def _speedup(row: Row, ratio: Ratio | None) -> str:
    if row.is_baseline:
        return "baseline"
    return "-" if ratio is None else ratio.text()


def table_rows(comparison: Comparison) -> list[list[str]]:
    """The comparison as rows of text cells in HEADERS order (model names carry [synthetic])."""
    out = []
    for row in comparison.rows:
        values = [row.model, row.workload, row.budget_bytes, row.engine, (row.decode_ts, row.stddev_ts, row.n_turns),
                  _speedup(row, row.decode_speedup), row.tbt_p50_ms, _speedup(row, row.tbt_p50_speedup),
                  (row.tbt_p90_ms, row.tbt_p99_ms), row.ttft_ms, _speedup(row, row.ttft_speedup),
                  quality_text(row.quality), row.run_id]  # fmt: skip
        out.append([col.text(v) for col, v in zip(TABLE_COLUMNS, values, strict=True)])
    return out


def footnote(comparison: Comparison) -> str:
    pct = round(comparison.confidence * 100)
    return (f"Speedups over the baseline ({comparison.baseline} where present) with {pct}% bootstrap "
            f"intervals: {comparison.resamples} resamples of the per-token TBT (per-turn TTFT), "
            f"numpy default_rng(seed={comparison.seed}). decode tok/s (pooled): all decode tokens over all "
            f"decode time, ± the stddev of the per-turn rates. Quality vs dense (pi2 bench --quality): "
            f"KL(dense || run) nats/token, top-1 agreement, perplexity ratio, 95% intervals (docs/QUALITY.md).")  # fmt: skip


def render(comparison: Comparison, fmt: str) -> str:
    """md / csv / json as text ("table" is drawn by render_rich)."""
    if fmt == "json":
        return json.dumps(comparison.to_json(), indent=1)
    if fmt == "csv":
        # One value per cell so a spreadsheet can use it: ratios and interval ends as plain numbers.
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(CSV_HEADERS)
        for row in comparison.rows:
            # bools as 0/1 (synthetic) so a spreadsheet can sum them
            cells = [
                int(v) if isinstance(v, bool) else v for v in (getattr(row, c.name) for c in CSV_COLUMNS)
            ]
            for ratio in (row.decode_speedup, row.tbt_p50_speedup, row.ttft_speedup):
                cells += [None, None, None] if ratio is None else [ratio.ratio, ratio.ci_low, ratio.ci_high]
            for key in QUALITY_KEYS:
                q = row.quality or {}
                cells += [q.get(key), *(q.get(f"{key}_ci") or [None, None])]
            writer.writerow(["" if c is None else (f"{c:.6g}" if isinstance(c, float) else c) for c in cells])
        return buf.getvalue().rstrip("\n")
    if fmt == "md":
        from tabulate import tabulate

        text = tabulate(table_rows(comparison), headers=HEADERS, tablefmt="github")
        lines = [text, "", footnote(comparison)]
        lines += [f"- {note}" for note in comparison.notes]
        return "\n".join(lines)
    raise ValueError(f"unknown format {fmt!r}")


def render_rich(comparison: Comparison, console) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    table = Table(title="pi2 compare", caption=escape(footnote(comparison)), show_lines=False)
    for header in HEADERS:
        table.add_column(header, overflow="fold", no_wrap=header in ("decode speedup", "TBT P50 speedup"))
    for cells in table_rows(comparison):
        table.add_row(*(Text(c) for c in cells))  # Text: "[synthetic]" is not rich markup
    console.print(table)
    for note in comparison.notes:
        console.print(Text(f"note: {note}", style="yellow"))
