"""Fig. 10, the memory sweep: TurboSparse-Mixtral-47B decode at four memory budgets, pi2 vs LLM in a
Flash vs llama.cpp, every engine under the same memory cgroup (page cache counted).

Full size: the paper's budgets, 7, 11, 15 and 19 GB, on the 47B shape from the local store. --small:
a scaled-down 47B shape, budgets = fixed region + 10/30/50/70% of its FFN (the paper's 7..19 GB of a
~26 GB model keep 12..60% of the experts in memory). Expected shape: pi2's rate grows with the budget
(near-linear, as in the paper) and beats llama.cpp at every budget.
"""

from __future__ import annotations

from common import (  # noqa: E501
    Ctx,
    GiB,
    curves_summary,
    fixed_bytes,
    fmt_tps,
    kiops,
    llama,
    machine_profile,
    model_dir,
    offload_budget,
    pi2,
    save,
    table,
)

TITLE = "memory sweep (Fig. 10): TurboSparse-Mixtral-47B decode tok/s by memory budget"
PAPER = {"budgets_gb": [7, 11, 15, 19], "pi2_tok_s": [2.13, None, None, 11.68],
         "note": "OnePlus 12: 2.13 tok/s at 7 GB, 11.68 at 19 GB, linear in between; llama.cpp 0.5-0.6 and "
                 "LLM in a Flash 3.5-3.9 tok/s at 19 GB across tasks"}  # fmt: skip
FULL_BUDGETS_GB = (7, 11, 15, 19)
SMALL_SHARES = (0.1, 0.3, 0.5, 0.7)


def budgets(ctx: Ctx, model) -> list[int]:
    if ctx.small:
        return [offload_budget(ctx, model, s) for s in SMALL_SHARES]
    return [int(b * GiB) for b in FULL_BUDGETS_GB]


def run(ctx: Ctx) -> dict:
    model = model_dir(ctx, "turbosparse-mixtral-47b")
    profile = machine_profile(ctx, model / "model.pi2")
    points = []
    for b in budgets(ctx, model):
        ctx.say(f"memory sweep: budget {b / GiB:.2f} GiB")
        row = {"budget_bytes": b, "pi2": pi2(ctx, model, "powerinfer2", b), "llmflash": pi2(ctx, model, "llmflash", b),
               "llama.cpp": llama(ctx, model, b)}  # fmt: skip
        points.append(row)
    pi = [p["pi2"].get("decode_tps") for p in points]
    ll = [p["llama.cpp"].get("decode_tps") or p["llama.cpp"].get("decode_tps_below") for p in points]
    grows = all(a is not None for a in pi) and all(b > a for a, b in zip(pi, pi[1:], strict=False))
    beats = all(a is not None and b is not None and a > b for a, b in zip(pi, ll, strict=False))
    rss_ok = all((p["pi2"].get("peak_rss_bytes") or 0) < p["budget_bytes"] for p in points)
    paper_lin = [2.13 + (11.68 - 2.13) * (g - 7) / 12 for g in FULL_BUDGETS_GB]
    rows = [[f"{p['budget_bytes'] / GiB:.2f}", fmt_tps(p["pi2"]), fmt_tps(p["llmflash"]), fmt_tps(p["llama.cpp"]),
             f"{(p['pi2'].get('peak_rss_bytes') or 0) / GiB:.2f}", f"{p['pi2'].get('hit_rate') or 0:.3f}",
             f"{kiops(p['pi2'])} / {kiops(p['llmflash'])}",
             f"{FULL_BUDGETS_GB[i]} GB: {paper_lin[i]:.2f}"] for i, p in enumerate(points)]  # fmt: skip
    headers = ["budget GiB", "pi2 tok/s", "llmflash tok/s", "llama.cpp tok/s", "pi2 peak RSS GiB", "pi2 hit rate",
               "8 KiB reads/s before pi2 / llmflash", "paper pi2 (OnePlus 12, linear 2.13..11.68)"]  # fmt: skip
    expect = "pi2 grows with the budget and beats llama.cpp at every budget; pi2's peak RSS stays under each budget"
    holds = bool(grows and beats and rss_ok)
    verdict = (f"grows: {'yes' if grows else 'NO'}; beats llama.cpp at every budget: {'yes' if beats else 'NO'}; "
               f"RSS under budget: {'yes' if rss_ok else 'NO'}")  # fmt: skip

    def plot(ax):
        xs = [p["budget_bytes"] / GiB for p in points]
        for key in ("pi2", "llmflash", "llama.cpp"):
            ax.plot(
                xs,
                [p[key].get("decode_tps") or p[key].get("decode_tps_below") or 0 for p in points],
                "o-",
                label=key,
            )
        ax.set_xlabel("memory budget (GiB)")
        ax.set_ylabel("decode tok/s")
        ax.set_title("memory sweep (synthetic 47B shape)" + (" --small" if ctx.small else ""))
        ax.legend()

    result = {"title": TITLE, "points": points, "paper": PAPER, "expect": expect, "holds": holds, "verdict": verdict,
              "fixed_bytes_estimate": fixed_bytes(model, ctx.threads), "model": str(model),
              "curves": curves_summary(profile), "table": {"headers": headers, "rows": rows},
              "llama_bound": f"llama.cpp: {ctx.llama_tokens} tokens, at most {ctx.llama_timeout_s:.0f} s per run"}  # fmt: skip
    save(ctx, "memory-sweep", result, plot)
    ctx.say(
        TITLE
        + "\n"
        + table(headers, rows)
        + f"\nexpected: {expect}\nhere: {verdict}\n{result['llama_bound']}"
    )
    return result
