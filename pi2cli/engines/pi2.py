"""The pi2-engine driver: runs the host build of pi2-engine and reads its JSONL events."""

from __future__ import annotations

import json
import subprocess
import tempfile
import time
from pathlib import Path

from pi2cli.engines.base import GenerateRequest, GenerateResult
from pi2cli.engines.pi2_chat import summary_counters
from pi2cli.errors import Pi2Error
from pi2cli.paths import host_build_dir


def engine_binary() -> Path:
    path = host_build_dir() / "pi2-engine"
    if not path.is_file():
        raise Pi2Error(f"{path} is not built (run `make engine`)", exit_code=2)
    return path


def parse_events(lines: list[str]) -> dict:
    """Group pi2-engine's events: start, token (list), turn, summary."""
    out: dict = {"token": []}
    for line in lines:
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError as err:
            raise Pi2Error(f"pi2-engine wrote a malformed event line: {line[:120]!r}") from err
        kind = event.get("event")
        if kind == "token":
            out["token"].append(event)
        elif kind:
            out[kind] = event
    return out


def result_from_events(text: str, events: dict) -> GenerateResult:
    for kind in ("start", "turn", "summary"):
        if kind not in events:
            raise Pi2Error(f"pi2-engine's events have no '{kind}' record")
    start, turn, summary = events["start"], events["turn"], events["summary"]
    t0 = start["t"]
    return GenerateResult(
        engine="pi2",
        text=text,
        token_ids=[e["id"] for e in events["token"]],
        n_prompt=turn["n_prompt"],
        ttft_s=turn["ttft_s"],
        prefill_tps=turn["prefill_tps"],
        decode_tps=turn["decode_tps"],
        peak_rss_bytes=summary["peak_rss_bytes"],
        token_times_s=[e["t"] - t0 for e in events["token"]],
        how="pi2-engine --events JSONL: monotonic clock; TTFT from prompt processing start to the first "
        "sampled token; decode rate over tokens after the first",
        extra={
            "prompt_ids": start.get("prompt_ids", []),
            "threads": start.get("threads"),
            "kernels": start.get("kernels"),
            "load_s": start.get("load_s"),
            "bytes_read": summary.get("bytes_read"),
            # the sparse engine's figures (policy, io_method, storage_bytes_read, hit_rate, io_share, ...)
            "sparse": {
                k: v
                for k, v in summary_counters(summary).items()
                if k not in ("peak_rss_bytes", "bytes_read")
            },
        },
    )


class Pi2Engine:
    name = "pi2"

    def command(
        self, request: GenerateRequest, events_path: Path, extra: list[str] | None = None
    ) -> list[str]:
        cmd = [
            str(engine_binary()), "generate", "-m", str(request.model), "-p", request.prompt,
            "-n", str(request.n_predict), "--temperature", str(request.temperature),
            "--seed", str(request.seed), "--events", str(events_path),
        ]  # fmt: skip
        if request.threads:
            cmd += ["--threads", str(request.threads)]
        return cmd + list(extra or [])

    def generate(self, request: GenerateRequest, extra: list[str] | None = None) -> GenerateResult:
        model = Path(request.model)
        if not model.is_file():
            raise Pi2Error(f"{model}: no such model file")
        if model.suffix != ".pi2":
            raise Pi2Error(f"{model}: pi2-engine runs .pi2 files (convert with `pi2 convert`)")
        with tempfile.TemporaryDirectory(prefix="pi2-gen-") as tmp:
            events_path = Path(tmp) / "events.jsonl"
            done = subprocess.run(self.command(request, events_path, extra), capture_output=True)
            if done.returncode != 0:
                lines = done.stderr.decode(errors="replace").strip().splitlines()
                msg = lines[-1] if lines else f"exit code {done.returncode}"
                raise Pi2Error(msg.removeprefix("pi2-engine: error: "))
            events = parse_events(events_path.read_text().splitlines())
        return result_from_events(done.stdout.decode("utf-8", errors="replace"), events)

    def run_conversation(
        self,
        model: Path,
        turns: list[str],
        max_new_tokens: int,
        system: str | None = None,
        *,
        threads: int | None = None,
        temperature: float = 0.0,
        seed: int = 0,
        ignore_eos: bool = True,
        chat_template: bool = True,
        n_ctx: int = 4096,
    ):
        """A multi-turn conversation in one `pi2-engine chat` process, keeping the KV cache across turns.

        Same arguments and return type (pi2cli.engines.llamacpp.ConversationResult) as the llama.cpp
        driver's run_conversation: turn K's prompt is [system, user1, answer1, ..., userK] rendered with
        the chat template of the model's GGUF twin (DIR/X.gguf next to DIR/X.pi2), and only the text
        after what the cache holds is prefilled (n_prompt_cached says how much was reused).
        chat_template=False concatenates raw text instead. Sampling is greedy (temperature 0).
        """
        from pi2cli.engines.llamacpp import ConversationResult
        from pi2cli.engines.pi2_chat import HOW, open_chat_session
        from pi2cli.targets import get_target
        from pi2cli.workloads import gguf_chat_template

        model = Path(model)
        if not turns:
            raise Pi2Error("a conversation needs at least one turn")
        if not model.is_file():
            raise Pi2Error(f"{model}: no such model file")
        if model.suffix != ".pi2":
            raise Pi2Error(f"{model}: pi2-engine runs .pi2 files (convert with `pi2 convert`)")
        if temperature:
            raise Pi2Error("pi2-engine chat sessions run greedy decoding here (temperature 0)")
        template = None
        if chat_template:
            twin = model.with_suffix(".gguf")
            if not twin.is_file():
                raise Pi2Error(f"{model}: no GGUF twin {twin} to take the chat template from")
            template = gguf_chat_template(twin)
        started = time.monotonic()
        session = open_chat_session(get_target("local"), str(engine_binary()), str(model), threads=threads,
                                    n_ctx=n_ctx, seed=seed)  # fmt: skip
        results, prompts = [], []
        messages = [{"role": "system", "content": system}] if system else []
        raw = f"{system}\n\n" if system else ""
        try:
            for user in turns:
                if template is not None:
                    messages.append({"role": "user", "content": user})
                    prompt = template.render(messages)
                else:
                    raw += user
                    prompt = raw
                turn = session.turn(prompt, max_new_tokens, ignore_eos=ignore_eos)
                results.append(turn)
                prompts.append(prompt)
                messages.append({"role": "assistant", "content": turn.text})
                raw += turn.text
            counters = session.close()
        except BaseException:
            session.kill()
            raise
        return ConversationResult(
            engine=self.name,
            model=str(model),
            turns=results,
            prompts=prompts,
            peak_rss_bytes=int(counters.get("peak_rss_bytes") or 0),
            load_s=float(session.start_event.get("load_s") or (time.monotonic() - started)),
            how=HOW,
        )
