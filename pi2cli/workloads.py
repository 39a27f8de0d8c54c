"""The four workload sets (multi-turn dialogue, code, math, role-play) and chat-template rendering.

The sets are JSONL files in workloads/ at the repository root (or $PI2_WORKLOADS), written by
workloads/build_workloads.py from real data. One record per line:

    {"id": str, "source": str, "system": str | null, "turns": [str, ...], "max_new_tokens": [int, ...]}

`turns` are the user turns of one conversation; the assistant answers are whatever the engine generates,
so each turn's prompt is the template rendered over everything said so far (see `messages_for_turn`).
`max_new_tokens[i]` caps the answer to turns[i].

workloads/stats.json holds the token counts of every user turn under each statistics tokenizer, keyed by
record id, so `pi2 workloads show` can summarise any subset without loading a tokenizer.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT

WORKLOADS: dict[str, str] = {
    "multi-turn": "Multi-turn dialogue: ShareGPT conversations with >= 3 user turns and MT-Bench's 80 questions.",
    "code": "Code generation: HumanEval's 164 prompts and MT-Bench coding.",
    "math": "Math: MT-Bench math and reasoning plus grade-school word problems written for pi2.",
    "role-play": "Role-play: MT-Bench roleplay plus ShareGPT conversations that set up a role.",
}

RECORD_KEYS = {"id", "source", "system", "turns", "max_new_tokens"}

# A record's source family (before the ":") -> its row in workloads/README.md's "Sources and licences"
# table, which stays the one place the origins and licences are written down.
SOURCE_ROWS = {"sharegpt-v3": "ShareGPT V3", "mt-bench": "MT-Bench", "humaneval": "HumanEval",
               "pi2-grade-school": "grade-school math"}  # fmt: skip


def source_licences(families: list[str]) -> list[dict]:
    """{"family", "source", "package", "licence"} for each family, from workloads/README.md's table
    (package and licence None when the README has no row for it)."""
    rows: dict[str, list[str]] = {}
    readme = workloads_dir() / "README.md"
    text = readme.read_text() if readme.is_file() else ""
    section = text.partition("## Sources and licences")[2].partition("\n## ")[0]
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("source", "---"):
            rows[cells[0]] = cells
    out = []
    for family in families:
        row = rows.get(SOURCE_ROWS.get(family, ""))
        out.append({"family": family, "source": row[0] if row else family, "package": row[1] if row else None,
                    "licence": row[3] if row else None})  # fmt: skip
    return out


def workloads_dir() -> Path:
    return Path(os.environ.get("PI2_WORKLOADS") or REPO_ROOT / "workloads")


@dataclass(frozen=True)
class Conversation:
    """One workload item: the user turns of a conversation and the answer budget of each turn."""

    id: str
    source: str
    system: str | None
    turns: tuple[str, ...]
    max_new_tokens: tuple[int, ...]

    @classmethod
    def from_dict(cls, data: Any, where: str = "record") -> Conversation:
        """Validate one decoded JSONL record; a bad one raises Pi2Error naming `where`."""
        if not isinstance(data, dict):
            raise Pi2Error(f"{where}: expected a JSON object, got {type(data).__name__}")
        keys = set(data)
        if keys != RECORD_KEYS:
            missing, extra = sorted(RECORD_KEYS - keys), sorted(keys - RECORD_KEYS)
            raise Pi2Error(f"{where}: wrong keys (missing {missing}, unexpected {extra})")
        if not isinstance(data["id"], str) or not data["id"]:
            raise Pi2Error(f"{where}: id must be a non-empty string")
        if not isinstance(data["source"], str) or not data["source"]:
            raise Pi2Error(f"{where}: source must be a non-empty string")
        system = data["system"]
        if system is not None and (not isinstance(system, str) or not system.strip()):
            raise Pi2Error(f"{where}: system must be null or a non-empty string")
        turns, budgets = data["turns"], data["max_new_tokens"]
        if not isinstance(turns, list) or not turns:
            raise Pi2Error(f"{where}: turns must be a non-empty list")
        if not all(isinstance(t, str) and t.strip() for t in turns):
            raise Pi2Error(f"{where}: every turn must be a non-empty string")
        if not isinstance(budgets, list) or len(budgets) != len(turns):
            raise Pi2Error(f"{where}: max_new_tokens must be a list with one entry per turn")
        if not all(type(b) is int and b > 0 for b in budgets):
            raise Pi2Error(f"{where}: max_new_tokens entries must be positive integers")
        return cls(data["id"], data["source"], system, tuple(turns), tuple(budgets))

    def to_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["turns"], data["max_new_tokens"] = list(self.turns), list(self.max_new_tokens)
        return data

    def messages_for_turn(self, index: int, answers: list[str] | tuple[str, ...] = ()) -> list[dict]:
        """Chat messages that prompt turn `index`: system, then user/assistant pairs, then the user turn.

        `answers` are the assistant replies to turns 0..index-1 (what the engine generated before).
        """
        if not 0 <= index < len(self.turns):
            raise Pi2Error(f"{self.id}: turn {index} out of range (it has {len(self.turns)})")
        if len(answers) != index:
            raise Pi2Error(f"{self.id}: turn {index} needs {index} earlier answers, got {len(answers)}")
        messages = [{"role": "system", "content": self.system}] if self.system else []
        for user, answer in zip(self.turns[:index], answers, strict=True):
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
        messages.append({"role": "user", "content": self.turns[index]})
        return messages


def list_workloads() -> list[str]:
    """Names of the workload sets, in the paper's order."""
    return list(WORKLOADS)


def workload_path(name: str) -> Path:
    if name not in WORKLOADS:
        raise Pi2Error(f"unknown workload {name!r} (choose from: {', '.join(WORKLOADS)})")
    return workloads_dir() / f"{name}.jsonl"


def read_workload(name: str) -> list[Conversation]:
    """Every record of a set, validated, in file order; ids must be unique."""
    path = workload_path(name)
    if not path.is_file():
        raise Pi2Error(f"workload file {path} is missing (regenerate: python workloads/build_workloads.py)")
    records: list[Conversation] = []
    seen: set[str] = set()
    with open(path, encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                data = json.loads(line)
            except json.JSONDecodeError as exc:
                raise Pi2Error(f"{where}: not valid JSON ({exc.msg})") from None
            record = Conversation.from_dict(data, where)
            if record.id in seen:
                raise Pi2Error(f"{where}: duplicate id {record.id!r}")
            seen.add(record.id)
            records.append(record)
    if not records:
        raise Pi2Error(f"workload file {path} has no records")
    return records


def load_workload(name: str, limit: int | None = None, seed: int | None = None) -> list[Conversation]:
    """The conversations of set `name`.

    Without a seed: file order, the first `limit`. With a seed: a random sample of `limit` (all of them,
    shuffled, without a limit) that depends only on the seed and the file.
    """
    if limit is not None and limit < 1:
        raise Pi2Error(f"--limit must be at least 1, got {limit}")
    records = read_workload(name)
    count = len(records) if limit is None else min(limit, len(records))
    if seed is None:
        return records[:count]
    return random.Random(seed).sample(records, count)


# ---------------------------------------------------------------------------------------------- templates


def _raise_exception(message: str) -> None:
    from jinja2.exceptions import TemplateError

    raise TemplateError(message)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _tojson(
    value: Any, ensure_ascii: bool = False, indent: int | None = None, separators=None, sort_keys=False
):
    # HF's tojson: no HTML escaping (jinja2's built-in escapes <, >, & which templates do not want).
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


# A chat template comes from a model file (a GGUF twin's tokenizer.chat_template), so it is untrusted
# code: jinja2's sandbox stops it reaching Python internals but not from building 'x'*4000000000 or
# looping 10^15 times. These bounds keep a hostile template to one error line in a few seconds and a
# few times MAX_TEMPLATE_CHARS of memory. A real conversation renders to well under the bound (a 128k
# token context is ~0.5M characters) in milliseconds.
MAX_TEMPLATE_CHARS = 1 << 22  # the output, and any string, list or number a template builds
MAX_TEMPLATE_SECONDS = 2.0


class _TemplateLimit(Exception):
    pass


def _check_size(value: Any) -> Any:
    if isinstance(value, (str, bytes, list, tuple, dict, set)) and len(value) > MAX_TEMPLATE_CHARS:
        raise _TemplateLimit(f"builds a value of {len(value):,} items, over the {MAX_TEMPLATE_CHARS:,} limit")
    return value


def _check_count(n: Any, what: str) -> None:
    if isinstance(n, int) and not isinstance(n, bool) and abs(n) > MAX_TEMPLATE_CHARS:
        raise _TemplateLimit(f"{what} {n:,} is over the {MAX_TEMPLATE_CHARS:,} limit")


def _check_widths(fmt: Any) -> None:
    """A printf / str.format / strftime width or precision allocates that many characters."""
    import re

    if isinstance(fmt, str):
        for digits in re.findall(r"\d{7,}", fmt):
            _check_count(int(digits), "a format width")


def _sized(value: Any) -> int:
    return len(value) if isinstance(value, (str, bytes, list, tuple)) else 1


def _bounded_list(items: Any) -> Any:
    import itertools

    if isinstance(items, (str, bytes, list, tuple, dict)) or not hasattr(items, "__iter__"):
        return items
    return _check_size(list(itertools.islice(items, MAX_TEMPLATE_CHARS + 1)))


def _precheck(name: str, target: Any, args: tuple, kwargs: dict) -> None:
    """Bound the calls whose result size is a product of their arguments before they allocate."""
    for a in (*args, *kwargs.values()):
        _check_count(a, "a count or width")
        _check_size(a)
    if name in ("format", "format_map", "strftime", "strftime_now"):
        _check_widths(target)
        for a in args:
            _check_widths(a)
    elif name == "replace" and isinstance(target, str) and args and isinstance(args[0], str):
        new = args[1] if len(args) > 1 and isinstance(args[1], str) else ""
        hits = target.count(args[0]) if args[0] else len(target) + 1
        _check_count(len(target) + hits * max(0, len(new) - len(args[0])), "a replace result")
    elif name in ("join", "sum") and args and isinstance(args[0], (list, tuple)):
        sep = _sized(target) if isinstance(target, str) else 0
        _check_count(sum(_sized(v) + sep for v in args[0]), f"a {name} result")


class _Deadline:
    def __init__(self, seconds: float):
        import time

        self._clock = time.monotonic
        self.at = self._clock() + seconds

    def check(self) -> None:
        if self._clock() > self.at:
            raise _TemplateLimit(f"ran over {MAX_TEMPLATE_SECONDS:g} s")


def _bounded_env(deadline: _Deadline):
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class BoundedSandbox(ImmutableSandboxedEnvironment):
        # intercepted operators also stop jinja2 folding 'x'*4000000000 at compile time
        intercepted_binops = frozenset({"*", "**", "+", "%", "//"})

        def call_binop(self, context, operator, left, right):
            deadline.check()
            if operator == "*":
                for a, b in ((left, right), (right, left)):
                    if isinstance(b, int) and isinstance(a, (str, list, tuple)):
                        _check_count(len(a) * b, "a repeated value's length")
            elif operator == "**" and isinstance(right, int) and isinstance(left, int) and abs(left) > 1:
                _check_count(right * max(1, abs(left).bit_length()) // 4, "a power's digit count")
            elif operator == "%":
                _check_widths(left)
                for a in right if isinstance(right, tuple) else (right,):
                    _check_count(a, "a format width")
            return _check_size(super().call_binop(context, operator, left, right))

        def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja2's signature)
            deadline.check()
            name = getattr(__obj, "__name__", "")
            if name == "join" and len(args) == 1:
                args = (_bounded_list(args[0]),)
            _precheck(name, getattr(__obj, "__self__", None), args, kwargs)
            return _check_size(super().call(__context, __obj, *args, **kwargs))

        def getattr(self, obj, attribute):
            deadline.check()
            return _check_size(super().getattr(obj, attribute))

        def getitem(self, obj, argument):
            deadline.check()
            return _check_size(super().getitem(obj, argument))

        def wrap_str_format(self, value):
            fmt = super().wrap_str_format(value)
            if fmt is None:
                return None

            def bounded(*args, **kwargs):
                _precheck("format", value.__self__, args, kwargs)
                return _check_size(fmt(*args, **kwargs))

            return bounded

    env = BoundedSandbox(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = _tojson
    env.filters = {name: _bounded_filter(name, f, deadline) for name, f in env.filters.items()}
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _bounded_filter(name: str, func, deadline: _Deadline):
    """Filters are called directly by the compiled template (not through the sandbox's call)."""
    import functools

    @functools.wraps(func)  # keeps jinja_pass_arg, so eval-context filters still get theirs
    def bounded(*args, **kwargs):
        deadline.check()
        value_at = 1 if getattr(func, "jinja_pass_arg", None) is not None else 0
        rest = args[value_at:]
        _precheck(name, rest[0] if rest else None, tuple(rest[1:]), kwargs)
        if name in ("join", "sum") and rest:
            items = _bounded_list(rest[0])  # a generator (map, select) can only be measured as a list
            sep = rest[1] if name == "join" and len(rest) > 1 else kwargs.get("d", "")
            _precheck(name, sep, (items,), {})
            args = (*args[:value_at], items, *rest[1:])
        return _check_size(func(*args, **kwargs))

    return bounded


def _compile_template(source: str, deadline: _Deadline | None = None):
    # Same environment as transformers' apply_chat_template (sandboxed, trim/lstrip blocks, loopcontrols,
    # tojson, raise_exception, strftime_now), so GGUF templates written for HF render here, with bounds.
    return _bounded_env(deadline or _Deadline(MAX_TEMPLATE_SECONDS)).from_string(source)


def _alarm(seconds: float):
    """SIGALRM after `seconds` on the main thread (a loop with no calls in its body passes no hook);
    elsewhere, or when a timer is already set, only the hooks' deadline checks apply."""
    import contextlib
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread() or signal.getitimer(signal.ITIMER_REAL)[0]:
        return contextlib.nullcontext()

    @contextlib.contextmanager
    def armed():
        def fire(signum, frame):
            raise _TemplateLimit(f"ran over {MAX_TEMPLATE_SECONDS:g} s")

        previous = signal.signal(signal.SIGALRM, fire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)

    return armed()


def render_chat(
    template_source: str,
    messages: list[dict],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    **extra: Any,
) -> str:
    """Render a chat template (the GGUF's tokenizer.chat_template, or the registry's) over messages.
    Any failure of the template -- a syntax error, raise_exception, a bound above, a Python error inside
    it -- is one Pi2Error line."""
    deadline = _Deadline(MAX_TEMPLATE_SECONDS)
    out: list[str] = []
    size = 0
    try:
        with _alarm(MAX_TEMPLATE_SECONDS):
            template = _compile_template(template_source, deadline)
            for chunk in template.generate(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=bos_token,
                eos_token=eos_token,
                **extra,
            ):
                size += len(chunk)
                if size > MAX_TEMPLATE_CHARS:
                    raise _TemplateLimit(f"output is over the {MAX_TEMPLATE_CHARS:,} character limit")
                out.append(chunk)
                deadline.check()
    except (KeyboardInterrupt, SystemExit):
        raise
    except MemoryError:
        raise Pi2Error("chat template failed: ran out of memory") from None
    except BaseException as exc:  # untrusted code: every way it can fail is the template's failure
        text = " ".join(str(exc).split())[:200] or type(exc).__name__
        raise Pi2Error(f"chat template failed: {text}") from None
    return "".join(out)


@dataclass(frozen=True)
class ChatTemplate:
    source: str
    bos_token: str
    eos_token: str

    def render(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return render_chat(self.source, messages, add_generation_prompt, self.bos_token, self.eos_token)


def gguf_chat_template(gguf_path: str | os.PathLike) -> ChatTemplate:
    """tokenizer.chat_template of a GGUF with its BOS/EOS token texts."""
    from pi2cli.models.gguf_meta import read_gguf_metadata

    wanted = {"tokenizer.chat_template", "tokenizer.ggml.tokens", "tokenizer.ggml.bos_token_id",
              "tokenizer.ggml.eos_token_id"}  # fmt: skip
    meta = read_gguf_metadata(gguf_path, wanted)
    if "tokenizer.chat_template" not in meta:
        raise Pi2Error(f"{gguf_path} has no tokenizer.chat_template")
    tokens = meta.get("tokenizer.ggml.tokens") or []

    def token_text(key: str) -> str:
        index = meta.get(key)
        return tokens[index] if isinstance(index, int) and 0 <= index < len(tokens) else ""

    return ChatTemplate(
        meta["tokenizer.chat_template"],
        token_text("tokenizer.ggml.bos_token_id"),
        token_text("tokenizer.ggml.eos_token_id"),
    )


# ---------------------------------------------------------------------------------------------- statistics


def read_stats() -> dict:
    """workloads/stats.json: {"tokenizers": {key: description}, "counts": {key: {id: [tokens per turn]}}}."""
    path = workloads_dir() / "stats.json"
    if not path.is_file():
        raise Pi2Error(f"{path} is missing (regenerate: python workloads/build_workloads.py)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise Pi2Error(f"{path}: not valid JSON ({exc.msg})") from None


def percentile(values: list[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default), q in [0, 100]."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("percentile of nothing")
    pos = (len(ordered) - 1) * q / 100.0
    low = int(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def summarize(records: list[Conversation], stats: dict) -> dict:
    """Counts, turns per conversation and user-turn token percentiles per tokenizer for `records`."""
    turns = [len(r.turns) for r in records]
    sources: dict[str, int] = {}
    for r in records:
        family = r.source.split(":")[0]
        sources[family] = sources.get(family, 0) + 1
    summary: dict[str, Any] = {
        "conversations": len(records),
        "turns": sum(turns),
        "sources": dict(sorted(sources.items())),
        "turns_per_conversation": _spread(turns),
        "max_new_tokens_per_turn": _spread([b for r in records for b in r.max_new_tokens]),
        "tokens_per_turn": {},
        "tokens_per_conversation": {},
    }
    counts_by_key = stats.get("counts", {})
    for key in sorted(counts_by_key, key=lambda k: (k != "smollm2", k)):  # the test model first
        counts = counts_by_key[key]
        per_turn: list[int] = []
        per_conv: list[int] = []
        for r in records:
            got = counts.get(r.id)
            if got is None or len(got) != len(r.turns):
                raise Pi2Error(f"stats.json has no token counts for {r.id} under {key} (regenerate it)")
            per_turn += got
            per_conv.append(sum(got))
        summary["tokens_per_turn"][key] = _spread(per_turn)
        summary["tokens_per_conversation"][key] = _spread(per_conv)
    return summary


def _spread(values: list[int]) -> dict[str, float]:
    return {
        "min": min(values),
        "mean": round(sum(values) / len(values), 1),
        "p50": round(percentile(values, 50), 1),
        "p90": round(percentile(values, 90), 1),
        "p99": round(percentile(values, 99), 1),
        "max": max(values),
    }
