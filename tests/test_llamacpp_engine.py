"""The llama.cpp driver end to end on SmolLM2: generate (one turn), a two-turn session, llama-bench."""

import json

import pytest

from pi2cli.bench.run import BenchConfig, run_bench
from pi2cli.engines import get_driver
from pi2cli.engines.base import GenerateRequest
from pi2cli.engines.generate import generate
from pi2cli.engines.llamacpp.driver import LlamaCppDriver
from pi2cli.engines.llamacpp.server import parse_llama_bench_json, turn_metrics
from pi2cli.errors import Pi2Error
from pi2cli.targets import get_target

pytestmark = pytest.mark.slow

# One thread: on a shared 2-core CI box llama.cpp's spinning worker threads collapse under contention.


def test_generate_streams_tokens_with_timings(llamacpp_bindir, smollm2_gguf):
    request = GenerateRequest(model=smollm2_gguf, prompt="The capital of France is", n_predict=12, threads=1)
    result = generate(LlamaCppDriver(llamacpp_bindir), request)
    assert result.engine == "llama.cpp"
    assert len(result.token_ids) == 12 == len(result.token_times_s)
    assert "Paris" in result.text
    assert result.n_prompt > 0
    assert 0 < result.ttft_s == result.token_times_s[0]
    assert result.token_times_s == sorted(result.token_times_s)
    assert result.prefill_tps > 0 and result.decode_tps > 0
    assert result.peak_rss_bytes > 50 * 2**20  # the mapped weights alone are ~96 MB
    assert result.extra["timings"]["predicted_n"] == 12
    assert "--no-repack" in result.extra["server_args"]
    assert result.extra["budget"]["enforced"] is False
    json.dumps(result.to_json())


def test_greedy_generation_is_deterministic(llamacpp_bindir, smollm2_gguf):
    request = GenerateRequest(model=smollm2_gguf, prompt="Once upon a time", n_predict=8, threads=1)
    driver = LlamaCppDriver(llamacpp_bindir)
    assert generate(driver, request).token_ids == generate(driver, request).token_ids


def test_conversation_reuses_the_kv_cache(llamacpp_bindir, smollm2_gguf):
    # the bench's session: each turn sends the whole conversation rendered with the chat template
    session = LlamaCppDriver(llamacpp_bindir).open_chat(get_target("local"), str(smollm2_gguf), binary_dir=None,
                                                        threads=1, n_ctx=2048)  # fmt: skip
    messages = [{"role": "system", "content": "You are a helpful assistant."}]
    prompts, turns = [], []
    try:
        for user in ("Name three colors.", "Which of them is the color of the sky?"):
            messages.append({"role": "user", "content": user})
            prompts.append(session.server.apply_template(messages))
            turns.append(session.turn(prompts[-1], 16))
            messages.append({"role": "assistant", "content": turns[-1].text})
    finally:
        counters = session.close()
    first, second = turns
    assert len(first.token_ids) == 16 == len(second.token_ids)  # ignore_eos: same length every turn
    assert first.n_prompt_cached == 0
    # turn 2's prompt starts with turn 1's prompt and answer: most of it comes from the KV cache
    assert prompts[1].startswith(prompts[0])
    assert second.n_prompt_cached >= first.n_prompt
    assert second.n_prompt_processed < second.n_prompt
    assert second.n_prompt == second.n_prompt_cached + second.n_prompt_processed
    assert counters["peak_rss_bytes"] > 0 and counters["load_s"] > 0
    assert len(second.tbt_s) == 15
    json.dumps(second.to_json())


def test_driver_is_registered_and_checks_the_model(tmp_path):
    with pytest.raises(Pi2Error, match="model file not found"):
        generate(get_driver("llama.cpp"), GenerateRequest(model=tmp_path / "missing.gguf", prompt="x"))


def test_llama_bench_keeps_its_json_fields(tmp_path, llamacpp_bindir, smollm2_gguf):
    # the bench's own llama-bench path (pi2cli.bench.llama_bench), here without a budget
    cfg = BenchConfig(model=str(smollm2_gguf), engines=["llama.cpp"], mode="llama-bench", n_prompt=16, n_gen=4,
                      repeat=1, threads=1, llamacpp_bin_dir=str(llamacpp_bindir), results_dir=str(tmp_path))  # fmt: skip
    (outcome,) = run_bench(cfg)
    run = outcome.run
    pp, tg = run["llama_bench"]
    assert (pp["n_prompt"], pp["n_gen"], tg["n_prompt"], tg["n_gen"]) == (16, 0, 0, 4)
    assert pp["avg_ts"] > 0 and tg["avg_ts"] > 0
    assert pp["load_mode"] == "mmap" and pp["repack"] is False
    assert "--repack" in run["settings"]["command"] and run["memory"]["enforced"] is False
    # every weight mapped and read
    assert run["counters"]["peak_rss_bytes"] > 0.9 * smollm2_gguf.stat().st_size


def test_llama_bench_json_errors_are_clear():
    assert parse_llama_bench_json('log line\n[{"avg_ts": 1.5}]') == [{"avg_ts": 1.5}]
    with pytest.raises(Pi2Error, match="no JSON"):
        parse_llama_bench_json("error: failed to load model")
    with pytest.raises(Pi2Error, match="could not be parsed"):
        parse_llama_bench_json("[{broken")


def test_turn_metrics_from_a_recorded_final_event():
    final = {
        "stop": True, "tokens_evaluated": 40, "stop_type": "limit",
        "timings": {"cache_n": 30, "prompt_n": 10, "prompt_per_second": 250.0,
                    "predicted_n": 3, "predicted_per_second": 20.0},
    }  # fmt: skip
    m = turn_metrics(final, "abc", [1, 2, 3], [0.1, 0.15, 0.25])
    assert (m.n_prompt, m.n_prompt_cached, m.n_prompt_processed) == (40, 30, 10)
    assert m.ttft_s == 0.1 and m.tbt_s == pytest.approx([0.05, 0.1])
    assert m.host_decode_tps == pytest.approx(2 / 0.15)
    assert (m.prefill_tps, m.decode_tps) == (250.0, 20.0)
