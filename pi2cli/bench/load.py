"""`pi2 bench --mode load`: N concurrent multi-turn conversations against any OpenAI-compatible server
(pi2-engine serve, llama-server, `mlc_llm serve`) for T seconds, stored as one run.

Each of the N clients is a thread that holds conversations from the workload set (client i starts at
conversation i and steps by N) and sends their turns one after another as streamed chat completions,
each with the whole conversation so far: the user turns and the server's OWN earlier answers, as
`--mode chat` prompts an engine. A 503 or 429 (the server's queue is full) is a rejection: counted,
waited out for its Retry-After (0.5 s when it names none) and the same turn sent again. After T seconds
no new request starts; those in flight finish (each bounded by --request-timeout), and the window
closes when the last one ends. Ctrl-C stops at once: in-flight requests are cancelled (closing the
connection: pi2-engine serve frees its slot at the next token) and the run is stored as aborted with
everything measured so far.

Stored as one run (pi2cli.results.schema): one turn per answered request (client-side TTFT and TBT from
arrival times: what a user of the server waits; the engine's own in extra.engine where chunks carry
pi2_timings), failed and timed-out requests as turns with their status and reason, and the run's `load`
block (docs/RESULTS.md): counts of every outcome with their reasons, throughput over the window, TTFT
and TBT percentiles from both clocks, and the server's usage totals. When the server listens on this
machine its process's memory is sampled every 0.5 s (psutil) and its peak is the kernel's VmHWM.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pi2cli.bench.load_client import (
    Attempt,
    Endpoint,
    InFlight,
    counter_deltas,
    get_json,
    get_metrics,
    stream_chat,
)
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.signals import signal_name
from pi2cli.workloads import Conversation, load_workload, workload_path

NO_RETRY_AFTER_WAIT_S = 0.5  # a rejection that names no Retry-After is retried this much later
FAILURE_PAUSE_S = 0.1  # after a failed request, so a server refusing everything is not hammered
SAMPLE_EVERY_S = 0.5
MAX_SECONDS = 7 * 86400  # --duration and --request-timeout: a week is more than any load test needs
OUTCOMES = ("completed", "failed", "rejected", "timed_out", "cancelled")
OWNERS = {"pi2": "pi2", "llamacpp": "llama.cpp", "mlc": "mlc-llm"}  # /v1/models owned_by -> engine name
MEASUREMENT = ("pi2 bench --mode load: N client threads, streamed /v1/chat/completions over HTTP; TTFT = "
               "request sent to the first chunk with text, TBT = gaps between such chunks, both on this "
               "machine's monotonic clock as chunks arrive (queueing included); the engine's own clock "
               "(pi2_timings) in each turn's extra.engine and the load block")  # fmt: skip


@dataclass
class LoadConfig:
    url: str
    concurrency: int = 4
    duration_s: float = 60.0
    model: str | None = None  # the model id sent; None: the server's first /v1/models entry
    engine: str | None = None  # the engine's name in the result; None: from /v1/models owned_by
    max_tokens: int | None = None  # None: each turn's max_new_tokens from the workload
    api_key: str | None = None
    workload: str = "multi-turn"
    limit: int | None = None
    seed: int | None = None
    request_timeout_s: float = 300.0
    temperature: float = 0.0
    results_dir: str | None = None
    tags: list[str] = field(default_factory=list)


def check_config(cfg: LoadConfig) -> Endpoint:
    if cfg.concurrency < 1:
        raise Pi2Error(f"-c/--concurrency must be at least 1, got {cfg.concurrency}")
    if not 0 < cfg.duration_s <= MAX_SECONDS:  # nan and inf too: the window is stored as a finite number
        raise Pi2Error(
            f"--duration must be above 0 and at most {MAX_SECONDS} seconds, got {cfg.duration_s:g}"
        )
    if cfg.max_tokens is not None and cfg.max_tokens < 1:
        raise Pi2Error(f"--max-tokens must be at least 1, got {cfg.max_tokens}")
    if not 0 < cfg.request_timeout_s <= MAX_SECONDS:
        raise Pi2Error(
            f"--request-timeout must be above 0 and at most {MAX_SECONDS} seconds, got {cfg.request_timeout_s:g}"
        )
    return Endpoint.parse(cfg.url)


# ------------------------------------------------------------------------------------------ the server
@dataclass
class Server:
    engine: str
    model_id: str
    pid: int | None  # the listening process, when it is on this machine and ours to read
    model_path: Path | None  # its -m file, read from its command line, when it names one that exists


def probe(ep: Endpoint, cfg: LoadConfig) -> Server:
    """GET /v1/models before any load: nothing listening, a wrong key or not an OpenAI server is one line."""
    models = get_json(ep, "/v1/models", cfg.api_key)
    data = [m for m in models.get("data") or [] if isinstance(m, dict) and isinstance(m.get("id"), str)]
    if cfg.model is None and not data:
        raise Pi2Error(f"{ep.url}/v1/models lists no model: name one with --model")
    first = data[0] if data else {}
    owner = str(first.get("owned_by") or "")
    engine = cfg.engine or next((v for k, v in OWNERS.items() if k in owner.lower()), owner or "server")
    pid = listening_pid(ep.port) if ep.loopback else None
    return Server(engine, cfg.model or first["id"], pid, model_file(pid))


def listening_pid(port: int) -> int | None:
    """The process listening on this machine's TCP `port` (psutil), None when none of ours is, or when
    it is adb forwarding the port to a device."""
    import psutil

    with contextlib.suppress(psutil.Error, OSError):
        for c in psutil.net_connections(kind="tcp"):
            if c.status == psutil.CONN_LISTEN and c.laddr and c.laddr.port == port and c.pid:
                # an adb forward (`pi2 serve` to a phone) listens here for a server that runs there:
                # adb's own memory is not the server's
                return None if psutil.Process(c.pid).name() == "adb" else c.pid
    return None


def model_file(pid: int | None) -> Path | None:
    """The model file a local server was started with (`-m PATH` / `--model PATH` / `-m=PATH`)."""
    import psutil

    if pid is None:
        return None
    try:
        argv = psutil.Process(pid).cmdline()
    except (psutil.Error, OSError):
        return None
    for i, arg in enumerate(argv):
        value = None
        if arg in ("-m", "--model") and i + 1 < len(argv):
            value = argv[i + 1]
        elif arg.startswith("--model="):
            value = arg.split("=", 1)[1]
        if value:
            path = Path(value)
            if not path.is_absolute():
                with contextlib.suppress(psutil.Error, OSError):
                    path = Path(psutil.Process(pid).cwd()) / path
            return path if path.is_file() else None
    return None


class ServerMemory:
    """The local server's RSS (and PSS where the kernel has it) every 0.5 s while the load runs."""

    def __init__(self, pid: int | None, t0: float):
        self.pid, self.t0 = pid, t0
        self.samples: list[tuple[float, int, int | None]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        if pid is not None:
            self._thread.start()

    def _loop(self) -> None:
        import psutil

        try:
            proc = psutil.Process(self.pid)
            while not self._stop.is_set():
                rss = proc.memory_info().rss
                pss = None
                with contextlib.suppress(psutil.Error, AttributeError, OSError):
                    pss = getattr(proc.memory_full_info(), "pss", None)
                self.samples.append((round(time.monotonic() - self.t0, 3), rss, pss))
                self._stop.wait(SAMPLE_EVERY_S)
        except (psutil.Error, OSError):
            return  # the server went away: the curve ends there

    def stop(self) -> int | None:
        """Stop sampling; the server's peak RSS as the kernel kept it (VmHWM), None when unreadable."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(5)
        if self.pid is None:
            return None
        from pi2cli.engines.llamacpp.server import vm_hwm_bytes

        return vm_hwm_bytes(self.pid) or None


# ------------------------------------------------------------------------------------------- the load
@dataclass
class Record:
    """One request's end, as a worker hands it to the tally."""

    client: int
    conversation: str
    turn: int
    attempt: Attempt
    retries: int  # rejections of this turn before this attempt


class Tally:
    """What the clients report, under one lock (the progress line reads it while they run)."""

    def __init__(self):
        self.lock = threading.Lock()
        self.records: list[Record] = []
        self.rejections: Counter = Counter()  # reason -> count (rejected attempts are not turns)
        self.retry_after_s: list[float | None] = []
        self.fatal: str | None = None
        self.tokens = 0

    def add(self, rec: Record) -> None:
        with self.lock:
            if rec.attempt.outcome == "rejected":
                self.rejections[rec.attempt.reason] += 1
                self.retry_after_s.append(rec.attempt.retry_after_s)
                return
            if rec.attempt.outcome == "fatal":
                self.fatal = self.fatal or rec.attempt.reason
                return
            self.records.append(rec)
            self.tokens += n_generated(rec.attempt)

    def counts(self) -> dict:
        with self.lock:
            n = Counter(OUTCOME_NAMES[r.attempt.outcome] for r in self.records)
            out = {k: n.get(k, 0) for k in OUTCOMES}
            out["rejected"] = sum(self.rejections.values())
            return out


OUTCOME_NAMES = {"ok": "completed", "failed": "failed", "timeout": "timed_out", "cancelled": "cancelled"}


def n_generated(a: Attempt) -> int:
    """Tokens the server generated for this request: its usage when it says, else the chunks with text."""
    usage = (a.usage or {}).get("completion_tokens")
    return usage if isinstance(usage, int) and usage >= 0 else len(a.arrivals_s)


def client_loop(i: int, cfg: LoadConfig, ep: Endpoint, model_id: str, conversations: list[Conversation],
                end_at: float, tally: Tally, inflight: InFlight) -> None:  # fmt: skip
    """Client i: conversations i, i+N, ... (wrapping), each turn until the window ends or the load stops."""
    c = i % len(conversations)
    while time.monotonic() < end_at and not inflight.stopping.is_set():
        conv = conversations[c]
        answers: list[str] = []
        for k, budget in enumerate(conv.max_new_tokens):
            retries = 0
            while True:
                if time.monotonic() >= end_at or inflight.stopping.is_set():
                    return
                body = {"model": model_id, "messages": conv.messages_for_turn(k, answers),
                        "max_tokens": cfg.max_tokens or budget, "temperature": cfg.temperature}  # fmt: skip
                a = stream_chat(ep, body, cfg.api_key, cfg.request_timeout_s, inflight)
                tally.add(Record(i, conv.id, k, a, retries))
                if a.outcome == "fatal":
                    inflight.stop_all()
                    return
                if a.outcome != "rejected":
                    break
                retries += 1
                wait = NO_RETRY_AFTER_WAIT_S if a.retry_after_s is None else a.retry_after_s
                inflight.stopping.wait(max(0.0, min(wait, end_at - time.monotonic())))
            if a.outcome != "ok":  # the conversation cannot go on without this answer: the next one
                inflight.stopping.wait(FAILURE_PAUSE_S)
                break
            answers.append(a.text)
        c = (c + cfg.concurrency) % len(conversations)


class LoadInterrupted(KeyboardInterrupt):
    """Ctrl-C / SIGTERM / SIGHUP during the load: the run was saved as aborted (`outcome.path`)."""

    def __init__(self, outcome, name: str):
        super().__init__("interrupted")
        self.outcome, self.signal_name = outcome, name


def run_load(cfg: LoadConfig, progress=None):
    """Probe the server, run the load, store the run; returns its RunOutcome. `progress(elapsed_s,
    counts, tokens)` is called about every 0.5 s while the clients run."""
    from pi2cli.bench.recorder import RunOutcome
    from pi2cli.results import store

    ep = check_config(cfg)
    conversations = load_workload(cfg.workload, cfg.limit, cfg.seed)
    store.check_writable(cfg.results_dir)
    server = probe(ep, cfg)
    run = new_load_run(cfg, ep, server, len(conversations))
    tally, inflight = Tally(), InFlight()
    metrics_before = get_metrics(ep, cfg.api_key)  # the server's own counts, where it keeps any
    t0 = time.monotonic()
    end_at = t0 + cfg.duration_s
    memory = ServerMemory(server.pid, t0)
    clients = [threading.Thread(target=client_loop, args=(i, cfg, ep, server.model_id, conversations, end_at,
                                                          tally, inflight), daemon=True)
               for i in range(cfg.concurrency)]  # fmt: skip
    stopped: BaseException | None = None
    try:
        for t in clients:
            t.start()
        while any(t.is_alive() for t in clients):
            for t in clients:
                t.join(0.5 / len(clients))
            if progress:
                progress(time.monotonic() - t0, tally.counts(), tally.tokens)
    except KeyboardInterrupt as exc:  # Ctrl-C, SIGTERM, SIGHUP: cancel what is in flight, keep the rest
        stopped = exc
        inflight.stop_all()
        for t in clients:
            t.join(5)
    window_s = time.monotonic() - t0
    peak = memory.stop()
    fill_run(run, cfg, tally, window_s, memory.samples, peak, t0)
    if stopped is None:  # after Ctrl-C no more requests: the counts of what finished are kept as they are
        run["load"]["server_metrics"] = counter_deltas(metrics_before, get_metrics(ep, cfg.api_key))
    if stopped is not None:
        name = signal_name(stopped)
        S.mark_failed(run, "aborted", f"aborted: {name}{' (Ctrl-C)' if name == 'SIGINT' else ''} after "
                                      f"{window_s:.1f} s of load; the requests in flight were cancelled")  # fmt: skip
    elif tally.fatal:
        S.mark_failed(run, "failed", f"the load stopped after {window_s:.1f} s: {tally.fatal}")
    elif not S.measured_turns(run):
        reasons = Counter(r.attempt.reason for r in tally.records) + tally.rejections
        why = reasons.most_common(1)[0][0] if reasons else "no request was sent"
        S.mark_failed(run, "failed", f"no request completed in {window_s:.1f} s: {why}")
    path = store.save_run(run, cfg.results_dir)
    outcome = RunOutcome(server.engine, run["workload"]["name"], None, run, path)
    if stopped is not None:
        raise LoadInterrupted(outcome, signal_name(stopped)) from None
    return outcome


def workload_name(cfg: LoadConfig) -> str:
    """load-c4-multi-turn: concurrency is part of what a load run measures, so it names its group."""
    return f"load-c{cfg.concurrency}-{cfg.workload}"


def new_load_run(cfg: LoadConfig, ep: Endpoint, server: Server, n_conversations: int) -> dict:
    from pi2cli.bench.recorder import file_sha256, model_facts
    from pi2cli.model_files import ModelFiles, model_display_name

    path = server.model_path
    if path is not None:
        pi2 = path if path.suffix == ".pi2" else None
        gguf = path if path.suffix == ".gguf" else (path.with_suffix(".gguf") if pi2 else None)
        files = ModelFiles(model_display_name(path), pi2, gguf if gguf and gguf.is_file() else None, None)
        model = S.model_info(files.name, path=str(path), sha256=file_sha256(path), size_bytes=path.stat().st_size,
                             **model_facts(files))  # fmt: skip
    else:  # a server elsewhere: only the id it answers to is known (synthetic or not cannot be told)
        model = S.model_info(server.model_id)
    if server.pid is not None:
        from pi2cli.targets import get_target

        local = get_target(None)
        facts = local.facts()
        target = S.target_info(
            local.name, local.kind, **{k: v for k, v in facts.items() if k not in ("name", "kind")}
        )
    else:
        target = S.target_info(f"{ep.host}:{ep.port}", "http")
    wl = workload_path(cfg.workload)
    return S.new_run(
        engine=S.engine_info(server.engine),
        model=model,
        workload=S.workload_info(workload_name(cfg), n_prompts=n_conversations, sha256=file_sha256(wl),
                                 source=wl.name),
        target=target,
        settings=S.settings_info(n_gen=cfg.max_tokens, threads=None, temperature=cfg.temperature, mode="load",
                                 concurrency=cfg.concurrency, duration_s=cfg.duration_s, url=ep.url,
                                 model_id=server.model_id, request_timeout_s=cfg.request_timeout_s,
                                 api_key=bool(cfg.api_key), limit=cfg.limit),
        measurement=MEASUREMENT,
        tags=cfg.tags,
    )  # fmt: skip


# ----------------------------------------------------------------------------------------- the result
def engine_gaps_ns(stamps: list[tuple[int, int]]) -> list[int]:
    """Times between tokens on the engine's clock: a chunk that carries several tokens (text held back at a
    possible stop string) spreads its gap evenly over them."""
    out: list[int] = []
    for (t_a, n_a), (t_b, n_b) in zip(stamps, stamps[1:], strict=False):
        tokens = n_b - n_a
        if tokens > 0 and t_b >= t_a:
            out += [round((t_b - t_a) / tokens)] * tokens
    return out


def percentiles_ms(values_ns) -> dict | None:
    v = np.asarray(list(values_ns), dtype=np.float64)
    if not v.size:
        return None
    return {f"p{q}": round(float(np.percentile(v, q)) / 1e6, 3) for q in (50, 90, 99)}


def add_request_turn(run: dict, rec: Record, t0: float) -> dict:
    a = rec.attempt
    n_gen = n_generated(a)
    usage = a.usage or {}
    n_prompt = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else 0
    if not a.arrivals_s:  # tokens without text (an end-of-turn token): nothing arrived to time
        n_gen = 0
    samples = S.tbt_from_times(a.arrivals_s)[: max(n_gen - 1, 0)]
    extra = {"client": rec.client, "conversation": rec.conversation, "turn": rec.turn, "retries": rec.retries,
             "start_s": round(a.sent_s - t0, 4), "end_s": round(a.ended_s - t0, 4), "http_status": a.status,
             "finish_reason": a.finish_reason, "chunks": len(a.arrivals_s)}  # fmt: skip
    if a.final_timings is not None:
        ft = a.final_timings
        engine = {k: ft.get(k) for k in ("queue_ms", "ttft_ms", "n_cached", "prefill_tps", "decode_tps",
                                         "peak_rss_bytes", "timed_out") if k in ft}  # fmt: skip
        if isinstance(ft.get("queue_ms"), int | float) and isinstance(ft.get("ttft_ms"), int | float):
            # the engine's TTFT from the request entering its queue, as the client's counts it from sending
            engine["ttft_ns"] = round((ft["queue_ms"] + ft["ttft_ms"]) * 1e6)
        engine["samples_ns"] = engine_gaps_ns(a.engine_ns)
        extra["engine"] = engine
    status = {"ok": S.STATUS_OK, "timeout": "timeout"}.get(a.outcome, "failed")
    return S.add_turn(
        run, n_prompt=n_prompt, n_gen=n_gen, prompt_id=f"{rec.conversation}#{rec.turn}", rep=rec.client,
        ttft_ns=round((a.arrivals_s[0] - a.sent_s) * 1e9) if a.arrivals_s else None, samples_ns=samples,
        status=status, error=None if status == S.STATUS_OK else f"{a.outcome}: {a.reason}", extra=extra,
    )  # fmt: skip


def fill_run(run: dict, cfg: LoadConfig, tally: Tally, window_s: float, samples: list, peak_rss: int | None,
             t0: float) -> None:  # fmt: skip
    """The turns, memory curve and `load` block of a finished (or stopped) load."""
    with tally.lock:
        records = sorted(tally.records, key=lambda r: r.attempt.sent_s)
        rejections = dict(tally.rejections)
        retry_after = list(tally.retry_after_s)
    for rec in records:
        add_request_turn(run, rec, t0)
    for t_s, rss, pss in samples:
        S.add_memory_sample(run, t_s, rss, pss)
    if peak_rss:
        S.set_counters(run, peak_rss_bytes=peak_rss, peak_rss_source=S.PEAK_RSS_SERVER)
    pss = [p for _, _, p in samples if p is not None]
    if pss:
        S.set_counters(run, peak_pss_bytes=max(pss))
    run["load"] = load_block(run, cfg, records, rejections, retry_after, window_s)


def load_block(run: dict, cfg: LoadConfig, records: list[Record], rejections: dict, retry_after: list,
               window_s: float) -> dict:  # fmt: skip
    counts = Counter(OUTCOME_NAMES[r.attempt.outcome] for r in records)
    requests = {k: counts.get(k, 0) for k in OUTCOMES}
    requests["rejected"] = sum(rejections.values())
    reasons = Counter()
    for r in records:
        if r.attempt.outcome != "ok":
            reasons[(OUTCOME_NAMES[r.attempt.outcome], r.attempt.reason)] += 1
    for reason, n in rejections.items():
        reasons[("rejected", reason)] += n
    ok_turns = [t for t in run["turns"] if t["status"] == S.STATUS_OK]
    engine = [t["extra"]["engine"] for t in ok_turns if "engine" in t["extra"]]
    tokens = sum(n_generated(r.attempt) for r in records)
    usage = [r.attempt.usage for r in records if isinstance(r.attempt.usage, dict)]

    def usage_sum(key: str) -> int | None:
        values = [u[key] for u in usage if isinstance(u.get(key), int)]
        return sum(values) if values else None

    given = [v for v in retry_after if v is not None]
    return {
        "concurrency": cfg.concurrency,
        "duration_s": float(cfg.duration_s),
        "window_s": round(window_s, 4),
        "requests": requests,
        "reasons": [{"outcome": o, "reason": why or "", "count": n} for (o, why), n in reasons.most_common()],
        "retry_after": {"given": len(given), "missing": len(retry_after) - len(given),
                        "asked_s": round(sum(given), 3)},
        "tokens": tokens,
        "tokens_per_s": round(tokens / window_s, 3) if window_s > 0 else 0.0,
        "requests_per_s": round(requests["completed"] / window_s, 3) if window_s > 0 else 0.0,
        "client": {"ttft_ms": percentiles_ms(t["ttft_ns"] for t in ok_turns if t["ttft_ns"] is not None),
                   "tbt_ms": percentiles_ms(s for t in ok_turns for s in t["samples_ns"])},
        "engine": {"ttft_ms": percentiles_ms(e["ttft_ns"] for e in engine if "ttft_ns" in e),
                   "tbt_ms": percentiles_ms(s for e in engine for s in e["samples_ns"])} if engine else None,
        "server_usage": {"prompt_tokens": usage_sum("prompt_tokens"),
                         "completion_tokens": usage_sum("completion_tokens")},
        "server_metrics": None,  # set by run_load: what the server's /metrics counters rose by
    }  # fmt: skip


def load_lines(run: dict) -> list[str]:
    """A load run in a few lines (bench's summary, `results show`): counts, throughput, both clocks'
    percentiles, the server's peak and every reason."""
    load = run["load"]
    r = load["requests"]

    def pct(block, name):
        values = (block or {}).get(name)
        return "-" if not values else " / ".join(f"{values[k]:.1f}" for k in ("p50", "p90", "p99"))

    lines = [f"requests: {r['completed']} completed, {r['rejected']} rejected, {r['failed']} failed, "
             f"{r['timed_out']} timed out" + (f", {r['cancelled']} cancelled" if r["cancelled"] else ""),
             f"throughput: {load['tokens_per_s']:.1f} tok/s ({load['tokens']} tokens), "
             f"{load['requests_per_s']:.2f} requests/s over {load['window_s']:.1f} s",
             f"TTFT ms p50 / p90 / p99: client {pct(load['client'], 'ttft_ms')}, engine "
             f"{pct(load['engine'], 'ttft_ms')}",
             f"TBT ms p50 / p90 / p99: client {pct(load['client'], 'tbt_ms')}, engine "
             f"{pct(load['engine'], 'tbt_ms')}"]  # fmt: skip
    peak = (run.get("summary") or S.summarize(run))["peak_rss_bytes"]
    if peak is not None:
        lines.append(f"server peak RSS {peak / 2**20:.1f} MiB ({run['counters'].get('peak_rss_source')}), "
                     f"{len(run['memory_samples'])} memory samples")  # fmt: skip
    tokens = {k: v for k, v in (load.get("server_metrics") or {}).items() if "token" in k and v}
    if tokens:
        lines.append("server /metrics: " + ", ".join(f"{k} +{v:g}" for k, v in tokens.items()))
    lines += [f"{x['count']} x {x['outcome']}: {x['reason']}" for x in load["reasons"]]
    return lines
