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

import contextlib
import csv
import os
import shlex
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.targets.base import TargetError

SWEEP_ENGINES = ("pi2", "llmflash", "llama.cpp")
DEFAULT_N_PROMPT = [512]
DEFAULT_N_GEN = [128]
DEFAULT_REPEAT = 3
DEFAULT_WARMUP = 1
TOKEN_SEED = 1234  # the synthetic prompt's ids: the same prompt for every engine, run and cell
# The dry run's time estimate (no run has happened yet): reading the whole model once per token at
# these rates, plus one load of it per process. Rough on purpose; it says so when printed.
EST_DECODE_BYTES_PER_S = 4e9
EST_PREFILL_TOKENS_PER_DECODE = 8  # a prefill token costs ~1/8 of a decode token (batched)
EST_LOAD_S = 0.5

PI2_HOW = ("pi2-engine generate --tokens (a synthetic prompt of exactly n_prompt ids) -n n_gen --ignore-eos, "
           "one process per repetition; --events JSONL stamped on the target's monotonic clock: TTFT = prefill "
           "of n_prompt tokens + the first token, TBT = differences of per-token timestamps (decode at depth "
           "n_prompt)")  # fmt: skip
LLAMA_HOW = ("llama-bench on the target, its own clock there (pi2-rusage: peak RSS): `-p P -n 0` (pp, prefill_ts) and `-p 0 -n N -d P` "
             "(tg at depth P, decode_ts), -r repetitions, -lm mmap --repack 0; whole tests are timed, so "
             "no TTFT or TBT")  # fmt: skip


@dataclass
class SweepConfig:
    model: str
    engines: list[str] = field(default_factory=lambda: ["pi2"])
    n_prompt: list[int] = field(default_factory=lambda: list(DEFAULT_N_PROMPT))
    n_gen: list[int] = field(default_factory=lambda: list(DEFAULT_N_GEN))
    threads: list[int | None] = field(default_factory=lambda: [None])
    repeat: int = DEFAULT_REPEAT
    warmup: int = DEFAULT_WARMUP
    budgets: list[int | None] = field(default_factory=lambda: [None])
    device: str | None = None
    results_dir: str | None = None
    tags: list[str] = field(default_factory=list)
    llmflash_window: int = 5
    llamacpp_bin_dir: str | None = None
    samples_csv: str | None = None
    dry_run: bool = False
    timeout_s: float = 3600.0


@dataclass
class Cell:
    engine: str
    budget: int | None
    threads: int | None
    n_prompt: int
    n_gen: int

    @property
    def workload(self) -> str:
        return f"pp{self.n_prompt}-tg{self.n_gen}"


def matrix(cfg: SweepConfig) -> list[Cell]:
    """Every cell, engine-major (one engine's cells run together), then budget, threads, pp, tg."""
    return [Cell(e, b, t, p, n) for e in dict.fromkeys(cfg.engines) for b in cfg.budgets for t in cfg.threads
            for p in cfg.n_prompt for n in cfg.n_gen]  # fmt: skip


def check_config(cfg: SweepConfig) -> None:
    """Everything that can be wrong with the options, before anything runs (one line each)."""
    for name in cfg.engines:
        if name not in SWEEP_ENGINES:
            raise Pi2Error(f"--mode pp-tg runs {', '.join(SWEEP_ENGINES)}; engine '{name}' has no pp-tg "
                           f"sweep (use --mode chat)")  # fmt: skip
    if cfg.repeat < 1:
        raise Pi2Error(f"--repeat must be at least 1, got {cfg.repeat}")
    if cfg.warmup < 0:
        raise Pi2Error(f"--warmup must be 0 or more, got {cfg.warmup}")
    if any(p < 1 for p in cfg.n_prompt) or any(n < 2 for n in cfg.n_gen):
        raise Pi2Error(
            "--mode pp-tg needs every --n-prompt >= 1 and every --n-gen >= 2 (a TBT needs two tokens)"
        )
    if any(t is not None and t < 1 for t in cfg.threads):
        raise Pi2Error("--threads must be at least 1")


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


def prompt_ids(n_vocab: int, n: int, seed: int = TOKEN_SEED) -> list[int]:
    """n token ids drawn from the vocabulary (ids 0..2, BOS/EOS/UNK in llama vocabularies, left out
    where the vocabulary is big enough), the same for every engine and run."""
    import numpy as np

    low = 3 if n_vocab > 16 else 0
    return [int(v) for v in np.random.default_rng(seed).integers(low, n_vocab, size=n)]


# -------------------------------------------------------------------------------------------- pi2 runs
@dataclass
class GenerateSample:
    """One `pi2-engine generate` process: its prompt/gen counts, TTFT, TBT samples and summary."""

    n_prompt: int
    n_gen: int
    ttft_ns: int
    samples_ns: list[int]
    summary: dict
    start: dict


def parse_generate_events(text: str, want_prompt: int) -> GenerateSample:
    """The engine's events of one generate run -> a GenerateSample; the prompt must be exactly
    want_prompt tokens (the engine's start event says how many it prefilled)."""
    import json

    start, turn, summary, times = {}, {}, {}, []
    for line in text.splitlines():
        if not line.strip():
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            raise Pi2Error(f"pi2-engine wrote a malformed event line: {line[:120]!r}") from None
        kind = ev.get("event")
        if kind == "token":
            times.append(float(ev["t"]))
        elif kind == "start":
            start = ev
        elif kind == "turn":
            turn = ev
        elif kind == "summary":
            summary = ev
    if not turn or "ttft_s" not in turn:
        raise Pi2Error("pi2-engine generate wrote no turn event (did it stop early?)")
    if int(start.get("n_prompt", turn.get("n_prompt", -1))) != want_prompt:
        raise Pi2Error(
            f"pi2-engine prefilled {start.get('n_prompt')} prompt tokens, not the {want_prompt} asked for"
        )
    samples = [round((b - a) * 1e9) for a, b in zip(times, times[1:], strict=False)]
    return GenerateSample(
        want_prompt, len(times), round(float(turn["ttft_s"]) * 1e9), samples, summary, start
    )


def run_generate_once(target, prepared, cell: Cell, ids: list[str], budget_bytes, timeout_s: float,
                      sampler: FollowingSampler) -> GenerateSample:  # fmt: skip
    """One `pi2-engine generate` on the target (inside the budget's cgroup here; on a device the
    engine still gets --memory-budget) and its events."""
    from pi2cli.engines.pi2_args import engine_argv
    from pi2cli.plan.budget import Budget

    driver = prepared.driver
    binary = f"{prepared.binary_dir}/pi2-engine" if prepared.binary_dir else str(driver.local_binary(target))
    flags = dict(driver.engine_options(budget_bytes), threads=cell.threads)
    tokens = ",".join(ids)
    if target.on_this_machine:
        import tempfile

        with tempfile.TemporaryDirectory(prefix="pi2-sweep-") as tmp:
            events = Path(tmp) / "events.jsonl"
            argv = target.command_prefix() + engine_argv(binary, "generate", prepared.model_remote, events=events,
                                                         n_predict=cell.n_gen, ignore_eos=True, **flags)  # fmt: skip
            argv[argv.index("--events") : argv.index("--events")] = ["--tokens", tokens]
            local_budget = budget_bytes if budget_bytes else None
            with Budget(local_budget, evict=[prepared.model_local] if local_budget else []) as budget:
                proc = budget.popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                    errors="replace", start_new_session=True)  # fmt: skip
                stop = sampler.follow(proc.pid)
                try:
                    _, err = proc.communicate(timeout=timeout_s)
                except BaseException:
                    with contextlib.suppress(OSError):
                        os.killpg(proc.pid, 9)
                    proc.communicate()
                    raise
                finally:
                    stop()
                sampler.budget_record = budget.record() if local_budget else None
            if proc.returncode != 0:
                raise Pi2Error(f"pi2-engine generate failed (code {proc.returncode}): "
                               f"{(err.strip().splitlines() or ['no output'])[-1]}")  # fmt: skip
            return parse_generate_events(events.read_text(), cell.n_prompt)
    runs = f"{target.workdir.rstrip('/')}/runs"
    target.mkdir(runs)
    events = f"{runs}/sweep-{os.getpid()}-{int(time.time() * 1000)}.events.jsonl"
    argv = engine_argv(binary, "generate", prepared.model_remote, events=events, n_predict=cell.n_gen,
                       ignore_eos=True, **flags)  # fmt: skip
    argv[argv.index("--events") : argv.index("--events")] = ["--tokens", tokens]
    err: list[bytes] = []
    proc = target.run(argv, on_output=lambda name, data: err.append(data) if name == "stderr" else None)
    stop = sampler.follow(proc.pid)
    try:
        code = proc.wait(timeout_s)
    except BaseException:
        with contextlib.suppress(Exception):
            proc.kill()
        raise
    finally:
        stop()
    try:
        text = target.read_text(events) or ""
    finally:
        with contextlib.suppress(TargetError):
            target.sh(f"rm -f {shlex.quote(events)}", timeout=10)
    if code != 0:
        tail = b"".join(err).decode(errors="replace").strip().splitlines()
        raise Pi2Error(
            f"pi2-engine generate failed on {target.name} (code {code}): {(tail or ['no output'])[-1]}"
        )
    return parse_generate_events(text, cell.n_prompt)


def pi2_cell(run: dict, target, prepared, cell: Cell, cfg: SweepConfig, n_vocab: int, reporter, label: str,
             sampler) -> None:  # fmt: skip
    """Warm-up and measured repetitions of one pi2/llmflash cell, as turns of `run`."""
    ids = [str(i) for i in prompt_ids(n_vocab, cell.n_prompt)]
    peak = 0
    summary: dict = {}
    for k in range(cfg.warmup + cfg.repeat):
        warm = k < cfg.warmup
        reporter.turn_started(label, "warm-up" if warm else f"rep {k - cfg.warmup + 1}", k + 1,
                              cfg.warmup + cfg.repeat)  # fmt: skip
        g = run_generate_once(target, prepared, cell, ids, cell.budget, cfg.timeout_s, sampler)
        turn = S.add_turn(run, n_prompt=g.n_prompt, n_gen=g.n_gen, ttft_ns=g.ttft_ns, samples_ns=g.samples_ns,
                          prompt_id=cell.workload, rep=0 if warm else k - cfg.warmup, warmup=warm,
                          peak_rss_bytes=g.summary.get("peak_rss_bytes"),
                          extra={"threads": g.start.get("threads"), "load_s": g.start.get("load_s")})  # fmt: skip
        peak = max(peak, int(g.summary.get("peak_rss_bytes") or 0))
        summary = g.summary
        reporter.turn_done(label, turn["decode_ts"], g.ttft_ns / 1e6)
    from pi2cli.engines.pi2_chat import summary_counters

    counters = {k: v for k, v in summary_counters(summary).items() if k not in ("peak_rss_bytes",)}
    S.set_counters(run, **counters)
    if peak:
        S.set_counters(run, peak_rss_bytes=peak, peak_rss_source=S.PEAK_RSS_ENGINE)


# -------------------------------------------------------------------------------------- llama.cpp runs
@dataclass
class LlamaBenchPlace:
    """Where llama-bench runs: here (bin_dir), or on a device (pushed: its bin directory and model there)."""

    bin_dir: Path
    remote_bin: str | None = None
    remote_model: str | None = None


def prepare_llama_bench(driver, target, gguf: Path, reporter) -> LlamaBenchPlace:
    """Here: the host build in place. On a device: llama-bench of the build for its architecture, this
    pi2 build's pi2-rusage (its peak memory) and the GGUF, pushed as every engine is (content hashes)."""
    from pi2cli.hw.push import collect_items, engine_files, push_files

    bin_dir = driver.bin_dir if target.native_here else driver.bin_dir_for(target)
    binary = bin_dir / "llama-bench"
    if not binary.is_file():
        raise Pi2Error(f"llama-bench not found in {bin_dir} (run `pi2 build --engine llama.cpp`)")
    if target.on_this_machine:
        return LlamaBenchPlace(bin_dir)
    rusage = [p for p in engine_files(target) if p.name == "pi2-rusage"]
    if not rusage:
        raise Pi2Error(
            f"no pi2-rusage in the pi2 build for {target.name}: rebuild it ({target.build_hint()})"
        )
    workdir = target.workdir.rstrip("/")
    items = collect_items(target, workdir, engine=[binary, *rusage], models=[gguf])
    reporter.message(f"pushing llama-bench, pi2-rusage, {gguf.name} to {target.name}")
    push_files(target, items, workdir)
    remote_model = next(i.remote for i in items if i.kind == "model")
    return LlamaBenchPlace(bin_dir, f"{workdir}/bin", remote_model)


def run_llama_bench_here(cmd: list[str], cell: Cell, gguf: Path, sampler, timeout_s: float):
    """llama-bench under pi2-rusage inside the budget's cgroup (model evicted first): (stdout, stderr, usage)."""
    from pi2cli.hw.rusage import Measured
    from pi2cli.plan.budget import Budget

    with Measured(cmd) as measured, Budget(cell.budget, evict=[gguf] if cell.budget else []) as budget:
        proc = budget.popen(measured.cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)  # fmt: skip
        stop = sampler.follow(proc.pid, wrapper=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except BaseException:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, 9)
            proc.communicate()
            raise
        finally:
            stop()
        sampler.budget_record = budget.record() if cell.budget else None
        return out, err, measured.usage()


def run_llama_bench_on_device(target, place: LlamaBenchPlace, cmd: list[str], timeout_s: float):
    """The same command on the device, on llama-bench's own clock there, under the pushed pi2-rusage
    (its report read back and removed): (stdout, stderr, usage). No memory curve: a sampler would follow
    pi2-rusage, not llama-bench; the peak is the kernel's ru_maxrss, as here."""
    from pi2cli.hw.rusage import parse_report

    runs = f"{target.workdir.rstrip('/')}/runs"
    report = f"{runs}/llama-bench-{os.getpid()}-{int(time.time() * 1000)}.rusage.json"
    target.mkdir(runs)
    argv = [f"{place.remote_bin}/pi2-rusage", "-o", report, "--", f"{place.remote_bin}/llama-bench", *cmd[1:]]
    argv[argv.index("-m") + 1] = place.remote_model
    chunks: dict[str, list[bytes]] = {"stdout": [], "stderr": []}
    proc = target.run(argv, on_output=lambda name, data: chunks.setdefault(name, []).append(data))
    try:
        proc.wait(timeout_s)
    except BaseException:
        with contextlib.suppress(Exception):
            proc.kill()
        raise
    try:
        usage = parse_report(target.read_text(report) or "")
    finally:
        with contextlib.suppress(TargetError):
            target.sh(f"rm -f {shlex.quote(report)}", timeout=10)
    text = {k: b"".join(v).decode(errors="replace") for k, v in chunks.items()}
    return text["stdout"], text["stderr"], usage


def llama_cell(run: dict, target, driver, gguf: Path, place: LlamaBenchPlace, cell: Cell, cfg: SweepConfig,
               reporter, label: str, sampler) -> list[dict]:  # fmt: skip
    """llama-bench's pp test and its tg test at depth P for one cell; returns its JSON records."""
    from pi2cli.engines.llamacpp import check_llama_bench_exit, llama_bench_command, parse_llama_bench_json

    records: list[dict] = []
    peak = 0
    extra = [] if cfg.warmup else ["--no-warmup"]
    tests = (("pp", dict(n_prompt=cell.n_prompt, n_gen=0), []),
             ("tg", dict(n_prompt=0, n_gen=cell.n_gen), ["-d", str(cell.n_prompt)]))  # fmt: skip
    for i, (test, sizes, more) in enumerate(tests):
        reporter.turn_started(label, f"llama-bench {test}", i + 1, 2)
        cmd = llama_bench_command(gguf, bin_dir=place.bin_dir, threads=cell.threads, repetitions=cfg.repeat,
                                  extra_args=more + extra, **sizes)  # fmt: skip
        if target.on_this_machine:
            out, err, usage = run_llama_bench_here(cmd, cell, gguf, sampler, cfg.timeout_s)
        else:
            out, err, usage = run_llama_bench_on_device(target, place, cmd, cfg.timeout_s)
        check_llama_bench_exit(usage.returncode, err)
        peak = max(peak, usage.maxrss_bytes or 0)
        got = parse_llama_bench_json(out)
        for record in got:
            try:
                times = [int(v) for v in record["samples_ns"]]
                rates = [float(v) for v in record["samples_ts"]]
            except (KeyError, TypeError, ValueError) as exc:
                raise Pi2Error(f"llama-bench record without samples_ns/samples_ts: {exc}") from None
            for rep, (t_ns, ts) in enumerate(zip(times, rates, strict=True)):
                S.add_turn(run, n_prompt=cell.n_prompt if test == "pp" else 0,
                           n_gen=cell.n_gen if test == "tg" else 0, ttft_ns=None,
                           prefill_ts=ts if test == "pp" else None, decode_ts=ts if test == "tg" else None,
                           prompt_id=f"{test}{cell.n_prompt if test == 'pp' else cell.n_gen}", rep=rep,
                           extra={"test": test, "t_ns": t_ns, "n_depth": cell.n_prompt if test == "tg" else 0,
                                  "rates_from": "engine"})  # fmt: skip
        records += got
        reporter.turn_done(label, None if test == "pp" else run["turns"][-1]["decode_ts"], None)
    if peak:
        S.set_counters(run, peak_rss_bytes=peak, peak_rss_source=S.PEAK_RSS_WRAPPER)
    return records


# --------------------------------------------------------------------------------------------- memory
class FollowingSampler:
    """One memory curve per run across its processes: follow(pid) samples that process until the
    returned stop() (times from the run's start, so the processes' curves line up one after another)."""

    def __init__(self, target):
        self.target = target
        self.samples: list[tuple[float, int, int | None]] = []
        self.budget_record: dict | None = None  # the last process's cgroup record (pi2cli.plan.budget)
        self._t0 = time.monotonic()

    def follow(self, pid: int | None, wrapper: bool = False):
        from pi2cli.bench.run import MemorySampler

        sampler = MemorySampler(self.target, pid, wrapper=wrapper)
        sampler._t0 = self._t0
        sampler.start()

        def stop():
            sampler.stop()
            self.samples += sampler.samples

        return stop


# ------------------------------------------------------------------------------------------- the sweep
def write_samples_csv(path: str, outcomes: list) -> None:
    """One row per sample of every run: pi2's TTFT and TBTs (per token), llama-bench's test times."""
    out = Path(path)
    tmp = out.with_name(f".{out.name}.partial-{os.getpid()}")
    with open(tmp, "w", newline="") as f:
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
    tmp.replace(out)


def run_sweep(cfg: SweepConfig, reporter=None, echo=print) -> list:
    """Resolve everything first (a typo fails before anything runs), then every cell in turn; a cell
    that fails is saved as failed and the sweep goes on (Ctrl-C saves it as aborted and stops)."""
    from pi2cli.bench.run import (
        Reporter,
        RunOutcome,
        file_sha256,
        memory_block,
        model_facts,
        prepare_engine,
        resolve_model,
        save_failed_run,
    )
    from pi2cli.engines import get_driver
    from pi2cli.results import store
    from pi2cli.targets import get_target

    reporter = reporter or Reporter()
    check_config(cfg)
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
        run = S.new_run(
            engine=S.engine_info(**driver.engine_info(target)),
            model=S.model_info(model.name, path=str(local), sha256=file_sha256(local),
                               size_bytes=local.stat().st_size, **model_facts(model)),
            workload=S.workload_info(cell.workload, n_prompts=1, source=f"synthetic prompt of {cell.n_prompt} "
                                     f"token ids (seed {TOKEN_SEED}), {cell.n_gen} generated"),
            target=S.target_info(target.name, target.kind,
                                 **{k: v for k, v in facts.items() if k not in ("name", "kind")}),
            memory=memory_block(target, cell.budget, None),
            settings=S.settings_info(n_gen=cell.n_gen, threads=cell.threads, repetitions=cfg.repeat,
                                     warmup=cfg.warmup, mode="pp-tg", n_prompt=cell.n_prompt, ignore_eos=True,
                                     **driver.extra_settings),
            measurement=LLAMA_HOW if cell.engine == "llama.cpp" else PI2_HOW,
            tags=cfg.tags,
        )  # fmt: skip
        reporter.run_started(label, 2 if cell.engine == "llama.cpp" else cfg.warmup + cfg.repeat)
        sampler = FollowingSampler(target)
        try:
            if cell.engine == "llama.cpp":
                run["llama_bench"] = llama_cell(
                    run, target, driver, model.gguf, place, cell, cfg, reporter, label, sampler
                )
            else:
                pi2_cell(run, target, prepared[cell.engine], cell, cfg, n_vocab, reporter, label, sampler)
        except (KeyboardInterrupt, Pi2Error, TargetError, OSError) as exc:
            for t_s, rss, pss in sampler.samples:
                S.add_memory_sample(run, t_s, rss, pss)
            try:
                outcomes.append(save_failed_run(exc, run, None, target, cell.budget, sampler.budget_record,
                                                _FailCfg(cfg.results_dir), reporter, label, cell.engine,
                                                cell.workload))  # fmt: skip
            except BaseException as stop:
                if cfg.samples_csv:  # Ctrl-C or a vanished device: the samples so far are kept too
                    saved = getattr(stop, "outcome", None)  # BenchInterrupted / DeviceVanished carry it
                    write_samples_csv(cfg.samples_csv, outcomes + ([saved] if saved else []))
                raise
            continue
        for t_s, rss, pss in sampler.samples:
            S.add_memory_sample(run, t_s, rss, pss)
        run["memory"] = memory_block(target, cell.budget, sampler.budget_record)
        if (sampler.budget_record or {}).get("peak_bytes") is not None:
            S.set_counters(run, budget_peak_bytes=sampler.budget_record["peak_bytes"])
        pss = [p for _, _, p in sampler.samples if p is not None]
        if pss:
            S.set_counters(run, peak_pss_bytes=max(pss))
        path = store.save_run(run, cfg.results_dir)
        reporter.run_done(label, run["status"])
        outcomes.append(RunOutcome(cell.engine, cell.workload, cell.budget, run, path))
    if cfg.samples_csv:
        write_samples_csv(cfg.samples_csv, outcomes)
    return outcomes


@dataclass
class _FailCfg:
    """What save_failed_run reads of a config."""

    results_dir: str | None
    annotate: object = None
