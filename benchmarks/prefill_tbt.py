"""Prefill (TTFT) and the time-between-tokens tail: pi2 vs llama.cpp on the same weights, in memory and
under one memory budget, with the bounds measured in the same run.

    .venv/bin/python benchmarks/prefill_tbt.py --model-dir DIR [--budget 2651M] [-p 64] [-n 48] [--rounds 3]
        [--variant '--read-cap auto' ...]

DIR holds model.pi2 and its GGUF twin model.gguf (e.g. `pi2 models synth --like turbosparse-mistral-7b
--no-dense-down --predictor-rank 32 --out DIR`: synthetic weights, labelled so). Per round, in this order
so that every ratio pairs runs a minute apart on the same machine state:
  pi2 in memory    pi2-engine generate, no budget (the whole model resident), a P-token prompt, N tokens
  llama.cpp in memory   llama-bench -p P -n N with --repack 0 and 1 (weights warm in the page cache);
                        the faster layout is the baseline
  pi2 under the budget  the same generate inside a memory cgroup of the budget (page cache counted,
                        the model evicted first)
  llama.cpp under the budget   llama-bench -p P -n 8 --repack 0 (mmap) inside the same cgroup
  pi2 variants     the budgeted pi2 run again with other flags (--miss-threshold P, --variant FLAGS)
Prefill is P prompt tokens over the time to the first token; pi2's TBT percentiles are over every gap
after the first token (the turn's steady decode); decode tok/s over the same tokens. pi2 samples
(temperature 0.8, seed = round): every engine processes the same number of tokens either way.
Bounds measured here: memory read bandwidth (pi2-probe membw) for prefill and decode in memory;
sequential-ish 4 MiB reads at queue depth 2 (how pi2 streams a block) for prefill under the budget;
for decode under the budget, random reads of a bundle at queue depth 512 and sorted waves of them within
a block's span (how decode issues a block's misses): budget_bound below.
Targets (issue 15): prefill >= 1.0x llama.cpp in memory and >= 2x under the budget; decode >= 2x llama.cpp
(--repack 1) in memory and >= 90% of its bound under the budget; TBT p99/p50 <= 1.5. Not a test.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
from pathlib import Path

from sparse_decode import model_pair, probe  # the same checks and pi2-probe runs as the decode benchmark

from pi2cli.engines.llamacpp.server import default_bin_dir
from pi2cli.engines.pi2.driver import run_generate
from pi2cli.hw.cgroup import run_budgeted
from pi2cli.models.pi2file import Pi2File
from pi2cli.plan.facts import model_facts
from pi2cli.plan.predict import Device, wave_read_time
from pi2cli.units import parse_size

MiB = 2**20


def percentile(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def run_pi2(
    model: Path, budget: int | None, p: int, n: int, threads: int, seed: int, vocab: int, more: tuple = ()
) -> dict:
    ids = ",".join(str(1 + (i * 7919) % (min(vocab, 32000) - 1)) for i in range(p))  # ids any tokenizer has
    run = run_generate(model, budget_bytes=budget, evict=[model], n_predict=n, temperature=0.8, seed=seed,
                       ignore_eos=True, threads=threads, policy="powerinfer2", more=["--tokens", ids, *more])  # fmt: skip
    if run.error is not None:
        return {"error": run.error}
    ev = run.events
    times = [e["t"] for e in ev["token"]]
    tbt = [b - a for a, b in zip(times, times[1:], strict=False)]
    s, turn = ev["summary"], ev["turn"]
    return {
        "prefill_tps": p / turn["ttft_s"], "ttft_ms": 1e3 * turn["ttft_s"], "decode_tps": len(tbt) / sum(tbt),
        "tbt_p50_ms": 1e3 * percentile(tbt, 0.5), "tbt_p90_ms": 1e3 * percentile(tbt, 0.9),
        "tbt_p99_ms": 1e3 * percentile(tbt, 0.99), "tbt_max_ms": 1e3 * max(tbt),
        "peak_rss_bytes": s["peak_rss_bytes"], "budget_source": s.get("memory_budget_source"),
        "streamed_blocks": s.get("streamed_blocks"), "dense_batch_blocks": s.get("dense_batch_blocks"),
        "two_phase": s.get("two_phase"), "hit_rate": s.get("hit_rate"),
        # the load's own reads (under a budget: the cache filled at open) happen before the prompt
        "load_s": ev["start"].get("load_s"), "preload_bytes": s.get("preload_bytes"),
        "stream_cached_bundles": s.get("stream_cached_bundles"),
        "reads_per_token": statistics.mean(e.get("reads", 0) for e in ev["token"][1:]) if n > 1 else None,
        # per decoded token after the first: its time and its storage reads (the budgeted bound below)
        "tbt_ms": [1e3 * x for x in tbt], "token_reads": [e.get("reads", 0) for e in ev["token"][1:]],
        "token_ffn_ms": [1e3 * e.get("ffn_s", 0) for e in ev["token"][1:]],
    }  # fmt: skip


def run_llama(gguf: Path, budget: int | None, p: int, n: int, threads: int, repack: int) -> dict:
    exe = default_bin_dir("host") / "llama-bench"
    cmd = [str(exe), "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads), "-r", "1", "--repack",
           str(repack), "-lm", "mmap", "-o", "json"]  # fmt: skip
    if not budget:  # in memory: a first run reads the file into the page cache
        subprocess.run(cmd, capture_output=True, text=True, check=True)
    done = run_budgeted(cmd, budget, evict=[gguf] if budget else [], timeout=7200)
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    rows = json.loads(done.stdout)
    pp = next(r["avg_ts"] for r in rows if r["n_prompt"] == p)
    tg = next((r["avg_ts"] for r in rows if r["n_gen"] == n and n), None)
    return {"prefill_tps": pp, "decode_tps": tg, "repack": repack}


WAVES = (64, 256, 1024)  # a block's misses on the 7B shape under 2651 MiB: ~15 to ~1000


def storage_rate(facts, rand: dict, waves: list[dict]):
    """Reads per second the storage serves a token that reads r bundles over its blocks: the faster of
    free-running random reads and sorted waves of r / blocks within a block's span (pi2-probe's JSON for
    `--wave N --range SPAN`; the planner's wave_read_time: log-linear between the wave sizes probed), so
    the bound credits the storage with the best it showed for the engine's pattern."""
    dev = Device("this machine", 0.0, [rand], 1, "probe", waves=waves)
    return lambda r: max(rand["iops"], 1.0 / wave_read_time(dev, facts, facts.full_len, r / facts.n_blocks))


def budget_bound(mem: dict, bud: dict, rate) -> dict:
    """The decode bound under the budget for one round, per token: no engine decodes a token faster than
    pi2 does with the whole model in memory (the same round's median TBT: its compute and memory side), nor
    faster than the storage serves that token's reads (its reads / rate(reads), storage_rate's). bound = the
    sum over tokens of the larger of the two (perfect overlap). Its p99/p50 is the steadiest TBT any engine
    that reads every predicted miss could have on this machine: a token that must read k times the usual
    misses takes at least that long."""
    comp = statistics.median(mem["tbt_ms"])
    floor = [max(comp, 1e3 * r / rate(r)) for r in bud["token_reads"]]
    bound = 1e3 * len(floor) / sum(floor)
    out = {
        "compute_ms": comp,
        "bound_tok_s": bound,
        "share": bud["decode_tps"] / bound,
        "floor_p99_over_p50": percentile(floor, 0.99) / percentile(floor, 0.5),
    }
    if mem.get("token_ffn_ms"):
        # The same bound for an engine that reads a block's neurons only once the block's input exists (an
        # exact prediction needs it): the reads overlap the FFN's compute, never attention's or the head's.
        # Per token: pi2's in-memory time outside the FFN, plus the larger of its in-memory FFN time and
        # the token's reads. What separates it from the bound above takes reads started before their
        # block's input exists (speculative, --lookahead).
        ffn = statistics.median(mem["token_ffn_ms"])
        rest = statistics.median(t - f for t, f in zip(mem["tbt_ms"], mem["token_ffn_ms"], strict=True))
        serial = [rest + max(ffn, 1e3 * r / rate(r)) for r in bud["token_reads"]]
        out.update(ffn_ms=ffn, outside_ffn_ms=rest, block_order_bound_tok_s=1e3 * len(serial) / sum(serial))
        out["block_order_share"] = bud["decode_tps"] / out["block_order_bound_tok_s"]
    return out


def med(rs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--budget", default="2651M")
    ap.add_argument("-p", type=int, default=64, help="prompt tokens")
    ap.add_argument("-n", type=int, default=48, help="tokens generated by pi2 (and llama.cpp in memory)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--miss-threshold", type=float, help="also run pi2 under the budget with this --miss-threshold"
    )
    ap.add_argument(
        "--variant", action="append", default=[], metavar="FLAGS",
        help="also run pi2 under the budget with these engine flags, e.g. '--read-cap auto' (repeatable)",
    )  # fmt: skip
    ap.add_argument("--json", type=Path, help="also write every measurement here")
    a = ap.parse_args()
    pi2, gguf = model_pair(a.model_dir, "prefill_tbt")
    budget = parse_size(a.budget)
    pf = Pi2File(pi2)
    vocab, synthetic = pf.header.n_vocab, bool(pf.metadata.get("synthetic"))
    print(f"model {pi2} ({'synthetic' if synthetic else 'real'}), {pi2.stat().st_size / MiB:.0f} MiB; "
          f"budget {budget / MiB:.0f} MiB; prompt {a.p}, {a.n} tokens, {a.threads} threads", flush=True)  # fmt: skip
    membw = probe(["membw", "--threads", str(a.threads)])
    stream = probe(["storage", "--file", str(pi2), "--block", str(4 * MiB), "--qd", "2", "--seconds", "3"])
    # decode's misses: whole bundles (the engine's read size), a block's misses at once (QD up to 512)
    facts = model_facts(pi2)
    miss_read = facts.full_len
    rand = probe(["storage", "--file", str(pi2), "--block", str(miss_read), "--qd", "512", "--seconds", "2"])
    # ... and as decode issues them: a block's misses sorted, within the block's span, collected whole
    span = facts.n_ff * facts.bundle_stride  # one block's bundles: where a decode wave's reads fall
    waves = [probe(["storage", "--file", str(pi2), "--block", str(miss_read), "--qd", "512", "--seconds", "2",
                    "--wave", str(w), "--range", str(span)]) for w in WAVES]  # fmt: skip
    storage = storage_rate(facts, rand, waves)
    print(f"memory read {membw['gb_per_s']:.1f} GB/s; storage {stream['mb_per_s']:.0f} MB/s in 4 MiB reads "
          f"at queue depth 2, {rand['iops'] / 1e3:.1f}k random {miss_read} B reads/s at queue depth 512; "
          f"in sorted waves of {'/'.join(map(str, WAVES))} within a block's {span / MiB:.0f} MiB: "
          + "/".join(f"{w['iops'] / 1e3:.1f}k" for w in waves), flush=True)  # fmt: skip

    # --miss-threshold P is the variant '--miss-threshold P' (the same run and row name)
    variants = ([f"--miss-threshold {a.miss_threshold}"] if a.miss_threshold else []) + a.variant
    runs: dict[str, list[dict]] = {}
    for rnd in range(1, a.rounds + 1):
        steps = [("pi2@memory", lambda rnd=rnd: run_pi2(pi2, None, a.p, a.n, a.threads, rnd, vocab)),
                 ("llama.cpp --repack 0@memory", lambda: run_llama(gguf, None, a.p, a.n, a.threads, 0)),
                 ("llama.cpp --repack 1@memory", lambda: run_llama(gguf, None, a.p, a.n, a.threads, 1)),
                 ("pi2@budget", lambda rnd=rnd: run_pi2(pi2, budget, a.p, a.n, a.threads, rnd, vocab)),
                 ("llama.cpp@budget", lambda: run_llama(gguf, budget, a.p, 8, a.threads, 0))]  # fmt: skip
        for flags in variants:  # the same budgeted run with other engine flags
            more = tuple(flags.split())
            steps.append((f"pi2 {flags}@budget",
                          lambda rnd=rnd, more=more: run_pi2(pi2, budget, a.p, a.n, a.threads, rnd, vocab, more)))  # fmt: skip
        for name, step in steps:
            r = step()
            runs.setdefault(name, []).append(r)
            print(f"  round {rnd} {name:28s} " + ("error: " + r["error"] if "error" in r else
                  f"prefill {r['prefill_tps']:.1f} tok/s, decode {r.get('decode_tps') or 0:.2f} tok/s"
                  + (f", load {r['load_s']:.1f} s" if r.get("load_s") is not None else "")), flush=True)  # fmt: skip

    def write_json(summary: dict) -> None:
        a.json.write_text(json.dumps({"model": str(pi2), "synthetic": synthetic, "budget_bytes": budget,
                                      "prompt_tokens": a.p, "n": a.n, "threads": a.threads, "membw": membw,
                                      "storage_4mib": stream, "storage_random": rand, "storage_waves": waves,
                                      "runs": runs, "summary": summary}, indent=1))  # fmt: skip

    if a.json:  # the runs first: a summary that fails must not lose them
        write_json({})

    def best_llama(i: int) -> dict:  # the faster layout of round i
        return max((runs[f"llama.cpp --repack {k}@memory"][i] for k in (0, 1)),
                   key=lambda r: r.get("prefill_tps") or 0)  # fmt: skip

    def ratios(pi_key: str, base: list[dict], key: str) -> list[float]:
        return [p[key] / b[key] for p, b in zip(runs[pi_key], base, strict=True) if p.get(key) and b.get(key)]

    base_mem = [best_llama(i) for i in range(a.rounds)]
    base_r1 = runs["llama.cpp --repack 1@memory"]
    table = [
        (
            "prefill tok/s, in memory",
            "pi2@memory",
            base_mem,
            "prefill_tps",
            ">= 1.0x llama.cpp (best layout)",
        ),
        ("prefill tok/s, budget", "pi2@budget", runs["llama.cpp@budget"], "prefill_tps", ">= 2x llama.cpp"),
        ("decode tok/s, in memory", "pi2@memory", base_r1, "decode_tps", ">= 2x llama.cpp --repack 1"),
    ]
    print(f"\n{'figure':28s} {'pi2':>9s} {'llama.cpp':>10s} {'ratio (median of rounds)':>26s}  target")
    summary = {}
    for label, pk, base, key, target in table:
        rs = ratios(pk, base, key)
        ratio = statistics.median(rs) if rs else None
        summary[label] = {
            "pi2": med(runs[pk], key),
            "llama.cpp": med(base, key),
            "ratios": rs,
            "ratio": ratio,
        }
        print(f"{label:28s} {med(runs[pk], key) or 0:9.2f} {med(base, key) or 0:10.2f} "
              f"{(ratio or 0):8.2f}x ({', '.join(f'{x:.2f}' for x in rs)})  {target}")  # fmt: skip
    for key in [k for k in runs if k.startswith("pi2")]:
        where = key.removeprefix("pi2").removeprefix("@").strip() or key
        rs = [r for r in runs[key] if "error" not in r]
        tails = [r["tbt_p99_ms"] / r["tbt_p50_ms"] for r in rs]
        summary[f"tbt {where}"] = {
            k: med(rs, k) for k in ("tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "tbt_max_ms")
        }
        summary[f"tbt {where}"]["p99_over_p50"] = tails
        print(f"pi2 TBT {where}: p50 {med(rs, 'tbt_p50_ms') or 0:.1f} ms, p90 {med(rs, 'tbt_p90_ms') or 0:.1f}, "
              f"p99 {med(rs, 'tbt_p99_ms') or 0:.1f}; p99/p50 per round {', '.join(f'{t:.2f}' for t in tails)} "
              f"(target <= 1.5); decode {med(rs, 'decode_tps') or 0:.2f} tok/s, "
              f"{med(rs, 'reads_per_token') or 0:.0f} reads/token; peak RSS {max((r['peak_rss_bytes'] for r in rs), default=0) / MiB:.0f} MiB")  # fmt: skip
    print("decode under the budget against its bound (per token the larger of pi2's in-memory TBT in the same round "
          "and the token's reads at the faster of the random and the wave rate; target >= 90%):")  # fmt: skip
    for key in [k for k in runs if k.startswith("pi2") and k.endswith("@budget")]:
        bounds = [budget_bound(m, b, storage) for m, b in zip(runs["pi2@memory"], runs[key], strict=True)
                  if "error" not in m and "error" not in b]  # fmt: skip
        summary[f"decode bound, {key}"] = bounds
        print(f"  {key}: " + "; ".join(f"{b['share']:.0%} of {b['bound_tok_s']:.2f} tok/s" for b in bounds)
              + "; the bound's own TBT p99/p50 (its reads, perfectly overlapped): "
              + ", ".join(f"{b['floor_p99_over_p50']:.2f}" for b in bounds))  # fmt: skip
        if all("block_order_share" in b for b in bounds):
            print("    with reads only once their block's input exists (in memory outside the FFN "
                  + ", ".join(f"{b['outside_ffn_ms']:.0f}" for b in bounds) + " ms a token): "
                  + "; ".join(f"{b['block_order_share']:.0%} of {b['block_order_bound_tok_s']:.2f} tok/s" for b in bounds))  # fmt: skip
    print(f"bounds: memory {membw['gb_per_s']:.1f} GB/s, storage {stream['mb_per_s']:.0f} MB/s in 4 MiB reads: "
          f"streaming the FFN once ({pf.sections[0][1] / MiB:.0f} MiB) takes "
          f"{pf.sections[0][1] / (stream['mb_per_s'] * 1e6):.2f} s, a floor on a budgeted prefill batch "
          f"(less what the cache holds)")  # fmt: skip
    if a.json:
        write_json(summary)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
