"""PowerInfer-2 decode from flash vs LLM in a Flash, dense mmap and llama.cpp, under one memory budget.

    .venv/bin/python benchmarks/sparse_decode.py --model-dir DIR [--budget auto|SIZE] [-n 32] [--threads 2]

DIR holds model.pi2 and its GGUF twin model.gguf, e.g. the TurboSparse-Mistral-7B-shaped synthetic model:
    pi2 models synth --like turbosparse-mistral-7b --no-dense-down --predictor-rank 32 --out DIR
(synthetic weights, labelled so; ~13 min of CPU here). Every run gets the same prompt, the same number of
generated tokens (greedy, EOS ignored), the same threads and the same budget, enforced the same way: a
memory cgroup (page cache counted) entered after the model files are evicted from the page cache.
The default budget holds half of the FFN: resident weights + 50% of the FFN (at its GGUF size) + 128 MiB.

Runs, all in one invocation so the ratios come from the same machine state:
  - llama.cpp (llama-bench tg, --repack 0: weights stay mmapped) under the budget and in memory;
  - pi2-engine policies dense -> bundle -> cache -> powerinfer2 (the ablation ladder) and llmflash,
    under the budget; powerinfer2 and dense with the whole model in memory.
pi2's decode rate is the steady state: generated tokens after the first --warmup ones, over their time
(its cache fills during those; llama.cpp's page cache cannot hold the model under the budget, and in
memory it is warmed by a first run). Also printed: median time between tokens, I/O vs compute share,
hit rate, bytes read from storage per token, peak RSS, and the fraction of the bound achieved:
  bound time per token = (resident bytes read per token + active FFN bytes) / memory bandwidth
                         + storage bytes per token (powerinfer2's, measured) / storage throughput,
with the bandwidths measured in the same run by pi2-probe. Targets (issue 6): >= 20x llama.cpp and
>= 3.5x llmflash under the budget, >= 2x llama.cpp in memory, >= 85% of the bound. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pi2cli.budget import run_budgeted
from pi2cli.engines.llamacpp import default_bin_dir
from pi2cli.engines.pi2 import engine_binary, parse_events
from pi2cli.pi2file import Pi2File

PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"
MiB = 2**20


def parse_size(text: str) -> int:
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    return int(float(t[:-1]) * units[t[-1]]) if t and t[-1] in units else int(t)


def probe(args: list[str]) -> dict:
    exe = engine_binary().parent / "pi2-probe"
    if not exe.is_file():
        sys.exit(f"sparse_decode: {exe} is not built (make engine)")
    done = subprocess.run([str(exe), *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"sparse_decode: pi2-probe {' '.join(args)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


def model_facts(pi2: Path) -> dict:
    f = Pi2File(pi2)
    h = f.header
    sec = {"neurons": f.sections[0][1], "resident": f.sections[1][1]}
    per_token_resident = sec["resident"] - sum(
        t.nbytes for t in f.tensors.values() if t.name == "token_embd.weight"
    )  # one embedding row is read per token, every other resident weight in full
    n_blocks = h.n_layer * max(1, h.n_expert)
    ffn_gguf = 3 * h.part_bytes * h.n_ff * n_blocks  # bundles without padding: the twin's FFN bytes
    measured = f.metadata.get("measured", {})
    return {
        "n_layer": h.n_layer, "n_embd": h.n_embd, "n_ff": h.n_ff, "neuron_type": h.neuron_type,
        "resident_bytes": sec["resident"], "neuron_region_bytes": sec["neurons"], "ffn_bytes": ffn_gguf,
        "per_token_resident_bytes": per_token_resident, "sparsity": measured.get("sparsity", 0.9),
        "synthetic": bool(f.metadata.get("synthetic")),
    }  # fmt: skip


def run_pi2(model: Path, policy: str, budget: int | None, n: int, threads: int, warmup: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [str(engine_binary()), "generate", "-m", str(model), "-p", PROMPT, "-n", str(n), "--temperature", "0",
               "--ignore-eos", "--threads", str(threads), "--policy", policy, "--events", str(events)]  # fmt: skip
        if budget:
            cmd += ["--memory-budget", str(budget)]
        t0 = time.monotonic()
        done = run_budgeted(cmd, budget, evict=[model], timeout=3600)
        if done.returncode != 0:
            return {"engine": "pi2", "policy": policy, "error": done.stderr.strip().splitlines()[-1:]}
        ev = parse_events(events.read_text().splitlines())
    tokens, s = ev["token"], ev["summary"]
    times = [e["t"] for e in tokens]
    steady = times[warmup:]
    tbt = [b - a for a, b in zip(steady, steady[1:], strict=False)]
    rate = (len(steady) - 1) / (steady[-1] - steady[0]) if len(steady) > 1 else 0.0
    after = tokens[warmup + 1 :]
    per_tok = lambda key: statistics.mean(e.get(key, 0) for e in after) if after else 0.0  # noqa: E731
    io, comp = per_tok("io_wait_s"), per_tok("compute_s")
    return {
        "engine": "pi2", "policy": policy, "decode_tps": rate, "median_tbt_ms": 1e3 * statistics.median(tbt),
        "decode_tps_all": ev["turn"]["decode_tps"], "peak_rss_bytes": s["peak_rss_bytes"],
        "storage_bytes_per_token": per_tok("bytes_read"), "reads_per_token": per_tok("reads"),
        "hit_rate": s.get("hit_rate"), "io_share": io / (io + comp) if io + comp else None,
        "io_method": s.get("io_method"), "o_direct": s.get("o_direct"), "cache_bytes": s.get("cache_bytes"),
        "active_fraction": s.get("active_fraction"), "budget": done.budget, "wall_s": time.monotonic() - t0,
    }  # fmt: skip


def run_llamacpp(gguf: Path, budget: int | None, n: int, threads: int, warm: bool) -> dict:
    exe = default_bin_dir("host") / "llama-bench"
    cmd = [str(exe), "-m", str(gguf), "-p", "0", "-n", str(n), "-t", str(threads), "-r", "1", "--repack", "0",
           "-lm", "mmap", "-o", "json"]  # fmt: skip
    if warm:  # in memory: a first run reads the file into the page cache
        subprocess.run(cmd, capture_output=True, text=True, check=True)
    done = run_budgeted(cmd, budget, evict=[] if warm else [gguf], timeout=7200)
    if done.returncode != 0:
        return {"engine": "llama.cpp", "error": done.stderr.strip().splitlines()[-1:]}
    row = next(r for r in json.loads(done.stdout) if r["n_gen"] == n)
    return {"engine": "llama.cpp", "policy": "mmap", "decode_tps": row["avg_ts"], "budget": done.budget,
            "llama_bench": {k: row[k] for k in ("build_commit", "n_threads", "avg_ts", "stddev_ts", "samples_ns")}}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--budget", default="auto")
    ap.add_argument("-n", type=int, default=32, help="generated tokens per pi2 run")
    ap.add_argument(
        "--llama-n", type=int, default=16, help="generated tokens for llama.cpp under the budget (slow)"
    )
    ap.add_argument("--warmup", type=int, default=8, help="pi2 tokens before the steady state is timed")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-llamacpp", action="store_true")
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    a = ap.parse_args()
    pi2, gguf = a.model_dir / "model.pi2", a.model_dir / "model.gguf"
    for p in (pi2, gguf):
        if not p.is_file():
            sys.exit(f"sparse_decode: {p} is missing (see --help for how to make it)")
    facts = model_facts(pi2)
    budget = (
        (facts["resident_bytes"] + facts["ffn_bytes"] // 2 + 128 * MiB)
        if a.budget == "auto"
        else parse_size(a.budget)
    )
    roomy = pi2.stat().st_size + 1024 * MiB  # "in memory": the cache can hold every bundle
    print(f"model {pi2} ({'synthetic' if facts['synthetic'] else 'real'}): {facts['n_layer']} layers, "
          f"{facts['n_embd']}/{facts['n_ff']}, {facts['neuron_type']}; resident {facts['resident_bytes'] / MiB:.0f} MiB, "
          f"FFN {facts['ffn_bytes'] / MiB:.0f} MiB; budget {budget / MiB:.0f} MiB", flush=True)  # fmt: skip

    membw = probe(["membw", "--threads", str(a.threads)])
    storage = probe(["storage", "--file", str(pi2), "--block", "8192", "--qd", "32", "--seconds", "3"])
    print(f"memory read {membw['gb_per_s']:.1f} GB/s, storage {storage['mb_per_s']:.0f} MB/s "
          f"({storage['method']}, 8 KiB random reads, queue depth 32)", flush=True)  # fmt: skip

    runs: dict[str, dict] = {}
    for policy in ("dense", "bundle", "llmflash", "cache", "powerinfer2"):
        runs[f"{policy}@budget"] = run_pi2(pi2, policy, budget, a.n, a.threads, a.warmup)
        print(
            f"  pi2 {policy:12s} budget: {runs[f'{policy}@budget'].get('decode_tps', 0):.2f} tok/s",
            flush=True,
        )
    for policy in ("powerinfer2", "dense"):
        runs[f"{policy}@memory"] = run_pi2(
            pi2, policy, roomy if policy != "dense" else None, a.n, a.threads, a.warmup
        )
        print(
            f"  pi2 {policy:12s} memory: {runs[f'{policy}@memory'].get('decode_tps', 0):.2f} tok/s",
            flush=True,
        )
    if not a.skip_llamacpp:
        runs["llama.cpp@memory"] = run_llamacpp(gguf, None, a.n, a.threads, warm=True)
        print(f"  llama.cpp memory: {runs['llama.cpp@memory'].get('decode_tps', 0):.2f} tok/s", flush=True)
        runs["llama.cpp@budget"] = run_llamacpp(gguf, budget, a.llama_n, a.threads, warm=False)
        print(f"  llama.cpp budget: {runs['llama.cpp@budget'].get('decode_tps', 0):.2f} tok/s", flush=True)

    pi = runs["powerinfer2@budget"]
    mem_bytes = facts["per_token_resident_bytes"] + (1 - facts["sparsity"]) * facts["ffn_bytes"]
    bound_s = mem_bytes / (membw["gb_per_s"] * 1e9) + pi.get("storage_bytes_per_token", 0) / (
        storage["mb_per_s"] * 1e6
    )
    rows = []
    for name, r in runs.items():
        tps = r.get("decode_tps") or 0

        def ratio(key: str, tps: float = tps) -> float | None:
            base = runs.get(key, {}).get("decode_tps")
            return tps / base if base else None

        rows.append((name, tps, ratio("llama.cpp@budget" if "budget" in name else "llama.cpp@memory"),
                     ratio("llmflash@budget"), r.get("median_tbt_ms"), r.get("io_share"), r.get("hit_rate"),
                     (r.get("storage_bytes_per_token") or 0) / MiB, (r.get("peak_rss_bytes") or 0) / MiB,
                     r.get("error")))  # fmt: skip
    fmt = lambda v, f: "-" if v is None else format(v, f)  # noqa: E731
    print(f"\n{'run':22s} {'tok/s':>7s} {'x llama':>8s} {'x llmfl':>8s} {'TBT ms':>7s} {'I/O':>5s} {'hit':>5s} "
          f"{'MiB/tok':>8s} {'RSS MiB':>8s}")  # fmt: skip
    for name, tps, xl, xf, tbt, io, hit, mib, rss, err in rows:
        print(f"{name:22s} {tps:7.2f} {fmt(xl, '8.2f')} {fmt(xf, '8.2f')} {fmt(tbt, '7.1f')} {fmt(io, '5.2f')} "
              f"{fmt(hit, '5.2f')} {mib:8.2f} {rss:8.0f}" + (f"  error: {err}" if err else ""))  # fmt: skip
    achieved = pi.get("decode_tps", 0)
    print(f"\nbound for powerinfer2 under the budget: {1 / bound_s:.2f} tok/s "
          f"({mem_bytes / 1e9:.2f} GB from memory at {membw['gb_per_s']:.1f} GB/s + "
          f"{pi.get('storage_bytes_per_token', 0) / 1e6:.2f} MB from storage at {storage['mb_per_s']:.0f} MB/s); "
          f"achieved {achieved:.2f} tok/s = {achieved * bound_s:.0%} of the bound")  # fmt: skip
    if a.json:
        out = {"facts": facts, "budget_bytes": budget, "membw": membw, "storage": storage, "runs": runs,
               "bound_tps": 1 / bound_s, "threads": a.threads, "n": a.n, "warmup": a.warmup, "prompt": PROMPT}  # fmt: skip
        a.json.write_text(json.dumps(out, indent=1))
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
