"""Dense pi2-engine vs llama.cpp on the same model: prefill and decode tokens/s, as ratios from one run.

    .venv/bin/python benchmarks/dense_vs_llamacpp.py [--gguf M.gguf] [--threads 2] [-p 64] [-n 32] [-r 3]

llama.cpp's side is llama-bench (pp<P> and tg<N>, same threads, its default flash attention).
pi2-engine's side runs `generate` on the .pi2 converted from the same GGUF, with a P-token prompt of
random ids (as llama-bench uses) and N generated tokens (--ignore-eos). The two alternate, one
repetition each at a time, -r times, so a slow spell of a shared machine hits both; the rates are
medians over the repetitions, and the ratio is the median of the per-repetition ratios.
Targets (issue 3): decode >= 0.9x and prefill >= 0.8x llama.cpp. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np

from pi2cli.engines.pi2.driver import run_generate
from pi2cli.models.convert import convert_gguf
from pi2cli.models.testmodels import smollm2_gguf
from pi2cli.paths import cache_dir


def llama_bench(bindir: Path, gguf: Path, threads: int, p: int, n: int) -> dict:
    cmd = [str(bindir / "llama-bench"), "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads),
           "-r", "1", "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(done.stdout)
    prefill = next(r for r in rows if r["n_prompt"] == p and r["n_gen"] == 0)
    decode = next(r for r in rows if r["n_gen"] == n and r["n_prompt"] == 0)
    return {
        "prefill_tps": prefill["avg_ts"],
        "decode_tps": decode["avg_ts"],
        "build": rows[0].get("build_commit"),
    }


def pi2_run(model: Path, threads: int, p: int, n: int, ids: list[int]) -> dict:
    run = run_generate(
        model, n_predict=n, ignore_eos=True, threads=threads, more=["--tokens", ",".join(map(str, ids))]
    )
    if run.error is not None:
        sys.exit(f"dense_vs_llamacpp: pi2-engine failed: {run.error}")
    turn = run.events["turn"]
    return {"prefill_tps": turn["prefill_tps"], "decode_tps": turn["decode_tps"]}


def alternate(
    model: Path, gguf: Path, bindir: Path, threads: int, p: int, n: int, reps: int, n_vocab: int
) -> dict:
    """pi2 and llama.cpp one repetition each, in turn; medians and the median per-repetition ratio."""
    rng = np.random.default_rng(0)
    runs: dict[str, list[dict]] = {"pi2": [], "llama.cpp": []}
    for _ in range(reps):
        ids = [int(t) for t in rng.integers(0, n_vocab, size=p)]
        runs["pi2"].append(pi2_run(model, threads, p, n, ids))
        runs["llama.cpp"].append(llama_bench(bindir, gguf, threads, p, n))
    keys = ("prefill_tps", "decode_tps")
    out = {name: {k: statistics.median(r[k] for r in rs) for k in keys} for name, rs in runs.items()}
    out["llama.cpp"]["build"] = runs["llama.cpp"][0]["build"]
    out["ratio"] = {
        k: statistics.median(a[k] / b[k] for a, b in zip(runs["pi2"], runs["llama.cpp"], strict=True))
        for k in keys
    }
    out["runs"] = runs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="GGUF model (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--pi2", type=Path, default=None,
                    help="the .pi2 of the same weights (default: converted from --gguf into the cache)")  # fmt: skip
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-p", type=int, default=64, help="prompt tokens for the prefill rate")
    ap.add_argument("-n", type=int, default=32, help="generated tokens for the decode rate")
    ap.add_argument("-r", type=int, default=5, help="repetitions per engine, alternating")
    ap.add_argument("--llamacpp-bin", type=Path, default=os.environ.get("PI2_LLAMACPP_BIN_DIR"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.llamacpp_bin is None:
        from pi2cli.builds.baselines.llamacpp_build import ensure_built

        args.llamacpp_bin = ensure_built("host")
    gguf = args.gguf or smollm2_gguf()
    model = args.pi2 or cache_dir() / "models" / (gguf.stem + ".pi2")
    if args.pi2 is None and (not model.exists() or model.stat().st_mtime < gguf.stat().st_mtime):
        convert_gguf(gguf, model)
    from pi2cli.models.pi2file import Pi2File

    n_vocab = Pi2File(model, verify=False).header.n_vocab
    both = alternate(model, gguf, args.llamacpp_bin, args.threads, args.p, args.n, args.r, n_vocab)
    ours, theirs, ratio = both["pi2"], both["llama.cpp"], both["ratio"]
    result = {"model": gguf.name, "threads": args.threads, "p": args.p, "n": args.n, "reps": args.r,
              "pi2": ours, "llama.cpp": theirs, "ratio": ratio, "runs": both["runs"]}  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{gguf.name}, {args.threads} threads, pp{args.p} / tg{args.n}, {args.r} alternating reps (medians)"
    )
    print(f"{'':10} {'pi2-engine':>12} {'llama.cpp':>12} {'ratio':>8} {'target':>8}")
    for key, name, target in (("prefill_tps", "prefill", 0.8), ("decode_tps", "decode", 0.9)):
        flag = "ok" if ratio[key] >= target else "BELOW"
        print(f"{name:10} {ours[key]:10.1f}/s {theirs[key]:10.1f}/s {ratio[key]:7.2f}x {target:5.1f}x {flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
