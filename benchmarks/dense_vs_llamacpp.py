"""Dense pi2-engine vs llama.cpp on the same model: prefill and decode tokens/s, as ratios from one run.

    .venv/bin/python benchmarks/dense_vs_llamacpp.py [--gguf M.gguf] [--threads 2] [-p 64] [-n 32] [-r 3]

llama.cpp's side is llama-bench (pp<P> and tg<N>, same threads, its default flash attention, the mean
of -r repetitions). pi2-engine's side runs `generate` -r times on the .pi2 converted from the same GGUF,
with a P-token prompt of random ids (as llama-bench uses) and N generated tokens (--ignore-eos), and
takes the median of its own prefill and decode rates. Both run back to back on this machine, so the
ratios come from the same conditions; run it on an idle machine for numbers worth quoting.
Targets (issue 3): decode >= 0.9x and prefill >= 0.8x llama.cpp. Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from pi2cli.convert import convert_gguf
from pi2cli.engines.pi2 import engine_binary, parse_events
from pi2cli.paths import cache_dir
from pi2cli.testmodels import smollm2_gguf


def llama_bench(bindir: Path, gguf: Path, threads: int, p: int, n: int, reps: int) -> dict:
    cmd = [str(bindir / "llama-bench"), "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads),
           "-r", str(reps), "-o", "json"]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, check=True)
    rows = json.loads(done.stdout)
    prefill = next(r for r in rows if r["n_prompt"] == p and r["n_gen"] == 0)
    decode = next(r for r in rows if r["n_gen"] == n and r["n_prompt"] == 0)
    return {
        "prefill_tps": prefill["avg_ts"],
        "decode_tps": decode["avg_ts"],
        "build": rows[0].get("build_commit"),
    }


def pi2_runs(model: Path, threads: int, p: int, n: int, reps: int, n_vocab: int) -> dict:
    rng = np.random.default_rng(0)
    prefill, decode = [], []
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        for _ in range(reps):
            ids = ",".join(str(int(t)) for t in rng.integers(0, n_vocab, size=p))
            cmd = [str(engine_binary()), "generate", "-m", str(model), "--tokens", ids, "-n", str(n),
                   "--ignore-eos", "--threads", str(threads), "--events", str(events)]  # fmt: skip
            subprocess.run(cmd, capture_output=True, check=True)
            turn = parse_events(events.read_text().splitlines())["turn"]
            prefill.append(turn["prefill_tps"])
            decode.append(turn["decode_tps"])
    return {"prefill_tps": statistics.median(prefill), "decode_tps": statistics.median(decode)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gguf", type=Path, default=None, help="GGUF model (default: SmolLM2-135M Q4_1)")
    ap.add_argument("--threads", "-t", type=int, default=os.cpu_count() or 1)
    ap.add_argument("-p", type=int, default=64, help="prompt tokens for the prefill rate")
    ap.add_argument("-n", type=int, default=32, help="generated tokens for the decode rate")
    ap.add_argument("-r", type=int, default=3, help="repetitions per engine")
    ap.add_argument("--llamacpp-bin", type=Path, default=os.environ.get("PI2_LLAMACPP_BIN_DIR"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.llamacpp_bin is None:
        from pi2cli.baselines.llamacpp_build import ensure_built

        args.llamacpp_bin = ensure_built("host")
    gguf = args.gguf or smollm2_gguf()
    model = cache_dir() / "models" / (gguf.stem + ".pi2")
    if not model.exists() or model.stat().st_mtime < gguf.stat().st_mtime:
        convert_gguf(gguf, model)
    from pi2cli.pi2file import Pi2File

    n_vocab = Pi2File(model, verify=False).header.n_vocab
    ours = pi2_runs(model, args.threads, args.p, args.n, args.r, n_vocab)
    theirs = llama_bench(args.llamacpp_bin, gguf, args.threads, args.p, args.n, args.r)
    ratio = {k: ours[k] / theirs[k] for k in ("prefill_tps", "decode_tps")}
    result = {"model": gguf.name, "threads": args.threads, "p": args.p, "n": args.n, "reps": args.r,
              "pi2": ours, "llama.cpp": theirs, "ratio": ratio}  # fmt: skip
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"{gguf.name}, {args.threads} threads, pp{args.p} / tg{args.n}, {args.r} reps each")
    print(f"{'':10} {'pi2-engine':>12} {'llama.cpp':>12} {'ratio':>8} {'target':>8}")
    for key, name, target in (("prefill_tps", "prefill", 0.8), ("decode_tps", "decode", 0.9)):
        flag = "ok" if ratio[key] >= target else "BELOW"
        print(f"{name:10} {ours[key]:10.1f}/s {theirs[key]:10.1f}/s {ratio[key]:7.2f}x {target:5.1f}x {flag}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
