"""`pi2-engine capabilities --json` and `pi2-engine size --json`: the engine describing itself.

capabilities is printed from the tables the engine parses with, so every flag it lists must be taken
(and flags it does not list for a command refused); size is the sparse engine's own sizing, so what it
reports must be what a real sparse open of the same model under the same budget decides (the summary
event of generate). The fixed region is measured RSS, which moves by some pages from run to run: the
budget, the hot set and the split rules agree exactly, the byte counts within that jitter.
"""

import json
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_bin, run_engine

MiB = 2**20
JITTER = MiB  # RSS differences between two processes opening the same session
RUN = ["--ctx", 64, "--batch", 16, "--threads", 2]


@pytest.fixture(scope="module")
def model(synth_model) -> Path:
    """An FFN of 8 MiB (2 layers x 8192 bundles of 512 B) over ~30 MiB of fixed region."""
    return synth_model("ffn-8k-wide")


def _caps() -> dict:
    return json.loads(run_engine("capabilities", "--json").stdout)


def _size(*args) -> tuple[int, dict, str]:
    done = run_engine("size", *map(str, args), "--json", check=False)
    return done.returncode, json.loads(done.stdout), done.stderr


def _summary(model: Path, tmp: Path, *args) -> dict:
    events = tmp / "events.jsonl"
    run_engine("generate", "-m", model, "--tokens", "1,2,3", "-n", "2", "--events", events, *map(str, args))
    summary = json.loads(events.read_text().splitlines()[-1])
    assert summary["event"] == "summary"
    return summary


def test_capabilities_lists_what_the_engine_parses():
    caps = _caps()
    assert caps["schema"] == 1 and caps["version"]
    assert {"generate", "eval", "info", "chat", "size", "capabilities"} <= set(caps["commands"])
    assert caps["policies"] == ["dense", "bundle", "llmflash", "cache", "powerinfer2"]
    assert {"policy", "memory_budget", "hot_fraction", "io_affinity"} <= set(caps["plan_keys"])
    levels = caps["kernel_levels"]
    assert "scalar" in levels["compiled"] and set(levels["runnable"]) <= set(levels["compiled"])
    assert levels["selected"] in levels["runnable"]
    for command in ("generate", "eval", "chat", "size", "info"):
        flags = caps["flags"][command]
        assert flags and all(f["name"].startswith("--") and f["help"] for f in flags)
        for f in flags:  # taken: whatever goes wrong next, it is not an unknown option
            argv = [f["name"], "1"] if f["takes_value"] else [f["name"]]
            done = subprocess.run([str(engine_bin()), command, *argv], capture_output=True, text=True,
                                  stdin=subprocess.DEVNULL, timeout=60)  # fmt: skip
            # size without -m or --facts checks the flags alone (a plan's: `size --plan`), so it may pass
            assert (
                done.returncode != 0 or command == "size"
            ) and f"option '{f['name']}'" not in done.stderr, done.stderr
    sparse = {f["name"] for f in caps["flags"]["generate"] if f["sparse"]}
    assert {"--policy", "--memory-budget", "--hot-fraction", "--io-affinity"} <= sparse
    # a flag a command does not list is refused as unknown
    assert "--policy" not in {f["name"] for f in caps["flags"]["info"]}
    done = run_engine("info", "--policy", "bundle", check=False)
    assert done.returncode == 2 and "unknown info option '--policy'" in done.stderr


@pytest.mark.slow
def test_generate_refuses_a_negative_seed_like_chat(model):
    for command in ("generate", "chat"):
        done = run_engine(command, "-m", model, "--seed", "-1", check=False)
        assert done.returncode == 2
        want = "pi2-engine: error: --seed needs a non-negative integer, got '-1'"
        assert done.stderr.strip().splitlines() == [want]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["bundle", "cache", "powerinfer2"])
def test_size_is_what_a_sparse_open_decides_under_a_budget(model, tmp_path, policy):
    budget = 36 * MiB  # the cache holds about half the FFN
    args = ["--policy", policy, "--memory-budget", budget, "--ctx", 64, "--batch", 16, "--threads", 2]
    rc, size, _ = _size("-m", model, *args)
    assert rc == 0 and size["fixed_source"] == "measured"
    s = _summary(model, tmp_path, *args)
    assert size["budget_bytes"] == s["memory_budget_bytes"] == budget and size["budget_source"] == "flag"
    assert not size["whole_model_resident"]
    fixed = size["fixed"]
    parts = ("resident_bytes", "context_bytes", "scratch_bytes", "margin_bytes")
    assert fixed["bytes"] == sum(fixed[p] for p in parts)
    h = json.loads(run_engine("info", "-m", model, "--json").stdout)
    kv_dim = h["n_head_kv"] * h["head_dim"]
    assert fixed["kv_cache_bytes"] == 2 * 2 * 64 * kv_dim * 2  # K and V, 2 layers, 64 positions, f16
    assert abs(fixed["bytes"] - s["fixed_bytes"]) < JITTER
    cache = size["cache"]
    assert abs(cache["bytes"] - s["cache_bytes"]) < JITTER
    assert cache["hot_neurons_per_block"] == s["hot_neurons_per_block"] and cache["cluster"] == s["cluster"]
    assert cache["hot_bytes"] == s["hot_bytes"]
    if policy == "bundle":  # a staging area for one block: exactly n_ff slots, no hot set
        assert cache["cold_slots"] == 8192 and cache["hot_neurons_per_block"] == 0
    else:  # the hot set (20% of 8192, in clusters of 32) fits whole: 1664 per block
        assert cache["hot_neurons_per_block"] == 1664 and cache["hot_slots"] == 2 * 1664 // 32


@pytest.mark.slow
def test_size_without_a_budget_keeps_the_whole_model_resident(model, tmp_path):
    args = ["--policy", "powerinfer2", "--ctx", 64, "--batch", 16, "--threads", 2]
    rc, size, _ = _size("-m", model, *args)
    s = _summary(model, tmp_path, *args)
    assert rc == 0 and size["whole_model_resident"] and size["budget_source"] == "none"
    assert s["memory_budget_source"] == size["budget_rule"] == "none: whole model resident"
    assert size["cache"]["cold_slots"] == 2 * 8192 and size["cache"]["bytes"] == s["cache_bytes"]
    assert abs(size["budget_bytes"] - s["memory_budget_bytes"]) < 2 * JITTER


@pytest.mark.slow
def test_a_budget_too_small_says_so_once_and_gives_the_minimum(model, tmp_path):
    args = ["--policy", "cache", "--ctx", 64, "--batch", 16, "--threads", 2]
    rc, size, err = _size("-m", model, *args, "--memory-budget", "10M")
    assert rc == 1 and "is too small" in size["error"]
    assert err.strip().splitlines() == [f"pi2-engine: error: {size['error']}"]
    least = size["min_budget_bytes"]
    assert 10 * MiB < least < 60 * MiB and "smallest budget for these settings" in size["error"]
    # (another process measures its own RSS: a few pages either way)
    assert _size("-m", model, *args, "--memory-budget", least + JITTER)[0] == 0
    assert _size("-m", model, *args, "--memory-budget", least - JITTER)[0] == 1
    # the engine agrees: a run opens above the minimum and refuses well below it
    _summary(model, tmp_path, *args, "--memory-budget", least + JITTER)
    done = run_engine("generate", "-m", model, "--tokens", "1", "-n", "1", *map(str, args),
                      "--memory-budget", least - JITTER, check=False)  # fmt: skip
    assert done.returncode == 1 and "is too small" in done.stderr


@pytest.mark.slow
def test_size_from_header_facts_estimates_the_same_split(model, tmp_path):
    facts = tmp_path / "facts.json"
    facts.write_text(run_engine("info", "-m", model, "--json").stdout)
    args = ["--policy", "powerinfer2", "--memory-budget", 36 * MiB, *RUN]
    rc, est, _ = _size("--facts", facts, *args)
    _, real, _ = _size("-m", model, *args)
    assert rc == 0 and est["fixed_source"] == "estimated" and est["model_bytes"] == model.stat().st_size
    # the context is computed, not measured: the same bytes; the resident part is the file's resident
    # section plus an allowance for the process (tokenizer tables, C library, stacks)
    assert est["fixed"]["context_bytes"] == real["fixed"]["context_bytes"]
    assert est["fixed"]["kv_cache_bytes"] == real["fixed"]["kv_cache_bytes"]
    assert est["fixed"]["estimated_process_bytes"] > 4 * MiB and real["fixed"]["estimated_process_bytes"] == 0
    assert abs(est["fixed"]["bytes"] - real["fixed"]["bytes"]) < 2 * MiB
    # the predictor's scratch is estimated too (its scores: 4 bytes a neuron per batch row), so the
    # smallest budget of the shape is the file's within a page or two of allocator rounding, not below it
    assert est["fixed"]["predictor_scratch_bytes"] >= real["fixed"]["predictor_scratch_bytes"] > 0
    assert abs(est["min_budget_bytes"] - real["min_budget_bytes"]) < MiB // 2
    assert est["cache"]["hot_neurons_per_block"] == real["cache"]["hot_neurons_per_block"] == 1664
    bad = tmp_path / "bad.json"
    bad.write_text('{"n_embd": 256}')
    done = run_engine("size", "--facts", bad, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "need n_embd" in done.stderr


def test_size_facts_size_cold_slots_in_the_devices_read_unit(tmp_path):
    # A 4096-wide Q4_0 bundle is 6912 bytes: the open rounds its reads and cold slots to the device's
    # direct-read unit (512 here), 7168; facts that do not say it assume the largest common one, 4096.
    shape = {"n_embd": 4096, "n_layer": 1, "n_ff": 4096, "n_head": 32, "head_dim": 128, "n_vocab": 1000}
    slots = {}
    for align in (None, 512):
        facts = tmp_path / f"facts-{align}.json"
        facts.write_text(json.dumps(shape | ({"read_align": align} if align else {})))
        rc, size, err = _size("--facts", facts, "--policy", "powerinfer2", "--memory-budget", 64 * MiB, *RUN)
        assert rc == 0, err
        slots[align] = size["cache"]["cold_slot_bytes"]
    assert slots == {None: 8192, 512: 7168}
    facts = tmp_path / "odd.json"
    facts.write_text(json.dumps(shape | {"read_align": 1000}))
    done = run_engine("size", "--facts", facts, check=False)
    assert done.returncode == 1 and done.stderr.count("\n") == 1 and "read_align" in done.stderr
