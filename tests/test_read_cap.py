"""--read-cap: decode reads at most N cold misses a token, the predictor's likeliest first (docs/SPARSE.md)."""

import json
import subprocess

import pytest
from engine_helpers import run_engine

PROMPT = "The capital of France is"
N = 24


@pytest.fixture(scope="module")
def model(synth_model):
    """Two layers of 8192 neurons (an 8 MiB FFN)."""
    return synth_model("ffn-8k")


SHAPE = ["--ctx", 64, "--batch", 8, "--policy", "powerinfer2", "--no-two-phase"]


@pytest.fixture(scope="module")
def budget(model) -> int:
    """The smallest budget for these settings + 3 MiB: the cache holds about a third of the FFN."""
    done = run_engine("size", "-m", model, "--memory-budget", "1M", "--json", *SHAPE, check=False)
    return json.loads(done.stdout)["min_budget_bytes"] + 3 * 2**20


def _run(model, budget, tmp_path, *more) -> tuple[subprocess.CompletedProcess, list[dict]]:
    events = tmp_path / "events.jsonl"
    done = run_engine("generate", "-m", model, "-p", PROMPT, "-n", N, "--ignore-eos", *SHAPE, "--memory-budget",
                      budget, "--events", events, *more, check=False)  # fmt: skip
    return done, [
        json.loads(line) for line in events.read_text().splitlines()
    ] if done.returncode == 0 else []


def _decode_misses(events: list[dict]) -> list[int]:
    return [e["misses"] for e in events if e["event"] == "token" and e["i"] > 0]


@pytest.mark.slow
def test_a_cap_bounds_every_decoded_tokens_misses(model, budget, tmp_path):
    free, ev_free = _run(model, budget, tmp_path)
    assert free.returncode == 0, free.stderr
    cap = 64  # 32 a block over 2 blocks
    assert max(_decode_misses(ev_free)) > 2 * cap  # without it, tokens miss far more: the cap has work
    assert "read_cap" not in ev_free[-1]  # off by default: the exact predicted set
    capped, ev = _run(model, budget, tmp_path, "--read-cap", cap)
    assert capped.returncode == 0, capped.stderr
    s = ev[-1]
    assert s["read_cap"] == cap and s["capped_misses"] > 0 and s["skipped_misses"] >= s["capped_misses"]
    # Hot clusters are not capped; at this budget the hot set is cached whole after the prompt, so a
    # decoded token's misses are cold ones, each block's at most its share of the cap.
    assert max(_decode_misses(ev)) <= cap
    assert sum(_decode_misses(ev)) < sum(_decode_misses(ev_free)) / 2


@pytest.mark.slow
def test_off_is_the_default_bit_for_bit_and_auto_runs(model, budget, tmp_path):
    free, _ = _run(model, budget, tmp_path)
    off, _ = _run(model, budget, tmp_path, "--read-cap", "off")
    assert off.returncode == 0 and off.stdout == free.stdout
    auto, ev = _run(model, budget, tmp_path, "--read-cap", "auto")
    assert auto.returncode == 0, auto.stderr
    assert ev[-1]["read_cap"] == -1 and ev[-1]["capped_misses"] >= 0


@pytest.mark.parametrize("value", ["0", "-3", "many", "1.5"])
def test_a_bad_cap_is_one_error_line(model, value):
    done = run_engine(
        "generate", "-m", model, "-p", "hi", "--policy", "powerinfer2", "--read-cap", value, check=False
    )
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "--read-cap" in done.stderr, done.stderr


def test_a_plan_sets_the_cap(model, budget, tmp_path):
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"format": "pi2-plan", "version": 1, "read_cap": 64}))
    done, ev = _run(model, budget, tmp_path, "--plan", plan)
    assert done.returncode == 0, done.stderr
    assert ev[-1]["read_cap"] == 64
    plan.write_text(json.dumps({"format": "pi2-plan", "version": 1, "read_cap": True}))
    bad = run_engine("generate", "-m", model, "-p", "hi", "--plan", plan, check=False)
    assert bad.returncode != 0 and 'a count, "auto" or "off"' in bad.stderr
