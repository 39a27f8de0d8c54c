"""The quality benchmark's curve (benchmarks/quality.py): quality and speed against CATS sparsity. The
report's own quality plot (quality beside speed, per run) is results/report.py's plot_quality."""

from __future__ import annotations


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
