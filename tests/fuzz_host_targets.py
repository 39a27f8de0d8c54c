"""Property targets for the host's parsers that take outside input: farm TOML, plan JSON, run JSON and
chat templates. Each says: ANY input gives either a parsed object or the project's one-line error
(Pi2Error), never another exception. tests/test_fuzz_host.py runs them briefly in every test run;
tests/fuzz_host.py feeds them random bytes for as long as `make fuzz` allows (docs/FUZZ.md)."""

from __future__ import annotations

import atexit
import json
import shutil
import tempfile
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pi2cli.errors import Pi2Error

CI = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), database=None)

# ------------------------------------------------------------------------------------------ values
_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 70), max_value=1 << 70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=20)
    | st.sampled_from(["none", "off", "150M", "2G", "-1G", "lab:5037", "lab:99999", "local", "pi2", "code"])
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)
toml_values = st.recursive(  # TOML has no null
    _scalars.filter(lambda v: v is not None),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


def _one_of_keys(keys: list[str]) -> st.SearchStrategy[str]:
    return st.sampled_from(keys) | st.text(max_size=12)


def _check(call) -> object:
    """The property itself: a result, or Pi2Error with one line of text."""
    try:
        return call()
    except Pi2Error as err:
        message = str(err)
        assert "\n" not in message.strip(), message
        return err


_TMP = Path(tempfile.mkdtemp(prefix="pi2-fuzz-"))  # one directory per process, removed at exit
atexit.register(shutil.rmtree, _TMP, ignore_errors=True)


def _in_file(data: bytes | str, suffix: str):
    path = _TMP / f"input{suffix}"
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass"))
    return path


# ------------------------------------------------------------------------------------------ farm TOML
_FARM_LINES = [
    'name = "n"', "[[device]]", 'name = "local"', 'name = "R5CT1"', 'adb_server = "lab:5037"',
    'adb_server = "lab:99999"', 'engines = ["pi2"]', "env = { A = \"1\" }", "[matrix]",
    'models = ["m/model.pi2"]', 'engines = ["pi2", "llama.cpp"]', 'workloads = ["code", "math"]',
    'budgets = ["none", "150M"]', "[limits]", "n_gen = nan", "n_gen = 1048577", "threads = 0",
    "threads = 4", "seed = 18446744073709551616", "energy_interval_s = inf", "conversations = \"none\"",
    "[gate]", "max_cpu_temp_c = nan", "screen_off = 1", "poll_s = 0", "repetitions = -1",
    "a = " + "[" * 3000 + "]" * 3000, 'results_dir = "r"',
]  # fmt: skip
farm_texts = st.lists(st.sampled_from(_FARM_LINES) | st.text(max_size=30), max_size=25).map("\n".join)
farm_dicts = st.dictionaries(
    _one_of_keys(["name", "results_dir", "repetitions", "device", "matrix", "limits", "gate"]),
    toml_values
    | st.lists(
        st.dictionaries(_one_of_keys(["name", "adb_server", "engines", "env"]), toml_values), max_size=3
    )
    | st.dictionaries(
        _one_of_keys(
            [
                "models",
                "engines",
                "workloads",
                "budgets",
                "n_gen",
                "threads",
                "seed",
                "conversations",
                "energy_interval_s",
                "reconnect_timeout_s",
                "max_cpu_temp_c",
                "screen_off",
                "poll_s",
            ]
        ),
        toml_values,
    ),  # fmt: skip
    max_size=7,
)


@given(farm_texts)
def farm_toml_text(text: str) -> None:
    from pi2cli.farm.file import load_farm

    _check(lambda: load_farm(_in_file(text, ".toml")))


@given(farm_dicts)
def farm_parsed(data: dict) -> None:
    from pi2cli.farm.file import parse_farm

    _check(lambda: parse_farm(data, Path("/tmp/fuzz/farm.toml")))


# ------------------------------------------------------------------------------------------ plan JSON
_PLAN_KEYS = ["format", "version", "policy", "memory_budget", "threads", "affinity", "hot_fraction", "hot_share",
              "cluster", "two_phase", "lookahead", "io", "io_threads", "io_affinity", "pred_threshold", "model",
              "device", "why", "created_by", "predicted_tok_s", "measured_x"]  # fmt: skip


def _plan_like(extra: dict) -> dict:
    from pi2cli.plan.plan import PLAN_FORMAT, PLAN_VERSION

    return {"format": PLAN_FORMAT, "version": PLAN_VERSION, **extra}


plan_dicts = st.dictionaries(_one_of_keys(_PLAN_KEYS), json_values, max_size=8).map(_plan_like)


@given(st.binary(max_size=300) | plan_dicts.map(lambda d: json.dumps(d, allow_nan=True).encode()))
def plan_file(raw: bytes) -> None:
    from pi2cli.plan.plan import load_plan

    _check(lambda: load_plan(_in_file(raw, ".json")))


# ------------------------------------------------------------------------------------------ run JSON
def _valid_run() -> dict:
    from results_fakes import fake_run

    return fake_run(turns=2, n_gen=4)


@st.composite
def mutated_runs(draw) -> bytes:
    """A valid run with some of its fields (at any depth) replaced by arbitrary JSON, or deleted."""
    run = _valid_run()
    for _ in range(draw(st.integers(1, 4))):
        node, path = run, []
        while isinstance(node, dict | list) and node and draw(st.booleans()):
            key = draw(st.sampled_from(sorted(node) if isinstance(node, dict) else list(range(len(node)))))
            path.append(key)
            node = node[key]
        if not path:
            continue
        parent = run
        for key in path[:-1]:
            parent = parent[key]
        if isinstance(parent, dict) and draw(st.booleans()):
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
    return json.dumps(run, allow_nan=True).encode()


@given(mutated_runs() | st.binary(max_size=300))
def run_file(raw: bytes) -> None:
    from pi2cli.results.index import read_run_file

    _check(lambda: read_run_file(_in_file(raw, ".json")))


# ------------------------------------------------------------------------------------------ chat templates
_JINJA = [
    "{% for m in messages %}", "{% endfor %}", "{{ m['content'] }}", "{{ m.role }}", "{% if add_generation_prompt %}",
    "{% endif %}", "{% else %}", "{{ bos_token }}", "{{ eos_token }}", "{{ messages[0]['content'] | trim }}",
    "{{ raise_exception('no') }}", "{% set ns = namespace(s='x') %}", "{% set ns.s = ns.s ~ ns.s %}",
    "{{ 'x' * 10 }}", "{{ 'x' * 4000000000 }}", "{% for i in range(50) %}", "{% for i in range(100000) %}",
    "{{ loop.index }}", "{{ messages | tojson }}", "{{ 1 / 0 }}", "{{ 2 ** 64 }}", "{{ 2.0 ** 5000 }}",
    "{{ '%5d' % 3 }}", "{{ '%999999999d' % 3 }}", "{{ 'a{}'.format(1) }}", "{{ x.__class__ }}",
    "{{ messages.__class__.__mro__ }}", "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}", "{{ strftime_now('%Y') }}",
    "{{ 'ab' | replace('a', 'aaaa') }}", "{{ 'a' | center(99999999) }}", "{% break %}", "{{", "}}", "{%", "%}",
]  # fmt: skip
templates = st.lists(st.sampled_from(_JINJA) | st.text(max_size=10), max_size=12).map("".join)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["system", "user", "assistant", ""]), "content": st.text(max_size=40)}
    ),
    max_size=4,
)


@given(templates, messages, st.booleans())
def chat_template(source: str, msgs: list, add_generation_prompt: bool) -> None:
    from pi2cli.workloads import render_chat

    out = _check(lambda: render_chat(source, msgs, add_generation_prompt, "<s>", "</s>"))
    assert isinstance(out, str | Pi2Error)


TARGETS = {"farm-toml": farm_toml_text, "farm": farm_parsed, "plan-file": plan_file,
           "run-file": run_file, "chat-template": chat_template}  # fmt: skip
