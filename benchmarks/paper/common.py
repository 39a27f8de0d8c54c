"""What every `pi2 repro` experiment shares: the models, the runs, the machine's curves, the report.

Runs reuse the benchmarks' own runners (benchmarks/sparse_decode.py: pi2-engine generate under a
memory cgroup with events, pi2-probe), so a repro figure and a benchmark figure are the same
measurement. llama.cpp is bounded twice: by tokens (`--llama-tokens`) and by time (`--llama-timeout`);
a run that hits the time bound is reported as "< N/T tok/s" (an upper bound), never as a number.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT, cache_dir

sys.path.insert(0, str(REPO_ROOT / "benchmarks"))
import sparse_decode  # noqa: E402  (benchmarks/ is not a package: its scripts import each other so)

GiB, MiB = 2**30, 2**20
# the scaled-down shapes --small runs (CI): synthetic, seconds to make, every experiment in seconds
SMALL = {
    "turbosparse-mixtral-47b": dict(n_layer=2, hidden=512, ffn=2048, calib_seqs=6, eval_seqs=2),
    "turbosparse-mistral-7b": dict(n_layer=4, hidden=512, ffn=8192, calib_seqs=6, eval_seqs=2),
}


@dataclass
class Ctx:
    out: Path
    small: bool = False
    n_tokens: int = 16  # pi2 tokens per run
    warmup: int = 2
    seeds: tuple[int, ...] = (1,)
    threads: int = 2
    llama_tokens: int = 8
    llama_timeout_s: float = 600.0
    profile_seconds: float = 1.0
    log: object = print
    _profiles: dict = field(default_factory=dict)

    def say(self, msg: str) -> None:
        self.log(msg)


# ------------------------------------------------------------------------------------------- models
def model_dir(ctx: Ctx, like: str) -> Path:
    """The full-size model from the store (synthetic or real, as stored), or with --small a
    scaled-down synthetic one made here once (deterministic: the same bytes every time)."""
    from pi2cli.models import store
    from pi2cli.models.registry import get_model

    spec = get_model(like)
    if not ctx.small:
        found = store.find(spec)
        if found is None or found.pi2 is None or found.gguf is None:
            raise Pi2Error(store.missing_message(spec))
        return found.pi2.parent
    from pi2cli.models import synth

    out = cache_dir() / "repro-small" / like
    if not ((out / "model.pi2").is_file() and (out / "model.gguf").is_file()):
        ctx.say(f"making the scaled-down synthetic {like} for --small in {out}")
        synth.synthesize(synth.SynthConfig(like=like, **SMALL[like]), out)
    return out


def facts(model: Path):
    from pi2cli.plan.facts import model_facts

    return model_facts(model / "model.pi2")


def fixed_bytes(model: Path, threads: int, budget: int = 0, ctx_len: int = 4096) -> int:
    """The fixed region the engine will hold at `budget` (pi2 plan's estimate; its margin is 1% of it)."""
    from pi2cli.plan.facts import fixed_region

    return int(fixed_region(facts(model), budget, ctx_len, threads)["total"])


def offload_budget(ctx: Ctx, model: Path, in_memory_share: float) -> int:
    """Budget that holds the fixed region plus `in_memory_share` of the FFN's bytes (+8 MiB slack).
    The fixed region is taken for a short context (generate's), and its 1%-of-budget margin solved for."""
    m = facts(model)
    base = fixed_bytes(model, ctx.threads, 0, ctx_len=256) + int(in_memory_share * m.ffn_bytes) + 8 * MiB
    return int(base / 0.99)


# --------------------------------------------------------------------------------------------- runs
def storage_iops(ctx: Ctx, file: Path) -> float:
    """8 KiB random reads a second over `file` right now (O_DIRECT, queue depth 32, 1 s; 0.2 s with
    --small). This VM's storage moves with its neighbours within minutes (5.5k to 61k within one
    hour), so each budgeted run records the rate it started on beside its own figures."""
    seconds = "0.2" if ctx.small else "1"
    r = sparse_decode.probe(
        ["storage", "--file", str(file), "--block", "8192", "--qd", "32", "--seconds", seconds]
    )
    return float(r["iops"])


def pi2(ctx: Ctx, model: Path, policy: str, budget: int | None, more: tuple[str, ...] = ()) -> dict:
    """pi2-engine generate (the median of ctx.seeds runs), sparse_decode's runner and figures; under a
    budget each run also records the storage rate measured just before it (storage_iops)."""
    runs = []
    for seed in ctx.seeds:
        iops = storage_iops(ctx, model / "model.pi2") if budget else None
        run = sparse_decode.run_pi2(model / "model.pi2", policy, budget, ctx.n_tokens, ctx.threads, ctx.warmup,
                                    seed, more)  # fmt: skip
        runs.append(run | ({"storage_iops_before": iops} if iops else {}))
    ok = [r for r in runs if "error" not in r]
    if not ok:
        return runs[0]
    return sparse_decode.median_run(ok)


def steady_warmup(ctx: Ctx) -> int:
    """Decode tokens run before the timed ones where the steady state is measured (the planner's
    prediction is for it, and so is the paper's TBT table). The cold region fills only as misses
    arrive: on the 47B shape at 19 GiB the hit rate climbed from 0.87-0.95 over the first 16 tokens to
    0.98-0.99 by tokens 32-64 (predicted 0.974), so in the sweeps' window (2 untimed, then 14) it read
    twice what the steady state does. The planner's validation and the TBT table time the tokens after
    it."""
    return 4 if ctx.small else 32


def hit_rate(tokens: list[dict]) -> float | None:
    """Hit rate over these tokens' lookups (the summary's also counts the prompt's)."""
    hits, misses = sum(e.get("hits", 0) for e in tokens), sum(e.get("misses", 0) for e in tokens)
    return hits / (hits + misses) if hits + misses else None


def pi2_tokens(ctx: Ctx, model: Path, budget: int | None, policy: str = "powerinfer2") -> dict:
    """One run keeping every token's time and its I/O and compute seconds (TBT, I/O share): ctx.n_tokens
    timed after steady_warmup's untimed decode tokens."""
    import tempfile

    from pi2cli.engines.pi2.driver import engine_binary, parse_events
    from pi2cli.hw.cgroup import run_budgeted

    with tempfile.TemporaryDirectory() as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = [str(engine_binary()), "generate", "-m", str(model / "model.pi2"), "-p", sparse_decode.PROMPT,
               "-n", str(steady_warmup(ctx) + ctx.n_tokens), "--temperature", str(sparse_decode.TEMPERATURE), "--seed", str(ctx.seeds[0]),
               "--ignore-eos", "--threads", str(ctx.threads), "--policy", policy, "--events", str(events)]  # fmt: skip
        if budget:
            cmd += ["--memory-budget", str(budget)]
        done = run_budgeted(cmd, budget, evict=[model / "model.pi2"], timeout=3600)
        if done.returncode != 0:
            return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
        ev = parse_events(events.read_text().splitlines())
    toks = ev["token"][steady_warmup(ctx) :]
    times = [e["t"] for e in toks]
    timed_hits = hit_rate(toks[1:])
    return {
        "tbt_ms": [1e3 * (b - a) for a, b in zip(times, times[1:], strict=False)],
        "io_s": [e.get("io_wait_s", 0.0) for e in toks[1:]],
        "compute_s": [e.get("compute_s", 0.0) for e in toks[1:]],
        "hit_rate": timed_hits if timed_hits is not None else ev["summary"].get("hit_rate"),
        "peak_rss_bytes": ev["summary"].get("peak_rss_bytes"),
    }


def llama(ctx: Ctx, model: Path, budget: int | None, n_prompt: int = 0, n_gen: int | None = None) -> dict:
    """llama-bench on the GGUF twin, bounded by tokens and by time (docstring above). In memory the
    file is read into the page cache by a first, unmeasured run, and llama.cpp runs its best layout
    (--repack 1: weights interleaved for its kernels; 1.7x its --repack 0 decode on the 7B shape);
    under a budget it runs from the mapping (--repack 0: repacking copies every weight into anonymous
    memory, which a budget smaller than the model cannot hold)."""
    from pi2cli.engines.llamacpp.server import default_bin_dir
    from pi2cli.hw.cgroup import run_budgeted

    n = ctx.llama_tokens if n_gen is None else n_gen
    gguf = model / "model.gguf"
    cmd = [str(default_bin_dir("host") / "llama-bench"), "-m", str(gguf), "-p", str(n_prompt), "-n", str(n),
           "-t", str(ctx.threads), "-r", "1", "--repack", "1" if budget is None else "0", "-lm", "mmap", "-o", "json"]  # fmt: skip
    if budget is None:
        subprocess.run(cmd, capture_output=True, text=True, timeout=ctx.llama_timeout_s)
    t0 = time.monotonic()
    try:
        done = run_budgeted(cmd, budget, evict=[] if budget is None else [gguf], timeout=ctx.llama_timeout_s)
    except subprocess.TimeoutExpired:
        secs = time.monotonic() - t0
        return {"bounded": True, "decode_tps_below": n / secs, "tokens": n, "seconds": round(secs, 1),
                "note": f"stopped at the {ctx.llama_timeout_s:.0f} s bound before {n} tokens: < {n / secs:.3f} tok/s"}  # fmt: skip
    if done.returncode != 0:
        return {"error": (done.stderr.strip().splitlines() or ["?"])[-1]}
    rows = json.loads(done.stdout)
    out = {"tokens": n, "seconds": round(time.monotonic() - t0, 1), "bounded": False}
    for r in rows:
        if r.get("n_gen"):
            out["decode_tps"] = r["avg_ts"]
        if r.get("n_prompt"):
            out["prefill_tps"] = r["avg_ts"]
    return out


def tps(run: dict) -> float | None:
    return run.get("decode_tps")


def kiops(run: dict) -> str:
    """The storage rate a budgeted run started on (storage_iops), in thousands of reads a second."""
    iops = run.get("storage_iops_before")
    return f"{iops / 1000:.1f}k" if iops else "-"


def fmt_tps(run: dict) -> str:
    if "error" in run:
        return "failed"
    if run.get("bounded"):
        return f"< {run['decode_tps_below']:.3f}"
    v = run.get("decode_tps")
    return "-" if v is None else f"{v:.3f}"


# ------------------------------------------------------------------------------------ machine curves
def machine_profile(ctx: Ctx, file: Path) -> dict:
    """Memory bandwidth and the storage curve over `file`, measured now (pi2 profile's probe)."""
    key = str(file)
    if key not in ctx._profiles:
        from pi2cli.plan.profile import profile_target

        ctx.say(f"measuring memory bandwidth and the storage curve over {file.name} (pi2-probe)")
        ctx._profiles[key] = profile_target("local", str(file), seconds=ctx.profile_seconds)
    return ctx._profiles[key]


def curves_summary(profile: dict) -> dict:
    return {
        "membw_gb_per_s": {str(r["threads"]): r["gb_per_s"] for r in profile["membw"]},
        "storage_random_read": [{k: p[k] for k in ("block", "qd", "mb_per_s", "iops")} for p in profile["storage"]["curve"]],
        "storage_method": profile["storage"].get("method"),
    }  # fmt: skip


# ------------------------------------------------------------------------------------------- report
def table(headers: list[str], rows: list[list]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers)


def save(ctx: Ctx, name: str, result: dict, plot=None) -> Path:
    """DIR/NAME.json (+ DIR/NAME.png when `plot(ax)` is given)."""
    ctx.out.mkdir(parents=True, exist_ok=True)
    result = {"experiment": name, "small": ctx.small, "synthetic": True, **result}
    path = ctx.out / f"{name}.json"
    path.write_text(json.dumps(result, indent=1, default=str) + "\n")
    if plot is not None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        plot(ax)
        fig.tight_layout()
        fig.savefig(ctx.out / f"{name}.png", dpi=100)
        plt.close(fig)
    return path


def monotone(values: list[float | None], slack: float = 0.0) -> bool:
    vals = [v for v in values if v is not None]
    return len(vals) == len(values) and all(
        b >= a * (1 - slack) for a, b in zip(vals, vals[1:], strict=False)
    )


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None
