"""Quality beside speed on real weights: SmolLM2-135M-Instruct (Q4_1 GGUF, tests/conftest.py's model)
made sparse by CATS at several sparsities, each scored against the dense model and timed.

    .venv/bin/python benchmarks/quality.py [--out-dir build/quality] [--budget 128M] [--reps 3]

Per sparsity S (0, 30, 50, 70%): `pi2 convert --sparsify cats --sparsity S` (bundles Q8_0, thresholds
from the calibration part of multi-turn), then
  - quality (pi2cli.quality.runner): KL(dense || sparse), top-1 agreement and perplexity over the
    evaluation part of multi-turn, 8 chunks of 256 tokens, llama-perplexity's protocol, batch 1, against
    the dense .pi2 converted losslessly from the GGUF (so the S = 0 row shows what the bundles' Q8_0
    copy costs by itself); in memory: a budget changes no float (tests/test_sparse_engine.py);
  - speed: `pi2-engine generate` (powerinfer2, 32 prompt tokens of the same text, 48 generated greedily,
    EOS ignored, 2 threads) in memory and under --budget in a memory cgroup entered after the file was
    evicted from the page cache: decode tok/s, storage bytes read per token, peak RSS, active fraction.
    Runs alternate (every configuration once, then again), medians over --reps.
Also the dense model's perplexity from llama.cpp's llama-perplexity on the same text file, -c 256,
--chunks 8 (its own tokenizer; the token counts are checked equal), and one S = 0 row with the
source's Q4_1 bundles (their down columns re-quantized along n_embd). Writes quality_smollm2.json and
.md under results/benchmarks. Not a test.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from pi2cli.engines.llamacpp.server import default_bin_dir
from pi2cli.engines.pi2.driver import engine_binary, parse_events
from pi2cli.hw.cgroup import run_budgeted
from pi2cli.models.convert import convert_gguf
from pi2cli.models.testmodels import smollm2_gguf
from pi2cli.quality import text
from pi2cli.quality.cats import convert_cats
from pi2cli.quality.plot import plot_sparsity_curve
from pi2cli.quality.runner import QualityConfig, measure
from pi2cli.units import parse_size

SPARSITIES = [0.0, 0.3, 0.5, 0.7]
CTX, CHUNKS, THREADS, N_PROMPT, N_GEN = 256, 8, 2, 32, 48
MiB = 2**20


def llama_perplexity(gguf: Path, text_file: Path) -> dict:
    """llama-perplexity from the pinned llama.cpp build (the tool is built into it on first use)."""
    bindir = default_bin_dir()
    tool = bindir / "llama-perplexity"
    if not tool.is_file():  # the cached build tree has every library: one more target is a small link
        subprocess.run(["cmake", "--build", str(bindir.parent), "--target", "llama-perplexity", "-j", "2"],
                       check=True, capture_output=True)  # fmt: skip
    done = subprocess.run([str(tool), "-m", str(gguf), "-f", str(text_file), "-c", str(CTX), "--chunks",
                           str(CHUNKS), "-t", str(THREADS), "-b", str(CTX)], capture_output=True, text=True)  # fmt: skip
    m = re.search(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)", done.stdout + done.stderr)
    if done.returncode != 0 or not m:
        sys.exit(f"llama-perplexity failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}")
    n_tok = re.search(r"tokenizing the input .*?\n.*?(\d+) tokens", done.stderr, re.S)
    return {"ppl": float(m.group(1)), "ppl_stderr": float(m.group(2)), "tool": str(tool),
            "tokens": int(n_tok.group(1)) if n_tok else None}  # fmt: skip


def llama_token_count(gguf: Path, text_file: Path) -> int:
    tool = default_bin_dir() / "llama-tokenize"
    done = subprocess.run([str(tool), "-m", str(gguf), "-f", str(text_file), "--ids", "--log-disable",
                           "--no-parse-special"], capture_output=True, text=True, check=True)  # fmt: skip
    return len(json.loads(done.stdout.strip().splitlines()[-1]))


def speed(model: Path, prompt: list[int], policy: str, budget: int | None) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [str(engine_binary()), "generate", "-m", str(model), "--tokens", ",".join(map(str, prompt)),
               "-n", str(N_GEN), "--temperature", "0", "--ignore-eos", "--threads", str(THREADS), "--policy",
               policy, "--events", str(events)] + (["--memory-budget", str(budget)] if budget else [])  # fmt: skip
        done = run_budgeted(cmd, budget, evict=[model] if budget else [], timeout=3600)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        ev = parse_events(events.read_text().splitlines())
    s, turn = ev["summary"], ev["turn"]
    after = ev["token"][1:]  # the reads of the forward passes that made tokens 2..N (decode only)
    return {
        "decode_tps": turn["decode_tps"],
        "peak_rss_bytes": s["peak_rss_bytes"],
        "storage_bytes_per_token": statistics.mean(e.get("bytes_read", 0) for e in after) if after else None,
        "active_fraction": s.get("active_fraction"),
        "hit_rate": s.get("hit_rate"),
        "budget_enforced_by": done.budget.get("how") if budget else None,
    }


def median_of(runs: list[dict]) -> dict:
    ok = [r for r in runs if "error" in r] or runs
    if any("error" in r for r in runs):
        return ok[0]
    out = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r[k], int | float) and not isinstance(r[k], bool)]
        out[k] = statistics.median(vals) if vals else runs[0][k]
    out["runs"] = len(runs)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out-dir", type=Path, default=Path("build/quality"))
    ap.add_argument("--budget", default="128M")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--results", type=Path, default=Path("results/benchmarks"))
    ap.add_argument("--render", action="store_true", help="Only rewrite the .md and .png from the JSON.")
    args = ap.parse_args()
    if args.render:
        out = json.loads((args.results / "quality_smollm2.json").read_text())
        (args.results / "quality_smollm2.md").write_text(markdown(out))
        (args.results / "quality_smollm2.png").write_bytes(plot_sparsity_curve(out))
        return
    budget = parse_size(args.budget)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    gguf = smollm2_gguf()
    dense = args.out_dir / "smollm2.pi2"
    if not dense.exists():
        convert_gguf(gguf, dense)
    models = {}
    for s in SPARSITIES:
        models[f"{s:.0%}"] = args.out_dir / f"smollm2-cats{int(s * 100)}.pi2"
        if not models[f"{s:.0%}"].exists():
            convert_cats(dense, models[f"{s:.0%}"], s)
    models["0% (Q4_1 bundles)"] = args.out_dir / "smollm2-cats0-q4_1.pi2"
    if not models["0% (Q4_1 bundles)"].exists():
        convert_cats(dense, models["0% (Q4_1 bundles)"], 0.0, bundle_type="source")

    eval_text = text.workload_text("multi-turn", "evaluation")
    text_file = args.out_dir / "multi-turn-evaluation.txt"
    text_file.write_text(eval_text)
    tok = text.tokenize(dense, eval_text)
    llama = llama_perplexity(gguf, text_file)
    llama["tokens_llama_tokenize"] = llama_token_count(gguf, text_file)
    llama["tokens_pi2"] = int(len(tok.ids))
    print(f"llama-perplexity: PPL {llama['ppl']:.4f} +/- {llama['ppl_stderr']:.4f}; tokens llama "
          f"{llama['tokens_llama_tokenize']} pi2 {llama['tokens_pi2']}", flush=True)  # fmt: skip

    rows = {}
    for label, model in models.items():
        q = measure(QualityConfig(model, policy="powerinfer2", reference=dense, ctx=CTX, chunks=CHUNKS,
                                  threads=THREADS))  # fmt: skip
        rows[label] = {"model": model.name, "bytes": model.stat().st_size, "quality": q}
        print(f"{label}: KL {q['kl_nats']:.4f} top-1 {q['top1_agreement']:.3f} ppl {q['ppl_sparse']:.3f} "
              f"(dense {q['ppl_dense']:.3f}) ratio {q['ppl_ratio']:.4f}", flush=True)  # fmt: skip

    prompt = [int(t) for t in text.chunks(tok, CTX, 1)[0][:N_PROMPT]]
    configs = [("dense", dense, "dense")] + [(label, m, "powerinfer2") for label, m in models.items()
                                              if "Q4_1" not in label]  # fmt: skip
    timings: dict = {(c[0], b): [] for c in configs for b in (None, budget)}
    for rep in range(args.reps):  # alternate: every configuration once per round
        for label, model, policy in configs:
            for b in (None, budget):
                r = speed(model, prompt, policy, b)
                timings[(label, b)].append(r)
                print(f"rep {rep} {label} {'budget' if b else 'memory'}: {r}", flush=True)
    speeds = {}
    for (label, b), runs in timings.items():
        speeds.setdefault(label, {})["budget" if b else "memory"] = median_of(runs)

    out = {
        "what": "SmolLM2-135M-Instruct (real weights, Q4_1 GGUF) made sparse by CATS; quality vs the dense "
        "model on multi-turn's evaluation text, speed in memory and under a budget",
        "model": gguf.name, "dense_pi2_bytes": dense.stat().st_size, "budget_bytes": budget,
        "ctx": CTX, "chunks": CHUNKS, "threads": THREADS, "n_prompt": N_PROMPT, "n_gen": N_GEN,
        "llama_perplexity": llama, "rows": rows, "speed": speeds,
    }  # fmt: skip
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "quality_smollm2.json").write_text(json.dumps(out, indent=1) + "\n")
    (args.results / "quality_smollm2.md").write_text(markdown(out))
    (args.results / "quality_smollm2.png").write_bytes(plot_sparsity_curve(out))
    print(markdown(out))


def markdown(out: dict) -> str:
    def ci(q, k, fmt):
        c = q.get(f"{k}_ci")
        return f" [{format(c[0], fmt)}, {format(c[1], fmt)}]" if c else ""

    lines = [
        "# Quality beside speed: SmolLM2-135M with CATS sparsity (real weights)",
        "",
        f"Quality: {out['chunks']} chunks x {out['ctx']} tokens of multi-turn's evaluation text (second halves "
        "scored), batch 1, powerinfer2, against the dense .pi2 (lossless from the GGUF); 95% bootstrap intervals. "
        f"Speed: {out['n_gen']} greedy tokens after {out['n_prompt']} prompt tokens, {out['threads']} threads, "
        f"medians of alternating runs; budget {out['budget_bytes'] / MiB:.0f} MiB (below every file here).",
        "",
        "| sparsity | file MiB | KL nats/token | top-1 agreement | ppl | ppl ratio | active | tok/s in memory "
        "| tok/s under budget | MiB read/token | peak RSS MiB |",
        "|---|---:|---|---|---:|---|---:|---:|---:|---:|---:|",
    ]
    for label, row in out["rows"].items():
        q = row["quality"]
        sp = out["speed"].get(label, {})
        mem, bud = sp.get("memory", {}), sp.get("budget", {})

        def num(d, k, scale=1.0, fmt=".1f"):
            v = d.get(k)
            return (
                format(v / scale, fmt)
                if isinstance(v, int | float)
                else (d.get("error", "-")[:40] if d else "-")
            )

        lines.append(
            f"| {label} | {row['bytes'] / MiB:.0f} | {q['kl_nats']:.4f}{ci(q, 'kl_nats', '.4f')} | "
            f"{q['top1_agreement']:.3f}{ci(q, 'top1_agreement', '.3f')} | {q['ppl_sparse']:.3f} | "
            f"{q['ppl_ratio']:.4f}{ci(q, 'ppl_ratio', '.4f')} | {num(bud, 'active_fraction', fmt='.2f')} | "
            f"{num(mem, 'decode_tps')} | {num(bud, 'decode_tps', fmt='.2f')} | "
            f"{num(bud, 'storage_bytes_per_token', MiB, '.2f')} | {num(bud, 'peak_rss_bytes', MiB, '.0f')} |"
        )  # fmt: skip
    d = out["speed"].get("dense", {})
    dm, db = d.get("memory", {}), d.get("budget", {})
    q0 = next(iter(out["rows"].values()))["quality"]
    lp = out["llama_perplexity"]
    lines += [
        "",
        f"Dense (pi2-engine --policy dense on the lossless {out['dense_pi2_bytes'] / MiB:.0f} MiB .pi2, same text): "
        f"ppl {q0['ppl_dense']:.3f}; decode {dm.get('decode_tps', 0):.1f} tok/s in memory, "
        f"{db.get('decode_tps', 0):.2f} under the budget (it pages the file through mmap; its token events "
        f"carry no read counts; peak RSS {db.get('peak_rss_bytes', 0) / MiB:.0f} MiB).",
        f"llama.cpp llama-perplexity on the GGUF, same text file, -c {out['ctx']} --chunks {out['chunks']}: "
        f"PPL {lp['ppl']:.4f} +/- {lp['ppl_stderr']:.4f} (pi2 dense {q0['ppl_dense']:.4f}: "
        f"{q0['ppl_dense'] / lp['ppl'] - 1:+.2%}; pi2 CATS 0% {out['rows']['0%']['quality']['ppl_sparse']:.4f}: "
        f"{out['rows']['0%']['quality']['ppl_sparse'] / lp['ppl'] - 1:+.2%}); tokens: llama-tokenize "
        f"{lp['tokens_llama_tokenize']}, pi2 {lp['tokens_pi2']}.",
        "",
        "![quality and speed against sparsity](quality_smollm2.png)",
        "",
    ]  # fmt: skip
    return "\n".join(lines)


if __name__ == "__main__":
    main()
