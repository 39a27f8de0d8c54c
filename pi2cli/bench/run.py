"""`pi2 bench`: run engines x workloads on a target and record TTFT, TBT and memory, one result per run.

One run = one engine x one workload x one memory budget. For every conversation of the workload (and
every --repeat), each user turn's prompt is the whole conversation so far, rendered with the model's
own chat template, including the engine's OWN earlier answers; the engine process lives for the whole
run and keeps its KV cache across turns (pi2-engine chat; llama-server with cache_prompt). Before each
run the bench waits for the device to cool below --cool-below where it reports a temperature.

run_bench resolves everything first, then runs each mode: chat here (run_one), llama-bench in
pi2cli.bench.llama_bench (`--mode pp-tg` is pi2cli.bench.sweep). Every mode records its runs the same
way (pi2cli.bench.recorder): the memory curve while the engine runs, the budget's cgroup record, and the
save, also when a run fails (status aborted / device_vanished / failed / timeout, with the turns
finished so far); --run-timeout limits each run (pi2cli.bench.limit).

The functions here are plain; pi2cli/commands/bench.py is the click front. `Reporter` is how the
bench talks to a user (rich progress in the command, silence in tests).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.bench.config import MODES, BenchConfig, Reporter
from pi2cli.bench.limit import RunLimit, check_run_timeout
from pi2cli.bench.llama_bench import DEFAULT_LLAMA_BENCH_REPEAT, llama_bench_target, run_llama_bench_mode
from pi2cli.bench.recorder import RUN_STOPS, RunOutcome, RunRecorder, file_sha256, new_run
from pi2cli.engines.base import TurnFailed
from pi2cli.errors import Pi2Error
from pi2cli.model_files import ModelFiles, context_for, resolve_model
from pi2cli.results import columns as C
from pi2cli.results import schema as S
from pi2cli.targets.base import TargetError
from pi2cli.units import parse_size
from pi2cli.workloads import (
    Conversation,
    load_workload,
    workload_path,
)

DEFAULT_COOL_BELOW_PHONE = 45.0


# ---------------------------------------------------------------------------------------------- cooling
def wait_until_cool(target, below: float | None, timeout_s: float, reporter: Reporter) -> float | None:
    """Wait until the target reports a temperature below `below` (None / 0: no waiting). Returns the
    last temperature read (None when the target reports none)."""
    if not below:
        return None
    temp = target.temperature()
    if temp is None:
        return None
    deadline = time.monotonic() + timeout_s
    while temp >= below and time.monotonic() < deadline:
        reporter.message(f"{target.name} at {temp:.1f} °C: waiting to cool below {below:.0f} °C")
        time.sleep(min(10.0, max(0.0, deadline - time.monotonic())))
        temp = target.temperature() or temp
    if temp >= below:
        reporter.message(f"{target.name} still {temp:.1f} °C after {timeout_s:.0f} s: running anyway")
    return temp


# ------------------------------------------------------------------------------------------------ runs
@dataclass
class Prepared:
    """An engine ready to run on the target: where its binary and model are there."""

    driver: object
    model_local: Path
    model_remote: str
    binary_dir: str | None
    floor: dict = field(default_factory=dict)  # the bandwidth floor of its TBT (pi2cli.bench.floor)


def prepare_engine(driver, target, model: ModelFiles, reporter: Reporter) -> Prepared:
    """Local targets run the build and model in place; devices get them through pi2cli.hw.push (skipping
    what is already there)."""
    reason = driver.supports(target)
    if reason:
        raise Pi2Error(reason)
    local_model = model.for_engine(driver.model_suffix, driver.name)
    driver.configure(target, local_model)
    if getattr(driver, "policy", None) == "dense" and local_model.suffix == ".pi2":
        from pi2cli.models.convert_any import runs_dense_note

        note = runs_dense_note(local_model)  # a sparse-kind model without predictors: said, not hidden
        if note:
            reporter.message(f"{driver.name}: {note}")
    if target.on_this_machine:
        return Prepared(driver, local_model, str(local_model), None)
    from pi2cli.hw.push import collect_items, push_files

    workdir = target.workdir
    items = collect_items(target, workdir, models=[local_model], **driver.files(target))
    reporter.message(f"pushing {', '.join(i.local.name for i in items)} to {target.name}")
    report = push_files(target, items, workdir)
    copied = sum(1 for f in report.files if f.action == "copied")
    reporter.message(f"{target.name}: {copied} copied, {len(report.files) - copied} already there")
    model_remote = next(i.remote for i in items if i.kind == "model")  # named by model and content hash
    return Prepared(driver, local_model, model_remote, f"{workdir.rstrip('/')}/bin")


def run_one(
    cfg: BenchConfig,
    target,
    facts: dict,
    prepared: Prepared,
    model: ModelFiles,
    workload: str,
    conversations: list[Conversation],
    budget_bytes: int | None,
    reporter: Reporter,
) -> RunOutcome:
    """One engine x workload x budget: every conversation (x repeat) through one engine process."""
    driver = prepared.driver
    label = f"{driver.name} · {workload}" + (f" · {S.budget_label(budget_bytes)}" if budget_bytes else "")
    wl_path = workload_path(workload)
    run = new_run(
        driver, target, facts, model, prepared.model_local, budget_bytes=budget_bytes,
        workload=S.workload_info(workload, n_prompts=len(conversations), sha256=file_sha256(wl_path),
                                 source=str(wl_path.name)),
        settings=S.settings_info(n_gen=cfg.n_gen, threads=cfg.threads, repetitions=cfg.repeat, warmup=0,
                                 temperature=0.0, seed=cfg.seed or 0, ctx=cfg.ctx, ignore_eos=cfg.ignore_eos,
                                 limit=cfg.limit, **driver.extra_settings,
                                 **({"via": driver.via} if driver.via else {})),
        measurement=driver.how,
        tags=cfg.tags,
    )  # fmt: skip
    rec = RunRecorder(run, target=target, budget_bytes=budget_bytes, label=label, engine=driver.name,
                      workload=workload, reporter=reporter, results_dir=cfg.results_dir,
                      annotate=cfg.annotate)  # fmt: skip
    total_turns = cfg.repeat * sum(len(c.turns) for c in conversations)
    reporter.run_started(label, total_turns)
    temp = wait_until_cool(target, cfg.cool_below, cfg.cool_timeout_s, reporter)
    if temp is not None:
        run["target"]["temperature_c"] = temp
    # A budget binds only on this machine (cgroup); on a device it is recorded as not enforced.
    # An engine pi2 does not start (an MLC server) cannot be put in a cgroup: recorded as not enforced.
    outside = driver.budget_outside
    local_budget = budget_bytes if target.on_this_machine and not outside else None
    if budget_bytes and outside:
        rec.budget_record = {"enforced": False, "how": f"not enforced: {outside}"}
    try:
        # the limit runs from the engine's start to its stop (not the cooling wait, nor --quality)
        evict = [prepared.model_local] if local_budget else []
        with rec.budget(local_budget, evict=evict) as budget, RunLimit(cfg.run_timeout_s) as limit:
            session = driver.open_chat(target, prepared.model_remote, binary_dir=prepared.binary_dir,
                                       threads=cfg.threads, n_ctx=cfg.ctx,
                                       cgroup=budget if local_budget else None, seed=cfg.seed or 0,
                                       budget_bytes=budget_bytes)  # fmt: skip
            rec.on_failure(session.kill)
            stop_sampling = rec.follow(session.pid)
            for rep in range(cfg.repeat):
                for conv in conversations:
                    answers: list[str] = []
                    for k, budget_tokens in enumerate(conv.max_new_tokens):
                        limit.where = (f"in {conv.id} turn {k + 1}/{len(conv.turns)}, "
                                       f"{len(S.measured_turns(run))} turn(s) finished")  # fmt: skip
                        n_predict = cfg.n_gen or budget_tokens
                        messages = conv.messages_for_turn(k, answers)
                        prompt = model.template.render(messages)
                        reporter.turn_started(label, conv.id, k + 1, len(conv.turns))
                        try:
                            t = session.turn(prompt, n_predict, ignore_eos=cfg.ignore_eos, messages=messages)
                        except TurnFailed as exc:
                            # The engine is up but refused this turn: record it, go to the next conversation.
                            S.add_turn(run, n_prompt=0, n_gen=0, ttft_ns=None, prompt_id=f"{conv.id}#{k}",
                                       rep=rep, status="failed", error=str(exc))  # fmt: skip
                            reporter.message(f"{label}: {conv.id} turn {k + 1} failed: {exc}")
                            break
                        answers.append(t.text)
                        turn = S.add_turn(run, **t.turn_fields(), prompt_id=f"{conv.id}#{k}", rep=rep)
                        reporter.turn_done(label, turn["decode_ts"],
                                           None if t.ttft_s is None else t.ttft_s * 1e3)  # fmt: skip
            limit.where = f"stopping the engine, {len(S.measured_turns(run))} turn(s) finished"
            stop_sampling()
            counters = session.close()
            rec.on_failure(None)
        S.set_counters(run, **{k: v for k, v in counters.items() if v is not None})
    except RUN_STOPS as exc:
        return rec.fail(exc)
    rec.finish()
    if not S.measured_turns(run):
        first = next((t["error"] for t in run["turns"] if t["error"]), "no turn ran")
        S.mark_failed(run, "failed", f"every turn failed: {first}")
    from pi2cli.bench.floor import apply_floor

    invalid = apply_floor(run, prepared.floor)  # token times faster than the weights can be read: invalid
    if invalid:
        reporter.message(f"{label}: invalid: {invalid}")
    from pi2cli.hw.cgroup import peak_over_budget

    over = peak_over_budget(run["counters"].get("peak_rss_bytes"), run["memory"],
                            run["counters"].get("budget_peak_bytes"))  # fmt: skip
    if over:  # stored beside the peak, so no table shows a peak above its budget without a word why
        S.set_counters(run, peak_over_budget=over)
        reporter.message(f"{label}: {over}")
    rec.annotate()  # before --quality, which runs the host engine (pi2 farm's energy stops here)
    if cfg.quality:  # measured here, with the host engine, on the same file, policy and budget
        from pi2cli.quality.bench_hook import attach_quality

        reporter.message(
            f"{label}: " + attach_quality(run, prepared.model_local, workload, budget_bytes, cfg.threads)
        )
    return rec.save()


def apply_engine_options(drivers: list, cfg: BenchConfig) -> None:
    """The bench options that belong to one engine (each driver declares its own: llama.cpp's build,
    llmflash's window, MLC's runner, pi2's plan): every one that was given goes to its driver."""
    given = {name: value for name, value in vars(cfg).items() if value is not None}
    for d in drivers:
        for name in d.options:
            if name in given:
                d.set_option(name, given[name])


def plan_budget(cfg: BenchConfig) -> None:
    """With --plan and no --memory-budget, the bench runs under the plan's budget (enforced as any)."""
    if not cfg.plan or any(b is not None for b in cfg.budgets):
        return
    from pi2cli.plan.plan import load_plan

    value = load_plan(cfg.plan).get("memory_budget")
    if value is not None:
        cfg.budgets = [parse_size(value, what=f"plan {cfg.plan}: memory_budget")]


def run_bench(cfg: BenchConfig, reporter: Reporter | None = None) -> list[RunOutcome]:
    """Resolve everything first (so a typo fails before anything runs), then every run in turn."""
    from pi2cli.engines import get_driver
    from pi2cli.targets import get_target

    reporter = reporter or Reporter()
    if cfg.repeat is None:
        cfg.repeat = DEFAULT_LLAMA_BENCH_REPEAT if cfg.mode == "llama-bench" else 1
    if cfg.repeat < 1:
        raise Pi2Error(f"--repeat must be at least 1, got {cfg.repeat}")
    if cfg.mode != "llama-bench" and cfg.n_gen is not None and cfg.n_gen < 1:
        raise Pi2Error(f"--n-gen must be at least 1, got {cfg.n_gen}")
    if cfg.mode not in MODES:
        raise Pi2Error(f"--mode {cfg.mode!r}: use one of {', '.join(MODES)}")
    check_run_timeout(cfg.run_timeout_s)
    from pi2cli.results import store

    store.check_writable(
        cfg.results_dir
    )  # a read-only or impossible --results-dir fails now, not after the runs
    drivers = [get_driver(name, cfg.via) for name in dict.fromkeys(cfg.engines)]
    if cfg.plan and "pi2" not in [d.name for d in drivers]:
        raise Pi2Error("--plan is for the pi2 engine (-e pi2); no pi2 run was asked for")
    apply_engine_options(drivers, cfg)
    plan_budget(cfg)
    if cfg.mode == "llama-bench":
        target = llama_bench_target(cfg, drivers)
        model = resolve_model(cfg.model, convert_missing_pi2=False, reporter=reporter, template=False)
        (driver,) = drivers  # llama.cpp alone (llama_bench_target)
        return run_llama_bench_mode(cfg, driver, target, model, reporter)
    workloads = {name: load_workload(name, cfg.limit, cfg.seed) for name in dict.fromkeys(cfg.workloads)}
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    for d in drivers:
        reason = d.supports(target)
        if reason:
            raise Pi2Error(reason)
    if cfg.cool_below is None:
        cfg.cool_below = 0 if target.on_this_machine else DEFAULT_COOL_BELOW_PHONE
    model = resolve_model(cfg.model, convert_missing_pi2=any(d.model_suffix == ".pi2" for d in drivers),
                          reporter=reporter)  # fmt: skip
    if cfg.ctx is None:
        cfg.ctx = max(context_for(c, model.template, cfg.n_gen) for c in workloads.values())
    from pi2cli.plan.min_budget import check_bench

    # the engine's own smallest budget for these settings, the same rule on every path (nothing run yet)
    check_bench([d.name for d in drivers], model.pi2, cfg.budgets, cfg.ctx, cfg.threads, model.name)
    try:
        facts = target.facts()
        prepared = [prepare_engine(d, target, model, reporter) for d in drivers]
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    from pi2cli.plan.min_budget import check_on_target

    check_on_target(target, prepared, cfg.budgets, cfg.ctx, cfg.threads, model.name)  # another build: ask it
    from pi2cli.bench.floor import tbt_floor

    for prep in prepared:  # measured before any engine runs, on a quiet device
        prep.floor = tbt_floor(target, prep.model_local, prep.driver.policy, cfg.threads, prep.driver.name)
    outcomes: list[RunOutcome] = []
    for budget in cfg.budgets:
        for name, conversations in workloads.items():
            for prep in prepared:
                outcome = run_one(cfg, target, facts, prep, model, name, conversations, budget, reporter)
                outcomes.append(outcome)
    return outcomes


# ----------------------------------------------------------------------------------------------- table
# The columns (header and formatting) are declared once in pi2cli.results.columns; this picks the bench's.
# The table fits 120 columns: the status alone in its cell, each failure's reason on a line after it.
TABLE_COLUMNS = C.select("engine", "workload", "budget_held", "threads", "status_label", "n_turns", "ttft_ms",
                         "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "decode_ts", "peak_rss_mib")  # fmt: skip
TABLE_TEXT_COLUMNS = 5  # engine .. status: left-aligned and never folded (the figures' headers wrap instead)


def table_rows(outcomes: list[RunOutcome]) -> list[list[str]]:
    return [[col.cell(o.run) for col in TABLE_COLUMNS] for o in outcomes]


def table_reasons(outcomes: list[RunOutcome]) -> list[str]:
    """One line per run that is not ok: which run, its status and why (the table shows the status only)."""
    from pi2cli.results.columns import status_cell

    return [f"{o.engine} / {o.workload}: {status_cell(o.run['status'], o.run['error'], width=200)}"
            for o in outcomes if o.run["status"] != S.STATUS_OK]  # fmt: skip
