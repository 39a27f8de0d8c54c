"""The planner's two validation tables (pi2cli/plan/predict.py).

1. Predicted vs measured HERE for every point of the sweeps (memory-sweep, offload-sweep: their JSON
   in the report directory, run first when missing), predicted from this machine's profile measured
   in the same run (pi2-probe: memory bandwidth, random-read curve over the model file) and the model
   file's own facts. Target: median |error| <= 10%.
2. Predicted vs the paper's OnePlus 12 figures for TurboSparse-Mixtral-47B (shipped profile
   pi2cli/plan/profiles/oneplus-12.toml, registry shapes, no model file): 2.13 tok/s at 7 GB, 11.68 at 19 GB,
   linear in between. Nothing is fitted to them; the error is reported as it comes.
"""

from __future__ import annotations

import json
from pathlib import Path

from common import Ctx, GiB, machine_profile, median, save, table

from pi2cli.errors import Pi2Error
from pi2cli.plan.predict import device_from_probe, facts_for, facts_from_registry, load_device, predict

TITLE = "planner validation: predicted vs measured here, predicted vs the paper's OnePlus 12"


def _sweep(ctx: Ctx, name: str, module) -> dict | None:
    """The sweep's result in the report directory, run now when missing; None (said) when its model is
    not in the store."""
    path = ctx.out / f"{name}.json"
    if not path.is_file():
        ctx.say(f"planner: {name} has no result in {ctx.out} yet: running it")
        try:
            module.run(ctx)
        except Pi2Error as exc:
            ctx.say(f"planner: skipping {name}: {exc}")
            return None
    return json.loads(path.read_text())


def _memory_efficiency(ctx: Ctx) -> tuple[float, str]:
    """The one constant fitted on this machine: the share of the probe's read bandwidth a decode step
    achieves, from ONE in-memory run of the 7B shape (no budget: no storage time at all) = predicted
    memory time / measured time. No sweep point takes part in it."""
    from common import model_dir, pi2

    try:
        model = model_dir(ctx, "turbosparse-mistral-7b")
    except Pi2Error as exc:
        return 1.0, f"not fitted ({exc})"
    run = pi2(ctx, model, "powerinfer2", None)
    measured = run.get("decode_tps")
    if not measured:
        return 1.0, "not fitted (the in-memory run failed)"
    device = device_from_probe(machine_profile(ctx, model / "model.pi2"), "measured here (pi2-probe)")
    device.threads = ctx.threads
    m, pred_bytes = facts_for(str(model / "model.pi2"))
    pr = predict(m, device, 64 * GiB, pred_bytes_per_block=pred_bytes)
    eff = min(1.0, pr["tok_s"] and measured / pr["tok_s"])
    return eff, (f"memory-side efficiency {eff:.2f} = measured in-memory {measured:.2f} tok/s / predicted "
                 f"{pr['tok_s']:.2f} at the probe's bandwidth (7B shape, one run, no sweep point)")  # fmt: skip


def run(ctx: Ctx) -> dict:
    import memory_sweep
    import offload_sweep

    rows, errors = [], []
    eff, eff_note = _memory_efficiency(ctx)
    for name, module in (("memory-sweep", memory_sweep), ("offload-sweep", offload_sweep)):
        data = _sweep(ctx, name, module)
        if data is None:
            continue

        model = Path(data["model"])
        device = device_from_probe(machine_profile(ctx, model / "model.pi2"), "measured here (pi2-probe)")
        device.threads = ctx.threads
        device.membw_bytes_per_s *= eff
        m, pred_bytes = facts_for(str(model / "model.pi2"))
        for p in data["points"]:
            measured = p["pi2"].get("decode_tps")
            pr = predict(m, device, p["budget_bytes"], pred_bytes_per_block=pred_bytes)
            err = (pr["tok_s"] - measured) / measured if measured else None
            if err is not None:
                errors.append(abs(err))
            rows.append([name, f"{p['budget_bytes'] / GiB:.2f}", f"{pr['tok_s']:.3f}",
                         "-" if measured is None else f"{measured:.3f}", "-" if err is None else f"{100 * err:+.0f}%",
                         f"{pr['hit_rate']:.2f}", "-" if p["pi2"].get("hit_rate") is None else f"{p['pi2']['hit_rate']:.2f}"])  # fmt: skip
    med = median(errors)
    phone = load_device("oneplus-12")
    m47 = facts_from_registry("turbosparse-mixtral-47b")
    paper_rows, paper_err = [], []
    for gb in (7, 11, 15, 19):
        pr = predict(m47, phone, gb * GiB)
        paper = 2.13 + (11.68 - 2.13) * (gb - 7) / 12
        e = (pr["tok_s"] - paper) / paper
        paper_err.append(abs(e))
        paper_rows.append([gb, f"{pr['tok_s']:.2f}", f"{paper:.2f}" + ("" if gb in (7, 19) else " (linear)"),
                           f"{100 * e:+.0f}%", f"{pr['memory_ms']:.0f}", f"{pr['storage_ms']:.0f}"])  # fmt: skip
    h1 = [
        "sweep",
        "budget GiB",
        "predicted tok/s",
        "measured tok/s",
        "error",
        "predicted hit",
        "measured hit",
    ]
    h2 = ["budget GB", "predicted tok/s", "paper tok/s", "error", "memory ms", "storage ms"]
    holds = bool(med is not None and med <= 0.10)
    verdict = (f"median |error| here {100 * med:.0f}% (target <= 10%): {'holds' if holds else 'does NOT hold'}; "
               if med is not None else "no measured points; ") + f"vs the paper: median |error| {100 * median(paper_err):.0f}%"  # fmt: skip
    result = {"title": TITLE, "here": {"headers": h1, "rows": rows, "median_abs_error": med, "fitted": eff_note},
              "paper": {"headers": h2, "rows": paper_rows, "median_abs_error": median(paper_err),
                        "profile": phone.source, "fitted": "nothing (one assumed constant: cpu_read_efficiency 0.5)"},
              "expect": "median |error| <= 10% on this machine", "holds": holds, "verdict": verdict}  # fmt: skip
    save(ctx, "planner", result)
    ctx.say(TITLE + f"\nfitted here: {eff_note}\n" + table(h1, rows) + "\n\nthe paper's phone (nothing fitted):\n"
            + table(h2, paper_rows) + f"\n{verdict}")  # fmt: skip
    return result
