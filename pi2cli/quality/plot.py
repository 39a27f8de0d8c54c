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
