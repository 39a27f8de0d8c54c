"""MLC-LLM's driver, through the runner the user provides (docs/MLC.md); `pi2 generate` is one turn.

Every turn sends the conversation so far as chat messages (the same messages the other engines get
rendered with the model's chat template; MLC applies its own conversation template to them):
  * URL runner (`mlc_llm serve`): one streamed /v1/chat/completions per turn. TTFT and the time of
    every streamed chunk are stamped on the host, as for llama.cpp; MLC keeps its prefix cache across
    requests by itself. Token counts and MLC's own rates come from the final chunk's usage.
  * command runner: the runner is started once per turn with the request on stdin, inside the memory
    budget when there is one. Its figures are its own (usage JSON or the stats line): no per-token
    times, so the turn records MLC's prefill/decode rates, its ttft_s when reported, and TBT stays
    unknown. Its peak RSS is the kernel's ru_maxrss of the runner (pi2-rusage: the runner's own or that of
    any child it waited for, whichever is higher), kept when it runs here (not an `adb shell` runner).
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from pi2cli.engines.base import Driver, TurnMetrics
from pi2cli.engines.mlc.runner import (
    RUNNER_ENV,
    parse_runner_output,
    resolve_runner,
    run_command_runner,
    stream_chat,
)
from pi2cli.errors import Pi2Error
from pi2cli.hw.rusage import wrapper_binary
from pi2cli.results.schema import PEAK_RSS_WRAPPER

MODEL_ENV = "PI2_MLC_MODEL"


def is_url(runner: str) -> bool:
    return runner.startswith(("http://", "https://"))


def request_body(messages: list[dict], n_predict: int, *, model: str | None, seed: int, ignore_eos: bool,
                 url: bool, temperature: float = 0.0) -> dict:  # fmt: skip
    """The chat request both runner kinds get (greedy unless `pi2 generate --temperature`). A URL runner
    gets ignore_eos the way `mlc_llm serve` takes it (debug_config), a command runner as a plain key."""
    body: dict = {
        "messages": messages,
        "max_tokens": int(n_predict),
        "temperature": temperature,
        "seed": seed,
    }
    if model:
        body["model"] = model
    if url:
        if ignore_eos:
            body["debug_config"] = {"ignore_eos": True}
    else:
        body["ignore_eos"] = bool(ignore_eos)
    return body


class MlcSession:
    """A conversation with MLC: no long-lived process of ours (pid None: nothing to sample)."""

    pid = None

    def __init__(self, runner: str, model: str | None, *, seed: int = 0, cgroup=None, local: bool = True,
                 timeout_s: float = 3600.0, temperature: float = 0.0):  # fmt: skip
        self.runner, self.model, self.seed, self.cgroup = runner, model, seed, cgroup
        self.temperature = temperature
        self.timeout_s = timeout_s
        cmd = shlex.split(runner) if not is_url(runner) else []
        # the runner's peak RSS is the engine's only when the runner IS the engine, here
        self.count_rss = local and bool(cmd) and Path(cmd[0]).name != "adb"
        self.peak_rss = 0
        self.sources: set[str] = set()

    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None,
             messages: list[dict] | None = None) -> TurnMetrics:  # fmt: skip
        messages = messages or [{"role": "user", "content": prompt}]
        url = is_url(self.runner)
        body = request_body(messages, n_predict, model=self.model, seed=self.seed, ignore_eos=ignore_eos, url=url,
                            temperature=self.temperature)  # fmt: skip
        if url:
            out = stream_chat(self.runner, body, self.timeout_s)
            text, stats, times = out.text, out.stats, out.chunk_times_s
            ttft = times[0] if times else stats.ttft_s
            self.sources.add("stream")
        else:
            run = run_command_runner(self.runner, body, self.timeout_s,
                                     popen=self.cgroup.popen if self.cgroup is not None else None)  # fmt: skip
            text, stats = parse_runner_output(run.stdout)
            times, ttft = [], stats.ttft_s
            if self.count_rss:
                self.peak_rss = max(self.peak_rss, run.peak_rss_bytes)
            self.sources.add(stats.source)
        n_gen = max(stats.completion_tokens or 0, len(times)) or int(n_predict)
        n_prompt = stats.prompt_tokens or 0
        if on_text and text:
            on_text(text)
        return TurnMetrics(
            text=text,
            token_ids=[],  # MLC reports text, not token ids
            n_prompt=n_prompt,
            n_prompt_cached=0,  # MLC does not say how much of the prompt its prefix cache reused
            n_prompt_processed=n_prompt,
            ttft_s=ttft,
            token_times_s=times,
            prefill_tps=stats.prefill_tps,
            decode_tps=stats.decode_tps,
            host_decode_tps=0.0,
            stop_type="",
            timings={
                "mlc_ttft_s": stats.ttft_s,
                "mlc_inter_token_latency_s": stats.inter_token_latency_s,
                "mlc_stats": stats.source,
                "n_gen_reported": stats.completion_tokens is not None,
            },  # fmt: skip
            n_gen=n_gen,
        )

    def close(self) -> dict:
        return {
            "peak_rss_bytes": self.peak_rss or None,
            "mlc_stats": ", ".join(sorted(self.sources)) or None,
            "peak_rss_source": PEAK_RSS_WRAPPER if self.peak_rss else None,
        }

    def kill(self) -> None:
        pass  # a command runner is killed by run_command_runner itself on Ctrl-C


class MlcDriver(Driver):
    """MLC-LLM through the runner the user provides, in MlcSession; options: the runner (URL or command)
    and the model id it is given (`pi2 generate -m` names it there)."""

    name = "mlc-llm"
    policy = None
    model_suffix = ".gguf"  # recorded as the weights benchmarked; the runner loads its own compiled model
    options = ("mlc_runner", "mlc_model")

    def __init__(self, runner: str | None = None, model: str | None = None):
        super().__init__()
        self.runner = runner
        self.model = model

    def set_option(self, name: str, value) -> None:
        if name == "mlc_runner":
            self.runner = value
        else:
            self.model = value

    def resolved_runner(self) -> str:
        return resolve_runner(self.runner)

    def supports(self, target) -> str | None:
        if not (self.runner or os.environ.get(RUNNER_ENV, "")).strip():
            return (f"engine 'mlc-llm' needs a runner and none is configured: pass --mlc-runner (or set "
                    f"{RUNNER_ENV}) with the URL of a running `mlc_llm serve` (e.g. http://127.0.0.1:8000) or a "
                    f"command that reads a JSON request on stdin and prints text plus MLC's stats (docs/MLC.md)")  # fmt: skip
        runner = self.resolved_runner()
        if not is_url(runner):
            cmd = shlex.split(runner)
            if not cmd or not shutil.which(cmd[0]):
                return f"the MLC runner command does not exist or is not executable: {cmd[0] if cmd else runner!r}"
            try:
                wrapper_binary()  # a command runner runs under pi2-rusage, which measures its peak memory
            except Pi2Error as exc:
                return str(exc)
        if not target.native_here:
            return ("mlc-llm is benched from this machine (--device local): point the runner at the phone "
                    "instead (adb forward for a server URL, or an `adb shell ...` command; docs/MLC.md)")  # fmt: skip
        return None

    def configure(self, target, model_local: Path) -> None:
        runner = self.resolved_runner()
        self.extra_settings = {"mlc_runner": runner,
                               "mlc_model": self.model or os.environ.get(MODEL_ENV) or None}  # fmt: skip
        if is_url(runner):
            self.how = (f"MLC-LLM through `mlc_llm serve` at {runner}: streamed /v1/chat/completions, TTFT and "
                        f"chunk times stamped on the host; token counts and MLC's own rates from usage.extra")  # fmt: skip
            self.budget_outside = (
                "the MLC server runs outside pi2 (start it under its own limit, or use a command runner)"
            )
        else:
            self.how = (f"MLC-LLM through the command runner {runner!r}, once per turn: prefill/decode tok/s (and "
                        f"TTFT when reported) are MLC's own figures from its output; no per-token times")  # fmt: skip
            self.budget_outside = None

    def prepare_generate(self, target, request) -> tuple[str, None]:
        """`pi2 generate -m ID`: the id the runner is given (the runner loads its own compiled model)."""
        self.model = self.model or str(request.model)
        self.configure(target, Path(request.model))
        return str(request.model), None

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  cgroup=None, budget_bytes: int | None = None, seed: int = 0,
                  temperature: float = 0.0) -> MlcSession:  # fmt: skip
        runner = self.resolved_runner()
        model_id = self.model or os.environ.get(MODEL_ENV) or (None if is_url(runner) else model)
        return MlcSession(runner, model_id, seed=seed, cgroup=cgroup, local=target.native_here,
                          temperature=temperature)  # fmt: skip

    def generate_extra(self, session, turn) -> dict:
        return {"mlc_stats": ", ".join(sorted(session.sources)) or None, "n_gen": turn.n_gen}

    def engine_info(self, target) -> dict:
        return {"name": self.name, "version": None, "commit": None, "build_flags": None, "build_type": None,
                "policy": None, "binary_sha256": None}  # fmt: skip


__all__ = ["RUNNER_ENV", "MODEL_ENV", "MlcDriver", "MlcSession", "request_body"]
