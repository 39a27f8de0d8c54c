"""`pi2 bench --mode llama-bench`: llama.cpp's own pp/tg benchmark on the GGUF, one run per memory budget.

llama-bench runs to completion on this machine, under pi2-rusage (its peak RSS: the kernel's ru_maxrss)
inside the budget's cgroup (the model evicted first), its memory curve sampled like any engine's. Its
result is one turn per test and repetition (pp: n_prompt and prefill_ts; tg: n_gen and decode_ts;
llama-bench times no first token, so TTFT and TBT stay unknown) and llama-bench's own JSON records,
unchanged, in run["llama_bench"]. The run is recorded as every bench run is (pi2cli.bench.recorder).
"""

from __future__ import annotations

from pi2cli.bench.config import BenchConfig, Reporter
from pi2cli.bench.limit import RunLimit
from pi2cli.bench.recorder import RUN_STOPS, RunOutcome, RunRecorder, new_run
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.targets.base import TargetError

DEFAULT_LLAMA_BENCH_N_GEN = 128
DEFAULT_LLAMA_BENCH_REPEAT = 3


def llama_bench_target(cfg: BenchConfig, drivers: list):
    """The mode's own checks, before the model is resolved: llama.cpp alone, pp or tg sizes above 0,
    and this machine (llama-bench runs here only). Returns the target."""
    from pi2cli.targets import get_target

    others = [d.name for d in drivers if d.name != "llama.cpp"]
    if others:
        raise Pi2Error(f"--mode llama-bench runs llama.cpp's llama-bench; engine '{others[0]}' has no such "
                       f"mode (use --mode chat, or -e llama.cpp alone)")  # fmt: skip
    if cfg.n_prompt < 0 or (cfg.n_gen or 0) < 0 or (cfg.n_prompt == 0 and cfg.n_gen == 0):
        raise Pi2Error("--mode llama-bench needs --n-prompt or --n-gen above 0 (pp and tg tests)")
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    if not target.native_here:
        raise Pi2Error(
            f"--mode llama-bench runs on this machine only (target {target.name} is {target.kind})"
        )
    return target


def run_llama_bench_mode(cfg: BenchConfig, driver, target, model, reporter: Reporter) -> list[RunOutcome]:
    """Every budget's run of llama-bench on `model` (a ModelFiles; its GGUF is what runs)."""
    from pi2cli.hw.rusage import wrapper_binary

    wrapper_binary()  # measures llama-bench's peak memory: missing, nothing runs
    facts = target.facts()
    return [llama_bench_run(cfg, target, facts, driver, model, budget, reporter) for budget in cfg.budgets]


def llama_bench_run(cfg: BenchConfig, target, facts: dict, driver, model, budget_bytes: int | None,
                    reporter: Reporter) -> RunOutcome:  # fmt: skip
    """One llama-bench process -> one result (see the module's docstring)."""
    import contextlib
    import os
    import subprocess

    from pi2cli.engines.llamacpp.server import (
        LLAMA_BENCH_HOW,
        check_llama_bench_exit,
        llama_bench_command,
        parse_llama_bench_json,
    )
    from pi2cli.hw.rusage import Measured

    n_gen = DEFAULT_LLAMA_BENCH_N_GEN if cfg.n_gen is None else cfg.n_gen
    reps = cfg.repeat
    gguf = model.for_engine(".gguf", "llama.cpp")
    cmd = llama_bench_command(gguf, bin_dir=driver.bin_dir, n_prompt=cfg.n_prompt, n_gen=n_gen,
                              threads=cfg.threads, repetitions=reps)  # fmt: skip
    workload = f"llama-bench-pp{cfg.n_prompt}-tg{n_gen}"
    label = f"llama.cpp · {workload}" + (f" · {S.budget_label(budget_bytes)}" if budget_bytes else "")
    run = new_run(
        driver, target, facts, model, gguf, budget_bytes=budget_bytes,
        workload=S.workload_info(workload, n_prompts=int(cfg.n_prompt > 0) + int(n_gen > 0),
                                 source="llama-bench synthetic tokens (-p / -n)"),
        settings=S.settings_info(n_gen=n_gen, threads=cfg.threads, repetitions=reps, warmup=0, mode="llama-bench",
                                 n_prompt=cfg.n_prompt, load_mode="mmap", repack=False, command=cmd[1:]),
        measurement=LLAMA_BENCH_HOW,
        tags=cfg.tags,
    )  # fmt: skip
    rec = RunRecorder(run, target=target, budget_bytes=budget_bytes, label=label, engine=driver.name,
                      workload=workload, reporter=reporter, results_dir=cfg.results_dir,
                      annotate=cfg.annotate)  # fmt: skip
    reporter.run_started(label, 1)
    reporter.turn_started(label, f"pp{cfg.n_prompt}/tg{n_gen}", 1, 1)
    measured = None
    try:
        with rec.budget(budget_bytes, evict=[gguf] if budget_bytes else []) as budget:
            measured = Measured(cmd)  # pi2-rusage joins the cgroup, and llama-bench with it
            with RunLimit(cfg.run_timeout_s) as limit:
                proc = budget.popen(measured.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip

                def kill() -> None:  # pi2-rusage and llama-bench (its own session)
                    if proc.poll() is None:
                        with contextlib.suppress(OSError):
                            os.killpg(proc.pid, 9)
                            proc.wait(10)

                rec.on_failure(kill)
                limit.where = f"in llama-bench pp{cfg.n_prompt}/tg{n_gen} x{reps}"
                stop_sampling = rec.follow(proc.pid, wrapper=True)
                out, err = proc.communicate()
                rec.on_failure(None)
            stop_sampling()
        usage = measured.usage()
        S.set_counters(run, peak_rss_bytes=usage.maxrss_bytes, peak_rss_source=S.PEAK_RSS_WRAPPER)
        check_llama_bench_exit(usage.returncode, err)
        records = parse_llama_bench_json(out)
        add_llama_bench_turns(run, records)
        run["llama_bench"] = records
    except RUN_STOPS as exc:
        return rec.fail(exc)
    finally:
        if measured is not None:
            measured.cleanup()
    rec.finish()
    tg = S.summarize(run)["avg_ts"]  # the mean tg rate (save_run summarises the same run again)
    reporter.turn_done(label, tg, None)
    return rec.save()


def add_llama_bench_turns(run: dict, records: list[dict]) -> None:
    """One turn per llama-bench test and repetition, from its samples_ns / samples_ts."""
    for record in records:
        try:
            n_p, n_g = int(record["n_prompt"]), int(record["n_gen"])
            times = [int(v) for v in record["samples_ns"]]
            rates = [float(v) for v in record["samples_ts"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise Pi2Error(
                f"llama-bench record without n_prompt/n_gen/samples_ns/samples_ts: {exc}"
            ) from None
        if (n_p > 0) == (n_g > 0) or len(times) != len(rates):
            raise Pi2Error(
                f"llama-bench record pp{n_p}/tg{n_g}: expected a pp or a tg test with one rate per time"
            )
        test = f"pp{n_p}" if n_p else f"tg{n_g}"
        for rep, (t_ns, ts) in enumerate(zip(times, rates, strict=True)):
            S.add_turn(run, n_prompt=n_p, n_gen=n_g, ttft_ns=None, prefill_ts=ts if n_p else None,
                       decode_ts=ts if n_g else None, prompt_id=test, rep=rep,
                       extra={"test": test, "t_ns": t_ns, "rates_from": "engine"})  # fmt: skip
