"""The decode calibration `pi2 profile` takes when its --file is a model: the engine itself on the model.

The probes (pi2cli.plan.profile) measure the memory and the storage; three things the prediction needs are
neither, and only a run of the engine on the model shows them (docs/PLAN.md, the profile's `decode`):
  - the named curve: which of a block's neurons the predictors name a step, by hotness rank (the engine's
    `named` event). The hit rate at a cache size is the share of the named neurons on the ranks the cache
    holds; without it the prediction takes the synthetic design's activation curve, which misses the
    predictors' false positives further down the ranks (the 47B shape: a 0.60 hit rate predicted where
    the engine hit 0.44, 1.36x the reads);
  - the compute side of a decode step: the step's time less the time it waited on reads (each token
    event's io_wait_s). The bandwidth probe streams memory with every thread; a decode step gathers
    neuron rows, runs the predictors, the router and attention between barriers, and shares the cores
    with the reads' completions. On 2 vCPUs the step's compute ran ~2x the probe's time for its bytes;
  - a step's time as a line in its reads (step_fit): the engine's own cost of a read on this device,
    wait, completion, copy and the missed neuron's rows together, which the storage curve and the
    memory side, each right on its own, add up wrong (docs/PLAN.md, "the step line").
The run is one `pi2-engine generate` on the target under an engine-enforced budget (half the target's
memory, at most the model: the cache then holds part of the FFN, as in the runs the planner plans; at
least the engine's smallest budget for the run, which a small model's fixed region can make the larger),
sampled text, its first WARMUP tokens untimed. The budget changes the reads, not the compute or the
named curve, so the prediction at other budgets keeps these two and predicts the reads from the storage
curve. The calibration belongs to the model it ran (matched by file size and FFN block count) and to the
compute threads it ran with (other thread counts: scaled by the probe's bandwidth at each).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import statistics
import tempfile
from pathlib import Path

from pi2cli.errors import Pi2Error, failure_line

PROMPT = "The history of the lighthouse on the northern cape begins with a storm that"
TEMPERATURE, SEED = 0.8, 2  # sampled: greedy decoding of a synthetic model loops over a few tokens
WARMUP, TOKENS = 8, 32  # untimed, then timed decode steps
BUDGET_SHARE = 0.5  # of the target's memory


def calibration_budget(model_bytes: int, ram_bytes: int | None) -> int:
    """Half the target's memory, at most the model file (then it runs whole in memory)."""
    share = int(BUDGET_SHARE * ram_bytes) if ram_bytes else model_bytes
    return max(1, min(model_bytes, share))


SMALLEST_JITTER = 512 << 10  # bytes over the engine's measured smallest budget (fitted_budget)


def fitted_budget(target, exe: list[str], model: str, threads: int, budget: int) -> int:
    """`budget`, raised to the engine's own smallest budget for the calibration's settings where it is below
    it: a small model's fixed region (KV cache, scratch) can outweigh its file. Asked on the target
    (`pi2-engine size` there); the smallest moves a little with the budget asked, as the scratch follows
    it, so it is asked again at the raised one. The smallest counts the engine's resident pages as it
    finds them, which move between processes (the 16 MB synthetic model: 35.00-35.17 MB over 8 runs), so
    the raised budget keeps SMALLEST_JITTER above it: the calibration run, a process of its own, must
    not find it too small."""
    from pi2cli.plan.min_budget import size_on_target

    for _ in range(3):
        least, fits = size_on_target(target, exe, model, "powerinfer2", None, threads, budget)
        if fits:
            return budget
        budget = least + SMALLEST_JITTER
    return budget  # the engine's own error line says what does not fit


def engine_command(
    exe: list[str], model: str, budget: int, threads: int, events: str, tokens: int
) -> list[str]:
    return [*exe, "generate", "-m", model, "--policy", "powerinfer2", "-p", PROMPT, "-n", str(WARMUP + tokens), "--ignore-eos",
            "--temperature", str(TEMPERATURE), "--seed", str(SEED), "--threads", str(threads),
            "--memory-budget", str(budget), "--events", events]  # fmt: skip


def decode_section(lines: list[str], budget: int, threads: int, membw_bytes_per_s: float) -> dict:
    """The profile's `decode` object from a calibration run's events (JSONL lines)."""
    events = [json.loads(x) for x in lines if x.strip().startswith("{")]
    tokens = [e for e in events if e.get("event") == "token"]
    named = next((e for e in reversed(events) if e.get("event") == "named"), None)
    start = next((e for e in events if e.get("event") == "start"), {})
    summary = next((e for e in reversed(events) if e.get("event") == "summary"), {})
    timed = tokens[WARMUP:]
    if len(timed) < 3 or named is None or "io_wait_s" not in timed[0]:
        raise Pi2Error("the decode calibration run gave no sparse decode to time (a model without "
                       f"predictors runs dense: {len(tokens)} tokens, named event {'present' if named else 'absent'})")  # fmt: skip
    steps = decode_steps(timed)
    reads = [float(b.get("reads", 0)) for b in timed[1:]]
    lookups = sum(t.get("hits", 0) + t.get("misses", 0) for t in timed[1:])
    n_prompt = int(start.get("n_prompt") or 0)
    return {
        "model": {
            "file_bytes": int(summary.get("model_bytes") or 0),
            "blocks": len(named.get("by_block") or []),
        },
        "threads": threads,
        "membw_bytes_per_s": membw_bytes_per_s,  # the probe's at these threads, to scale to other counts
        "budget_bytes": budget,
        "prompt_tokens": n_prompt,
        "warmup_tokens": WARMUP,
        "timed_steps": len(steps),
        "position": n_prompt + WARMUP + len(timed) // 2,  # the timed steps' middle KV position
        "tbt_s": statistics.median(dt for dt, _ in steps),
        "io_wait_s": statistics.median(w for _, w in steps),
        "compute_s": statistics.median(dt - w for dt, w in steps),
        "hit_rate": (sum(t.get("hits", 0) for t in timed[1:]) / lookups) if lookups else None,
        "reads_per_token": sum(t.get("reads", 0) for t in timed[1:]) / len(steps),
        "two_phase": summary.get("two_phase"),
        "step_fit": step_fit(reads, [dt for dt, _ in steps]),
        "named": {k: named[k] for k in ("decode_steps", "rank_bins", "by_rank")},
    }


def decode_steps(tokens: list[dict]) -> list[tuple[float, float]]:
    """Each decode step of a run's token events (from the second on): (its time, its wait on reads)."""
    return [(b["t"] - a["t"], b.get("io_wait_s", 0.0)) for a, b in zip(tokens, tokens[1:], strict=False)]


def step_fit(reads: list[float], step_s: list[float]) -> dict | None:
    """A decode step's time as a line in its storage reads, least squares over the timed steps: the
    engine's own cost of a read on this device (the wait, the completion, the copy into the cache and the
    missed neuron's rows, with whatever of it overlaps) and of a step without one. Sampled text routes
    each step to other experts, so the reads of a step spread (the 47B shape: 12k to 108k a step, r2 0.96);
    None where they do not spread enough to fit a slope."""
    import numpy as np

    r, y = np.asarray(reads, float), np.asarray(step_s, float)
    if len(r) < 8 or r.std() < 0.1 * max(r.mean(), 1.0):
        return None
    per_read, base = np.polyfit(r, y, 1)
    if per_read <= 0 or base <= 0:  # the fit runs backwards: the steps' time is not the reads'
        return None
    fitted = base + per_read * r
    r2 = 1.0 - float(((y - fitted) ** 2).sum() / max(((y - y.mean()) ** 2).sum(), 1e-30))
    return {"base_s": float(base), "per_read_s": float(per_read), "r2": round(r2, 4), "steps": len(r),
            "reads_min": int(r.min()), "reads_max": int(r.max())}  # fmt: skip


def calibrate(target, exe: list[str], model: str, model_bytes: int, threads: int, ram_bytes: int | None,
              membw_bytes_per_s: float, budget: int | None = None, tokens: int = TOKENS) -> dict:  # fmt: skip
    """Run the engine on `model` (`model_bytes` long, as the storage probe found it) on `target` and return
    the profile's `decode` object."""
    from pi2cli.targets import TargetError

    if budget is None:  # the default; a budget the user named is run as named
        budget = fitted_budget(target, exe, model, threads, calibration_budget(model_bytes, ram_bytes))
    with tempfile.TemporaryDirectory(prefix="pi2-calibrate-") as tmp:
        events = (
            str(Path(tmp) / "events.jsonl")
            if target.on_this_machine
            else f"{target.workdir}/calibrate-events.jsonl"
        )
        argv = engine_command(exe, model, budget, threads, events, tokens)
        try:
            done = target.sh(" ".join(shlex.quote(a) for a in argv), timeout=1800)
            if done.returncode != 0:
                why = failure_line(done.stderr or done.stdout, f"exit {done.returncode}", "pi2-engine")
                raise Pi2Error(f"decode calibration on {target.name}: pi2-engine failed: {why}")
            if target.on_this_machine:
                text = Path(events).read_text()
            else:
                text = target.sh(f"cat {shlex.quote(events)}").stdout
        except (TargetError, OSError) as exc:
            raise Pi2Error(f"decode calibration on {target.name}: {exc}") from None
        finally:
            if not target.on_this_machine:
                with contextlib.suppress(TargetError):
                    target.sh(f"rm -f {shlex.quote(events)}")
    return decode_section(text.splitlines(), budget, threads, membw_bytes_per_s)


def applies(decode: dict | None, file_bytes: int, n_blocks: int) -> bool:
    """Whether a profile's calibration was measured on this model (same file size and FFN blocks)."""
    model = (decode or {}).get("model") or {}
    return bool(file_bytes) and model.get("file_bytes") == file_bytes and model.get("blocks") == n_blocks
