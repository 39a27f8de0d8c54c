"""The pi2-engine driver: runs the host build of pi2-engine and reads its JSONL events."""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

from pi2cli.engines.base import GenerateRequest, GenerateResult
from pi2cli.engines.pi2_args import engine_argv
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

    def generate(self, request: GenerateRequest, **sparse) -> GenerateResult:
        """One prompt through `pi2-engine generate`; `sparse`: keywords of pi2_args.sparse_flags."""
        model = Path(request.model)
        if not model.is_file():
            raise Pi2Error(f"{model}: no such model file")
        if model.suffix != ".pi2":
            raise Pi2Error(f"{model}: pi2-engine runs .pi2 files (convert with `pi2 convert`)")
        with tempfile.TemporaryDirectory(prefix="pi2-gen-") as tmp:
            events_path = Path(tmp) / "events.jsonl"
            argv = engine_argv(engine_binary(), "generate", model, events=events_path, prompt=request.prompt,
                               n_predict=request.n_predict, temperature=request.temperature, seed=request.seed,
                               threads=request.threads, **sparse)  # fmt: skip
            done = subprocess.run(argv, capture_output=True)
            if done.returncode != 0:
                lines = done.stderr.decode(errors="replace").strip().splitlines()
                msg = lines[-1] if lines else f"exit code {done.returncode}"
                raise Pi2Error(msg.removeprefix("pi2-engine: error: "))
            events = parse_events(events_path.read_text().splitlines())
        return result_from_events(done.stdout.decode("utf-8", errors="replace"), events)
