"""pi2-engine's multi-turn mode (`pi2-engine chat`) from the host: sessions on any target, and the bench
driver for the pi2 engine.

The protocol (native/src/engine/chat.h): the engine loads the model once and reads one JSON request per stdin
line, {"prompt": TEXT, "n_predict": N, "ignore_eos": B, "reset": B}. TEXT is appended to the KV cache
(only its tokens are prefilled); the answer streams to stdout and ends with "\\x1e" + the turn's JSON
record + "\\n". Per-token times are in the --events file (JSONL, monotonic clock on the target).

The host keeps the conversation as text: a turn's prompt is the whole conversation rendered with the
chat template; when it extends what the cache already holds (previous prompt + the model's own answer)
only the new part is sent, else the session resets the cache and sends it all (a new conversation).
"""

from __future__ import annotations

import codecs
import contextlib
import json
import os
import queue
import shlex
import struct
import subprocess
import threading
import time
from collections import deque
from pathlib import Path

from pi2cli.engines.base import TurnFailed, TurnMetrics
from pi2cli.engines.pi2.args import engine_argv
from pi2cli.engines.pi2.events import parse_line, parse_lines, summary_counters, turn_io_sums
from pi2cli.errors import Pi2Error
from pi2cli.results.schema import PEAK_RSS_ENGINE
from pi2cli.targets.base import TargetError, wrap_command

RECORD_SEPARATOR = b"\x1e"
HOW = (
    "pi2-engine chat (--events JSONL, monotonic clock on the device): TTFT from the request's arrival to "
    "the first sampled token (prefill of the new tokens included); TBT = differences of per-token "
    "timestamps; the KV cache is kept across turns, only new tokens are prefilled"
)
STDIN, CLOSE_STDIN = 0, 4  # adb shell protocol v2 packet ids


# the turn event's fields that become TurnMetrics' own attributes (the rest stay in its timings)
TURN_METRICS_FIELDS = frozenset(
    {"event", "turn", "t0", "n_prompt", "n_cached", "ttft_s", "prefill_tps", "decode_tps", "stop"}
)


class EngineExited(Pi2Error):
    """The engine process ended while a turn was waiting for it."""


# ------------------------------------------------------------------------------------------- processes
class LocalChatProcess:
    """pi2-engine on this machine with a stdin pipe, optionally started inside a memory cgroup."""

    def __init__(self, argv: list[str], cgroup=None, cwd: str | None = None):
        popen = cgroup.popen if cgroup is not None else subprocess.Popen
        try:
            self.popen = popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               cwd=cwd, start_new_session=True)  # fmt: skip
        except OSError as exc:
            raise Pi2Error(f"cannot start {argv[0]}: {exc.strerror}") from exc
        self.pid: int | None = self.popen.pid
        self.stdout: queue.Queue[bytes | None] = queue.Queue()
        self.stderr_tail: deque[str] = deque(maxlen=20)
        self._threads = [threading.Thread(target=self._pump_out, daemon=True),
                         threading.Thread(target=self._pump_err, daemon=True)]  # fmt: skip
        for t in self._threads:
            t.start()

    def _pump_out(self) -> None:
        while chunk := self.popen.stdout.read1(65536):
            self.stdout.put(chunk)
        self.stdout.put(None)

    def _pump_err(self) -> None:
        for line in self.popen.stderr:
            self.stderr_tail.append(line.decode(errors="replace").rstrip())

    def write(self, data: bytes) -> None:
        try:
            self.popen.stdin.write(data)
            self.popen.stdin.flush()
        except OSError as exc:  # a broken pipe: it is gone (usually it could not load the model)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(5)
            for t in self._threads:
                t.join(2)
            why = self.last_error().removeprefix("pi2-engine: error: ") or str(exc)
            raise EngineExited(f"pi2-engine exited (code {self.popen.poll()}): {why}") from None

    def close_stdin(self) -> None:
        with contextlib.suppress(OSError):
            self.popen.stdin.close()

    def wait(self, timeout: float) -> int | None:
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def poll(self) -> int | None:
        return self.popen.poll()

    def kill(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, 9)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(10)

    def last_error(self) -> str:
        return next((ln for ln in reversed(self.stderr_tail) if ln.strip()), "")

    @property
    def lost(self) -> str | None:
        return None


def adb_chat_process(target, argv: list[str], cwd: str | None = None):
    """pi2-engine on an adb device through one shell-v2 stream whose stdin packets carry the requests."""
    from pi2cli.targets.adb import AdbProcess, adb_errors

    if "shell_v2" not in getattr(target, "features", set()):
        raise Pi2Error(f"device {target.name} has no adb shell v2: cannot talk to pi2-engine chat on it")

    class AdbChatProcess(AdbProcess):
        def __init__(self):
            self.stdout: queue.Queue[bytes | None] = queue.Queue()
            self.stderr_tail: deque[str] = deque(maxlen=20)
            self._err_partial = ""
            self._write_lock = threading.Lock()
            try:
                super().__init__(target, wrap_command(argv, None, cwd or target.workdir, make_cwd=cwd is None),
                                 self._route)  # fmt: skip
            except TargetError as exc:
                raise Pi2Error(str(exc)) from None
            threading.Thread(target=self._eof_when_done, daemon=True).start()

        def _route(self, name: str, data: bytes) -> None:
            if name == "stdout":
                self.stdout.put(data)
            else:
                text = self._err_partial + data.decode(errors="replace")
                *lines, self._err_partial = text.split("\n")
                self.stderr_tail.extend(ln.rstrip() for ln in lines)

        def _eof_when_done(self) -> None:
            self._done.wait()
            if self._err_partial:
                self.stderr_tail.append(self._err_partial)
            self.stdout.put(None)

        def write(self, data: bytes) -> None:
            # The reader thread closes the stream when the device goes away, so a write can meet
            # a closed adbutils connection (AdbError) as well as a dead socket (OSError).
            try:
                with self._write_lock:
                    self.conn.conn.sendall(struct.pack("<BI", STDIN, len(data)) + data)
            except adb_errors() as exc:
                raise TargetError(self.error or f"lost the device {target.name}: {exc}") from None

        def close_stdin(self) -> None:
            with contextlib.suppress(*adb_errors()), self._write_lock:
                self.conn.conn.sendall(struct.pack("<BI", CLOSE_STDIN, 0))

        def wait(self, timeout: float) -> int | None:
            return self.returncode if self._done.wait(timeout) else None

        def last_error(self) -> str:
            return next((ln for ln in reversed(self.stderr_tail) if ln.strip()), "")

        @property
        def lost(self) -> str | None:
            return self.error

    return AdbChatProcess()


# --------------------------------------------------------------------------------------------- events
class EventsTail:
    """New complete lines of the engine's events file, wherever it is (read here or via the target),
    parsed by the one events parser (events.py)."""

    def __init__(self, target, path: str):
        self.target, self.path, self.offset = target, path, 0

    def read_new(self) -> list[dict]:
        if self.target.on_this_machine:
            try:
                with open(self.path, "rb") as f:
                    f.seek(self.offset)
                    data = f.read()
            except OSError:
                return []
        else:
            out = self.target.sh(f"tail -c +{self.offset + 1} {shlex.quote(self.path)} 2>/dev/null; true",
                                 timeout=120)  # fmt: skip
            data = out.stdout.encode()
        end = data.rfind(b"\n") + 1
        self.offset += end
        return parse_lines(data[:end].splitlines())


# -------------------------------------------------------------------------------------------- session
def common_prefix_extends(context: str, prompt: str) -> str | None:
    """The part of `prompt` after `context` when prompt starts with it (and adds something), else None."""
    if context and prompt.startswith(context) and len(prompt) > len(context):
        return prompt[len(context) :]
    return None


class Pi2ChatSession:
    """A running `pi2-engine chat`: send full conversation prompts, get TurnMetrics back."""

    def __init__(self, process, events: EventsTail, *, turn_timeout_s: float = 3600.0, cleanup=None):
        self.process = process
        self.cleanup = cleanup  # removes the events file once read (called once, at close or kill)
        self.events = events
        self.turn_timeout_s = turn_timeout_s
        self.context = ""  # the text the KV cache holds (prompts sent + answers), as the host knows it
        self.counters: dict = {}
        self.start_event: dict = {}
        self._buffer = b""
        self._turn = 0

    @property
    def pid(self) -> int | None:
        return self.process.pid

    def _next_chunk(self, deadline: float) -> bytes:
        while True:
            try:
                chunk = self.process.stdout.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > deadline:
                    raise Pi2Error(f"pi2-engine gave no answer within {self.turn_timeout_s:.0f} s") from None
                continue
            if chunk is None:
                if self.process.lost:
                    raise TargetError(self.process.lost)
                self.process.wait(5)
                why = self.process.last_error() or f"exit code {self.process.poll()}"
                raise EngineExited(
                    f"pi2-engine exited during a turn: {why.removeprefix('pi2-engine: error: ')}"
                )
            return chunk

    def turn(self, prompt: str, n_predict: int, *, ignore_eos: bool = True, on_text=None,
             messages: list[dict] | None = None) -> TurnMetrics:  # fmt: skip
        """One turn; `messages` (the same conversation as chat messages) is for engines that take
        messages rather than rendered text, and unused here."""
        delta = common_prefix_extends(self.context, prompt)
        reset = delta is None
        request = {"prompt": prompt if reset else delta, "n_predict": int(n_predict),
                   "ignore_eos": bool(ignore_eos), "reset": reset}  # fmt: skip
        self.process.write((json.dumps(request) + "\n").encode())
        deadline = time.monotonic() + self.turn_timeout_s
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        pieces: list[str] = []
        while RECORD_SEPARATOR not in self._buffer:
            if self._buffer:
                text = decoder.decode(self._buffer)
                self._buffer = b""
                pieces.append(text)
                if on_text and text:
                    on_text(text)
            self._buffer += self._next_chunk(deadline)
        head, _, rest = self._buffer.partition(RECORD_SEPARATOR)
        while b"\n" not in rest:
            rest += self._next_chunk(deadline)
        record_line, _, self._buffer = rest.partition(b"\n")
        pieces.append(decoder.decode(head, final=True))
        text = "".join(pieces)
        record = parse_line(record_line)  # the turn event, as the events file holds it
        if record is None:
            raise Pi2Error("pi2-engine wrote an empty turn record")
        turn_index = self._turn
        self._turn += 1
        if record.get("stop") == "error":
            self.events.read_new()  # the error record: skip it
            raise TurnFailed(f"pi2-engine: {record.get('error', 'turn failed')}")
        self.context = (prompt if reset else self.context + delta) + text
        tokens = []
        for event in self.events.read_new():
            kind = event.get("event")
            if kind == "token" and event.get("turn") == turn_index:
                tokens.append(event)
            elif kind == "start":
                self.start_event = event
        t0 = record["t0"]
        n_new, n_cached = int(record["n_prompt"]), int(record["n_cached"])
        timings = {k: record[k] for k in ("prefill_s", "decode_s", "n_past", "peak_rss_bytes") if k in record}
        sparse = turn_io_sums(tokens)
        if sparse:
            timings["sparse"] = sparse
        return TurnMetrics(
            text=text,
            token_ids=[int(e["id"]) for e in tokens],
            n_prompt=n_new + n_cached,
            n_prompt_cached=n_cached,
            n_prompt_processed=n_new,
            ttft_s=float(record["ttft_s"]),
            token_times_s=[float(e["t"]) - t0 for e in tokens],
            prefill_tps=float(record["prefill_tps"]),
            decode_tps=float(record["decode_tps"]),
            host_decode_tps=0.0,
            stop_type=str(record.get("stop", "")),
            timings=timings,
            # the rest of the engine's turn record, whatever its schema lists beyond TurnMetrics' own
            # fields: a field added to the engine's event table reaches the stored run (extra.engine_turn)
            engine_turn={k: v for k, v in record.items() if k not in TURN_METRICS_FIELDS},
        )

    def close(self) -> dict:
        """End of input: the engine writes its summary and exits; returns the summary's counters."""
        self.process.close_stdin()
        code = self.process.wait(30)
        if code is None:
            self.process.kill()
            raise Pi2Error("pi2-engine did not exit after its input ended")
        for event in self.events.read_new():
            if event.get("event") == "summary":
                self.counters.update(summary_counters(event))
            elif event.get("event") == "start":
                self.start_event = event
        if self.start_event.get("load_s") is not None:
            self.counters["load_s"] = float(self.start_event["load_s"])
        if self.counters.get("peak_rss_bytes"):  # pi2-engine read its own VmHWM as it finished
            self.counters["peak_rss_source"] = PEAK_RSS_ENGINE
        self._cleanup()
        if code != 0:
            raise EngineExited(f"pi2-engine chat exited with code {code}: {self.process.last_error()}")
        return self.counters

    def kill(self) -> None:
        with contextlib.suppress(Exception):
            self.process.kill()
        self._cleanup()

    def _cleanup(self) -> None:
        cleanup, self.cleanup = self.cleanup, None
        if cleanup:
            with contextlib.suppress(Exception):
                cleanup()


def open_chat_session(target, binary: str, model: str, *, n_ctx: int | None = 4096, cgroup=None, seed: int = 0,
                      temperature: float = 0.0, events_dir: str | None = None, **sparse) -> Pi2ChatSession:  # fmt: skip
    """Start `pi2-engine chat` on `target` (local, qemu or adb); the events file goes to events_dir
    (a temporary directory here, the working directory on a device). n_ctx None: the engine's default;
    temperature 0 (greedy) is the engine's default and left off the command line. `sparse`: the
    keywords of args.sparse_flags (threads, policy, plan, memory_budget, ...)."""
    flags = dict(n_ctx=n_ctx, seed=seed, temperature=temperature or None, **sparse)
    if target.on_this_machine:
        import shutil
        import tempfile

        own_dir = events_dir is None
        events_dir = events_dir or tempfile.mkdtemp(prefix="pi2-chat-")
        events = str(Path(events_dir) / "events.jsonl")
        cleanup = (lambda: shutil.rmtree(events_dir, ignore_errors=True)) if own_dir else None
        try:
            argv = target.command_prefix() + engine_argv(binary, "chat", model, events=events, **flags)
            process = LocalChatProcess(argv, cgroup=cgroup)
        except BaseException:  # the engine did not start (or Ctrl-C / SIGTERM came): no session owns the dir
            if cleanup:
                cleanup()
            raise
    else:
        events_dir = events_dir or f"{target.workdir.rstrip('/')}/runs"
        target.mkdir(events_dir)
        events = f"{events_dir}/chat-{os.getpid()}-{int(time.time() * 1000)}.events.jsonl"

        def cleanup():
            target.sh(f"rm -f {shlex.quote(events)}", timeout=10)

        try:
            process = adb_chat_process(target, engine_argv(binary, "chat", model, events=events, **flags))
        except TargetError as exc:
            raise Pi2Error(str(exc)) from None
    return Pi2ChatSession(process, EventsTail(target, events), cleanup=cleanup)
