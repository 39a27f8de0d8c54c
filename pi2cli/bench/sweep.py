"""`pi2 bench --mode pp-tg`: llama-bench's habits for every engine -- a matrix of prompt lengths x
generation lengths x thread counts, warm-up runs, repetitions, a dry run and per-token samples.

One cell = one engine x budget x threads x (pp P, tg N), stored as one run (workload `ppP-tgN`), so
every engine's cell lands in the same comparison group:
  - pi2 / llmflash: one `pi2-engine generate` process per repetition with a synthetic prompt of
    exactly P token ids (`--tokens`, drawn from the vocabulary with a fixed seed, as llama-bench draws
    random tokens) and N tokens generated with --ignore-eos. The engine stamps every token on the
    target's monotonic clock (events JSONL), so TTFT (prefill of P tokens + the first token) and the
    N - 1 times between tokens (decode at depth P) are device-clock times on any target.
  - llama.cpp: llama-bench, here or on an adb device (pushed with pi2-rusage), on its own clock there:
    `-p P -n 0` (pp) and `-p 0 -n N -d P` (tg at depth P, as pi2's decode is), `-r` repetitions, its
    own warm-up unless --warmup 0. It times whole tests, not tokens: its turns carry rates (pp:
    prefill_ts, tg: decode_ts) and no TBT.
Warm-up repetitions are stored as warm-up turns (kept, never summarised). --samples-csv writes one
row per sample: pi2's TTFT and every TBT, llama-bench's per-repetition test times.
"""

from __future__ import annotations

import csv
from pathlib import Path

from pi2cli.bench.config import Reporter
from pi2cli.bench.limit import RunLimit, check_run_timeout
from pi2cli.bench.recorder import RUN_STOPS, RunRecorder, new_run
from pi2cli.bench.sweep_cells import llama_cell, pi2_cell, prepare_llama_bench
from pi2cli.bench.sweep_config import TOKEN_SEED, Cell, SweepConfig, check_config, matrix
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.targets.base import TargetError

# The dry run's time estimate (no run has happened yet): reading the whole model once per token at
# these rates, plus one load of it per process. Rough on purpose; it says so when printed.
EST_DECODE_BYTES_PER_S = 4e9
EST_PREFILL_TOKENS_PER_DECODE = 8  # a prefill token costs ~1/8 of a decode token (batched)
EST_LOAD_S = 0.5

PI2_HOW = ("pi2-engine generate --tokens (a synthetic prompt of exactly n_prompt ids) -n n_gen --ignore-eos, "
           "one process per repetition; --events JSONL stamped on the target's monotonic clock: TTFT = prefill "
           "of n_prompt tokens + the first token, TBT = differences of per-token timestamps (decode at depth "
           "n_prompt)")  # fmt: skip
LLAMA_HOW = ("llama-bench on the target, its own clock there (pi2-rusage: peak RSS): `-p P -n 0` (pp, "
             "prefill_ts) and `-p 0 -n N -d P` (tg at depth P, decode_ts), -r repetitions, -lm mmap --repack 0; "
             "whole tests are timed, so no TTFT or TBT")  # fmt: skip


def estimate_seconds(cell: Cell, model_bytes: int, cfg: SweepConfig) -> float:
    """A rough wall time for one cell (see EST_*): processes x (load + prefill + decode)."""
    token_s = model_bytes / EST_DECODE_BYTES_PER_S
    work = cell.n_prompt * token_s / EST_PREFILL_TOKENS_PER_DECODE + cell.n_gen * token_s
    runs = cfg.repeat + max(cfg.warmup, 0)
    if cell.engine == "llama.cpp":  # two llama-bench processes; the tg test also fills its depth
        return 2 * EST_LOAD_S + runs * (work + cell.n_prompt * token_s / EST_PREFILL_TOKENS_PER_DECODE)
    return runs * (EST_LOAD_S + work)


def dry_run_lines(cfg: SweepConfig, model_bytes: int, model_name: str) -> list[str]:
    cells = matrix(cfg)
    lines = [f"pi2 bench --mode pp-tg: {len(cells)} cells on {cfg.device or 'local'}, model {model_name} "
             f"({model_bytes / 2**20:.1f} MiB), {cfg.repeat} repetitions + {cfg.warmup} warm-up each",
             f"{'engine':<10} {'budget':>16} {'threads':>7} {'pp':>6} {'tg':>6} {'runs':>5} {'est. s':>8}"]  # fmt: skip
    total = 0.0
    for c in cells:
        est = estimate_seconds(c, model_bytes, cfg)
        total += est
        lines.append(f"{c.engine:<10} {S.budget_label(c.budget):>16} {c.threads or 'default':>7} "
                     f"{c.n_prompt:>6} {c.n_gen:>6} {cfg.repeat + cfg.warmup:>5} {est:>8.1f}")  # fmt: skip
    lines.append(f"estimated total: {total:.0f} s (rough: the model read once per decoded token at "
                 f"{EST_DECODE_BYTES_PER_S / 1e9:.0f} GB/s, prefill {EST_PREFILL_TOKENS_PER_DECODE}x cheaper per "
                 f"token, {EST_LOAD_S} s per load); nothing was run")  # fmt: skip
    return lines


# ------------------------------------------------------------------------------------------- the sweep
def write_samples_csv(path: str, outcomes: list) -> None:
    """One row per sample of every run: pi2's TTFT and TBTs (per token), llama-bench's test times."""
    from pi2cli import safe_write

    with safe_write.safe_open(path, "w", newline="") as f:  # never through a link; whole or not at all
        w = csv.writer(f)
        w.writerow(["run_id", "engine", "policy", "target", "threads", "budget_bytes", "n_prompt", "n_gen",
                    "rep", "warmup", "kind", "index", "ns"])  # fmt: skip
        for o in outcomes:
            run = o.run
            head = [run["run_id"], run["engine"]["name"], run["engine"].get("policy") or "", run["target"]["name"],
                    run["settings"].get("threads") or "", run["memory"]["budget_bytes"] or ""]  # fmt: skip
            for t in run["turns"]:
                base = head + [t["n_prompt"], t["n_gen"], t["rep"], int(t["warmup"])]
                if t["ttft_ns"] is not None:
                    w.writerow(base + ["ttft", 0, t["ttft_ns"]])
                for i, ns in enumerate(t["samples_ns"]):
                    w.writerow(base + ["tbt", i + 1, ns])
                if "t_ns" in t["extra"]:
                    w.writerow(base + [f"{t['extra']['test']}_test", 0, t["extra"]["t_ns"]])


def run_sweep(cfg: SweepConfig, reporter=None, echo=print) -> list:
    """Resolve everything first (a typo fails before anything runs), then every cell in turn; a cell
    that fails is saved as failed (past --run-timeout: timeout) and the sweep goes on (Ctrl-C saves it
    as aborted and stops)."""
    from pi2cli.bench.run import prepare_engine
    from pi2cli.engines import get_driver
    from pi2cli.model_files import resolve_model
    from pi2cli.results import store
    from pi2cli.targets import get_target

    reporter = reporter or Reporter()
    check_config(cfg)
    check_run_timeout(cfg.run_timeout_s)
    names = list(dict.fromkeys(cfg.engines))
    needs_pi2 = any(n != "llama.cpp" for n in names)
    # a dry run converts nothing: a .gguf's .pi2 is only made when the sweep runs
    model = resolve_model(cfg.model, convert_missing_pi2=needs_pi2 and not cfg.dry_run, reporter=reporter,
                          template=False)  # fmt: skip
    for n in names:  # the model form each engine runs, or one line saying how to get it
        suffix = ".gguf" if n == "llama.cpp" else ".pi2"
        if not (cfg.dry_run and suffix == ".pi2" and model.gguf is not None):
            model.for_engine(suffix, n)
    if cfg.dry_run:
        main_file = (model.pi2 if needs_pi2 else None) or model.gguf
        for line in dry_run_lines(cfg, main_file.stat().st_size, model.name):
            echo(line)
        if needs_pi2 and model.pi2 is None:
            echo(f"(the sweep converts {model.gguf.name} to .pi2 first; not counted)")
        return []
    if cfg.samples_csv:
        from pi2cli.outputs import check_file_writable

        check_file_writable(Path(cfg.samples_csv), "--samples-csv")
    store.check_writable(cfg.results_dir)
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    if "llama.cpp" in names:
        if target.on_this_machine and not target.native_here:
            raise Pi2Error(f"--mode pp-tg runs llama.cpp's llama-bench here or on an adb device, not under "
                           f"{target.name} ({target.kind}); -e pi2 / -e llmflash sweep there")  # fmt: skip
        from pi2cli.hw.rusage import wrapper_binary

        wrapper_binary()
    drivers = {}
    for n in names:
        d = get_driver(n)
        if n == "llmflash":
            d.set_option("llmflash_window", cfg.llmflash_window)
        if n == "llama.cpp" and cfg.llamacpp_bin_dir:
            d.set_option("llamacpp_bin_dir", cfg.llamacpp_bin_dir)
        drivers[n] = d
    try:
        facts = target.facts()
        prepared = {
            n: prepare_engine(d, target, model, reporter) for n, d in drivers.items() if n != "llama.cpp"
        }
        if "llama.cpp" in drivers:
            reason = drivers["llama.cpp"].supports(target)
            if reason:
                raise Pi2Error(reason)
            place = prepare_llama_bench(drivers["llama.cpp"], target, model.gguf, reporter)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    n_vocab = None
    if model.pi2 is not None and needs_pi2:
        from pi2cli.models.pi2file import Pi2File

        n_vocab = Pi2File(model.pi2, verify=False).header.n_vocab
    outcomes = []
    for cell in matrix(cfg):
        driver = drivers[cell.engine]
        local = model.gguf if cell.engine == "llama.cpp" else prepared[cell.engine].model_local
        label = (f"{cell.engine} · {cell.workload} · t{cell.threads or '-'}"
                 + (f" · {S.budget_label(cell.budget)}" if cell.budget else ""))  # fmt: skip
        run = new_run(
            driver, target, facts, model, local, budget_bytes=cell.budget,
            workload=S.workload_info(cell.workload, n_prompts=1, source=f"synthetic prompt of {cell.n_prompt} "
                                     f"token ids (seed {TOKEN_SEED}), {cell.n_gen} generated"),
            settings=S.settings_info(n_gen=cell.n_gen, threads=cell.threads, repetitions=cfg.repeat,
                                     warmup=cfg.warmup, mode="pp-tg", n_prompt=cell.n_prompt, ignore_eos=True,
                                     **driver.extra_settings),
            measurement=LLAMA_HOW if cell.engine == "llama.cpp" else PI2_HOW,
            tags=cfg.tags,
        )  # fmt: skip
        rec = RunRecorder(run, target=target, budget_bytes=cell.budget, label=label, engine=cell.engine,
                          workload=cell.workload, reporter=reporter, results_dir=cfg.results_dir)  # fmt: skip
        reporter.run_started(label, 2 if cell.engine == "llama.cpp" else cfg.warmup + cfg.repeat)
        try:
            with RunLimit(cfg.run_timeout_s) as limit:  # a cell is one run: --run-timeout limits it whole
                limit.where = f"in the {cell.workload} cell"
                if cell.engine == "llama.cpp":
                    run["llama_bench"] = llama_cell(
                        run, target, driver, model.gguf, place, cell, cfg, reporter, label, rec
                    )
                else:
                    pi2_cell(run, target, prepared[cell.engine], cell, cfg, n_vocab, reporter, label, rec)
        except RUN_STOPS as exc:
            try:
                outcomes.append(rec.fail(exc))
            except BaseException as stop:
                if cfg.samples_csv:  # Ctrl-C or a vanished device: the samples so far are kept too
                    saved = getattr(stop, "outcome", None)  # BenchInterrupted / DeviceVanished carry it
                    write_samples_csv(cfg.samples_csv, outcomes + ([saved] if saved else []))
                raise
            continue
        rec.finish()
        outcomes.append(rec.save())
    if cfg.samples_csv:
        write_samples_csv(cfg.samples_csv, outcomes)
    return outcomes
