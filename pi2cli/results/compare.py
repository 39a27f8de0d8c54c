"""Side-by-side comparison of runs: speedups over a baseline engine with bootstrap confidence intervals.

Runs are grouped by schema.GroupKey (model, workload, memory budget and whether it was enforced, device,
threads): a phone run and a local run of one engine, runs at different thread counts, or a run held to its
budget and one that was not, are never in one group. In each group every finished run is
compared with the baseline run, and each ratio is a speedup (above 1: faster than the baseline):

    decode   mean TBT(baseline) / mean TBT(engine)    (= pooled decode tok/s ratio)
    tbt_p50  median TBT(baseline) / median TBT(engine)
    ttft     mean TTFT(baseline) / mean TTFT(engine)

The interval is a percentile bootstrap: both sample sets are resampled with replacement, independently,
`resamples` times, from numpy's default_rng(seed) started afresh for every ratio, so an interval depends
only on the two runs and the settings, never on what else is being compared. Runs that are not ok
(failed, aborted, timeout, invalid, ...) are rows of their group with their status and reason, no figures.
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
    budget_enforced: bool  # held to the budget (False: none, or not enforced): part of the group
    target: str  # the device (schema.target_label): part of the group, so local and phone runs never mix
    threads: int | None  # settings.threads (None: the engine's default): part of the group too
    engine: str
    run_id: str
    created_at: str
    synthetic: bool
    status: str  # a run that is not ok is shown in its group with its reason, never compared
    error: str | None
    commit: str  # schema.commit_label: the engine's commit, else pi2's
    is_baseline: bool
    baseline: str | None
    baseline_run_id: str | None
    n_turns: int
    decode_ts: float | None  # schema.decode_rate: THE decode tok/s
    avg_ts: float | None  # the mean of the per-turn rates (another statistic, named so)
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

    @property
    def key(self) -> schema.GroupKey:
        return schema.GroupKey.of(model=self.model, workload=self.workload, budget_bytes=self.budget_bytes,
                                  enforced=self.budget_enforced, target=self.target, threads=self.threads)  # fmt: skip


@dataclass
class Comparison:
    rows: list[Row]
    baseline: str
    resamples: int
    seed: int
    confidence: float
    notes: list[str] = field(default_factory=list)

    def groups(self) -> list[tuple[schema.GroupKey, list[Row]]]:
        """The rows by group (schema.group_key), in order: what the grouped tables draw."""
        out: dict[schema.GroupKey, list[Row]] = {}
        for row in self.rows:
            out.setdefault(row.key, []).append(row)
        return list(out.items())

    def to_json(self) -> dict:
        return {
            "baseline": self.baseline,
            "resamples": self.resamples,
            "seed": self.seed,
            "confidence": self.confidence,
            "group_by": ["model", "workload", "budget_bytes", "budget_enforced", "target", "threads"],
            "metrics": {
                "decode_ts": f"{schema.DECODE_LABEL}: {schema.DECODE_MEANING}",
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


def _row(run: dict, key: schema.GroupKey, base_run: dict | None) -> Row:
    ok = run["status"] == schema.STATUS_OK
    s = run["summary"]

    def fig(value):  # a run that did not finish or cannot be true: no figure beside the others
        return value if ok else None

    return Row(
        model=key.model, workload=key.workload, budget_bytes=key.budget_bytes, budget_enforced=key.enforced,
        target=key.target, threads=key.threads,
        engine=schema.engine_label(run), run_id=run["run_id"], created_at=run["created_at"],
        synthetic=bool(run["model"]["synthetic"]), status=run["status"], error=run["error"],
        commit=schema.commit_label(run), is_baseline=run is base_run,
        baseline=None if base_run is None else schema.engine_label(base_run),
        baseline_run_id=None if base_run is None else base_run["run_id"],
        n_turns=s["n_turns"], decode_ts=fig(schema.decode_rate(run)), avg_ts=fig(s["avg_ts"]),
        stddev_ts=fig(s["stddev_ts"]), tbt_p50_ms=fig(_ms(s["tbt_p50_ns"])), tbt_p90_ms=fig(_ms(s["tbt_p90_ns"])),
        tbt_p99_ms=fig(_ms(s["tbt_p99_ns"])), ttft_ms=fig(_ms(s["ttft_avg_ns"])),
        peak_rss_mib=fig(None if s["peak_rss_bytes"] is None else s["peak_rss_bytes"] / 2**20),
        quality=fig(run.get("quality")),
    )  # fmt: skip


def compare_runs(
    runs: Sequence[dict],
    *,
    baseline: str | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = DEFAULT_SEED,
    confidence: float = DEFAULT_CONFIDENCE,
) -> Comparison:
    """Group the runs (schema.group_key: model, workload, budget held or not, device, threads) and compare
    each finished run with its group's baseline run (see the module doc).

    The baseline of a group is its first ok run (in the order given) of the baseline engine; a group
    without that engine is compared with its first ok run, and a note says so. Runs that are not ok
    (failed, aborted, timeout, invalid, ...) stay in their group as rows with their status and reason,
    without figures or speedups (the tables print the reason under the group)."""
    wanted = baseline or DEFAULT_BASELINE
    for run in runs:
        if not run.get("summary"):
            schema.summarize(run)
    notes: list[str] = []
    groups: dict[schema.GroupKey, list[dict]] = {}
    for run in runs:
        groups.setdefault(schema.group_key(run), []).append(run)

    rows: list[Row] = []
    for key in sorted(groups, key=schema.group_sort_key):
        given = groups[key]  # in the order the runs were given: that order decides the baseline
        finished = [r for r in given if r["status"] == schema.STATUS_OK]
        members = sorted(given, key=lambda r: (r["status"] != schema.STATUS_OK, schema.engine_label(r),
                                               r["created_at"], r["run_id"]))  # fmt: skip
        base_run = _pick_baseline(finished, wanted)
        if base_run is None and finished:
            base_run = finished[0]
            if len(finished) > 1:
                notes.append(f"{schema.group_label(key)}: no {wanted} run; compared with "
                             f"{schema.engine_label(base_run)} ({base_run['run_id']})")  # fmt: skip
        base_tbt = None if base_run is None else schema.tbt_samples_ns(base_run)
        base_ttft = None if base_run is None else schema.ttft_samples_ns(base_run)
        for run in members:
            row = _row(run, key, base_run)
            if run["status"] == schema.STATUS_OK and not row.is_baseline:
                tbt = schema.tbt_samples_ns(run)
                opts = {"resamples": resamples, "seed": seed, "confidence": confidence}
                row.decode_speedup = bootstrap_speedup(base_tbt, tbt, np.mean, **opts)
                row.tbt_p50_speedup = bootstrap_speedup(base_tbt, tbt, np.median, **opts)
                row.ttft_speedup = bootstrap_speedup(base_ttft, schema.ttft_samples_ns(run), np.mean, **opts)
                base_rate = schema.decode_rate(base_run)
                if row.decode_speedup is None and base_rate and row.decode_ts:
                    # An engine that reports only rates: the plain ratio of the decode rates, no interval.
                    row.decode_speedup = Ratio(row.decode_ts / base_rate, None, None)
            rows.append(row)
    return Comparison(rows, wanted, resamples, seed, confidence, notes)


# ---------------------------------------------------------------------------------------------------
# Rendering.

# The columns (header and formatting) are declared once in pi2cli.results.columns; these pick compare's.
# The default table is one per group (its title names model, workload, budget, device and threads), with
# the columns that fit a 120-column terminal; failure reasons follow as notes. --wide: every column, flat.
TABLE_COLUMNS = columns.select("engine", "status_label", "decode_pooled", "decode_speedup", "tbt_p50_ms", "ttft_ms",
                               "commit")  # fmt: skip
HEADERS = columns.headers(TABLE_COLUMNS)
WIDE_COLUMNS = columns.select("model", "workload", "budget_held", "target", "threads", "engine", "status",
                              "decode_pooled", "decode_speedup", "tbt_p50_ms", "tbt_p50_speedup", "tbt_p90_p99_ms",
                              "ttft_ms", "ttft_speedup", "quality", "commit", "run_id")  # fmt: skip
WIDE_HEADERS = columns.headers(WIDE_COLUMNS)

# CSV: the columns' machine names, then each ratio and quality score with its interval ends
CSV_COLUMNS = columns.select("model", "workload", "budget_bytes", "budget_enforced", "target", "threads", "engine",
                             "status", "error", "synthetic", "commit", "run_id", "baseline", "n_turns", "decode_ts",
                             "avg_ts", "stddev_ts", "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "ttft_ms")  # fmt: skip
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


def _values(row: Row) -> dict:
    """A row's value for each column name (the columns write them)."""
    return {"model": row.model, "workload": row.workload, "target": row.target,
            "budget_held": schema.budget_held_label(row.budget_bytes, row.budget_enforced),
            "threads": row.threads, "engine": row.engine, "status": (row.status, row.error),
            "status_label": (row.status, row.error), "decode_pooled": (row.decode_ts, row.stddev_ts, row.n_turns),
            "decode_speedup": _speedup(row, row.decode_speedup), "tbt_p50_ms": row.tbt_p50_ms,
            "tbt_p50_speedup": _speedup(row, row.tbt_p50_speedup), "tbt_p90_p99_ms": (row.tbt_p90_ms, row.tbt_p99_ms),
            "ttft_ms": row.ttft_ms, "ttft_speedup": _speedup(row, row.ttft_speedup),
            "quality": quality_text(row.quality), "commit": row.commit, "run_id": row.run_id}  # fmt: skip


def _cells(row: Row, cols: list) -> list[str]:
    values = _values(row)
    return [col.text(values[col.name]) for col in cols]


def table_rows(comparison: Comparison, *, wide: bool = False) -> list[list[str]]:
    """The comparison as rows of text cells: WIDE_HEADERS order with wide, else HEADERS order (the group
    is then the title of each table: group_tables)."""
    cols = WIDE_COLUMNS if wide else TABLE_COLUMNS
    return [_cells(row, cols) for row in comparison.rows]


# The report's comparison tables: one per group as here, with the columns a page has room for.
REPORT_COLUMNS = columns.select("engine", "status", "decode_pooled", "decode_speedup", "tbt_p50_ms", "tbt_p50_speedup",
                                "tbt_p90_p99_ms", "ttft_ms", "ttft_speedup", "quality", "commit", "run_id")  # fmt: skip
REPORT_HEADERS = columns.headers(REPORT_COLUMNS)


def group_tables(comparison: Comparison, cols: list | None = None) -> list[tuple[str, list[list[str]]]]:
    """(group title, rows of `cols`, TABLE_COLUMNS by default) per group: model, workload, budget, device,
    threads, in group order."""
    cols = cols or TABLE_COLUMNS
    return [(schema.group_label(key), [_cells(r, cols) for r in rows]) for key, rows in comparison.groups()]


def reasons(rows: list[Row]) -> list[str]:
    """One line per row that is not ok: "engine: status: reason (run id)", printed under its group."""
    return [f"{r.engine}: {columns.status_cell(r.status, r.error, width=300)} ({schema.short_run_id(r.run_id)})"
            for r in rows if r.status != schema.STATUS_OK]  # fmt: skip


def footnote(comparison: Comparison) -> str:
    pct = round(comparison.confidence * 100)
    return (f"Groups: model, workload, memory budget (enforced or not), device and threads (runs from "
            f"different devices, thread counts or budget enforcement are never compared). Speedups over the "
            f"baseline ({comparison.baseline} where present) with {pct}% bootstrap intervals: {comparison.resamples} resamples of the per-token TBT "
            f"(per-turn TTFT), numpy default_rng(seed={comparison.seed}). {schema.DECODE_LABEL}: "
            f"{schema.DECODE_MEANING}, ± the stddev of the per-turn rates. Runs that are not ok are shown "
            f"with their status and no figures. Quality vs dense (pi2 bench --quality): KL(dense || run) "
            f"nats/token, top-1 agreement, perplexity ratio, 95% intervals (docs/QUALITY.md).")  # fmt: skip


def render(comparison: Comparison, fmt: str, *, wide: bool = False) -> str:
    """md / csv / json as text ("table" is drawn by render_rich); csv and json always hold every column."""
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
        return render_md(comparison, wide=wide)
    raise ValueError(f"unknown format {fmt!r}")


def render_md(comparison: Comparison, *, wide: bool = False, level: str = "###") -> str:
    """GitHub markdown: one table per group under a heading (wide: one flat table), footnote, notes."""
    from tabulate import tabulate

    if wide:
        lines = [tabulate(table_rows(comparison, wide=True), headers=WIDE_HEADERS, tablefmt="github"), ""]
    else:
        lines = []
        for (title, rows), (_, members) in zip(group_tables(comparison), comparison.groups(), strict=True):
            lines += [f"{level} {title}", "", tabulate(rows, headers=HEADERS, tablefmt="github"), ""]
            lines += [f"- {line}" for line in reasons(members)] + ([""] if reasons(members) else [])
    lines += [footnote(comparison)]
    lines += [f"- {note}" for note in comparison.notes]
    return "\n".join(lines)


def render_rich(comparison: Comparison, console, *, wide: bool = False) -> None:
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    no_wrap = ("decode speedup", "TBT P50 speedup", "TTFT speedup")
    if wide:  # the status column holds the reasons
        tables = [("pi2 compare", WIDE_HEADERS, table_rows(comparison, wide=True), [])]
    else:
        tables = [(title, HEADERS, rows, reasons(members))
                  for (title, rows), (_, members) in zip(group_tables(comparison), comparison.groups(), strict=True)]  # fmt: skip
    for title, headers, rows, why in tables:
        table = Table(title=Text(title, style="bold"), title_justify="left", show_lines=False)
        for header in headers:
            table.add_column(header, overflow="fold", no_wrap=header in no_wrap)
        for cells in rows:
            table.add_row(*(Text(c) for c in cells))  # Text: "[synthetic]" is not rich markup
        console.print(table)
        for line in why:
            console.print(Text(f"  {line}", style="yellow"))
    console.print(escape(footnote(comparison)), style="dim", highlight=False)
    for note in comparison.notes:
        console.print(Text(f"note: {note}", style="yellow"))
