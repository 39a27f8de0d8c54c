"""Fig. 14, the ablation ladder: dense -> bundle -> cache -> +pipeline (powerinfer2) -> +plan, at 50%
of the FFN off memory, TurboSparse-Mistral-7B shape.

Paper (Bamboo-7B, 50% offload, tok/s): naive 0.40, +bundling 1.09, +neuron cache 4.18, +pipeline 9.60,
+CPU/NPU split 11.07 (no NPU here: the last rung is the planner's settings instead). Expected shape: a
monotone ladder (each rung at least as fast as the one before, within 5% noise).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from common import Ctx, GiB, fmt_tps, machine_profile, model_dir, monotone, offload_budget, pi2, save, table

from pi2cli.plan.facts import model_facts
from pi2cli.plan.plan import make_plan
from pi2cli.plan.profile import write_json_atomic

TITLE = "ablation ladder (Fig. 14): decode tok/s at 50% of the FFN off memory"
PAPER = {"rungs": ["naive", "+bundling", "+neuron cache", "+pipeline", "+CPU/NPU"], "tok_s": [0.40, 1.09, 4.18, 9.60, 11.07],
         "model": "Bamboo-7B, OnePlus 12"}  # fmt: skip
RUNGS = [("dense", "dense (naive mmap)"), ("bundle", "+bundles"), ("cache", "+neuron cache"),
         ("powerinfer2", "+pipeline (powerinfer2)"), ("plan", "+plan (pi2 plan)")]  # fmt: skip


def run(ctx: Ctx) -> dict:
    model = model_dir(ctx, "turbosparse-mistral-7b")
    b = offload_budget(ctx, model, 0.5)
    runs = []
    for policy, label in RUNGS:
        ctx.say(f"ablation: {label} at {b / GiB:.2f} GiB")
        if policy == "plan":
            with tempfile.TemporaryDirectory() as tmp:
                plan = Path(tmp) / "plan.json"
                prof = machine_profile(ctx, model / "model.pi2")
                write_json_atomic(
                    plan, make_plan(model_facts(model / "model.pi2"), prof, b, threads=ctx.threads).to_json()
                )
                runs.append((label, pi2(ctx, model, "powerinfer2", b, ("--plan", str(plan)))))
        else:
            runs.append((label, pi2(ctx, model, policy, b)))
    rates = [r.get("decode_tps") for _, r in runs]
    holds = bool(monotone(rates, slack=0.05))
    # each rung's seeds beside its median: the text, and with it the reads a token, follows the seed
    seeds = lambda r: " ".join(f"{x:.3f}" for x in r.get("decode_tps_per_seed") or [] if x is not None)  # noqa: E731
    rows = [[label, fmt_tps(r), seeds(r), f"{r.get('io_share') or 0:.2f}", f"{(r.get('storage_bytes_per_token') or 0) / 2**20:.1f}",
             f"{PAPER['rungs'][i]}: {PAPER['tok_s'][i]}"] for i, (label, r) in enumerate(runs)]  # fmt: skip
    headers = [
        "rung",
        "tok/s (median)",
        "per seed",
        "I/O share",
        "MiB read/token",
        "paper (Bamboo-7B, OnePlus 12)",
    ]
    expect = "a monotone ladder: every rung at least as fast as the one before (5% noise allowed)"
    verdict = "monotone: " + ("yes" if holds else "NO")

    def plot(ax):
        ax.bar(range(len(runs)), [r or 0 for r in rates])
        ax.set_xticks(range(len(runs)), [lab for lab, _ in runs], rotation=20, ha="right", fontsize=7)
        ax.set_ylabel("decode tok/s")

    result = {"title": TITLE, "budget_bytes": b, "runs": [{"rung": lab, **r} for lab, r in runs], "paper": PAPER,
              "expect": expect, "holds": holds, "verdict": verdict, "table": {"headers": headers, "rows": rows}}  # fmt: skip
    save(ctx, "ablation", result, plot)
    ctx.say(TITLE + "\n" + table(headers, rows) + f"\nexpected: {expect}\nhere: {verdict}")
    return result
