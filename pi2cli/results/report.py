"""Reports: matplotlib plots (Agg) of runs, a markdown report and one self-contained HTML page.

write_report(runs, out_dir) writes out_dir/report.md (plots beside it in out_dir/plots/) and
out_dir/index.html, whose plots are inline base64 PNGs so the page works when mailed or opened offline.
Everything is built in a temporary directory next to out_dir and moved in only when complete.
"""

import base64
import datetime as dt
import errno
import os
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2cli import safe_write
from pi2cli.results import columns, schema
from pi2cli.results.compare import (
    REPORT_COLUMNS,
    REPORT_HEADERS,
    Comparison,
    compare_runs,
    footnote,
    group_tables,
)
from pi2cli.results.template import HTML_TEMPLATE


@dataclass
class ReportFiles:
    markdown: Path
    html: Path
    plots_dir: Path
    figures: list  # the Plot objects drawn


@dataclass
class Plot:
    name: str  # file stem
    title: str
    caption: str
    png: bytes
    text: str = ""  # every piece of text drawn on the figure (titles, ticks, legends), for checks

    @property
    def data_uri(self) -> str:
        return "data:image/png;base64," + base64.b64encode(self.png).decode("ascii")


# ---------------------------------------------------------------------------------------------------
# Plots.


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


def _key_order(key: schema.GroupKey) -> tuple:
    return schema.group_sort_key(key)


def _case_labels(runs: Sequence[dict]) -> tuple[dict[str, str], list[str]]:
    """A label per run for its group (schema.GroupKey) showing only the parts that vary (the workload
    always), and the labels in group order."""
    keys = {r["run_id"]: schema.group_key(r) for r in runs}

    def varies(*fields: str) -> bool:
        return len({tuple(getattr(k, f) for f in fields) for k in keys.values()}) > 1

    labels, order = {}, {}
    for run_id, key in keys.items():
        parts = [key.workload]
        if varies("model"):
            parts.insert(0, key.model)
        if varies("budget_bytes", "enforced"):
            parts.append(key.budget)
        if varies("target"):
            parts.append(key.target)
        if varies("threads"):
            parts.append(f"{schema.threads_label(key.threads)} threads")
        labels[run_id] = "\n".join(parts)
        order.setdefault(labels[run_id], _key_order(key))
    return labels, sorted(order, key=order.get)


def _models_title(runs: Sequence[dict]) -> str:
    """The model(s) for a plot title; synthetic ones say so."""
    return ", ".join(sorted({schema.model_label(r) for r in runs}))


def _engine_colors(runs: Sequence[dict]) -> dict[str, tuple]:
    plt = _pyplot()
    cmap = plt.get_cmap("tab10")
    engines = sorted({schema.engine_label(r) for r in runs})
    return {engine: cmap(i % 10) for i, engine in enumerate(engines)}


def _save(fig) -> tuple[bytes, str]:
    """The figure as PNG bytes, and all its text joined (so tests can see what a reader sees)."""
    import io

    from matplotlib.text import Text

    text = "\n".join(t.get_text() for t in fig.findobj(Text) if t.get_visible() and t.get_text())
    buf = io.BytesIO()
    fig.tight_layout()  # cheaper than bbox_inches="tight", which draws the figure twice
    fig.savefig(buf, format="png", dpi=96)
    _pyplot().close(fig)
    return buf.getvalue(), text


def _grouped_bars(runs, value, error, ylabel: str, title: str):
    """Bars per case (x) and engine (colour), packed so each case shows only the engines it has;
    `value(run)` may be None (bar left out)."""
    plt = _pyplot()
    cases, case_order = _case_labels(runs)
    colors = _engine_colors(runs)
    per_case = {c: sorted((r for r in runs if cases[r["run_id"]] == c and value(r) is not None),
                          key=schema.engine_label) for c in case_order}  # fmt: skip
    most = max((len(v) for v in per_case.values()), default=1) or 1
    width = 0.8 / most
    fig, ax = plt.subplots(figsize=(max(6.0, 0.55 * sum(len(v) for v in per_case.values()) + 2.5), 4.2))
    labelled = set()
    for i, case in enumerate(case_order):
        members = per_case[case]
        for k, run in enumerate(members):
            engine = schema.engine_label(run)
            x = i + (k - (len(members) - 1) / 2) * width
            err = error(run) if error else None
            bars = ax.bar([x], [value(run)], width * 0.95, yerr=[err] if err else None, capsize=3,
                          color=colors[engine], label=None if engine in labelled else engine)  # fmt: skip
            labelled.add(engine)
            ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    ax.set_xticks(range(len(case_order)), case_order)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{title}\n{_models_title(runs)}", fontsize=10)
    handles, labels = ax.get_legend_handles_labels()
    order = sorted(range(len(labels)), key=lambda n: labels[n])
    ax.legend([handles[n] for n in order], [labels[n] for n in order], fontsize=8, title="engine",
              title_fontsize=8)  # fmt: skip
    ax.grid(axis="y", alpha=0.3)
    ax.set_ylim(bottom=0)
    return fig


def plot_decode(runs: Sequence[dict]) -> Plot:
    fig = _grouped_bars(runs, schema.decode_rate, lambda r: r["summary"]["stddev_ts"], schema.DECODE_LABEL,
                        "Decode speed per engine and group (error bars: stddev of the per-turn rates)")  # fmt: skip
    return Plot("decode", "Decode speed", f"{schema.DECODE_LABEL}: {schema.DECODE_MEANING} (the same figure as "
                "the tables); error bars one standard deviation of the per-turn rates.", *_save(fig))  # fmt: skip


def plot_ttft(runs: Sequence[dict]) -> Plot | None:
    if not any(r["summary"]["ttft_avg_ns"] for r in runs):
        return None
    value = lambda r: None if r["summary"]["ttft_avg_ns"] is None else r["summary"]["ttft_avg_ns"] / 1e6  # noqa: E731
    fig = _grouped_bars(runs, value, None, "TTFT ms (mean over turns)", "Time to first token")
    return Plot("ttft", "Time to first token", "Mean time from prompt start to the first generated token.",
                *_save(fig))  # fmt: skip


def plot_tbt_cdf(runs: Sequence[dict]) -> Plot | None:
    runs = [r for r in runs if r["summary"]["tbt_count"]]
    if not runs:
        return None
    plt = _pyplot()
    cases, case_order = _case_labels(runs)
    colors = _engine_colors(runs)
    cols = min(2, len(case_order))
    nrows = (len(case_order) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6.5 * cols, 3.8 * nrows), squeeze=False)
    for i, case in enumerate(case_order):
        ax = axes[i // cols][i % cols]
        for run in sorted(runs, key=schema.engine_label):
            if cases[run["run_id"]] != case:
                continue
            tbt = np.sort(schema.tbt_samples_ns(run)) / 1e6
            frac = np.arange(1, tbt.size + 1) / tbt.size
            engine = schema.engine_label(run)
            ax.step(tbt, frac, where="post", color=colors[engine], label=engine)
            pcts = np.percentile(tbt, [50, 90, 99])
            ax.plot(pcts, [0.5, 0.9, 0.99], "o", color=colors[engine], markersize=4)
        ax.set_title(case.replace("\n", " / "), fontsize=9)
        ax.set_xlabel("time between tokens, ms")
        ax.set_ylabel("fraction of tokens")
        ax.set_ylim(0, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for j in range(len(case_order), nrows * cols):
        axes[j // cols][j % cols].set_visible(False)
    fig.suptitle(f"TBT distribution (dots: P50, P90, P99)\n{_models_title(runs)}", fontsize=10)
    return Plot("tbt_cdf", "Time between tokens", "Cumulative distribution of every time between tokens; "
                "dots mark P50, P90 and P99.", *_save(fig))  # fmt: skip


def plot_memory(runs: Sequence[dict]) -> Plot | None:
    runs = [r for r in runs if r["memory_samples"]]
    if not runs:
        return None
    plt = _pyplot()
    cases, case_order = _case_labels(runs)
    colors = _engine_colors(runs)
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    budgets = set()
    styles = ["-", "--", ":", "-."]
    for run in runs:
        samples = run["memory_samples"]
        t = [s["t_s"] for s in samples]
        rss = [s["rss_bytes"] / 2**20 for s in samples]
        engine = schema.engine_label(run)
        style = styles[case_order.index(cases[run["run_id"]]) % len(styles)]
        label = f"{engine} ({cases[run['run_id']].replace(chr(10), ' / ')}) RSS"
        ax.plot(t, rss, style, color=colors[engine], label=label)
        pss = [s["pss_bytes"] for s in samples]
        if any(p is not None for p in pss):
            ax.plot(t, [np.nan if p is None else p / 2**20 for p in pss], style, color=colors[engine], alpha=0.5,
                    label=label[:-3] + "PSS")  # fmt: skip
        if run["memory"]["budget_bytes"]:
            budgets.add(run["memory"]["budget_bytes"])
    for budget in sorted(budgets):
        ax.axhline(budget / 2**20, color="grey", linestyle="--", linewidth=1)
        ax.annotate(f"budget {schema.budget_label(budget)}", (0, budget / 2**20), fontsize=7, color="grey",
                    xytext=(2, 2), textcoords="offset points")  # fmt: skip
    ax.set_xlabel("seconds since run start")
    ax.set_ylabel("MiB")
    ax.set_title(f"Memory of the engine process over time\n{_models_title(runs)}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return Plot("memory", "Memory over time", "Resident (RSS) and proportional (PSS) memory of the engine "
                "process; dashed lines are memory budgets.", *_save(fig))  # fmt: skip


def plot_budget(runs: Sequence[dict]) -> Plot | None:
    """Decode tok/s against the memory budget, for (engine, model, workload, device, threads) run at 2+
    budgets; budgets that were not enforced are a line of their own (their memory is not comparable)."""
    series: dict[tuple, list[tuple[float, float]]] = {}
    for run in runs:
        budget = run["memory"]["budget_bytes"]
        if budget is None or schema.decode_rate(run) is None:
            continue
        held = "" if run["memory"]["enforced"] else " (not enforced)"
        key = (schema.engine_label(run), schema.model_label(run), run["workload"]["name"], schema.target_label(run),
               schema.threads_label(schema.run_threads(run)), held)  # fmt: skip
        series.setdefault(key, []).append((budget / 2**30, schema.decode_rate(run)))
    series = {k: sorted(v) for k, v in series.items() if len({b for b, _ in v}) > 1}
    if not series:
        return None
    plt = _pyplot()
    colors = _engine_colors(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for (engine, model, workload, target, threads, held), points in sorted(series.items()):
        xs, ys = zip(*points, strict=True)
        ax.plot(
            xs,
            ys,
            "o-",
            color=colors[engine],
            label=f"{engine}: {model} / {workload} / {target} / {threads} thr{held}",
        )
    ax.set_xlabel("memory budget, GiB")
    ax.set_ylabel(schema.DECODE_LABEL)
    models = ", ".join(sorted({k[1] for k in series}))
    ax.set_title(f"Decode speed against memory budget\n{models}", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return Plot("budget", "Speed against memory budget", f"{schema.DECODE_LABEL} at each memory budget.",
                *_save(fig))  # fmt: skip


def plot_ablation(runs: Sequence[dict]) -> Plot | None:
    """The pi2 policies dense -> bundle -> cache -> powerinfer2 side by side, where 2+ exist for a case."""
    ladder: dict[schema.GroupKey, dict[str, dict]] = {}
    for run in runs:
        policy = run["engine"]["policy"]
        if run["engine"]["name"] != "pi2" or policy not in schema.ABLATION_POLICIES:
            continue
        ladder.setdefault(schema.group_key(run), {})[policy] = run
    ladder = {k: v for k, v in ladder.items() if len(v) > 1}
    if not ladder:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4.2))
    cases = sorted(ladder, key=_key_order)
    width = 0.8 / len(cases)
    for i, key in enumerate(cases):
        xs, ys = [], []
        for p, policy in enumerate(schema.ABLATION_POLICIES):
            if policy in ladder[key] and schema.decode_rate(ladder[key][policy]) is not None:
                xs.append(p + (i - (len(cases) - 1) / 2) * width)
                ys.append(schema.decode_rate(ladder[key][policy]))
        bars = ax.bar(xs, ys, width * 0.95, label=schema.group_label(key))
        ax.bar_label(bars, fmt="%.3g", fontsize=7, padding=2)
    ax.set_xticks(range(len(schema.ABLATION_POLICIES)), ["dense", "+bundle", "+cache", "powerinfer2"])
    ax.set_ylabel(schema.DECODE_LABEL)
    ax.set_title("Ablation ladder: each pi2 policy adds one technique\n"
                 + ", ".join(sorted({k[0] for k in cases})), fontsize=10)  # fmt: skip
    ax.set_ylim(bottom=0)
    ax.grid(axis="y", alpha=0.3)
    ax.legend(fontsize=7)
    return Plot("ablation", "Ablation ladder", f"{schema.DECODE_LABEL} of pi2-engine with each technique "
                "switched on in turn (policies dense, bundle, cache, powerinfer2).", *_save(fig))  # fmt: skip


def plot_quality(runs: Sequence[dict]):
    """The quality plot: each run that carries a quality block (pi2 bench --quality) as a point, its
    perplexity ratio to the dense model (with the 95% interval) against its decode speed."""
    points = [r for r in runs if r.get("quality") and schema.decode_rate(r) is not None]
    if not points:
        return None
    plt = _pyplot()
    colors = _engine_colors(runs)
    fig, ax = plt.subplots(figsize=(7, 4.2))
    seen = set()
    for run in sorted(points, key=lambda r: r["quality"]["ppl_ratio"]):
        q, engine = run["quality"], schema.engine_label(run)
        ci = q.get("ppl_ratio_ci")
        err = [[q["ppl_ratio"] - ci[0]], [ci[1] - q["ppl_ratio"]]] if ci else None
        ax.errorbar(q["ppl_ratio"], schema.decode_rate(run), xerr=err, fmt="o", capsize=3,
                    color=colors[engine], label=None if engine in seen else engine)  # fmt: skip
        seen.add(engine)
        ax.annotate(f"{schema.model_label(run)} / {schema.budget_label(run['memory']['budget_bytes'])}",
                    (q["ppl_ratio"], schema.decode_rate(run)), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("perplexity / dense perplexity (same tokens; 1 = no loss)")
    ax.set_ylabel(schema.DECODE_LABEL)
    ax.set_title("Quality beside speed", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return Plot("quality", "Quality beside speed",
                "Each sparse run's perplexity relative to the dense model on the workload's evaluation text "
                f"(95% bootstrap interval) against its {schema.DECODE_LABEL}.", *_save(fig))  # fmt: skip


def make_plots(runs: Sequence[dict]) -> list[Plot]:
    ok = [r for r in runs if r["status"] == schema.STATUS_OK]
    if not ok:
        return []
    plots = [plot_decode(ok), plot_tbt_cdf(ok), plot_ttft(ok), plot_memory(ok), plot_budget(ok),
             plot_ablation(ok), plot_quality(ok)]  # fmt: skip
    return [p for p in plots if p is not None]


# ---------------------------------------------------------------------------------------------------
# Tables.

# The columns (header and formatting) are declared once in pi2cli.results.columns; this picks the report's.
# The Runs tables are one per group (model, workload, budget, device, threads: the table's title), so
# every run is seen in its group with its status and reason, whatever the status.
RUN_COLUMNS = columns.select("run_id", "engine", "budget_enforced", "status_error", "n_turns", "decode_pooled", "tbt_ms",
                             "ttft_ms", "peak_rss_why", "cache_hit_rate", "io_share", "commit")  # fmt: skip
RUN_HEADERS = columns.headers(RUN_COLUMNS)


def run_rows(runs: Sequence[dict]) -> list[list[str]]:
    # decode: the same statistic as the Comparison table (schema.decode_rate)
    return [[col.cell(run) for col in RUN_COLUMNS] for run in runs]


def run_groups(runs: Sequence[dict]) -> list[tuple[str, list[list[str]]]]:
    """(group title, its runs' rows) per group in group order; in a group ok runs first, then by engine."""
    groups: dict[schema.GroupKey, list[dict]] = {}
    for run in runs:
        groups.setdefault(schema.group_key(run), []).append(run)
    ordered = sorted(groups, key=schema.group_sort_key)
    return [(schema.group_label(key), run_rows(sorted(groups[key], key=lambda r: (
        r["status"] != schema.STATUS_OK, schema.engine_label(r), r["created_at"])))) for key in ordered]  # fmt: skip


def _measurements(runs: Sequence[dict]) -> list[tuple[str, str]]:
    seen: dict[str, str] = {}
    for run in runs:
        seen.setdefault(schema.engine_label(run), run["measurement"] or "not stated")
    return sorted(seen.items())


def _engines(runs: Sequence[dict]) -> list[str]:
    out = {}
    for run in runs:
        e = run["engine"]
        bits = [e["version"] and f"version {e['version']}", e["commit"] and f"commit {e['commit'][:12]}",
                e["build_type"], e["build_flags"] and f"flags `{e['build_flags']}`"]  # fmt: skip
        out.setdefault(schema.engine_label(run), ", ".join(b for b in bits if b) or "no build facts recorded")
    return [f"{k}: {v}" for k, v in sorted(out.items())]


# ---------------------------------------------------------------------------------------------------
# The report.


def _markdown(
    title: str, generated: str, runs, comparison: Comparison, plots: list[Plot], synthetic: bool
) -> str:
    from tabulate import tabulate

    lines = [f"# {title}", "", f"Generated {generated} from {len(runs)} run(s).", ""]
    if synthetic:
        lines += ["**Synthetic models are marked [synthetic]: their weights are generated, so their speed says "
                  "nothing about output quality.**", ""]  # fmt: skip
    lines += [
        "## Runs",
        "",
        "One table per group: model · workload · memory budget (marked where not enforced) · device · "
        "threads.",
        "",
    ]
    for group, rows in run_groups(runs):
        lines += [f"### {group}", "", tabulate(rows, headers=RUN_HEADERS, tablefmt="github"), ""]
    if comparison.rows:
        lines += ["## Comparison", ""]
        for group, rows in group_tables(comparison, REPORT_COLUMNS):  # the status column holds the reasons
            lines += [f"### {group}", "", tabulate(rows, headers=REPORT_HEADERS, tablefmt="github"), ""]
        lines += [footnote(comparison), ""]
        lines += [f"- {note}" for note in comparison.notes] + ([""] if comparison.notes else [])
    for plot in plots:
        lines += [f"## {plot.title}", "", f"![{plot.title}](plots/{plot.name}.png)", "", plot.caption, ""]
    lines += ["## How it was measured", ""]
    lines += [f"- {engine}: {how}" for engine, how in _measurements(runs)]
    lines += ["", "## Engines", ""] + [f"- {line}" for line in _engines(runs)] + [""]
    return "\n".join(lines)


def _html(
    title: str, generated: str, runs, comparison: Comparison, plots: list[Plot], synthetic: bool
) -> str:
    import jinja2

    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(HTML_TEMPLATE)
    return template.render(
        title=title,
        generated=generated,
        n_runs=len(runs),
        synthetic=synthetic,
        run_headers=RUN_HEADERS,
        run_groups=run_groups(runs),
        compare_headers=REPORT_HEADERS,
        compare_groups=group_tables(comparison, REPORT_COLUMNS),
        compare_note=footnote(comparison) if comparison.rows else "",
        notes=comparison.notes,
        plots=plots,
        measurements=_measurements(runs),
        engines=_engines(runs),
    )


def write_report(
    runs: Sequence[dict],
    out_dir: str | os.PathLike,
    *,
    title: str = "pi2 benchmark report",
    baseline: str | None = None,
    resamples: int | None = None,
    seed: int | None = None,
) -> ReportFiles:
    """Write report.md, plots/*.png and index.html into out_dir; returns their paths and the plots."""
    runs = list(runs)
    if not runs:
        raise ValueError("no runs to report")
    for run in runs:
        if not run.get("summary"):
            schema.summarize(run)
    opts = {k: v for k, v in {"resamples": resamples, "seed": seed}.items() if v is not None}
    comparison = compare_runs(runs, baseline=baseline, **opts)
    plots = make_plots(runs)
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    synthetic = any(r["model"]["synthetic"] for r in runs)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        (tmp / "plots").mkdir()
        for plot in plots:
            (tmp / "plots" / f"{plot.name}.png").write_bytes(plot.png)
        (tmp / "report.md").write_text(_markdown(title, generated, runs, comparison, plots, synthetic))
        (tmp / "index.html").write_text(_html(title, generated, runs, comparison, plots, synthetic))
        out.mkdir(exist_ok=True)
        old_plots = out / "plots"
        if old_plots.is_symlink():  # moving it would move where it points to no more than its name: refuse
            raise OSError(errno.ELOOP, "is a symbolic link (pi2 never writes through a link)", str(old_plots))
        if old_plots.exists():
            trash = tmp / "old-plots"
            os.replace(old_plots, trash)
        os.replace(tmp / "plots", old_plots)
        safe_write.commit(tmp / "report.md", out / "report.md")  # never over a link or device planted there
        # last: its presence means the report is whole
        safe_write.commit(tmp / "index.html", out / "index.html")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return ReportFiles(out / "report.md", out / "index.html", out / "plots", plots)
