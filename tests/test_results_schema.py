"""The result schema: builders, validation (good and bad runs) and summaries."""

import copy
import json

import pytest
from results_fakes import fake_run

from pi2cli.engines.base import GenerateResult, TurnMetrics
from pi2cli.results import schema as S


def test_a_built_run_validates_and_survives_json():
    run = fake_run(memory_samples=True)
    S.summarize(run)
    S.validate(run)
    again = json.loads(json.dumps(run))
    S.validate(again)
    assert again["schema_version"] == S.SCHEMA_VERSION
    assert again["pi2"]["commit"]  # this checkout is a git repository


def _bad(mutate):
    run = fake_run(turns=2)
    S.summarize(run)
    mutate(run)
    return run


BAD = {
    "missing engine": (lambda r: r.pop("engine"), "run.engine: missing"),
    "engine name wrong type": (lambda r: r["engine"].update(name=3), "run.engine.name: must be a string"),
    "unknown model field": (lambda r: r["model"].update(colour="red"), "run.model: unknown field 'colour'"),
    "synthetic not bool": (lambda r: r["model"].update(synthetic="no"), "run.model.synthetic"),
    "negative TBT": (lambda r: r["turns"][1]["samples_ns"].__setitem__(3, -5), "run.turns[1].samples_ns[3]"),
    "float TBT": (lambda r: r["turns"][0]["samples_ns"].__setitem__(0, 1.5), "run.turns[0].samples_ns[0]"),
    "too many TBTs": (lambda r: r["turns"][0].update(n_gen=5), "run.turns[0].samples_ns: 32 times"),
    "bad status": (lambda r: r.update(status="exploded"), "run.status: must be one of"),
    "failure without error": (lambda r: r.update(status="aborted"), "run.error: a aborted record needs"),
    "multi-line error": (lambda r: r.update(status="failed", error="a\nb"), "run.error: must be one line"),
    "newer schema": (lambda r: r.update(schema_version=99), "newer than this pi2 reads"),
    "older schema": (lambda r: r.update(schema_version=0), "run.schema_version: must be 1"),
    "bad run id": (lambda r: r.update(run_id="../etc/passwd"), "run.run_id"),
    "bad time": (lambda r: r.update(created_at="yesterday"), "run.created_at"),
    "enforced without budget": (lambda r: r["memory"].update(enforced=True, budget_bytes=None), "enforced"),
    "ok run without turns": (lambda r: r.update(turns=[]), "run.turns: an ok run needs"),
    "turn without ttft": (lambda r: r["turns"][0].update(ttft_ns=None), "run.turns[0].ttft_ns"),
    "NaN rate": (lambda r: r["turns"][0].update(decode_ts=float("nan")), "run.turns[0].decode_ts"),
    "memory sample": (lambda r: r["memory_samples"].append({"t_s": 1.0}), "run.memory_samples[0].rss_bytes"),
    "not an object": (lambda r: r.update(target=[1]), "run.target: must be an object"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_runs_are_refused_naming_the_field(case):
    mutate, message = BAD[case]
    with pytest.raises(S.ResultSchemaError) as err:
        S.validate(_bad(mutate))
    assert message in str(err.value)
    assert "\n" not in str(err.value)


def test_a_failed_run_without_turns_is_valid():
    run = fake_run(turns=1)
    run["turns"] = []
    S.mark_failed(run, "device_vanished", "adb: device 1a2b\n disconnected")
    S.summarize(run)
    S.validate(run)
    assert run["error"] == "adb: device 1a2b disconnected"
    assert run["summary"]["n_turns"] == 0 and run["summary"]["avg_ts"] is None
    with pytest.raises(ValueError):
        S.mark_failed(run, "ok", "x")


def test_summary_figures():
    run = S.new_run(engine=S.engine_info("pi2"), model=S.model_info("m"), workload=S.workload_info("w"),
                    target=S.target_info("t", "local"))  # fmt: skip
    S.add_turn(run, n_prompt=10, n_gen=5, ttft_ns=1_000_000_000, samples_ns=[10e6, 10e6, 10e6, 10e6],
               cache_hits=30, cache_misses=10, io_ns=1, compute_ns=3)  # fmt: skip
    S.add_turn(run, n_prompt=10, n_gen=5, ttft_ns=3_000_000_000, samples_ns=[20e6, 20e6, 20e6, 20e6],
               cache_hits=10, cache_misses=10, io_ns=1, compute_ns=3)  # fmt: skip
    S.add_turn(run, n_prompt=99, n_gen=5, ttft_ns=9, samples_ns=[1, 1, 1, 1], warmup=True)
    S.add_turn(run, n_prompt=99, n_gen=0, ttft_ns=None, status="aborted", error="killed")
    S.add_memory_sample(run, 0.0, 100, 80)
    S.add_memory_sample(run, 1.0, 300, 90)
    s = S.summarize(run)
    S.validate(run)
    assert run["turns"][0]["decode_ts"] == pytest.approx(100.0)
    assert run["turns"][0]["prefill_ts"] == pytest.approx(10.0)
    assert s["n_turns"] == 2 and s["n_failed_turns"] == 1
    assert s["avg_ts"] == pytest.approx(75.0)
    assert s["stddev_ts"] == pytest.approx(35.355, rel=1e-3)
    assert s["pooled_ts"] == pytest.approx(8 / 0.12)
    assert s["tbt_count"] == 8 and s["tbt_p50_ns"] == 15_000_000 and s["tbt_p99_ns"] == 20_000_000
    assert s["ttft_avg_ns"] == 2_000_000_000
    assert s["cache_hit_rate"] == pytest.approx(40 / 60)
    assert s["io_share"] == pytest.approx(0.25) and s["compute_share"] == pytest.approx(0.75)
    # the peak RSS is the kernel's, never the polled samples' (PSS has no kernel peak: polled)
    assert s["peak_rss_bytes"] is None and s["peak_rss_source"] is None and s["peak_pss_bytes"] == 90
    S.set_counters(run, cache_hits=1, cache_misses=1, peak_rss_bytes=1000, peak_rss_source=S.PEAK_RSS_WRAPPER)
    s = S.summarize(run)
    assert s["cache_hit_rate"] == 0.5 and s["peak_rss_bytes"] == 1000
    assert s["peak_rss_source"] == "rusage maxrss via wrapper"


def test_peak_rss_source_is_one_of_the_known_sources():
    run = fake_run(turns=1)
    with pytest.raises(ValueError, match="peak_rss_source must be one of"):
        S.set_counters(run, peak_rss_bytes=1, peak_rss_source="sampled")
    run["counters"].update(peak_rss_bytes=5, peak_rss_source="polled VmHWM")
    with pytest.raises(S.ResultSchemaError, match="run.counters.peak_rss_source: must be one of"):
        S.validate(run)
    for source in S.PEAK_RSS_SOURCES:
        run["counters"]["peak_rss_source"] = source
        S.validate(run)
    del run["counters"]["peak_rss_source"]  # results from before the field stay valid
    S.validate(run)
    run["turns"][0]["peak_rss_bytes"] = 9  # a turn's figure above the counters' has no recorded source
    run["counters"]["peak_rss_source"] = S.PEAK_RSS_ENGINE
    assert S.summarize(run)["peak_rss_bytes"] == 9 and run["summary"]["peak_rss_source"] is None


def test_a_generate_result_is_recorded_as_a_bench_turn_from_its_token_times():
    turn = TurnMetrics(text="x", token_ids=[1, 2, 3, 4], n_prompt=7, n_prompt_cached=0, n_prompt_processed=7,
                       ttft_s=0.25, token_times_s=[1.0, 1.1, 1.3, 1.4], prefill_tps=28.0, decode_tps=999.0,
                       host_decode_tps=0.0, stop_type="limit")  # fmt: skip
    result = GenerateResult(engine="llama.cpp", turn=turn, peak_rss_bytes=5 << 20)
    run = fake_run(turns=1)
    recorded = S.add_turn(run, **result.turn.turn_fields(), prompt_id="q1")
    assert recorded["samples_ns"] == [100_000_000, 200_000_000, 100_000_000]
    assert S.tbt_from_times(turn.token_times_s) == recorded["samples_ns"]
    assert recorded["ttft_ns"] == 250_000_000 and recorded["n_gen"] == 4
    assert recorded["decode_ts"] == pytest.approx(3 / 0.4)  # from the timestamps, not the engine's own 999
    S.validate(run)
    # `pi2 generate --json` prints the turn's figures flat, as it always has
    assert list(result.to_json()) == ["engine", "text", "token_ids", "n_prompt", "ttft_s", "prefill_tps",
                                      "decode_tps", "peak_rss_bytes", "token_times_s", "how", "extra"]  # fmt: skip
    assert result.to_json()["ttft_s"] == 0.25 and result.ttft_s == 0.25


def test_run_ids_are_file_safe_and_labels_mark_synthetic():
    run_id = S.make_run_id("llama.cpp", "Mixtral 47B/Q4 (syn)", "role play", "2026-11-21T23:18:00Z")
    assert run_id.startswith("20261121T231800Z-llama.cpp-Mixtral-47B-Q4-syn-role-play-")
    assert S._RUN_ID_RE.match(run_id)
    run = fake_run(synthetic=True, model="syn", engine="pi2", policy="dense")
    assert S.model_label(run) == "syn [synthetic]"
    assert S.engine_label(run) == "pi2:dense"
    plain = copy.deepcopy(run)
    plain["engine"]["policy"] = None
    assert S.engine_label(plain) == "pi2"
