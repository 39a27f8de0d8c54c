"""`pi2 bench`: the click front of pi2cli.bench.run (all logic lives there)."""

from __future__ import annotations

import json
import sys

import click

from pi2cli.commands.results_options import results_dir_option
from pi2cli.errors import Pi2Error


def int_list(value: str | None, option: str, low: int) -> list[int] | None:
    """`128,512` -> [128, 512] (llama-bench's list syntax); None when not given."""
    if value is None:
        return None
    try:
        values = [int(v) for v in str(value).split(",")]
    except ValueError:
        raise click.BadParameter(f"{value!r}: give a number or a comma-separated list of numbers") from None
    if any(v < low for v in values):
        raise click.BadParameter(f"{value!r}: every value must be at least {low}")
    return values


def one_value(values: list[int] | None, option: str) -> int | None:
    if values is None:
        return None
    if len(values) > 1:
        raise Pi2Error(f"{option} {','.join(map(str, values))}: lists of values are for --mode pp-tg")
    return values[0]


class RichReporter:
    """Live progress on stderr: one bar per run, the conversation and turn it is on, the last tok/s."""

    def __init__(self, console):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.progress = Progress(
            TextColumn("[bold]{task.fields[label]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[where]}"),
            TextColumn("[cyan]{task.fields[speed]}"),
            TimeElapsedColumn(),
            console=console,
            transient=False,
        )
        self.tasks: dict[str, int] = {}

    def __enter__(self):
        self.progress.start()
        return self

    def __exit__(self, *exc):
        self.progress.stop()

    def message(self, text: str) -> None:
        self.progress.console.print(f"[dim]{text}[/dim]", highlight=False)

    def run_started(self, label: str, total_turns: int) -> None:
        self.tasks[label] = self.progress.add_task("", total=total_turns, label=label, where="", speed="")

    def turn_started(self, label: str, conversation: str, turn: int, n_turns: int) -> None:
        self.progress.update(self.tasks[label], where=f"{conversation} turn {turn}/{n_turns}")

    def turn_done(self, label: str, decode_tps: float | None, ttft_ms: float | None) -> None:
        speed = f"last turn {decode_tps:.1f} tok/s" if decode_tps else ""  # not the run's decode tok/s
        if ttft_ms is not None:
            speed += f", TTFT {ttft_ms:.0f} ms"
        self.progress.update(self.tasks[label], advance=1, speed=speed)

    def run_done(self, label: str, status: str) -> None:
        self.progress.update(self.tasks[label], where="done" if status == "ok" else f"[red]{status}")


def print_table(console, outcomes) -> None:
    from rich import box
    from rich.table import Table
    from rich.text import Text

    from pi2cli.bench.run import TABLE_COLUMNS, TABLE_TEXT_COLUMNS, table_reasons, table_rows

    rows = table_rows(outcomes)
    # 120 columns hold it: no vertical rules, and no cell folds (a header wraps instead: "TBT P50" over "ms")
    table = Table(
        title="pi2 bench",
        header_style="bold",
        box=box.SIMPLE_HEAD,
        padding=(0, 1),
        collapse_padding=True,
        show_edge=False,
    )
    for i, col in enumerate(TABLE_COLUMNS):
        text = i < TABLE_TEXT_COLUMNS
        widest = max((len(row[i]) for row in rows), default=0)
        table.add_column(col.header, justify="left" if text else "right", no_wrap=text, min_width=widest)
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))  # Text: an error's "[...]" is not rich markup
    console.print(table)
    for line in table_reasons(outcomes):
        console.print(Text(f"  {line}", style="yellow"))
    for o in outcomes:
        console.print(f"[dim]{o.engine} / {o.workload}: {o.path}[/dim]", highlight=False)


@click.command(name="bench")
@click.option("--model", "-m", default=None,
              help="DIR/model.pi2 (its GGUF twin DIR/model.gguf runs llama.cpp and gives the chat template), "
                   "a .gguf (converted to the .pi2 beside it when pi2 needs it), or a registry name "
                   "(`pi2 models list`) found in the local store. Required, except with --mode load, where it "
                   "is the model id sent to the server (default: the first one /v1/models lists).")  # fmt: skip
@click.option("--synth", "make_synth", is_flag=True,
              help="With a registry name not in the store: synthesize it there first (SYNTHETIC weights; "
                   "sizes stated and disk checked before writing).")  # fmt: skip
@click.option("--engine", "-e", "engines", multiple=True,
              help="Engine to run; repeat for several: pi2 (policy powerinfer2 when the model has predictors, "
                   "else dense), llmflash (pi2-engine --policy llmflash: the LLM-in-a-Flash baseline), "
                   "llama.cpp, mlc-llm (needs --mlc-runner).  [default: pi2; llama-bench mode: llama.cpp]")  # fmt: skip
@click.option("--mode", type=click.Choice(["chat", "llama-bench", "pp-tg", "load"]), default="chat", show_default=True,
              help="chat: the workloads as multi-turn conversations (every engine). llama-bench: llama.cpp's "
                   "own pp/tg benchmark (-p --n-prompt, -n --n-gen, -r --repeat; -lm mmap --repack 0), its "
                   "JSON records kept in the result. pp-tg: a sweep of -p x -n x -t lists for pi2, llmflash "
                   "and llama.cpp alike, with warm-up runs. load: -c clients hold conversations with the "
                   "OpenAI-compatible server at --url for --duration seconds (docs/BENCH.md).")  # fmt: skip
@click.option("--via", type=click.Choice(["pipe", "server"]), default=None,
              help="How pi2 drives pi2-engine (pi2, llmflash): pipe = `pi2-engine chat` over stdin; server = "
                   "`pi2-engine serve` started on the target (adb forward on a phone), each turn a streamed "
                   "POST /v1/completions timed from the engine's own per-token pi2_timings -- the API "
                   "llama.cpp is benched through. llama.cpp and mlc-llm are driven as always. Stored as "
                   "settings.via; tables label such runs 'via server'.  [default: pipe]")  # fmt: skip
@click.option("--url", default=None, help="--mode load: the server, e.g. http://127.0.0.1:8080.")
@click.option("--concurrency", "-c", type=int, default=None, help="--mode load: concurrent clients.")
@click.option("--duration", type=float, default=None,
              help="--mode load: seconds during which requests start (those in flight then finish).")  # fmt: skip
@click.option("--max-tokens", type=int, default=None,
              help="--mode load: max_tokens of every request (default: each turn's max_new_tokens).")  # fmt: skip
@click.option("--api-key", default=None,
              help="--mode load: sent as `Authorization: Bearer KEY` (not stored).")  # fmt: skip
@click.option("--request-timeout", type=float, default=None,
              help="--mode load: seconds one request may take before it counts as timed out [300].")  # fmt: skip
@click.option("--n-prompt", "-p", default=None, metavar="N[,N...]", callback=lambda _c, _p, v: int_list(v, "--n-prompt", 0),
              help="Prompt tokens: llama-bench mode's pp test (0: none) [512]; pp-tg: a list, e.g. 128,512.")  # fmt: skip
@click.option("--warmup", type=click.IntRange(0), default=None,
              help="--mode pp-tg: warm-up runs before each cell's repetitions, stored but not summarised [1].")  # fmt: skip
@click.option(
    "--dry-run", is_flag=True, help="--mode pp-tg: print the matrix and its estimated time, run nothing."
)
@click.option("--samples-csv", type=click.Path(dir_okay=False), default=None,
              help="--mode pp-tg: also write every sample (pi2: TTFT and each TBT; llama-bench: each test's "
                   "time) as CSV rows to this file.")  # fmt: skip
@click.option("--llmflash-window", type=click.IntRange(1), default=5, show_default=True,
              help="llmflash: keep the neurons used by the last K tokens (LLM in a Flash uses 5).")  # fmt: skip
@click.option("--mlc-runner", default=None, envvar="PI2_MLC_RUNNER", show_envvar=True,
              help="mlc-llm: an `mlc_llm serve` URL (http://127.0.0.1:8000) or a command that reads a JSON "
                   "request on stdin and prints text plus MLC's stats (docs/MLC.md).")  # fmt: skip
@click.option("--mlc-model", default=None, envvar="PI2_MLC_MODEL", show_envvar=True,
              help="mlc-llm: the model id given to the runner (default: a URL runner's only model; a command "
                   "runner gets the GGUF path).")  # fmt: skip
@click.option("--workload", "-w", "workloads", multiple=True, default=("multi-turn",), show_default=True,
              type=click.Choice(["multi-turn", "code", "math", "role-play"]),
              help="Workload set; repeat for several.")  # fmt: skip
@click.option("--limit", type=int, default=None, help="Conversations per workload (default: all).")
@click.option("--seed", type=int, default=None,
              help="Sample --limit conversations at random with this seed (default: the first ones).")  # fmt: skip
@click.option("--memory-budget", "budgets", multiple=True,
              help="Memory budget, e.g. 8G; repeat for several (one run per budget). Enforced with a "
                   "memory cgroup on this machine; recorded as not enforced on adb devices.")  # fmt: skip
@click.option("--device", "-d", default=None,
              help="Target: local (default), qemu-arm64, or an adb serial / HOST:PORT (see `pi2 devices`).")  # fmt: skip
@click.option("--repeat", type=int, default=None,
              help="Run every conversation this many times [default: 1; llama-bench mode: 3 repetitions].")  # fmt: skip
@click.option("--threads", "-t", default=None, metavar="N[,N...]", callback=lambda _c, _p, v: int_list(v, "--threads", 1),
              help="Engine threads (default: the engine's own); pp-tg: a list, e.g. 1,2,4.")  # fmt: skip
@click.option("--n-gen", "-n", default=None, metavar="N[,N...]", callback=lambda _c, _p, v: int_list(v, "--n-gen", 0),
              help="Tokens generated per turn (default: each turn's max_new_tokens from the workload; "
                   "llama-bench mode: the tg test's length, default 128; pp-tg: a list [128]).")  # fmt: skip
@click.option(
    "--ctx",
    type=click.IntRange(16, 1 << 20),
    default=None,
    help="KV cache size (tokens) of every engine.  [default: what the longest conversation needs, up to 4096]",
)
@click.option("--stop-at-eos", is_flag=True,
              help="Let engines stop at end-of-turn (default: exactly --n-gen tokens, the same for all).")  # fmt: skip
@click.option("--cool-below", type=float, default=None,
              help="Before each run wait until the device is below this many °C (default 45 on phones, no "
                   "waiting here; 0 never waits). Skipped when the target reports no temperature.")  # fmt: skip
@click.option("--plan", "plan", type=click.Path(dir_okay=False), default=None,
              help="pi2 only: run pi2-engine with this plan (`pi2 plan --out`); pushed to WORKDIR/plans/ on a "
                   "device. --memory-budget and --threads override the plan's; without --memory-budget the "
                   "plan's budget is the run's (enforced like any budget). Stored in the result's settings.")  # fmt: skip
@click.option(
    "--quality",
    is_flag=True,
    help="Also score each sparse pi2 run against the dense model on the workload's real text "
    "(pi2 quality; measured on this machine).",
)
@click.option("--run-timeout", "run_timeout", type=click.FloatRange(0, min_open=True), default=None,
              metavar="SECONDS",
              help="Stop a run that takes longer than this, engine start to stop (every mode; a pp-tg cell is a "
                   "run): the engine is killed (on the device too), the run is saved as `timeout` with what it "
                   "measured, and the next run goes ahead.  [default: none: a run's length depends on model, "
                   "device and workload (hours for a 47B model on a phone), so no limit fits all; an engine "
                   "that hangs is still stopped by its one-hour limit on a turn, as failed]")  # fmt: skip
@click.option("--tag", "tags", multiple=True, help="Label stored with every run (e.g. nightly).")
@results_dir_option
@click.option(
    "--json", "as_json", is_flag=True, help='Print {"runs": [...]} (result files and figures) on stdout.'
)
def command(model, make_synth, engines, mode, via, url, concurrency, duration, max_tokens, api_key, request_timeout,
            n_prompt, warmup, dry_run, samples_csv, llmflash_window, mlc_runner,
            mlc_model, workloads, limit, seed, budgets, device, repeat, threads, n_gen, ctx, stop_at_eos, cool_below,
            plan, quality, run_timeout, tags, results_dir, as_json) -> None:  # fmt: skip
    """Run engines x workloads on a device and record TTFT, TBT and memory.

    Every (engine, workload, budget) is one run, saved as one result JSON (see `pi2 results list`).
    Each conversation turn is prompted with the whole conversation so far, rendered with the model's
    chat template and including the engine's own earlier answers; the engine keeps its KV cache across
    turns. The engine process's memory is sampled while it runs. Ctrl-C stops the engine (on the
    device too) and saves the current run as aborted; a run past --run-timeout is stopped the same way,
    saved as timeout, and the bench goes on. Exit code 1 when any run is not ok.

    \b
    Examples:
      pi2 bench -m models/smollm2/model.pi2 -e pi2 -e llama.cpp -w multi-turn --limit 2 --json
      pi2 bench -m models/smollm2/model.pi2 -w code --limit 3 -n 64
      pi2 bench -m models/smollm2/model.pi2 --device 127.0.0.1:5555 -w math --limit 1
      pi2 bench -m models/smollm2/model.pi2 -e pi2 -e llama.cpp --via server --limit 2
      pi2 bench -m synth/model.pi2 -e pi2 -e llmflash --llmflash-window 5 --memory-budget 256M --limit 1
      pi2 bench -m models/smollm2/model.gguf -e llama.cpp --mode llama-bench -p 512 -n 128 --repeat 3
      pi2 bench -m synth/model.pi2 -e pi2 --plan plan.json --limit 1
      pi2 bench -m synth/model.pi2 --mode pp-tg -e pi2 -e llmflash -e llama.cpp -p 128,512 -n 32 -t 1,4 --dry-run
      PI2_MLC_RUNNER=http://127.0.0.1:8000 pi2 bench -m models/smollm2/model.pi2 -e mlc-llm --limit 1
      pi2 bench --mode load --url http://127.0.0.1:8080 -c 8 --duration 60 --max-tokens 64
    """
    from rich.console import Console

    from pi2cli.bench.run import BenchConfig, Reporter, run_bench
    from pi2cli.models.store import model_arg
    from pi2cli.units import parse_size

    load_opts = {"--url": url, "--concurrency": concurrency, "--duration": duration, "--max-tokens": max_tokens,
                 "--api-key": api_key, "--request-timeout": request_timeout}  # fmt: skip
    if via is not None and mode != "chat":  # the other modes run one way: their own tools, or a given URL
        raise Pi2Error(f"--via goes with --mode chat, not {mode}")
    if mode == "load":
        from pi2cli.commands.bench_load import load_command

        unused = {"--synth": make_synth, "--device": device, "--memory-budget": budgets, "--plan": plan,
                  "--quality": quality, "--warmup": warmup, "--dry-run": dry_run, "--samples-csv": samples_csv,
                  "--repeat": repeat, "--threads": threads, "--n-prompt": n_prompt, "--n-gen": n_gen, "--ctx": ctx,
                  "--stop-at-eos": stop_at_eos, "--cool-below": cool_below}  # fmt: skip
        return load_command(url=url, concurrency=concurrency, duration=duration, model=model, engines=engines,
                            max_tokens=max_tokens, api_key=api_key, request_timeout=request_timeout,
                            workloads=workloads, limit=limit, seed=seed, tags=tags, results_dir=results_dir,
                            as_json=as_json, unused=[k for k, v in unused.items() if v not in (None, False, ())])  # fmt: skip
    given = [k for k, v in load_opts.items() if v is not None]
    if given:
        raise Pi2Error(f"{given[0]} goes with --mode load")
    if model is None:
        raise click.UsageError("Missing option '--model' / '-m'.")
    model = model_arg(model, synth=make_synth)
    engines = list(engines) or (["llama.cpp"] if mode == "llama-bench" else ["pi2"])
    if mode == "pp-tg":
        if plan or quality:
            raise Pi2Error(f"{'--plan' if plan else '--quality'} goes with --mode chat, not pp-tg")
        return sweep_command(model, engines, n_prompt, n_gen, threads, repeat, warmup, budgets, device, results_dir,
                             tags, llmflash_window, samples_csv, dry_run, as_json, run_timeout)  # fmt: skip
    sweep_only = [o for o, v in (("--warmup", warmup), ("--dry-run", dry_run), ("--samples-csv", samples_csv))
                  if v not in (None, False)]  # fmt: skip
    if sweep_only:
        raise Pi2Error(f"{sweep_only[0]} goes with --mode pp-tg")
    n_prompt, n_gen, threads = (one_value(v, o) for v, o in ((n_prompt, "--n-prompt"), (n_gen, "--n-gen"),
                                                              (threads, "--threads")))  # fmt: skip
    n_prompt = 512 if n_prompt is None else n_prompt
    cfg = BenchConfig(
        model=model, engines=engines, workloads=list(workloads), limit=limit, seed=seed,
        budgets=[parse_size(b) for b in budgets] or [None], device=device, repeat=repeat, threads=threads,
        n_gen=n_gen, ctx=ctx, ignore_eos=not stop_at_eos, results_dir=results_dir, cool_below=cool_below,
        tags=list(tags), mode=mode, n_prompt=n_prompt, llmflash_window=llmflash_window, mlc_runner=mlc_runner,
        mlc_model=mlc_model, plan=plan, quality=quality, run_timeout_s=run_timeout, via=via or "pipe",
    )  # fmt: skip
    from pi2cli.results import store

    store.check_writable(results_dir)  # here too, so the refusal comes before any progress display
    console = Console(stderr=True)
    if console.is_terminal or not as_json:
        with RichReporter(console) as reporter:
            outcomes = run_bench(cfg, reporter)
    else:
        outcomes = run_bench(cfg, Reporter())
    if as_json:
        click.echo(json.dumps({"runs": [o.row() for o in outcomes]}, indent=1))
    else:
        out = Console()
        print_table(out if out.is_terminal else Console(width=200), outcomes)  # piped: wide, not squeezed
    if any(o.run["status"] != "ok" for o in outcomes):
        sys.exit(1)


def sweep_command(model, engines, n_prompt, n_gen, threads, repeat, warmup, budgets, device, results_dir, tags,
                  llmflash_window, samples_csv, dry_run, as_json, run_timeout=None) -> None:  # fmt: skip
    """--mode pp-tg: pi2cli.bench.sweep does the work; the same table and --json as the other modes."""
    from rich.console import Console

    from pi2cli.bench.sweep import run_sweep
    from pi2cli.bench.sweep_config import (
        DEFAULT_N_GEN,
        DEFAULT_N_PROMPT,
        DEFAULT_REPEAT,
        DEFAULT_WARMUP,
        SweepConfig,
    )
    from pi2cli.units import parse_size

    cfg = SweepConfig(model=model, engines=engines, n_prompt=n_prompt or list(DEFAULT_N_PROMPT),
                      n_gen=n_gen or list(DEFAULT_N_GEN), threads=threads or [None],
                      repeat=DEFAULT_REPEAT if repeat is None else repeat,
                      warmup=DEFAULT_WARMUP if warmup is None else warmup,
                      budgets=[parse_size(b) for b in budgets] or [None], device=device, results_dir=results_dir,
                      tags=list(tags), llmflash_window=llmflash_window, samples_csv=samples_csv, dry_run=dry_run,
                      run_timeout_s=run_timeout)  # fmt: skip
    if dry_run:
        run_sweep(cfg, echo=click.echo)
        return
    console = Console(stderr=True)
    if console.is_terminal or not as_json:
        with RichReporter(console) as reporter:
            outcomes = run_sweep(cfg, reporter)
    else:
        outcomes = run_sweep(cfg)
    if as_json:
        click.echo(json.dumps({"runs": [o.row() for o in outcomes]}, indent=1))
    else:
        out = Console()
        print_table(out if out.is_terminal else Console(width=200), outcomes)
    if samples_csv:
        click.echo(f"samples: {samples_csv}", err=True)
    if any(o.run["status"] != "ok" for o in outcomes):
        sys.exit(1)
