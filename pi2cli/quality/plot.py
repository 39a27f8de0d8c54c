"""The report's quality plot: each run that carries a quality block (pi2 bench --quality) as a point,
its perplexity ratio to the dense model (with the 95% interval) against its decode speed."""

from __future__ import annotations

from collections.abc import Sequence

from pi2cli.results import schema


def plot_quality(runs: Sequence[dict]):
    from pi2cli.results.report import Plot, _engine_colors, _pyplot, _save

    points = [r for r in runs if r.get("quality") and r["summary"]["avg_ts"] is not None]
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
        ax.errorbar(q["ppl_ratio"], run["summary"]["avg_ts"], xerr=err, fmt="o", capsize=3,
                    color=colors[engine], label=None if engine in seen else engine)  # fmt: skip
        seen.add(engine)
        ax.annotate(f"{schema.model_label(run)} / {schema.budget_label(run['memory']['budget_bytes'])}",
                    (q["ppl_ratio"], run["summary"]["avg_ts"]), fontsize=7, xytext=(4, 4),
                    textcoords="offset points")  # fmt: skip
    ax.axvline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xlabel("perplexity / dense perplexity (same tokens; 1 = no loss)")
    ax.set_ylabel("decode tokens/s")
    ax.set_title("Quality beside speed", fontsize=10)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    return Plot("quality", "Quality beside speed",
                "Each sparse run's perplexity relative to the dense model on the workload's evaluation text "
                "(95% bootstrap interval) against its decode tokens per second.", *_save(fig))  # fmt: skip


def plot_sparsity_curve(table: dict) -> bytes:
    """benchmarks/quality.py's table as one figure: perplexity ratio (95% interval) and decode tok/s under
    the budget against the CATS sparsity."""
    from pi2cli.results.report import _pyplot, _save

    rows = [(label, row) for label, row in table["rows"].items() if label.endswith("%")]
    xs = [float(label.rstrip("%")) for label, _ in rows]
    q = [row["quality"] for _, row in rows]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    lo = [x["ppl_ratio"] - (x["ppl_ratio_ci"] or [x["ppl_ratio"]] * 2)[0] for x in q]
    hi = [(x["ppl_ratio_ci"] or [x["ppl_ratio"]] * 2)[1] - x["ppl_ratio"] for x in q]
    ax.errorbar(xs, [x["ppl_ratio"] for x in q], yerr=[lo, hi], fmt="o-", capsize=3, color="tab:red",
                label="perplexity / dense (95% interval)")  # fmt: skip
    ax.set_xlabel("CATS sparsity target, % of FFN activations")
    ax.set_ylabel("perplexity ratio", color="tab:red")
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    speed = [table["speed"].get(label, {}).get("budget", {}).get("decode_tps") for label, _ in rows]
    if any(isinstance(s, int | float) for s in speed):
        ax2 = ax.twinx()
        ax2.plot(xs, speed, "s--", color="tab:blue", label="decode tok/s under the budget")
        ax2.set_ylabel(f"decode tok/s, budget {table['budget_bytes'] / 2**20:.0f} MiB", color="tab:blue")
        ax2.set_ylim(bottom=0)
    ax.set_title(f"{table['model']}: quality and speed against sparsity", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="upper left")
    return _save(fig)[0]
