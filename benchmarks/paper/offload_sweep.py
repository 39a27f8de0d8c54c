"""The offload sweep: TurboSparse-Mistral-7B shape with 0, 25, 50 and 75% of its FFN off memory
(budget = fixed region + the rest of the FFN), pi2 vs llama.cpp in the same cgroup.

Paper (OnePlus 12): with 50% of the FFN on flash pi2 is 24.6x llama.cpp on average (27.8x max); in
memory 2.24x. Expected shape here: pi2's rate falls gently as more of the FFN is offloaded, llama.cpp's
collapses once the model no longer fits, so the ratio grows with the offloaded share.
"""

from __future__ import annotations

from common import (  # noqa: E501
    Ctx,
    GiB,
    curves_summary,
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

TITLE = "offload sweep: TurboSparse-Mistral-7B decode tok/s by share of the FFN off memory"
PAPER = {"offloaded_50pct_speedup_vs_llamacpp": 24.6, "in_memory_speedup_vs_llamacpp": 2.24}
SHARES_OFF = (0.0, 0.25, 0.5, 0.75)


def run(ctx: Ctx) -> dict:
    model = model_dir(ctx, "turbosparse-mistral-7b")
    profile = machine_profile(ctx, model / "model.pi2")
    points = []
    for off in SHARES_OFF:
        b = offload_budget(ctx, model, 1.0 - off)
        ctx.say(f"offload sweep: {int(off * 100)}% of the FFN off memory, budget {b / GiB:.2f} GiB")
        points.append({"offloaded": off, "budget_bytes": b, "pi2": pi2(ctx, model, "powerinfer2", b),
                       "llama.cpp": llama(ctx, model, b)})  # fmt: skip

    def ratio(p):
        a, b = (
            p["pi2"].get("decode_tps"),
            p["llama.cpp"].get("decode_tps") or p["llama.cpp"].get("decode_tps_below"),
        )
        return a / b if a and b else None

    ratios = [ratio(p) for p in points]
    pis = [p["pi2"].get("decode_tps") for p in points]
    grows = all(r is not None for r in ratios) and ratios[-1] > ratios[0]
    gentle = all(v is not None for v in pis) and pis[-1] > 0.2 * pis[0]
    rows = [[f"{int(p['offloaded'] * 100)}%", f"{p['budget_bytes'] / GiB:.2f}", fmt_tps(p["pi2"]), fmt_tps(p["llama.cpp"]),
             "-" if r is None else (">" if p["llama.cpp"].get("bounded") else "") + f"{r:.2f}x", kiops(p["pi2"])]
            for p, r in zip(points, ratios, strict=True)]  # fmt: skip
    headers = [
        "FFN off memory",
        "budget GiB",
        "pi2 tok/s",
        "llama.cpp tok/s",
        "pi2 / llama.cpp",
        "8 KiB reads/s before pi2",
    ]
    expect = (
        "the pi2/llama.cpp ratio grows with the offloaded share; pi2 keeps > 20% of its in-memory rate at 75%"
    )
    holds = bool(grows and gentle)
    verdict = f"ratio grows: {'yes' if grows else 'NO'}; pi2 degrades gently: {'yes' if gentle else 'NO'}"

    def plot(ax):
        xs = [100 * p["offloaded"] for p in points]
        ax.plot(xs, [p["pi2"].get("decode_tps") or 0 for p in points], "o-", label="pi2")
        ax.plot(xs, [p["llama.cpp"].get("decode_tps") or p["llama.cpp"].get("decode_tps_below") or 0 for p in points],
                "o-", label="llama.cpp")  # fmt: skip
        ax.set_xlabel("% of FFN off memory")
        ax.set_ylabel("decode tok/s")
        ax.set_yscale("log")
        ax.legend()

    result = {"title": TITLE, "points": points, "paper": PAPER, "expect": expect, "holds": holds, "verdict": verdict,
              "model": str(model), "curves": curves_summary(profile), "table": {"headers": headers, "rows": rows}}  # fmt: skip
    save(ctx, "offload-sweep", result, plot)
    ctx.say(TITLE + "\n" + table(headers, rows) + f"\nexpected: {expect}\nhere: {verdict}")
    return result
