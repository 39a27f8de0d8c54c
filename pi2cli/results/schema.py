"""The result schema: one JSON object per run, versioned, with builders, a validator and summaries.

A run is a plain dict (it is written as JSON as is). Build it with the functions here so field names
cannot be misspelt, then `pi2cli.results.store.save_run` validates, summarises, writes and indexes it:

    run = new_run(engine=engine_info("pi2", policy="powerinfer2"), model=model_info("smollm2", ...),
                  workload=workload_info("dialogue"), target=target_info("local", "local"),
                  memory=memory_info(budget_bytes=2 << 30, enforced=True, how="cgroup memory.max"),
                  settings=settings_info(n_gen=64, threads=4, repetitions=3))
    add_turn(run, n_prompt=57, n_gen=64, ttft_ns=..., samples_ns=[...])   # once per prompt and repetition
    save_run(run)

Times are integer nanoseconds and rates tokens per second, named as llama-bench names them where they
mean the same: n_prompt, n_gen, avg_ts, stddev_ts, samples_ns (here: every time between tokens of a
turn). docs/RESULTS.md describes every field.
"""

import datetime as dt
import math
import re
import secrets
import subprocess
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple

import numpy as np

from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT
from pi2cli.units import MAX_MEMORY_BYTES, format_size

SCHEMA_VERSION = 1

# Run and turn outcomes. Anything but "ok" carries a one-line `error`. "invalid": the run finished but its
# numbers cannot be true (e.g. token times faster than the device's memory bandwidth allows); it is kept and
# shown with its reason, never summarised into comparisons or farm series as if it were a measurement.
STATUS_OK = "ok"
RUN_STATUSES = ("ok", "aborted", "device_vanished", "failed", "timeout", "invalid")
# How every view names a status (tables, the report, compare's notes): one word or two, no underscores.
STATUS_LABELS = {"ok": "ok", "aborted": "aborted", "device_vanished": "device vanished", "failed": "failed",
                 "timeout": "timeout", "invalid": "invalid"}  # fmt: skip

# Where a run's peak RSS (counters.peak_rss_bytes) came from: always the kernel's own high-water mark,
# never a poll (docs/RESULTS.md). Stored as counters.peak_rss_source; results from before it lack it.
PEAK_RSS_ENGINE = "engine VmHWM at exit"  # the engine read its own /proc/self/status as it finished
PEAK_RSS_WRAPPER = "rusage maxrss via wrapper"  # wait4's ru_maxrss through pi2-rusage (pi2cli.hw.rusage)
PEAK_RSS_BEFORE_STOP = "VmHWM before stop"  # a server's VmHWM read here right before it was stopped
PEAK_RSS_DEVICE = "device VmHWM via shell"  # the same, read on an adb device through its shell
# a server pi2 did not start and does not stop (bench --mode load): its VmHWM read here after the load,
# the peak of the server's whole life so far (the load's included)
PEAK_RSS_SERVER = "server VmHWM after load"
PEAK_RSS_SOURCES = (PEAK_RSS_ENGINE, PEAK_RSS_WRAPPER, PEAK_RSS_BEFORE_STOP, PEAK_RSS_DEVICE, PEAK_RSS_SERVER)

# How pi2 drove pi2-engine (run.settings.via, absent before it was recorded and for engines with one way):
# "pipe" = `pi2-engine chat` over stdin, "server" = `pi2-engine serve` over streamed HTTP (pi2 bench --via).
VIAS = ("pipe", "server")

# The pi2-engine policies of the ablation ladder, in ladder order (each adds one technique).
ABLATION_POLICIES = ("dense", "bundle", "cache", "powerinfer2")

_RUN_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class ResultSchemaError(Pi2Error):
    """A result that does not follow the schema; the message names the field."""


# ---------------------------------------------------------------------------------------------------
# Builders for the metadata blocks. Keyword-only, so a misspelt field is a TypeError at the call site.


def engine_info(
    name: str,
    *,
    version: str | None = None,
    commit: str | None = None,
    build_flags: str | None = None,
    build_type: str | None = None,
    policy: str | None = None,
    binary_sha256: str | None = None,
) -> dict:
    """The engine that ran: `name` is the driver ("pi2", "llama.cpp", "llmflash", "mlc-llm");
    `policy` the pi2-engine policy (dense / bundle / cache / powerinfer2 / llmflash) when it has one."""
    return {
        "name": name,
        "version": version,
        "commit": commit,
        "build_flags": build_flags,
        "build_type": build_type,
        "policy": policy,
        "binary_sha256": binary_sha256,
    }


def model_info(
    name: str,
    *,
    path: str | None = None,
    sha256: str | None = None,
    quant: str | None = None,
    synthetic: bool = False,
    size_bytes: int | None = None,
    n_params: int | None = None,
    arch: str | None = None,
) -> dict:
    """The model: `synthetic` is True for generated weights (reports label them so everywhere)."""
    return {
        "name": name,
        "path": None if path is None else str(path),
        "sha256": sha256,
        "quant": quant,
        "synthetic": bool(synthetic),
        "size_bytes": size_bytes,
        "n_params": n_params,
        "arch": arch,
    }


def workload_info(
    name: str,
    *,
    n_prompts: int | None = None,
    sha256: str | None = None,
    source: str | None = None,
) -> dict:
    """The workload set (dialogue, code, math, roleplay, or a custom name) the prompts came from."""
    return {"name": name, "n_prompts": n_prompts, "sha256": sha256, "source": source}


def target_info(name: str, kind: str, **facts: Any) -> dict:
    """The device: `kind` is local / adb / qemu-arm64; `facts` are whatever the target reports
    (soc, cpu, cores, ram_bytes, storage, android, kernel, serial, temperature_c, ...)."""
    return {"name": name, "kind": kind, **facts}


def memory_info(budget_bytes: int | None = None, *, enforced: bool = False, how: str | None = None) -> dict:
    """The memory budget (None: none, the model in memory) and whether and how it was enforced (e.g. "cgroup memory.max")."""
    return {"budget_bytes": budget_bytes, "enforced": bool(enforced), "how": how}


def settings_info(
    *,
    n_gen: int | None = None,
    threads: int | None = None,
    repetitions: int = 1,
    warmup: int = 0,
    temperature: float = 0.0,
    seed: int = 0,
    **extra: Any,
) -> dict:
    """How the bench ran: generated length, threads, repetitions, warm-up turns, sampling."""
    return {
        "n_gen": n_gen,
        "threads": threads,
        "repetitions": repetitions,
        "warmup": warmup,
        "temperature": temperature,
        "seed": seed,
        **extra,
    }


def pi2_commit() -> dict:
    """The pi2 checkout this runs from: {"commit": sha or None, "dirty": bool or None}."""
    try:
        sha = subprocess.run(["git", "-C", str(REPO_ROOT), "rev-parse", "HEAD"],
                             capture_output=True, text=True, timeout=10, check=True).stdout.strip()  # fmt: skip
        status = subprocess.run(["git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10, check=True).stdout  # fmt: skip
        return {"commit": sha, "dirty": bool(status.strip())}
    except (OSError, subprocess.SubprocessError):
        return {"commit": None, "dirty": None}


def utc_now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def make_run_id(engine: str, model: str, workload: str, created_at: str | None = None) -> str:
    """A sortable, unique, file-name-safe id: 20261121T231800Z-pi2-smollm2-dialogue-a3f9c1."""
    when = parse_time(created_at) if created_at else dt.datetime.now(dt.UTC)
    parts = [when.strftime("%Y%m%dT%H%M%SZ")]
    for part in (engine, model, workload):
        slug = re.sub(r"[^A-Za-z0-9.]+", "-", part).strip("-.")[:32]
        if slug:
            parts.append(slug)
    return "-".join(parts + [secrets.token_hex(3)])


_SHORT_ID_RE = re.compile(r"^(\d{8}T\d{6}Z)-.+-([0-9a-f]{6})$")
SHORT_ID_RE = re.compile(r"^(\d{8}T\d{6}Z)-([0-9a-f]{6})$")


def short_run_id(run_id: str) -> str:
    """20261121T231800Z-a3f9c1 for 20261121T231800Z-pi2-smollm2-dialogue-a3f9c1: the time and the random
    suffix, which name a run as surely as the whole id (the index finds runs by it); other ids as they are."""
    match = _SHORT_ID_RE.match(run_id)
    return f"{match.group(1)}-{match.group(2)}" if match else run_id


def parse_time(text: str) -> dt.datetime:
    """An ISO-8601 time (a trailing Z allowed; no zone means UTC) as an aware datetime."""
    value = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


# ---------------------------------------------------------------------------------------------------
# The run itself.


def new_run(
    *,
    engine: dict,
    model: dict,
    workload: dict,
    target: dict,
    memory: dict | None = None,
    plan: dict | None = None,
    settings: dict | None = None,
    measurement: str = "",
    run_id: str | None = None,
    created_at: str | None = None,
    tags: Sequence[str] = (),
) -> dict:
    """A new run with no turns yet. `measurement` says how TTFT/TBT were taken (the report prints it)."""
    created_at = created_at or utc_now()
    run = {
        "schema_version": SCHEMA_VERSION,
        "run_id": run_id or make_run_id(engine["name"], model["name"], workload["name"], created_at),
        "created_at": created_at,
        "status": STATUS_OK,
        "error": None,
        "pi2": pi2_commit(),
        "engine": engine,
        "model": model,
        "workload": workload,
        "target": target,
        "memory": memory or memory_info(),
        "plan": plan,
        "settings": settings or settings_info(),
        "measurement": measurement,
        "tags": list(tags),
        "turns": [],
        "memory_samples": [],
        "counters": {},
        "summary": None,
    }
    return run


def add_turn(
    run: dict,
    *,
    n_prompt: int,
    n_gen: int,
    ttft_ns: int | None,
    samples_ns: Iterable[int] = (),
    prefill_ts: float | None = None,
    decode_ts: float | None = None,
    prompt_id: str | None = None,
    rep: int = 0,
    warmup: bool = False,
    bytes_read: int | None = None,
    cache_hits: int | None = None,
    cache_misses: int | None = None,
    io_ns: int | None = None,
    compute_ns: int | None = None,
    peak_rss_bytes: int | None = None,
    status: str = STATUS_OK,
    error: str | None = None,
    extra: dict | None = None,
) -> dict:
    """Record one turn (one prompt, one repetition) and return it.

    ttft_ns: prompt start to the first generated token. samples_ns: every time between consecutive
    generated tokens (n_gen - 1 of them when all were timed). prefill_ts defaults to n_prompt / TTFT and
    decode_ts to len(samples_ns) / sum(samples_ns), so every engine is measured alike; pass them only
    for an engine that reports rates and no per-token times. Warm-up turns are kept but not summarised.
    `extra` holds anything else worth keeping (generated text, token ids, engine-specific figures).
    """
    samples = [int(round(s)) for s in samples_ns]
    if prefill_ts is None and ttft_ns and n_prompt:
        prefill_ts = n_prompt / (ttft_ns / 1e9)
    if decode_ts is None and samples and sum(samples) > 0:
        decode_ts = len(samples) / (sum(samples) / 1e9)
    turn = {
        "index": len(run["turns"]),
        "prompt_id": prompt_id,
        "rep": rep,
        "warmup": bool(warmup),
        "status": status,
        "error": " ".join(str(error).split()) if error else None,
        "n_prompt": int(n_prompt),
        "n_gen": int(n_gen),
        "ttft_ns": None if ttft_ns is None else int(round(ttft_ns)),
        "prefill_ts": None if prefill_ts is None else float(prefill_ts),
        "decode_ts": None if decode_ts is None else float(decode_ts),
        "samples_ns": samples,
        "bytes_read": bytes_read,
        "cache_hits": cache_hits,
        "cache_misses": cache_misses,
        "io_ns": io_ns,
        "compute_ns": compute_ns,
        "peak_rss_bytes": peak_rss_bytes,
        "extra": dict(extra or {}),
    }
    run["turns"].append(turn)
    return turn


def tbt_from_times(times_s: Sequence[float]) -> list[int]:
    """The times between tokens, in nanoseconds, from each token's timestamp in seconds: the one way a
    TBT sample is made from token times, whichever engine or mode stamped them."""
    times = list(times_s)
    return [round((b - a) * 1e9) for a, b in zip(times, times[1:], strict=False)]


def add_memory_sample(run: dict, t_s: float, rss_bytes: int, pss_bytes: int | None = None) -> None:
    """One memory reading of the engine process, `t_s` seconds after the run started."""
    run["memory_samples"].append({"t_s": float(t_s), "rss_bytes": int(rss_bytes),
                                  "pss_bytes": None if pss_bytes is None else int(pss_bytes)})  # fmt: skip


def set_counters(
    run: dict,
    *,
    peak_rss_bytes: int | None = None,
    peak_pss_bytes: int | None = None,
    bytes_read: int | None = None,
    cache_hits: int | None = None,
    cache_misses: int | None = None,
    io_ns: int | None = None,
    compute_ns: int | None = None,
    peak_rss_source: str | None = None,
    **extra: int | float | str | None,
) -> None:
    """Run-level figures the engine reports once (its per-run event); they win over sums of turns.
    peak_rss_source: one of PEAK_RSS_SOURCES, where peak_rss_bytes came from."""
    if peak_rss_source is not None and peak_rss_source not in PEAK_RSS_SOURCES:
        raise ValueError(f"peak_rss_source must be one of {PEAK_RSS_SOURCES}, not {peak_rss_source!r}")
    values = {"peak_rss_bytes": peak_rss_bytes, "peak_pss_bytes": peak_pss_bytes, "bytes_read": bytes_read,
              "cache_hits": cache_hits, "cache_misses": cache_misses, "io_ns": io_ns,
              "compute_ns": compute_ns, "peak_rss_source": peak_rss_source, **extra}  # fmt: skip
    run["counters"].update({k: v for k, v in values.items() if v is not None})


def mark_failed(run: dict, status: str, error: str) -> None:
    """The run did not finish, or its numbers cannot be true: status is aborted / device_vanished /
    failed / timeout / invalid; error one line (the reason). Turns recorded so far stay; save_run still
    writes the run so the failure is on record and every view shows it with its reason."""
    if status not in RUN_STATUSES or status == STATUS_OK:
        raise ValueError(f"failure status must be one of {RUN_STATUSES[1:]}, not {status!r}")
    run["status"] = status
    run["error"] = " ".join(str(error).split()) or status


# ---------------------------------------------------------------------------------------------------
# Summaries.


def measured_turns(run: dict) -> list[dict]:
    """The turns summaries and comparisons use: finished, not warm-up."""
    return [t for t in run["turns"] if t["status"] == STATUS_OK and not t["warmup"]]


def tbt_samples_ns(run: dict) -> np.ndarray:
    """Every time between tokens of the measured turns, pooled, in nanoseconds."""
    parts = [t["samples_ns"] for t in measured_turns(run) if t["samples_ns"]]
    return np.concatenate([np.asarray(p, dtype=np.float64) for p in parts]) if parts else np.zeros(0)


def ttft_samples_ns(run: dict) -> np.ndarray:
    values = [t["ttft_ns"] for t in measured_turns(run) if t["ttft_ns"] is not None]
    return np.asarray(values, dtype=np.float64)


def _sum_opt(values: Iterable[int | None]) -> int | None:
    present = [v for v in values if v is not None]
    return sum(present) if present else None


def summarize(run: dict) -> dict:
    """Compute run["summary"] from the turns, memory samples and counters; returns it.

    avg_ts / stddev_ts: mean and sample standard deviation of the per-turn decode tok/s (as llama-bench
    does over repetitions). pooled_ts: all decode tokens over all decode time. decode_ts: THE decode
    statistic (see decode_rate). TBT percentiles pool every measured token; I/O share = io_ns / (io_ns +
    compute_ns).
    """
    turns = measured_turns(run)
    decode = np.asarray([t["decode_ts"] for t in turns if t["decode_ts"] is not None], dtype=np.float64)
    prefill = np.asarray([t["prefill_ts"] for t in turns if t["prefill_ts"] is not None], dtype=np.float64)
    tbt = tbt_samples_ns(run)
    ttft = ttft_samples_ns(run)
    counters = run.get("counters") or {}

    def pct(values: np.ndarray, q: float) -> int | None:
        return int(round(float(np.percentile(values, q)))) if values.size else None

    def counter(name: str) -> int | None:
        if counters.get(name) is not None:
            return counters[name]
        return _sum_opt(t.get(name) for t in turns)

    # The peak RSS is the kernel's (an engine's VmHWM, pi2-rusage's ru_maxrss), never the memory samples:
    # a poll misses whatever happened between two reads. PSS has no kernel peak: its peak is polled.
    rss_values = [counters.get("peak_rss_bytes")] + [t.get("peak_rss_bytes") for t in run["turns"]]
    rss_peak = max((v for v in rss_values if v is not None), default=None)
    pss_values = [counters.get("peak_pss_bytes")] + [m["pss_bytes"] for m in run["memory_samples"]]
    hits, misses = counter("cache_hits"), counter("cache_misses")
    io_ns, compute_ns = counter("io_ns"), counter("compute_ns")
    busy = (io_ns or 0) + (compute_ns or 0)

    summary = {
        "status": run["status"],
        "n_turns": len(turns),
        "n_failed_turns": sum(1 for t in run["turns"] if t["status"] != STATUS_OK),
        "n_prompt_total": sum(t["n_prompt"] for t in turns),
        "n_gen_total": sum(t["n_gen"] for t in turns),
        "avg_ts": float(decode.mean()) if decode.size else None,
        "stddev_ts": float(decode.std(ddof=1)) if decode.size > 1 else (0.0 if decode.size else None),
        "pooled_ts": float(tbt.size / (tbt.sum() / 1e9)) if tbt.size and tbt.sum() > 0 else None,
        "decode_ts": None,  # set below from pooled_ts or the rate-only turns (decode_rate)
        "prefill_avg_ts": float(prefill.mean()) if prefill.size else None,
        "ttft_avg_ns": int(round(float(ttft.mean()))) if ttft.size else None,
        "ttft_p50_ns": pct(ttft, 50),
        "tbt_count": int(tbt.size),
        "tbt_mean_ns": int(round(float(tbt.mean()))) if tbt.size else None,
        "tbt_p50_ns": pct(tbt, 50),
        "tbt_p90_ns": pct(tbt, 90),
        "tbt_p99_ns": pct(tbt, 99),
        "peak_rss_bytes": rss_peak,
        "peak_rss_source": counters.get("peak_rss_source")
        if rss_peak is not None and rss_peak == counters.get("peak_rss_bytes")
        else None,
        "peak_pss_bytes": max((v for v in pss_values if v is not None), default=None),
        "bytes_read": counter("bytes_read"),
        "cache_hit_rate": hits / (hits + misses)
        if hits is not None and misses is not None and hits + misses
        else None,
        "io_share": io_ns / busy if io_ns is not None and compute_ns is not None and busy else None,
        "compute_share": compute_ns / busy if io_ns is not None and compute_ns is not None and busy else None,
    }
    summary["decode_ts"] = _pooled_decode(summary["pooled_ts"], turns)
    run["summary"] = summary
    return summary


# ---------------------------------------------------------------------------------------------------
# The one decode statistic. Every view that says "decode tok/s" shows this number and nothing else; a view
# that shows another statistic (the mean of the per-turn rates, one turn's rate) labels it differently.

DECODE_LABEL = "decode tok/s"
DECODE_MEANING = "all decode tokens over all decode time, pooled over the measured turns"


def _pooled_decode(pooled_ts: float | None, turns: list[dict]) -> float | None:
    """pooled_ts when there are token times; for rate-only turns (an engine that reports rates, no token
    times) the same quantity from the rates: sum(tokens) / sum(tokens / rate), a turn's tokens being its
    n_gen (each rate is its turn's tokens over its decode time, so this is tokens over time again)."""
    if pooled_ts is not None:
        return pooled_ts
    rated = [
        (t["n_gen"], t["decode_ts"]) for t in turns if t["decode_ts"] and not t["samples_ns"] and t["n_gen"]
    ]
    time_s = sum(n / rate for n, rate in rated)
    return sum(n for n, _ in rated) / time_s if rated and time_s > 0 else None


def decode_rate(run: dict) -> float | None:
    """THE decode tok/s of a run (DECODE_LABEL, DECODE_MEANING): summary.decode_ts."""
    summary = run.get("summary") or summarize(run)
    return summary.get("decode_ts")


# ---------------------------------------------------------------------------------------------------
# Validation: a declarative description of every field, checked with messages that name the field.

_INT = "int"
_NUM = "number"
_STR = "str"
_BOOL = "bool"
_DICT = "dict"
_LIST = "list"

# field -> (kind, nullable)
_RUN_FIELDS = {
    "schema_version": (_INT, False),
    "run_id": (_STR, False),
    "created_at": (_STR, False),
    "status": (_STR, False),
    "error": (_STR, True),
    "pi2": (_DICT, False),
    "engine": (_DICT, False),
    "model": (_DICT, False),
    "workload": (_DICT, False),
    "target": (_DICT, False),
    "memory": (_DICT, False),
    "plan": (_DICT, True),
    "settings": (_DICT, False),
    "measurement": (_STR, False),
    "tags": (_LIST, False),
    "turns": (_LIST, False),
    "memory_samples": (_LIST, False),
    "counters": (_DICT, False),
    "summary": (_DICT, True),
}
# Fields a run may have (validated when present; older results simply lack them)
_OPTIONAL_RUN_FIELDS = {
    "llama_bench": (_LIST, False),  # llama-bench's own -o json records, unchanged (--mode llama-bench)
    "farm": (_DICT, False),  # a `pi2 farm run` cell: night, gate, conditions, energy (docs/FARM.md)
    "quality": (_DICT, False),  # divergence from the dense model (pi2 bench --quality, pi2cli.quality)
    "load": (_DICT, False),  # a server under concurrent clients (pi2 bench --mode load, pi2cli.bench.load)
}
# run.quality: point values, their 95% intervals ([low, high] or null) and how they were measured
_QUALITY_FIELDS = {"tokens_scored": (_INT, False), "kl_nats": (_NUM, False), "kl_nats_ci": (_LIST, True),
                   "top1_agreement": (_NUM, False), "top1_agreement_ci": (_LIST, True),
                   "ppl_dense": (_NUM, False), "ppl_sparse": (_NUM, False), "ppl_ratio": (_NUM, False),
                   "ppl_ratio_ci": (_LIST, True), "reference": (_STR, False), "policy": (_STR, False),
                   "memory_budget": (_STR, True), "workload": (_STR, False), "text": (_STR, False),
                   "ctx": (_INT, False), "chunks": (_INT, False), "batch": (_INT, False), "how": (_STR, False)}  # fmt: skip
# (low, high) bounds of the quality numbers: KL of a 2^24-token vocabulary is at most ~17 nats unless a
# distribution is degenerate; perplexities stay below the vocabulary's size times a wide margin.
_QUALITY_RANGE = {"kl_nats": (0.0, 1e3), "top1_agreement": (0.0, 1.0), "ppl_dense": (1.0, 1e9),
                  "ppl_sparse": (1.0, 1e9), "ppl_ratio": (1e-9, 1e9), "tokens_scored": (1, (1 << 53)),
                  "ctx": (1, (1 << 53)), "chunks": (1, (1 << 53)), "batch": (1, (1 << 53))}  # fmt: skip
# run.load: the outcome counts, throughput over the window and percentiles of `pi2 bench --mode load`
_LOAD_FIELDS = {"concurrency": (_INT, False), "duration_s": (_NUM, False), "window_s": (_NUM, False),
                "requests": (_DICT, False), "reasons": (_LIST, False), "retry_after": (_DICT, False),
                "tokens": (_INT, False), "tokens_per_s": (_NUM, False), "requests_per_s": (_NUM, False),
                "client": (_DICT, False), "engine": (_DICT, True), "server_usage": (_DICT, False),
                "server_metrics": (_DICT, True)}  # fmt: skip
_LOAD_REQUESTS = {k: (_INT, False) for k in ("completed", "failed", "rejected", "timed_out", "cancelled")}
_LOAD_REASON = {"outcome": (_STR, False), "reason": (_STR, False), "count": (_INT, False)}
_LOAD_RETRY = {"given": (_INT, False), "missing": (_INT, False), "asked_s": (_NUM, False)}
_LOAD_TIMES = {"ttft_ms": (_DICT, True), "tbt_ms": (_DICT, True)}
_LOAD_PCT = {"p50": (_NUM, False), "p90": (_NUM, False), "p99": (_NUM, False)}
_LOAD_USAGE = {"prompt_tokens": (_INT, True), "completion_tokens": (_INT, True)}
_ENGINE_FIELDS = {"name": (_STR, False), "version": (_STR, True), "commit": (_STR, True),
                  "build_flags": (_STR, True), "build_type": (_STR, True), "policy": (_STR, True),
                  "binary_sha256": (_STR, True)}  # fmt: skip
_MODEL_FIELDS = {"name": (_STR, False), "path": (_STR, True), "sha256": (_STR, True), "quant": (_STR, True),
                 "synthetic": (_BOOL, False), "size_bytes": (_INT, True), "n_params": (_INT, True),
                 "arch": (_STR, True)}  # fmt: skip
_WORKLOAD_FIELDS = {"name": (_STR, False), "n_prompts": (_INT, True), "sha256": (_STR, True),
                    "source": (_STR, True)}  # fmt: skip
_TARGET_FIELDS = {"name": (_STR, False), "kind": (_STR, False)}
_MEMORY_FIELDS = {"budget_bytes": (_INT, True), "enforced": (_BOOL, False), "how": (_STR, True)}
_PI2_FIELDS = {"commit": (_STR, True), "dirty": (_BOOL, True)}
_TURN_FIELDS = {
    "index": (_INT, False),
    "prompt_id": (_STR, True),
    "rep": (_INT, False),
    "warmup": (_BOOL, False),
    "status": (_STR, False),
    "error": (_STR, True),
    "n_prompt": (_INT, False),
    "n_gen": (_INT, False),
    "ttft_ns": (_INT, True),
    "prefill_ts": (_NUM, True),
    "decode_ts": (_NUM, True),
    "samples_ns": (_LIST, False),
    "bytes_read": (_INT, True),
    "cache_hits": (_INT, True),
    "cache_misses": (_INT, True),
    "io_ns": (_INT, True),
    "compute_ns": (_INT, True),
    "peak_rss_bytes": (_INT, True),
    "extra": (_DICT, False),
}
_MEMORY_SAMPLE_FIELDS = {"t_s": (_NUM, False), "rss_bytes": (_INT, False), "pss_bytes": (_INT, True)}
# Upper bounds, so a stored run always fits the SQLite index (INTEGER is 64-bit signed) and a typo such as
# a 1e26-byte budget is refused before it is written instead of breaking every later listing.
INT64_MAX = (1 << 63) - 1
MAX_NS = 10**16  # ~116 days: no turn, token or run lasts longer
MAX_COUNT = 1 << 53  # tokens, turns, reads, hits: exact in a float too
MAX_FILE_BYTES = 1 << 60
_UPPER = {"budget_bytes": MAX_MEMORY_BYTES, "peak_rss_bytes": MAX_MEMORY_BYTES, "peak_pss_bytes": MAX_MEMORY_BYTES,
          "rss_bytes": MAX_MEMORY_BYTES, "pss_bytes": MAX_MEMORY_BYTES, "budget_peak_bytes": MAX_MEMORY_BYTES,
          "size_bytes": MAX_FILE_BYTES, "bytes_read": MAX_FILE_BYTES, "n_params": MAX_COUNT,
          "ttft_ns": MAX_NS, "io_ns": MAX_NS, "compute_ns": MAX_NS, "n_prompt": MAX_COUNT, "n_gen": MAX_COUNT,
          "cache_hits": MAX_COUNT, "cache_misses": MAX_COUNT, "index": MAX_COUNT, "rep": MAX_COUNT,
          "n_prompts": MAX_COUNT, "schema_version": MAX_COUNT, "t_s": MAX_NS / 1e9}  # fmt: skip
# Counters the summary and the index read: integers (the rest of run.counters may be any scalar).
_INT_COUNTERS = ("peak_rss_bytes", "peak_pss_bytes", "bytes_read", "cache_hits", "cache_misses", "io_ns",
                 "compute_ns", "budget_peak_bytes")  # fmt: skip
_NON_NEGATIVE = {"n_prompt", "n_gen", "ttft_ns", "prefill_ts", "decode_ts", "bytes_read", "cache_hits",
                 "cache_misses", "io_ns", "compute_ns", "peak_rss_bytes", "rss_bytes", "pss_bytes",
                 "budget_bytes", "size_bytes", "n_params", "t_s", "rep", "index"}  # fmt: skip


def _kind_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if kind == _STR:
        return isinstance(value, str)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _DICT:
        return isinstance(value, dict)
    return isinstance(value, list)


_KIND_WORDS = {_INT: "an integer", _NUM: "a finite number", _STR: "a string", _BOOL: "true or false",
               _DICT: "an object", _LIST: "a list"}  # fmt: skip


def _check_fields(obj: Any, spec: dict, where: str, *, open_ended: bool = False) -> None:
    if not isinstance(obj, dict):
        raise ResultSchemaError(f"{where}: must be an object")
    for name, (kind, nullable) in spec.items():
        if name not in obj:
            raise ResultSchemaError(f"{where}.{name}: missing")
        value = obj[name]
        if value is None:
            if not nullable:
                raise ResultSchemaError(f"{where}.{name}: must not be null")
            continue
        if not _kind_ok(value, kind):
            raise ResultSchemaError(f"{where}.{name}: must be {_KIND_WORDS[kind]}, not {value!r:.60}")
        if name in _NON_NEGATIVE and value < 0:
            raise ResultSchemaError(f"{where}.{name}: must not be negative, not {value!r}")
        _check_upper(value, kind, f"{where}.{name}", _UPPER.get(name))
    if not open_ended:
        extra = sorted(set(obj) - set(spec))
        if extra:
            raise ResultSchemaError(f"{where}: unknown field {extra[0]!r}")


def _check_upper(value: Any, kind: str, where: str, upper: float | None) -> None:
    if kind in (_INT, _NUM) and upper is not None and value > upper:
        most = format_size(upper) if where.endswith("_bytes") else f"{upper:.4g}"
        raise ResultSchemaError(f"{where}: {value!r:.40} is out of range (at most {most})")
    if kind == _INT and not -INT64_MAX <= value <= INT64_MAX:
        raise ResultSchemaError(f"{where}: {value!r:.40} does not fit 64 bits")


def _check_status(obj: dict, where: str) -> None:
    if obj["status"] not in RUN_STATUSES:
        raise ResultSchemaError(
            f"{where}.status: must be one of {', '.join(RUN_STATUSES)}, not {obj['status']!r}"
        )
    if obj["status"] != STATUS_OK and not obj["error"]:
        raise ResultSchemaError(f"{where}.error: a {obj['status']} record needs a one-line error")
    if obj["error"] is not None and "\n" in obj["error"]:
        raise ResultSchemaError(f"{where}.error: must be one line")


def validate(run: Any) -> None:
    """Raise ResultSchemaError naming the first field that breaks the schema; return None if it holds."""
    if not isinstance(run, dict):
        raise ResultSchemaError("run: must be a JSON object")
    version = run.get("schema_version")
    if isinstance(version, int) and not isinstance(version, bool) and version > SCHEMA_VERSION:
        raise ResultSchemaError(
            f"run.schema_version: {version} is newer than this pi2 reads ({SCHEMA_VERSION}); update pi2"
        )
    _check_fields(run, _RUN_FIELDS | {k: v for k, v in _OPTIONAL_RUN_FIELDS.items() if k in run}, "run")
    if version != SCHEMA_VERSION:
        raise ResultSchemaError(f"run.schema_version: must be {SCHEMA_VERSION}, not {version!r}")
    if not _RUN_ID_RE.match(run["run_id"]):
        raise ResultSchemaError(f"run.run_id: {run['run_id']!r} must be letters, digits, '.', '_' or '-'")
    try:
        parse_time(run["created_at"])
    except ValueError:
        raise ResultSchemaError(f"run.created_at: {run['created_at']!r} is not an ISO-8601 time") from None
    _check_status(run, "run")
    _check_fields(run["pi2"], _PI2_FIELDS, "run.pi2")
    _check_fields(run["engine"], _ENGINE_FIELDS, "run.engine")
    _check_fields(run["model"], _MODEL_FIELDS, "run.model")
    _check_fields(run["workload"], _WORKLOAD_FIELDS, "run.workload")
    _check_fields(run["target"], _TARGET_FIELDS, "run.target", open_ended=True)
    _check_fields(run["memory"], _MEMORY_FIELDS, "run.memory")
    if run["memory"]["enforced"] and run["memory"]["budget_bytes"] is None:
        raise ResultSchemaError("run.memory.enforced: true needs a budget_bytes")
    via = run["settings"].get("via")
    if via is not None and via not in VIAS:
        raise ResultSchemaError(f"run.settings.via: must be one of {', '.join(VIAS)}, not {via!r:.40}")
    if not all(isinstance(tag, str) for tag in run["tags"]):
        raise ResultSchemaError("run.tags: must be a list of strings")
    for key, value in run["counters"].items():
        if value is None:
            continue
        where = f"run.counters.{key}"
        if key in _INT_COUNTERS:
            if not _kind_ok(value, _INT) or value < 0:
                raise ResultSchemaError(f"{where}: must be a non-negative integer, not {value!r:.40}")
            _check_upper(value, _INT, where, _UPPER.get(key))
        elif not (isinstance(value, str | bool) or _kind_ok(value, _NUM)):
            raise ResultSchemaError(
                f"{where}: must be a finite number, a string or a bool, not {value!r:.40}"
            )
        elif _kind_ok(value, _INT):
            _check_upper(value, _INT, where, None)
    source = run["counters"].get("peak_rss_source")
    if source is not None and source not in PEAK_RSS_SOURCES:
        raise ResultSchemaError(
            f"run.counters.peak_rss_source: must be one of {', '.join(PEAK_RSS_SOURCES)}, not {source!r:.60}"
        )
    for i, turn in enumerate(run["turns"]):
        where = f"run.turns[{i}]"
        _check_fields(turn, _TURN_FIELDS, where)
        _check_status(turn, where)
        for j, sample in enumerate(turn["samples_ns"]):
            if not _kind_ok(sample, _INT) or not 0 <= sample <= MAX_NS:
                raise ResultSchemaError(
                    f"{where}.samples_ns[{j}]: must be an integer in [0, {MAX_NS:.0e}] ns, not {sample!r:.40}"
                )
        if len(turn["samples_ns"]) > max(turn["n_gen"] - 1, 0):
            raise ResultSchemaError(
                f"{where}.samples_ns: {len(turn['samples_ns'])} times between tokens for n_gen={turn['n_gen']} "
                f"(at most n_gen - 1)"
            )
        # An engine that reports only rates (llama-bench's tg test, an MLC command runner) has no
        # per-token times and may have no TTFT; every other finished turn needs its TTFT.
        rate_only = turn["decode_ts"] is not None and not turn["samples_ns"]
        if (turn["status"] == STATUS_OK and not turn["warmup"] and turn["ttft_ns"] is None and turn["n_gen"]
                and not rate_only):  # fmt: skip
            raise ResultSchemaError(f"{where}.ttft_ns: a finished turn that generated tokens needs its TTFT")
    for i, record in enumerate(run.get("llama_bench") or []):
        if not isinstance(record, dict):
            raise ResultSchemaError(f"run.llama_bench[{i}]: must be an object")
    if "quality" in run:
        _check_quality(run["quality"])
    if "load" in run:
        _check_load(run["load"])
    for i, sample in enumerate(run["memory_samples"]):
        _check_fields(sample, _MEMORY_SAMPLE_FIELDS, f"run.memory_samples[{i}]")
    if run["status"] == STATUS_OK and not measured_turns(run):
        raise ResultSchemaError("run.turns: an ok run needs at least one finished, measured turn")


def _check_load(load: dict) -> None:
    _check_fields(load, _LOAD_FIELDS, "run.load")
    _check_fields(load["requests"], _LOAD_REQUESTS, "run.load.requests")
    _check_fields(load["retry_after"], _LOAD_RETRY, "run.load.retry_after")
    _check_fields(load["server_usage"], _LOAD_USAGE, "run.load.server_usage")
    for i, reason in enumerate(load["reasons"]):
        _check_fields(reason, _LOAD_REASON, f"run.load.reasons[{i}]")
    for name, delta in (load["server_metrics"] or {}).items():
        if not _kind_ok(delta, _NUM):
            raise ResultSchemaError(
                f"run.load.server_metrics[{name!r:.60}]: must be a finite number, not {delta!r:.40}"
            )
    for clock in ("client", "engine"):
        if load[clock] is None:
            continue
        _check_fields(load[clock], _LOAD_TIMES, f"run.load.{clock}")
        for name, pct in load[clock].items():
            if pct is not None:
                _check_fields(pct, _LOAD_PCT, f"run.load.{clock}.{name}")
    numbers = [("concurrency", load["concurrency"]), ("tokens", load["tokens"])]
    numbers += [(f"requests.{k}", v) for k, v in load["requests"].items()]
    numbers += [(k, load[k]) for k in ("duration_s", "window_s", "tokens_per_s", "requests_per_s")]
    for name, value in numbers:
        if value < 0:
            raise ResultSchemaError(f"run.load.{name}: must not be negative, not {value!r}")
        _check_upper(value, _INT if isinstance(value, int) else _NUM, f"run.load.{name}", MAX_COUNT)


def _check_quality(q: dict) -> None:
    _check_fields(q, _QUALITY_FIELDS, "run.quality")
    for name, (low, high) in _QUALITY_RANGE.items():
        if not low <= q[name] <= high:
            raise ResultSchemaError(
                f"run.quality.{name}: {q[name]!r:.40} is out of range [{low:g}, {high:g}]"
            )
        ci = q.get(f"{name}_ci")
        if ci is not None and not (len(ci) == 2 and all(_kind_ok(v, _NUM) and low <= v <= high for v in ci)
                                   and ci[0] <= ci[1]):  # fmt: skip
            raise ResultSchemaError(f"run.quality.{name}_ci: must be [low, high] within [{low:g}, {high:g}]")


# ---------------------------------------------------------------------------------------------------
# Labels that every table and plot uses, so a run is named the same way everywhere.


def engine_label(run: dict) -> str:
    """ "pi2:dense" for a pi2-engine policy, else the engine name ("llama.cpp"); " via server" when pi2
    drove pi2-engine through its server (settings.via), so no table shows it as the pipe run."""
    name, policy = run["engine"]["name"], run["engine"].get("policy")
    label = f"{name}:{policy}" if policy and policy != name else name
    return label + (" via server" if (run.get("settings") or {}).get("via") == "server" else "")


def model_label(run: dict) -> str:
    """The model name, with " [synthetic]" for generated weights: synthetic models are always labelled."""
    name = run["model"]["name"]
    return f"{name} [synthetic]" if run["model"]["synthetic"] else name


def budget_label(budget_bytes: int | None) -> str:
    # no budget: each engine holds the model in memory (pi2 resident, llama.cpp through the page cache)
    return format_size(budget_bytes, none="none (in memory)")


def status_label(status: str) -> str:
    """How every view names a run's or turn's status (STATUS_LABELS; an unknown one as stored)."""
    return STATUS_LABELS.get(status, str(status))


def status_text(run: dict) -> str:
    """ "ok", or "<status>: <reason>": a run that did not give true numbers says why, wherever it is shown."""
    label = status_label(run["status"])
    return label if run["status"] == STATUS_OK or not run.get("error") else with_reason(label, run["error"])


def with_reason(label: str, error: str) -> str:
    """ "<label>: <reason>", once: a reason that already starts with its label ("aborted: SIGINT ...") is
    not prefixed again."""
    return error if error.startswith(f"{label}:") else f"{label}: {error}"


def target_label(run: dict) -> str:
    """The device a run ran on: "local", "qemu-arm64", an adb serial; with its kind when the name hides it."""
    name, kind = run["target"]["name"], run["target"]["kind"]
    return name if name == kind else f"{name} ({kind})"


def threads_label(threads: int | None) -> str:
    # no --threads: the engine's own default (each engine picks its own, so it is shown, not guessed)
    return "default" if threads is None else str(threads)


def commit_label(run: dict) -> str:
    """The engine's commit, else the pi2 checkout's (first 8 hex digits; "+dirty" for uncommitted changes)."""
    engine = run["engine"].get("commit")
    if engine:
        return str(engine)[:8]
    pi2 = run.get("pi2") or {}
    if not pi2.get("commit"):
        return "-"
    return str(pi2["commit"])[:8] + ("+dirty" if pi2.get("dirty") else "")


class GroupKey(NamedTuple):
    """What a comparison holds fixed: model label, workload, memory budget and whether anything held the
    run to it, device, threads. A local run and a phone run of one engine, runs at 2 and 4 threads, or a
    run held to 32 MiB and one only told 32 MiB (an adb device, an engine pi2 does not start) are never in
    one group. Build it with group_key (a run) or GroupKey.of (a row that holds the same facts)."""

    model: str
    workload: str
    budget_bytes: int | None
    enforced: bool  # False with no budget: there is nothing to hold a run to
    target: str
    threads: int | None

    @classmethod
    def of(cls, *, model: str, workload: str, budget_bytes: int | None, enforced: bool, target: str,
           threads: int | None) -> "GroupKey":  # fmt: skip
        return cls(
            model, workload, budget_bytes, bool(enforced) and budget_bytes is not None, target, threads
        )

    @property
    def budget(self) -> str:
        """The budget as a group's title says it: "(not enforced)" where nothing held the run to it."""
        return budget_held_label(self.budget_bytes, self.enforced)


def group_key(run: dict) -> GroupKey:
    """The group of a run (GroupKey)."""
    return GroupKey.of(model=model_label(run), workload=run["workload"]["name"],
                       budget_bytes=run["memory"]["budget_bytes"], enforced=run["memory"]["enforced"],
                       target=target_label(run), threads=run_threads(run))  # fmt: skip


def budget_held_label(budget_bytes: int | None, enforced: bool) -> str:
    """The budget, marked " (not enforced)" where nothing held the run to it: such a run's memory is not
    comparable with an enforced one's, so every table and group title says so."""
    text = budget_label(budget_bytes)
    return text + " (not enforced)" if budget_bytes is not None and not enforced else text


def run_threads(run: dict) -> int | None:
    """settings.threads as a count, None for the engine's default (or anything that is not a count)."""
    threads = run["settings"].get("threads")
    return threads if isinstance(threads, int) and not isinstance(threads, bool) else None


def group_sort_key(key: GroupKey) -> tuple:
    """Groups in order: model, workload, budget (none first; enforced before not enforced), device,
    threads (default first)."""
    return (key.model, key.workload, -1 if key.budget_bytes is None else key.budget_bytes, not key.enforced,
            key.target, -1 if key.threads is None else key.threads)  # fmt: skip


def group_label(key: GroupKey) -> str:
    """ "model · workload · budget · device · N threads": the title of a group in every view."""
    return " · ".join(
        [key.model, key.workload, key.budget, key.target, f"{threads_label(key.threads)} threads"]
    )
