"""In-memory decode and prefill: pi2 vs llama.cpp with the whole model resident (no budget), 7B shape.

Paper: 2.24x llama.cpp decode when the model fits in memory; prefill of a 7B INT4 model on the CPU
~8 tok/s (NPU ~770). Expected shape here: pi2 decode >= llama.cpp decode (it computes only the
predicted neurons), prefill within the same order of magnitude.
"""

from __future__ import annotations

from common import Ctx, facts, fmt_tps, llama, model_dir, pi2, save, table

TITLE = (
    "in memory: decode and prefill tok/s, pi2 vs llama.cpp (its best layout, --repack 1), 7B shape, no budget"
)
PAPER = {"decode_speedup_vs_llamacpp": 2.24, "prefill_cpu_tok_s": 8}
N_PROMPT = 64  # prompt tokens for prefill (both engines)


def run(ctx: Ctx) -> dict:
    import prefill_tbt  # benchmarks/prefill_tbt.py: imported here, once common has put benchmarks/ on the path

    model = model_dir(ctx, "turbosparse-mistral-7b")
    ctx.say("in memory: pi2 and llama.cpp")
    p = pi2(ctx, model, "powerinfer2", None)
    pf = prefill_tbt.run_pi2(
        model / "model.pi2", None, N_PROMPT, 2, ctx.threads, ctx.seeds[0], facts(model).n_vocab
    )
    ll = llama(ctx, model, None, n_prompt=N_PROMPT, n_gen=ctx.n_tokens)
    ratio = p.get("decode_tps") / ll["decode_tps"] if p.get("decode_tps") and ll.get("decode_tps") else None
    holds = bool(ratio is not None and ratio >= 1.0)
    rows = [["decode tok/s", fmt_tps(p), fmt_tps(ll), "-" if ratio is None else f"{ratio:.2f}x", "2.24x"],
            ["prefill tok/s", f"{pf.get('prefill_tps') or 0:.1f}", f"{ll.get('prefill_tps') or 0:.1f}",
             f"{pf['prefill_tps'] / ll['prefill_tps']:.2f}x" if pf.get("prefill_tps") and ll.get("prefill_tps") else "-",
             "CPU ~8 tok/s"]]  # fmt: skip
    headers = ["", "pi2", "llama.cpp", "pi2 / llama.cpp", "paper"]
    expect = "pi2 decode at least llama.cpp's in memory"
    verdict = "pi2 >= llama.cpp: " + ("yes" if holds else "NO")
    result = {"title": TITLE, "pi2": p, "pi2_prefill": pf, "llama.cpp": ll, "paper": PAPER, "expect": expect, "holds": holds,
              "verdict": verdict, "table": {"headers": headers, "rows": rows}}  # fmt: skip
    save(ctx, "in-memory", result)
    ctx.say(TITLE + "\n" + table(headers, rows) + f"\nexpected: {expect}\nhere: {verdict}")
    return result
