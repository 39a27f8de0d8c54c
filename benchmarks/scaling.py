"""pi2 against llama.cpp as the thread count grows: prefill and decode in memory and under a memory budget,
with the memory bandwidth at each thread count as the bound. Issue 31's table, for any thread list.

    .venv/bin/python benchmarks/scaling.py --model-dir DIR [--threads 1,2,4] [--budget 60%] [--reps 2]
        [-p 128] [-n 32] [--budget-n 32] [--llama-budget-n 8] [--skip-budget] [--engine-b PATH]
        [--b-env NAME=VALUE] [--gemv-prefetch 0,512,1024,2048] [--gemv-streams 1,2,4] [--note TEXT] [--json OUT]

DIR holds model.pi2 and its GGUF twin model.gguf (the same weights), e.g. issue 31's model:
    pi2 models synth --like turbosparse-mistral-7b --layers 8 --no-dense-down --predictor-rank 32 --out DIR
(synthetic weights, labelled so in the output; full width, 8 of 32 layers, 1.2 GB). On the scaling kit
(../shared/scaling/scaling.sh) the environment names everything: MODEL_DIR (the default --model-dir),
ENGINE (pi2-engine; pi2-probe is taken from beside it and built there with ninja when missing) and
LLAMA_BENCH (llama-bench); without them, build/host's engine and pi2's own llama.cpp build
(`pi2 build --engine llama.cpp`). So on the kit:
    bash .scaling/scaling.sh python3 benchmarks/scaling.py --threads 2,4,8,16

Per repetition, for each thread count T in turn (the order reversed on odd repetitions, so a drifting
machine does not favour one end of the list), every figure a minute apart on the same machine state:
  membw             pi2-probe membw --threads T: read GB/s, the bound on decode in memory
  gemv              pi2-probe gemv --threads T: the GB/s of pi2's dense decode GEMV (attention's and the
                    output head's kernel, through its pool) over 512 MiB; beside membw and llama.cpp's
                    effective rate (tg x the bytes a token reads), whether pi2's kernel or the memory
                    bounds it
  llama.cpp memory  llama-bench -p P -n N -t T -r 1 (its defaults: repacked layout, warm-up run)
  pi2 memory        pi2-engine generate --policy powerinfer2 -t T, a P-token prompt (token ids), N tokens,
                    no budget (the whole model resident)
  pi2 budget        the same with --memory-budget B (engine-enforced: the engine sizes its cache from it),
                    inside a memory cgroup of B where this machine has one, the model evicted first
  llama.cpp budget  llama-bench -p P -n N' --repack 0 -lm mmap -t T -r 1 inside the cgroup of B (the
                    weights paged from the file through the page cache), the GGUF evicted first; without
                    a cgroup the run happens but is marked "not enforced": its figures are in-memory ones
  pi2 B memory      with --engine-b: that engine (another build: the one before a change), the same run
                    right after pi2 memory, and the ratios pi2 / B per repetition (a before/after
                    figure from one run of one machine); with --b-env NAME=VALUE, B runs with that in
                    its environment (B is this engine unless --engine-b names another), e.g.
                    PI2_X4_STREAMS=4 or PI2_KERNELS=avx2 against the defaults
  --gemv-prefetch   pi2-probe gemv --prefetch B for each distance B, a table by distance
  --gemv-streams    pi2-probe gemv --streams S and membw --streams S for each S, a table by stream count:
                    whether one core reads DRAM faster as several sequential streams
Prefill = P / time to the first token (pi2) or llama-bench's pp; decode = pi2's whole-decode average (the
turn's decode_tps over every generated token, as llama-bench's tg averages its N) and, in the JSON, its
steady state after --warmup tokens. Ratios are medians of the per-repetition ratios. pi2 samples
(temperature 0.8, seed = repetition + 1): greedy decoding of a synthetic model loops over a few tokens.
Bounds: in memory, tok/s <= membw / bytes a token reads (pi2: resident weights read per token + the
active share of the FFN, 1 - the model's measured sparsity; llama.cpp: resident + the whole FFN), and
the other way round, the bytes-per-token ceiling: membw / the measured rate, the most a token could read.
Under the budget, also storage: reads a token / the random-read rate of a bundle at queue depth 512
(pi2-probe storage, before the runs). io_wait and FFN time are the pi2 run summary's, for the whole run.
Not a test.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sparse_decode import model_facts, model_pair  # the same model checks and statistics

from pi2cli.engines.pi2.driver import parse_events
from pi2cli.hw.cgroup import detect_cgroup, run_budgeted
from pi2cli.paths import REPO_ROOT, host_build_dir
from pi2cli.results.schema import pi2_commit
from pi2cli.units import parse_size

MiB = 2**20


# ------------------------------------------------------------------------------------------ the tools
def engine_path() -> Path:
    exe = Path(os.environ["ENGINE"]) if os.environ.get("ENGINE") else host_build_dir() / "pi2-engine"
    if not exe.is_file():
        sys.exit(f"scaling: {exe} is not built (make engine, or set ENGINE)")
    return exe


def probe_path(engine: Path) -> Path:
    """pi2-probe beside the engine; the scaling kit builds only pi2-engine, so build it there if missing."""
    exe = engine.parent / "pi2-probe"
    if not exe.is_file() and (engine.parent / "build.ninja").is_file():
        subprocess.run(["ninja", "-C", str(engine.parent), "pi2-probe"], capture_output=True, check=False)
    if not exe.is_file():
        sys.exit(f"scaling: {exe} is not built (ninja -C {engine.parent} pi2-probe)")
    return exe


def llama_bench_path() -> Path:
    if os.environ.get("LLAMA_BENCH"):
        exe = Path(os.environ["LLAMA_BENCH"])
    else:
        from pi2cli.engines.llamacpp.server import default_bin_dir

        exe = default_bin_dir("host") / "llama-bench"
    if not exe.is_file():
        sys.exit(f"scaling: {exe} not found (pi2 build --engine llama.cpp, or set LLAMA_BENCH)")
    return exe


def probe(exe: Path, args: list[str]) -> dict:
    done = subprocess.run([str(exe), *args, "--json"], capture_output=True, text=True)
    if done.returncode != 0:
        sys.exit(f"scaling: pi2-probe {' '.join(args)} failed: {done.stderr.strip()}")
    return json.loads(done.stdout)


# --------------------------------------------------------------------------------------- the machine
def machine() -> dict:
    """What the figures were measured on: CPU model, cores, memory, kernel, load at the start."""
    cpuinfo = Path("/proc/cpuinfo").read_text(errors="replace") if Path("/proc/cpuinfo").exists() else ""
    model = next((m.group(1).strip() for key in ("model name", "Hardware", "Processor")
                  if (m := re.search(rf"^{key}\s*:\s*(.+)$", cpuinfo, re.M))), platform.processor() or None)  # fmt: skip
    mem = (
        re.search(r"^MemTotal:\s*(\d+)", Path("/proc/meminfo").read_text())
        if Path("/proc/meminfo").exists()
        else None
    )
    flags = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    simd = [
        f for f in ("avx2", "avx512f", "avx512_vnni", "amx_int8") if flags and f in flags.group(1).split()
    ]
    return {"cpu_model": model, "cores": os.cpu_count(), "cores_usable": len(os.sched_getaffinity(0)),
            "memory_bytes": int(mem.group(1)) * 1024 if mem else None, "kernel": platform.release(),
            "arch": platform.machine(), "simd": simd, "hostname": platform.node(),
            "loadavg_start": list(os.getloadavg())}  # fmt: skip


# ------------------------------------------------------------------------------------------ the runs
def token_ids(n: int, vocab: int) -> str:
    """n prompt token ids any tokenizer of this vocabulary has (prefill_tbt's)."""
    return ",".join(str(1 + (i * 7919) % (min(vocab, 32000) - 1)) for i in range(n))


def run_pi2(engine: Path, model: Path, threads: int, budget: int | None, p: int, n: int, seed: int, vocab: int,
            warmup: int, env: dict[str, str] | None = None) -> dict:  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="pi2-scaling-") as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [str(engine), "generate", "-m", str(model), "--tokens", token_ids(p, vocab), "-n", str(n),
               "--temperature", "0.8", "--seed", str(seed), "--ignore-eos", "-t", str(threads),
               "--policy", "powerinfer2", "--events", str(events)]  # fmt: skip
        if budget:
            cmd += ["--memory-budget", str(budget)]
        shown = shlex.join([*cmd[:4], "--tokens", f"<{p} ids>", *cmd[6:]]).replace(str(events), "EVENTS")
        t0 = time.monotonic()
        done = run_budgeted(
            cmd, budget, evict=[model] if budget else [], timeout=900, env=os.environ | env if env else None
        )
        out = {"cmd": shown, "budget": done.budget, "wall_s": round(time.monotonic() - t0, 2)}
        if env:
            out["env"] = env
        if done.returncode != 0:
            return out | {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
        ev = parse_events(events.read_text().splitlines())
    s, turn, tokens, named = ev["summary"], ev["turn"], ev["token"], ev.get("named") or {}
    times = [e["t"] for e in tokens][warmup:]
    after = tokens[1:]  # the first token's reads and time belong to the prefill
    return out | {
        "prefill_tps": p / turn["ttft_s"], "decode_tps": turn["decode_tps"],
        "steady_decode_tps": (len(times) - 1) / (times[-1] - times[0]) if len(times) > 1 else None,
        "io_wait_s": s.get("io_wait_s"), "ffn_s": s.get("ffn_s"), "compute_s": s.get("compute_s"),
        "reads_per_token": statistics.mean(e.get("reads", 0) for e in after) if after else None,
        "storage_bytes_read": s.get("storage_bytes_read"), "hit_rate": s.get("hit_rate"),
        "peak_rss_bytes": s.get("peak_rss_bytes"), "io_method": s.get("io_method"),
        "anon_huge_bytes": s.get("anon_huge_bytes"),
        "threads": s.get("threads"), "load_s": ev["start"].get("load_s"),
        "kernels": {k: ev["start"].get(k) for k in ("kernels", "x4_prefetch", "x4_streams")},
        "memory_budget_source": s.get("memory_budget_source"), "decode_profile": s.get("decode_profile"),
        "prefill_profile": s.get("prefill_profile"),
        "named_per_token": sum(named["by_block"]) / named["decode_steps"] if named.get("decode_steps") else None,
    }  # fmt: skip


def run_llama(exe: Path, gguf: Path, threads: int, budget: int | None, p: int, n: int) -> dict:
    cmd = [str(exe), "-m", str(gguf), "-p", str(p), "-n", str(n), "-t", str(threads), "-r", "1", "-o", "json"]
    if budget:  # weights paged from the file: mmap, no repacked copy in anonymous memory
        cmd += ["--repack", "0", "-lm", "mmap"]
    t0 = time.monotonic()
    done = run_budgeted(cmd, budget, evict=[gguf] if budget else [], timeout=900)
    out = {"cmd": shlex.join(cmd), "budget": done.budget, "wall_s": round(time.monotonic() - t0, 2)}
    if done.returncode != 0:
        return out | {
            "error": f"exit {done.returncode}: " + (done.stderr.strip().splitlines() or ["no output"])[-1]
        }
    rows = json.loads(done.stdout)
    pp = next((r["avg_ts"] for r in rows if r["n_prompt"] == p and not r["n_gen"]), None)
    tg = next((r["avg_ts"] for r in rows if r["n_gen"] == n and not r["n_prompt"]), None)
    return out | {"prefill_tps": pp, "decode_tps": tg, "build_commit": rows[0].get("build_commit"),
                  "n_threads": rows[0].get("n_threads")}  # fmt: skip


# ---------------------------------------------------------------------------------------- the summary
def med(rs: list[dict], key: str) -> float | None:
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def ratio(a: list[dict], b: list[dict], key: str) -> float | None:
    """Median over repetitions of a[i][key] / b[i][key] (runs of one repetition are minutes apart)."""
    rs = [x[key] / y[key] for x, y in zip(a, b, strict=True) if x.get(key) and y.get(key)]
    return statistics.median(rs) if rs else None


def mb(v: float | None) -> float | None:
    return None if v is None else v / 1e6


def fmt(v, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if v is None else format(v, spec) + suffix


def summarize(
    threads: list[int],
    runs: dict,
    membw: dict,
    facts: dict,
    storage: dict | None,
    cores: int,
    gemv: dict,
) -> list[dict]:
    pi2_bytes = facts["per_token_resident_bytes"] + (1 - facts["sparsity"]) * facts["ffn_bytes"]
    dense_bytes = facts["per_token_resident_bytes"] + facts["ffn_bytes"]
    rows = []
    for t in threads:
        lm, pm = runs[f"llama.cpp@memory t={t}"], runs[f"pi2@memory t={t}"]
        gbs = statistics.median(m["gb_per_s"] for m in membw[t])
        row = {"threads": t, "oversubscribed": t > cores, "membw_gb_per_s": gbs,
               "llama_pp_tps": med(lm, "prefill_tps"), "pi2_prefill_tps": med(pm, "prefill_tps"),
               "llama_tg_tps": med(lm, "decode_tps"), "pi2_decode_tps": med(pm, "decode_tps"),
               "pi2_steady_decode_tps": med(pm, "steady_decode_tps"),
               "decode_ratio": ratio(pm, lm, "decode_tps"), "prefill_ratio": ratio(pm, lm, "prefill_tps"),
               "pi2_bytes_per_token": pi2_bytes, "dense_bytes_per_token": dense_bytes,
               "pi2_bound_tps": gbs * 1e9 / pi2_bytes, "dense_bound_tps": gbs * 1e9 / dense_bytes,
               "pi2_ffn_s_memory": med(pm, "ffn_s"),
               "gemv_gb_per_s": statistics.median(m["gb_per_s"] for m in gemv[t])}  # fmt: skip
        tg = row["llama_tg_tps"]
        row["llama_gb_per_s"] = tg * dense_bytes / 1e9 if tg else None  # what llama.cpp's decode streams
        # the other way round: the most bytes a token could read at the measured rate and this bandwidth
        for key, tps in (("pi2", row["pi2_decode_tps"]), ("llama", row["llama_tg_tps"])):
            row[f"{key}_bytes_per_token_ceiling"] = gbs * 1e9 / tps if tps else None
        if f"pi2 B@memory t={t}" in runs:  # the other build, run right after pi2's own each repetition
            bm = runs[f"pi2 B@memory t={t}"]
            row |= {"b_prefill_tps": med(bm, "prefill_tps"), "b_decode_tps": med(bm, "decode_tps"),
                    "ab_decode_ratio": ratio(pm, bm, "decode_tps"), "ab_prefill_ratio": ratio(pm, bm, "prefill_tps")}  # fmt: skip
        n_neurons = facts["n_layer"] * facts["n_ff"]
        row |= {f"split_{k}": v for k, v in time_split(pm, n_neurons).items()}
        row |= {f"prefill_split_{k}": v for k, v in time_split(pm, n_neurons, "prefill").items()}
        if f"pi2@budget t={t}" in runs:
            pb, lb = runs[f"pi2@budget t={t}"], runs[f"llama.cpp@budget t={t}"]
            row |= {f"budget_split_{k}": v for k, v in time_split(pb, n_neurons).items()}
            reads = med(pb, "reads_per_token")
            # decode's read rate: whether more compute threads slow the reads (issue 31) shows here,
            # where io_wait alone grows whenever faster compute leaves more of the read time uncovered
            rates = [
                r["reads_per_token"] * r["decode_tps"]
                for r in pb
                if r.get("reads_per_token") and r.get("decode_tps")
            ]
            io_s = reads / storage["iops"] if storage and reads is not None else None
            mem_s = pi2_bytes / (gbs * 1e9)
            row |= {"budget_pi2_prefill_tps": med(pb, "prefill_tps"), "budget_pi2_decode_tps": med(pb, "decode_tps"),
                    "budget_pi2_steady_decode_tps": med(pb, "steady_decode_tps"),
                    "budget_io_wait_s": med(pb, "io_wait_s"), "budget_ffn_s": med(pb, "ffn_s"),
                    "budget_reads_per_token": reads, "budget_hit_rate": med(pb, "hit_rate"),
                    "budget_reads_per_s": statistics.median(rates) if rates else None,
                    "budget_llama_pp_tps": med(lb, "prefill_tps"), "budget_llama_tg_tps": med(lb, "decode_tps"),
                    "budget_decode_ratio": ratio(pb, lb, "decode_tps"),
                    "budget_bound_tps": 1 / max(mem_s, io_s) if io_s is not None else None,
                    "budget_storage_bound_tps": 1 / io_s if io_s else None}  # fmt: skip
        rows.append(row)
    return rows


# decode_profile's parts a token (ms), in the order the split table prints them
SPLIT = ("attention_ms", "ffn_predict_ms", "ffn_wave_ms", "ffn_other_ms", "output_ms", "rest_ms", "io_wait_ms",
         "pool_jobs", "worker_sleeps")  # fmt: skip


def time_split(runs: list[dict], n_neurons: int, phase: str = "decode") -> dict:
    """Where a decode token's time goes, medians over the runs of their summaries' decode_profile: the
    profile's parts, the FFN's time outside its predictor and waves (the active list, the wave's setup),
    and the rest of the token's wall time (sampling, norms, the gaps between pool jobs); with the share
    of the FFN's neurons the predictor named a token (its reads: gate rows for every named neuron).
    phase "prefill": the same of a prompt token, from prefill_profile (its FFN is dense: no share)."""
    per_run = []
    for r in runs:
        d, tps = r.get(f"{phase}_profile") or {}, r.get(f"{phase}_tps")
        if not d or not tps:
            continue
        x = {k: d.get(k) for k in SPLIT if k not in ("ffn_other_ms", "rest_ms")}  # the profile's own parts
        x["ffn_other_ms"] = d["ffn_ms"] - d["ffn_predict_ms"] - d["ffn_wave_ms"]
        x["rest_ms"] = 1000 / tps - d["attention_ms"] - d["ffn_ms"] - d["output_ms"]
        named = r.get("named_per_token") if phase == "decode" else None
        x["named_share"] = named / n_neurons if named else None
        per_run.append(x)
    return {k: med(per_run, k) for k in (*SPLIT, "named_share")}


def print_sweep(
    title: str, threads: list[int], columns: list[tuple[str, dict[str, list[dict]], int]]
) -> None:
    """A table of probe rates (GB/s, medians over repetitions) by thread count: one column per (header, the
    sweep's runs keyed "T/value", value)."""
    print(
        f"\n{title}\n| threads | "
        + " | ".join(h for h, _, _ in columns)
        + " |\n|---|"
        + "---|" * len(columns)
    )
    for t in threads:
        cells = [
            fmt(statistics.median(m["gb_per_s"] for m in sweep[f"{t}/{v}"]), ".1f") for _, sweep, v in columns
        ]
        print(f"| {t} | " + " | ".join(cells) + " |")


def parse_list(flag: str, text: str, ok, what: str) -> list[int]:
    """A comma-separated list of integers, each ok(v), else one clear error line."""
    try:
        vals = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"scaling: {flag} needs comma-separated {what}, got '{text}'")
    if not all(ok(v) for v in vals):
        sys.exit(f"scaling: {flag} '{text}': {what}")
    return vals


def parse_env(items: list[str]) -> dict[str, str]:
    out = {}
    for it in items:
        name, eq, value = it.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            sys.exit(f"scaling: --b-env {it!r}: give NAME=VALUE, e.g. PI2_X4_STREAMS=4")
        out[name] = value
    return out


def per_thread(row: dict, key: str) -> str:
    """A rate and, in brackets, its share per thread (a core's own rate where threads <= cores)."""
    v = row.get(key)
    return "-" if v is None else f"{v:.1f} ({v / row['threads']:.1f})"


def print_rows(rows: list[dict], columns: list) -> None:
    """One markdown row per thread count: its threads, then each column, (key, *fmt args) or a function of
    the row; a missing value prints as "-"."""
    for r in rows:
        cells = [f"{r['threads']}{' (oversubscribed)' if r['oversubscribed'] else ''}"]
        cells += [c(r) if callable(c) else fmt(r.get(c[0]), *c[1:]) for c in columns]
        print("| " + " | ".join(cells) + " |")


def share(v: float | None, of: float | None) -> float | None:
    return v / of if v is not None and of else None


def print_tables(
    rows: list[dict], p: int, n: int, nb: int, budget: int | None, how: dict, iops: float | None
) -> None:
    print(f"\nin memory (pi2 decode: whole-decode average; bounds: membw / bytes a token reads)\n"
          f"| threads | llama.cpp pp{p} tok/s | pi2 prefill | llama.cpp tg{n} | pi2 decode | decode ratio | "
          f"prefill ratio | membw GB/s | pi2 bound | llama.cpp bound |\n|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    print_rows(rows, [("llama_pp_tps", ".1f"), ("pi2_prefill_tps", ".1f"), ("llama_tg_tps",), ("pi2_decode_tps",),
                      ("decode_ratio", ".2f", "x"), ("prefill_ratio", ".2f", "x"), ("membw_gb_per_s", ".1f"),
                      ("pi2_bound_tps", ".1f"), ("dense_bound_tps", ".1f")])  # fmt: skip
    print("bytes a token could read at the measured rate and bandwidth (pi2 / llama.cpp; the model's: "
          f"{rows[0]['pi2_bytes_per_token'] / 1e6:.0f} / {rows[0]['dense_bytes_per_token'] / 1e6:.0f} MB): "
          + ", ".join(f"{r['threads']} threads {fmt(mb(r['pi2_bytes_per_token_ceiling']), '.0f')} / "
                      f"{fmt(mb(r['llama_bytes_per_token_ceiling']), '.0f')} MB" for r in rows))  # fmt: skip
    print(
        "\nthe dense decode kernels' rate (GB/s): memory (membw), pi2's GEMV alone (pi2-probe gemv), "
        "llama.cpp's decode (tg x the bytes a token reads); per thread in brackets\n"
        "| threads | membw | pi2 GEMV | llama.cpp decode |\n|---|---|---|---|"
    )
    print_rows(
        rows, [lambda r, k=k: per_thread(r, k) for k in ("membw_gb_per_s", "gemv_gb_per_s", "llama_gb_per_s")]
    )
    if any("ab_decode_ratio" in r for r in rows):
        print("\nthe engine against B (--engine-b / --b-env), in memory (medians; ratios: per repetition, engine / B)\n"
              "| threads | prefill | B prefill | prefill ratio | decode | B decode | decode ratio |\n|---|---|---|---|---|---|---|")  # fmt: skip
        print_rows(rows, [("pi2_prefill_tps", ".1f"), ("b_prefill_tps", ".1f"), ("ab_prefill_ratio", ".3f", "x"),
                          ("pi2_decode_tps",), ("b_decode_tps",), ("ab_decode_ratio", ".3f", "x")])  # fmt: skip
    print_split(rows, "split_", "in memory")
    print_split(rows, "prefill_split_", "in memory", "prefill")
    if not budget:
        return
    print(f"\nunder a budget of {budget / MiB:.0f} MiB (pi2: {how['pi2']}; llama.cpp: {how['llama.cpp']}); "
          f"io_wait and FFN time: pi2's whole run\n"
          f"| threads | pi2 prefill | pi2 decode | llama.cpp pp{p} | llama.cpp tg{nb} | decode ratio | io_wait s | "
          f"FFN s | reads/token | reads/s (of the probe's) | hit rate | bound tok/s (storage) |\n"
          f"|---|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    print_rows(rows, [("budget_pi2_prefill_tps", ".1f"), ("budget_pi2_decode_tps",), ("budget_llama_pp_tps", ".1f"),
                      ("budget_llama_tg_tps",), ("budget_decode_ratio", ".2f", "x"), ("budget_io_wait_s",),
                      ("budget_ffn_s",), ("budget_reads_per_token", ".0f"),
                      lambda r: f"{fmt(r.get('budget_reads_per_s'), '.0f')} ({fmt(share(r.get('budget_reads_per_s'), iops), '.0%')})",
                      ("budget_hit_rate", ".3f"),
                      lambda r: f"{fmt(r.get('budget_bound_tps'))} ({fmt(r.get('budget_storage_bound_tps'))})"])  # fmt: skip
    print_split(rows, "budget_split_", "under the budget")


def print_split(rows: list[dict], prefix: str, where: str, phase: str = "decode") -> None:
    """The time_split table: one row per thread count."""
    token = "a token" if phase == "decode" else "a prompt token"
    print(f"\nwhere pi2's {phase} time goes {where} (ms {token}, medians of the runs' {phase}_profile; rest: the "
          f"time outside attention, FFN and output head: sampling, norms, gaps between pool jobs; "
          f"named: the FFN neurons the predictor named, whose gate rows are read)\n"
          f"| threads | attention | predictor | FFN waves | FFN other | output head | rest | io_wait | "
          f"pool jobs | worker sleeps | named |\n|---|---|---|---|---|---|---|---|---|---|---|")  # fmt: skip
    print_rows(rows, [(prefix + k, ".1f" if k in ("pool_jobs", "worker_sleeps") else ".2f") for k in SPLIT]
               + [(prefix + "named_share", ".1%")])  # fmt: skip


def budget_how(runs: dict, engine_how: str) -> dict:
    """How each engine's budget was held, from the runs' own records (a run without a cgroup says so)."""

    def said(prefix: str) -> str:
        records = [
            r["budget"] for k, rs in runs.items() if k.startswith(prefix) for r in rs if r.get("budget")
        ]
        hows = sorted({r.get("how", "?") for r in records})
        return "; ".join(hows) or "no runs"

    return {
        "pi2": f"{engine_how} (--memory-budget), and {said('pi2@budget')}",
        "llama.cpp": said("llama.cpp@budget"),
    }


# ------------------------------------------------------------------------------------------------ main
def parse_threads(text: str) -> list[int]:
    try:
        ts = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        sys.exit(f"scaling: --threads {text!r}: give a comma-separated list of thread counts, e.g. 2,4,8")
    if not ts or min(ts) < 1:
        sys.exit(f"scaling: --threads {text!r}: every thread count must be at least 1")
    return ts


def default_threads(cores: int) -> list[int]:
    """2, 4, 8, ... up to the cores, and the cores themselves (issue 31's 2,4,8,16 on 16 cores)."""
    out = [t for t in (2**i for i in range(1, 12)) if t <= cores]
    return out + [cores] if cores not in out else out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", type=Path, default=os.environ.get("MODEL_DIR"),
                    help="holds model.pi2 and model.gguf (default: $MODEL_DIR)")  # fmt: skip
    ap.add_argument("--threads", help="comma-separated thread counts; more than the cores is run and marked "
                    "oversubscribed (default: 2, 4, 8, ... up to the usable cores, and the cores: 2,4,8,16 on 16)")  # fmt: skip
    ap.add_argument("--budget", default="60%",
                    help="memory budget: a size (2G) or a share of model.pi2's size (default 60%%)")  # fmt: skip
    ap.add_argument("--skip-budget", action="store_true", help="in memory only")
    ap.add_argument("--reps", type=int, default=2, help="repetitions; figures are medians (default 2)")
    ap.add_argument("-p", type=int, default=128, help="prompt tokens (llama-bench -p; default 128)")
    ap.add_argument(
        "-n", type=int, default=32, help="generated tokens in memory (llama-bench -n; default 32)"
    )
    ap.add_argument("--budget-n", type=int, default=32, help="tokens pi2 generates under the budget")
    ap.add_argument("--llama-budget-n", type=int, default=8,
                    help="tokens llama.cpp generates under the budget (it pages its weights: slow)")  # fmt: skip
    ap.add_argument("--warmup", type=int, default=8, help="pi2 tokens before the steady state (JSON only)")
    ap.add_argument("--engine-b", type=Path,
                    help="a second pi2-engine (e.g. the build before a change) run after pi2's own in memory: "
                    "its figures and the ratios engine / B")  # fmt: skip
    ap.add_argument("--gemv-prefetch", default="",
                    help="comma-separated byte distances (e.g. 0,512,1024,2048): pi2-probe gemv at each of them too, "
                    "per thread count and repetition, and a table of the GB/s by distance (the engine uses 512)")  # fmt: skip
    ap.add_argument("--b-env", action="append", default=[], metavar="NAME=VALUE",
                    help="environment for B's runs (repeatable); without --engine-b, B is this engine with it: "
                    "e.g. PI2_X4_STREAMS=4")  # fmt: skip
    ap.add_argument("--gemv-streams", default="",
                    help="comma-separated stream counts (1, 2, 4, 8): pi2-probe gemv --streams S and membw "
                    "--streams S at each, per thread count and repetition, and a table by stream count")  # fmt: skip
    ap.add_argument("--note", default="", help="recorded with the machine, e.g. 'shared with other jobs'")
    ap.add_argument("--json", type=Path, help="default: results/benchmarks/scaling-<cores>core.json")
    a = ap.parse_args()
    if a.model_dir is None:
        sys.exit("scaling: give --model-dir DIR (or set MODEL_DIR)")
    if a.reps < 1 or a.p < 1 or a.n < 2 or a.budget_n < 2 or a.llama_budget_n < 1:
        sys.exit("scaling: --reps, -p and --llama-budget-n must be at least 1, -n and --budget-n at least 2")
    threads = parse_threads(a.threads) if a.threads else default_threads(len(os.sched_getaffinity(0)))
    distances = parse_list(
        "--gemv-prefetch", a.gemv_prefetch, lambda d: 0 <= d <= 65536, "byte distances 0..65536"
    )
    counts = parse_list(
        "--gemv-streams", a.gemv_streams, lambda c: c in (1, 2, 4, 8), "stream counts 1, 2, 4 or 8"
    )
    b_env = parse_env(a.b_env)
    engine, llama = engine_path(), llama_bench_path()
    engine_b = a.engine_b or (engine if b_env else None)
    if engine_b and not engine_b.is_file():
        sys.exit(f"scaling: --engine-b {engine_b}: no such engine")
    probe_exe = probe_path(engine)
    pi2, gguf = model_pair(a.model_dir, "scaling")
    facts = model_facts(pi2)
    from pi2cli.models.pi2file import Pi2File

    vocab = Pi2File(pi2).header.n_vocab
    size = pi2.stat().st_size
    budget = None
    if not a.skip_budget:
        budget = int(size * float(a.budget[:-1]) / 100) if a.budget.endswith("%") else parse_size(a.budget)
    host = machine() | {"note": a.note}
    cores = host["cores_usable"]
    commit = pi2_commit()
    cg = detect_cgroup()
    print(f"machine: {host['cpu_model']}, {host['cores']} cores ({cores} usable), "
          f"{(host['memory_bytes'] or 0) / 2**30:.0f} GiB, load {host['loadavg_start'][0]:.1f}"
          + (f"; {a.note}" if a.note else ""), flush=True)  # fmt: skip
    print(f"pi2 {commit['commit'] or '?'}{' (dirty)' if commit['dirty'] else ''}; engine {engine}; {llama}")
    if engine_b:
        print(f"B: {engine_b}" + (" with " + " ".join(f"{k}={v}" for k, v in b_env.items()) if b_env else ""))
    print(f"model {pi2} ({'synthetic' if facts['synthetic'] else 'real'} weights; GGUF twin {gguf.name}): "
          f"{facts['n_layer']} layers, {facts['n_embd']}/{facts['n_ff']}, {facts['neuron_type']}, {size / MiB:.0f} MiB; "
          f"sparsity {facts['sparsity']:.3f}; threads {threads}"
          + (f"; budget {budget / MiB:.0f} MiB ({a.budget}), cgroup: "
             + (f"cgroup v{cg.version}" if cg.usable else f"none ({cg.reason}): llama.cpp's budget NOT enforced")
             if budget else ""), flush=True)  # fmt: skip
    over = [t for t in threads if t > cores]
    if over:
        print(
            f"note: {over} thread(s) exceed the {cores} usable cores: oversubscribed, marked so", flush=True
        )

    storage = None
    if budget:  # decode's misses: whole bundles, a block's misses at once (queue depth up to 512)
        bundle = (3 * facts["part_bytes"] + 511) // 512 * 512
        storage = probe(probe_exe, ["storage", "--file", str(pi2), "--block", str(bundle), "--qd", "512",
                                    "--seconds", "2"])  # fmt: skip
        print(f"storage: {storage['iops'] / 1e3:.1f}k random {bundle} B reads/s at queue depth 512 "
              f"({storage['method']})", flush=True)  # fmt: skip
    runs: dict[str, list[dict]] = {}
    membw: dict[int, list[dict]] = {}
    gemv: dict[int, list[dict]] = {}
    gemv_sweep: dict[str, list[dict]] = {}  # "T/B": pi2-probe gemv --threads T --prefetch B, per repetition
    streams_gemv: dict[str, list[dict]] = {}  # "T/S": pi2-probe gemv --threads T --streams S, per repetition
    streams_membw: dict[str, list[dict]] = {}  # "T/S": pi2-probe membw --threads T --streams S
    t_start = time.time()
    out = a.json or REPO_ROOT / "results" / "benchmarks" / f"scaling-{host['cores']}core.json"
    out.parent.mkdir(parents=True, exist_ok=True)

    # written after every run too: a cut-off run keeps its figures
    def save(rows: list[dict] | None, how: dict) -> None:
        out.write_text(json.dumps({
            "benchmark": "benchmarks/scaling.py", "argv": sys.argv[1:], "machine": host, "pi2": commit,
            "engine": str(engine), "engine_b": str(engine_b) if engine_b else None, "b_env": b_env, "llama_bench": str(llama), "model": str(pi2), "gguf": str(gguf),
            "synthetic": facts["synthetic"], "facts": facts, "budget_bytes": budget, "budget_how": how,
            "prompt_tokens": a.p, "prompt_token_ids": token_ids(a.p, vocab), "n": a.n, "budget_n": a.budget_n,
            "llama_budget_n": a.llama_budget_n, "reps": a.reps, "threads": threads, "storage": storage,
            "membw": {str(k): v for k, v in membw.items()}, "gemv": {str(k): v for k, v in gemv.items()},
            "gemv_prefetch": gemv_sweep, "gemv_streams": streams_gemv, "membw_streams": streams_membw, "table": rows, "complete": rows is not None,
            "runs": runs,
        }, indent=1))  # fmt: skip

    for rep in range(a.reps):
        for t in threads if rep % 2 == 0 else threads[::-1]:
            membw.setdefault(t, []).append(probe(probe_exe, ["membw", "--threads", str(t), "--passes", "3"]))
            gemv.setdefault(t, []).append(probe(probe_exe, ["gemv", "--threads", str(t), "--reps", "3"]))
            for d in distances:
                gemv_sweep.setdefault(f"{t}/{d}", []).append(
                    probe(probe_exe, ["gemv", "--threads", str(t), "--reps", "3", "--prefetch", str(d)])
                )
            for c in counts:
                streams_membw.setdefault(f"{t}/{c}", []).append(
                    probe(probe_exe, ["membw", "--threads", str(t), "--passes", "3", "--streams", str(c)])
                )
                streams_gemv.setdefault(f"{t}/{c}", []).append(
                    probe(probe_exe, ["gemv", "--threads", str(t), "--reps", "3", "--streams", str(c)])
                )
            steps = [("llama.cpp@memory", lambda t=t: run_llama(llama, gguf, t, None, a.p, a.n)),
                     ("pi2@memory", lambda t=t, rep=rep: run_pi2(engine, pi2, t, None, a.p, a.n, rep + 1, vocab, a.warmup))]  # fmt: skip
            if engine_b:
                steps += [("pi2 B@memory", lambda t=t, rep=rep: run_pi2(engine_b, pi2, t, None, a.p, a.n, rep + 1, vocab,
                                                                a.warmup, b_env))]  # fmt: skip
            if budget:
                steps += [("pi2@budget", lambda t=t, rep=rep: run_pi2(engine, pi2, t, budget, a.p, a.budget_n, rep + 1, vocab,
                                                             a.warmup)),
                          ("llama.cpp@budget", lambda t=t: run_llama(llama, gguf, t, budget, a.p, a.llama_budget_n))]  # fmt: skip
            for name, step in steps:
                r = step()
                runs.setdefault(f"{name} t={t}", []).append(r)
                save(None, {})
                print(f"  rep {rep + 1} t={t:<3d} {name:17s} " + (f"error: {r['error']}" if "error" in r else
                      f"prefill {fmt(r.get('prefill_tps'), '.1f')}, decode {fmt(r.get('decode_tps'))} tok/s"
                      + (f", io_wait {r['io_wait_s']:.2f} s, FFN {r['ffn_s']:.2f} s" if r.get("io_wait_s") is not None
                         and "budget" in name else "")
                      + (f", {r['anon_huge_bytes'] / MiB:.0f} MiB on huge pages" if r.get("anon_huge_bytes") is not None
                         else "") + f" ({r['wall_s']:.0f} s)"), flush=True)  # fmt: skip
            print(f"  rep {rep + 1} t={t:<3d} membw {membw[t][-1]['gb_per_s']:.1f} GB/s, pi2's decode GEMV "
                  f"{gemv[t][-1]['gb_per_s']:.1f} GB/s", flush=True)  # fmt: skip
    host["loadavg_end"] = list(os.getloadavg())
    rows = summarize(threads, runs, membw, facts, storage, cores, gemv)
    how = budget_how(runs, "engine-enforced") if budget else {}
    print_tables(rows, a.p, a.n, a.llama_budget_n, budget, how, storage["iops"] if storage else None)
    if distances:
        print_sweep("pi2's decode GEMV by prefetch distance (GB/s, pi2-probe gemv --prefetch B; the engine uses 512)",
                    threads, [(f"{d} B", gemv_sweep, d) for d in distances])  # fmt: skip
    if counts:
        print_sweep("reads by streams per thread (GB/s, medians: pi2-probe membw --streams S, then pi2-probe gemv "
                    "--streams S; the engine reads 1 unless PI2_X4_STREAMS says otherwise)", threads,
                    [(f"membw {c}", streams_membw, c) for c in counts] + [(f"GEMV {c}", streams_gemv, c) for c in counts])  # fmt: skip
    print(f"\n{a.reps} repetitions, {time.time() - t_start:.0f} s; load average {host['loadavg_start'][0]:.1f} at the "
          f"start, {host['loadavg_end'][0]:.1f} at the end")  # fmt: skip
    save(rows, how)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
