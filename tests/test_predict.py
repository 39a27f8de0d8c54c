"""pi2cli/plan/predict.py term by term on made-up hardware: the cache the engine sizes at the run's
context, the steady-state hit rate from its split, reads per token counting both phases of a two-phase
read, and read times at the queue depth a block's wave keeps in flight."""

import pytest
from engine_helpers import needs_engine
from test_plan import BANDWIDTH_BOUND, REQUEST_BOUND, curve, mistral7b, profile

from pi2cli.plan.facts import engine_sizing
from pi2cli.plan.predict import Device, coverage, device_from_probe, predict, read_time_at, wave_read_time

MiB = 1 << 20
DEEP = curve({4096: 120000, 8192: 100000})  # the same disk with 512 reads in flight: faster per read
for p in DEEP:
    p["qd"] = 512


def device(storage=REQUEST_BOUND, deep=(), membw=18.9e9) -> Device:
    return Device("fake", membw, storage, 2, "test", list(deep))


def test_read_time_follows_the_queue_depth_where_it_was_measured():
    d = device(deep=DEEP)
    t32, t512 = read_time_at(d, 4096, 32), read_time_at(d, 4096, 512)
    assert t32 == pytest.approx(1 / 78000) and t512 == pytest.approx(1 / 120000)
    assert t512 < read_time_at(d, 4096, 128) < t32  # log-linear in between
    assert read_time_at(d, 4096, 8) == t32 and read_time_at(d, 4096, 5000) == t512
    # without a deep point the QD 32 curve is all there is
    assert read_time_at(device(), 4096, 512) == pytest.approx(1 / 78000)


def test_the_deep_curve_comes_from_the_profile():
    prof = profile()
    prof["storage"]["deep"] = DEEP
    assert [p["qd"] for p in device_from_probe(prof).deep] == [512, 512]
    assert device_from_probe(profile()).deep == []  # a profile from before: QD 32 only


@needs_engine
def test_the_cache_is_the_engines_at_the_runs_context():
    m = mistral7b()
    short, chat = (predict(m, device(), 2651 * MiB, ctx=c) for c in (35, 4096))
    # generate reserves a KV cache for prompt + tokens, chat for 4096 positions: 0.5 GiB more cache
    assert short["cache_bytes"] - chat["cache_bytes"] > 400 * MiB
    size = engine_sizing(m, 2651 * MiB, 35, 2)["cache"]
    assert short["cache_bytes"] == size["hot_bytes"] + size["cold_bytes"]
    assert short["hot_neurons_per_block"] == size["hot_neurons_per_block"]
    assert (
        short["hit_rate"] > chat["hit_rate"]
        and short["storage_reads_per_token"] < chat["storage_reads_per_token"]
    )


@needs_engine
def test_hit_rate_is_the_coverage_of_what_the_split_keeps():
    m = mistral7b()
    pr = predict(m, device(), 2651 * MiB, ctx=35)
    kept = (pr["hot_neurons_per_block"] + pr["cold_slots"] / m.n_blocks) / m.n_ff
    assert pr["hit_rate"] == pytest.approx(coverage(m, kept), abs=1e-4)
    per_block = pr["predicted_neurons_per_token"] / m.blocks_per_token
    assert pr["misses_per_token"] == pytest.approx(
        m.blocks_per_token * per_block * (1 - coverage(m, kept)), rel=1e-3
    )
    whole = predict(m, device(), 8 << 30, ctx=35)  # the whole FFN fits: nothing is read
    assert whole["hit_rate"] == 1.0 and whole["storage_ms"] == 0 and whole["storage_reads_per_token"] == 0


@needs_engine
def test_a_measured_named_curve_replaces_the_designs():
    # A run's `named` event: the neurons decode named by hotness rank bin, and over how many steps.
    from dataclasses import replace

    from pi2cli.plan.predict import named_profile

    m = mistral7b()
    by_rank = [0] * 64
    by_rank[0], by_rank[32] = 3000 * 10, 1000 * 10  # 10 steps: 75% in the hottest 64th, 25% mid-way
    event = {"event": "named", "decode_steps": 10, "by_rank": by_rank}
    prof = named_profile(event, m)
    assert prof["per_block"] == pytest.approx(40000 / (10 * m.blocks_per_token))
    mm = replace(m, measured=m.measured | {"named": prof})
    assert coverage(mm, 1 / 64) == pytest.approx(0.75) and coverage(mm, 0.5) == pytest.approx(0.75)
    assert coverage(mm, 33 / 64) == pytest.approx(1.0) and coverage(mm, 0.5 / 64) == pytest.approx(0.375)
    pr = predict(mm, device(), 2651 * MiB, ctx=35)  # keeps 1/64 < x < 32/64 of every block
    assert pr["named_source"].startswith("measured") and pr["hit_rate"] == pytest.approx(0.75, abs=1e-3)
    assert pr["predicted_neurons_per_token"] == round(40000 / 10)
    with pytest.raises(Exception, match="no decode step"):
        named_profile(event | {"decode_steps": 0}, m)


@needs_engine
def test_two_phase_reads_count_both_phases_and_follow_the_engines_rule():
    m = mistral7b()
    prec = m.measured["precision"]
    # bandwidth-bound storage: a gate read costs a third of a whole one, so the engine reads in two phases
    bw = predict(m, device(BANDWIDTH_BOUND), 2651 * MiB, ctx=35)
    assert bw["two_phase"] is True
    assert bw["storage_reads_per_token"] == pytest.approx(bw["misses_per_token"] * (1 + prec), rel=1e-3)
    # request-bound storage (every read costs about the same): whole bundles, one read per miss
    rq = predict(m, device(REQUEST_BOUND), 2651 * MiB, ctx=35)
    assert rq["two_phase"] is False and rq["storage_reads_per_token"] == rq["misses_per_token"]
    # a run's own setting wins over the rule
    forced = predict(m, device(REQUEST_BOUND), 2651 * MiB, ctx=35, two_phase=True)
    assert forced["two_phase"] is True and forced["storage_ms"] > rq["storage_ms"]


@needs_engine
def test_deeper_queues_shorten_storage_time():
    m = mistral7b()
    shallow = predict(m, device(), 2000 * MiB, ctx=35)
    deep = predict(m, device(deep=DEEP), 2000 * MiB, ctx=35)
    assert shallow["read_queue_depth"] > 32 and deep["storage_ms"] < shallow["storage_ms"]
    assert deep["storage_reads_per_token"] == shallow["storage_reads_per_token"]


@needs_engine
def test_storage_and_compute_add_less_the_pipelines_overlap():
    # A block waits for its own reads before the next layer's attention can start, so the time per
    # token is the sum, less (powerinfer2's pipeline only) the cached neurons' gate/up rows computed while
    # the block's reads fly: never more than either side.
    m = mistral7b()
    for policy in ("powerinfer2", "llmflash"):
        pr = predict(m, device(), 2000 * MiB, ctx=35, policy=policy)
        assert pr["memory_ms"] > 0 and pr["storage_ms"] > 0
        overlap = pr["overlap_ms"]
        assert pr["tbt_ms"] == pytest.approx(pr["memory_ms"] + pr["storage_ms"] - overlap, abs=0.02)
        assert pr["tok_s"] == pytest.approx(1e3 / pr["tbt_ms"], rel=1e-2)
        if policy == "powerinfer2":
            assert 0 < overlap <= min(pr["memory_ms"], pr["storage_ms"])
        else:
            assert overlap == 0
    # the hidden part is the cached rows' time, bounded by the reads': a slower memory side hides more
    fast = predict(m, device(), 2000 * MiB, ctx=35)
    slow = predict(m, device(membw=2e9), 2000 * MiB, ctx=35)
    assert slow["overlap_ms"] > fast["overlap_ms"]


WAVES = [{"wave": n, "range": 128 << 20, "block": 8192, "qd": 512, "iops": iops}
         for n, iops in ((64, 80000.0), (256, 90000.0), (1024, 100000.0), (2048, 120000.0))]  # fmt: skip


@needs_engine
def test_a_blocks_misses_are_timed_as_a_wave_at_its_share_of_the_span():
    # decode issues a block's misses as one sorted wave (sparse_ffn.c); a profile with storage.waves times
    # them at the wave of the same share of the span's blocks: 1787 of 14336 neurons = 12.5% = 2048 of
    # 128 MiB / 8 KiB, and 14336 * 64 / 16384 = 56 neurons = the smallest wave measured
    m = mistral7b()
    d = Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", list(DEEP), WAVES)
    scale = read_time_at(d, 7168, 32) / read_time_at(d, 8192, 32)  # the QD 32 curve's size scaling
    assert wave_read_time(d, m, 7168, 1792) == pytest.approx(scale / 120000.0)
    assert wave_read_time(d, m, 7168, 56) == pytest.approx(scale / 80000.0)
    assert wave_read_time(d, m, 7168, 5) == pytest.approx(scale / 80000.0)  # held flat past the points
    mid = wave_read_time(d, m, 7168, 14336 * 512 / 16384)  # halfway between 256 and 1024 in log
    assert mid == pytest.approx(scale / 95000.0)
    # without waves: the queue-depth curve, as before
    plain = device(deep=DEEP)
    assert wave_read_time(plain, m, 7168, 1792) == read_time_at(plain, 7168, 512)
    # waves faster than the free-running reads shorten the storage side and nothing else
    fast = Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", list(DEEP), [p | {"iops": 2e5} for p in WAVES])
    a = predict(m, plain, 2000 * MiB, ctx=35, two_phase=False)
    b = predict(m, fast, 2000 * MiB, ctx=35, two_phase=False)
    assert b["storage_ms"] < a["storage_ms"] and b["storage_reads_per_token"] == a["storage_reads_per_token"]
    assert b["memory_ms"] == a["memory_ms"]


def test_the_plan_predicts_with_the_one_predictor():
    """make_plan's predicted_tok_s is predict() for the plan's own settings (its split, its two-phase
    choice, its threads), not a second model of the same number."""
    from pi2cli.plan.plan import make_plan

    m, prof = mistral7b(), profile()
    for budget in (1800 * MiB, 2651 * MiB):
        plan = make_plan(m, prof, budget, ctx=64)
        s = plan.settings
        split = {k: s[k] for k in ("hot_fraction", "hot_share", "cluster") if k in s}
        p = predict(m, device_from_probe(prof, threads=s["threads"]), budget, ctx=64,
                    two_phase=s.get("two_phase"), split=split)  # fmt: skip
        assert plan.info["predicted_tok_s"] == p["tok_s"] and plan.info["predicted_hit_rate"] == p["hit_rate"]
        other = predict(m, device_from_probe(prof, threads=s["threads"]), budget, ctx=64,
                        two_phase=not s["two_phase"], split=split)  # fmt: skip
        assert p["tbt_ms"] <= other["tbt_ms"]  # the plan picked the faster kind of cold read


# ------------------------------------------------------------------------------ the decode calibration
def calibration(m, compute_s=0.5, position=100, threads=2, membw=18.9e9, file_bytes=5 << 30) -> dict:
    """A profile's `decode` object as pi2cli.plan.calibrate writes it, for a model of `file_bytes`."""
    by_rank = [0] * 64
    by_rank[0], by_rank[32] = 3000 * 10, 1000 * 10
    return {"model": {"file_bytes": file_bytes, "blocks": m.n_blocks}, "threads": threads, "membw_bytes_per_s": membw,
            "budget_bytes": 4 << 30, "prompt_tokens": 20, "warmup_tokens": 8, "timed_steps": 31,
            "position": position, "tbt_s": compute_s + 0.1, "io_wait_s": 0.1, "compute_s": compute_s,
            "hit_rate": 0.7, "reads_per_token": 1000.0, "named": {"decode_steps": 10, "rank_bins": 64, "by_rank": by_rank}}  # fmt: skip


@needs_engine
def test_a_calibration_of_the_model_gives_its_compute_time_and_named_curve():
    from dataclasses import replace

    m = replace(mistral7b(), file_bytes=5 << 30)
    cal = calibration(m, compute_s=0.5, position=512)
    d = Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", decode=cal)
    whole = predict(
        m, d, 8 << 30, ctx=35
    )  # nothing read: the step is the calibration's compute, at its position
    assert whole["storage_ms"] == 0 and whole["tbt_ms"] == pytest.approx(500, rel=1e-3)
    assert whole["memory_ms"] == pytest.approx(500, rel=1e-3) and whole["compute_source"].startswith(
        "the profile's"
    )
    assert whole["named_source"].startswith("measured (10 decode steps)")
    # the bandwidth probe alone would have said much less for the same bytes
    probe = predict(m, device(), 8 << 30, ctx=35)
    assert probe["compute_source"] == "the bandwidth probe" and probe["memory_ms"] < 200
    # under a budget: the calibration's compute plus the reads its named curve leaves, less the overlap
    part = predict(m, d, 2651 * MiB, ctx=35)
    assert part["hit_rate"] == pytest.approx(0.75, abs=1e-3) and part["storage_ms"] > 0
    assert part["tbt_ms"] == pytest.approx(
        part["memory_ms"] + part["storage_ms"] - part["overlap_ms"], abs=0.05
    )
    # other threads: scaled as the probe's bandwidth is (twice the bandwidth, half the compute time)
    fast = predict(m, Device("fake", 37.8e9, REQUEST_BOUND, 4, "test", decode=cal), 8 << 30, ctx=35)
    assert fast["tbt_ms"] == pytest.approx(250, rel=1e-3)


@needs_engine
def test_a_calibration_of_another_model_is_not_used():
    from dataclasses import replace

    m = replace(mistral7b(), file_bytes=5 << 30)
    for other in (calibration(m, file_bytes=4 << 30), calibration(replace(m, n_layer=16))):
        pr = predict(m, Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", decode=other), 8 << 30, ctx=35)
        assert pr["compute_source"] == "the bandwidth probe" and pr["named_source"] == "the design's curve"
    # a model known only by its shapes (no file) never matches
    pr = predict(mistral7b(), Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", decode=calibration(m, file_bytes=0)),
                 8 << 30, ctx=35)  # fmt: skip
    assert pr["compute_source"] == "the bandwidth probe"


def test_the_calibration_section_comes_from_the_runs_events():
    import json

    from pi2cli.errors import Pi2Error
    from pi2cli.plan.calibrate import WARMUP, decode_section

    ev = [{"event": "start", "n_prompt": 12}]
    for i in range(WARMUP + 5):  # steps of 100 ms, 30 of them waiting on reads (the last one 60)
        ev.append({"event": "token", "t": 0.1 * i, "io_wait_s": 0.06 if i == WARMUP + 4 else 0.03, "hits": 90,
                   "misses": 10, "reads": 10})  # fmt: skip
    ev += [{"event": "named", "decode_steps": 12, "rank_bins": 4, "by_rank": [5, 3, 1, 1], "by_block": [1, 2, 3]},
           {"event": "summary", "model_bytes": 12345}]  # fmt: skip
    d = decode_section([json.dumps(e) for e in ev], 1 << 30, 2, 1e10)
    assert d["model"] == {"file_bytes": 12345, "blocks": 3} and d["timed_steps"] == 4
    assert d["tbt_s"] == pytest.approx(0.1) and d["io_wait_s"] == pytest.approx(0.03)
    assert d["compute_s"] == pytest.approx(0.07) and d["hit_rate"] == pytest.approx(0.9)
    assert d["position"] == 12 + WARMUP + 2 and d["named"]["by_rank"] == [5, 3, 1, 1]
    with pytest.raises(Pi2Error, match="no sparse decode"):  # a dense run: no named event, no io_wait
        decode_section([json.dumps(e) for e in ev if e["event"] != "named"], 1 << 30, 2, 1e10)


def test_the_step_fit_is_the_steps_line_in_their_reads():
    from pi2cli.plan.calibrate import step_fit

    reads = [10000, 40000, 20000, 80000, 15000, 60000, 30000, 50000, 25000]
    fit = step_fit(reads, [0.15 + 8e-6 * r for r in reads])
    assert fit["base_s"] == pytest.approx(0.15) and fit["per_read_s"] == pytest.approx(8e-6)
    assert fit["r2"] == pytest.approx(1.0) and fit["steps"] == 9
    assert (fit["reads_min"], fit["reads_max"]) == (10000, 80000)
    assert step_fit([30000] * 9, [0.4] * 9) is None  # reads that do not spread: no slope to fit
    assert step_fit(reads[:5], [0.15 + 8e-6 * r for r in reads[:5]]) is None  # too few steps
    assert step_fit(reads, [0.5 - 1e-6 * r for r in reads]) is None  # the time is not the reads'


@needs_engine
def test_a_calibrated_step_line_predicts_the_step_at_the_runs_reads():
    from dataclasses import replace

    m = replace(mistral7b(), file_bytes=5 << 30)
    fit = {"base_s": 0.2, "per_read_s": 10e-6, "r2": 0.97, "steps": 31, "reads_min": 500, "reads_max": 3000}
    cal = calibration(m, compute_s=0.5, position=512) | {"step_fit": fit, "two_phase": False}
    d = Device("fake", 18.9e9, REQUEST_BOUND, 2, "test", decode=cal)
    part = predict(m, d, 2651 * MiB, ctx=35, two_phase=False)
    assert part["tbt_fitted"]
    assert part["tbt_source"].startswith("the profile's decode calibration: a step = 200.0 ms")
    # the request-bound disk costs the same a read at any wave: the line as it was drawn, at the run's reads
    reads = part["storage_reads_per_token"]
    assert part["tbt_ms"] == pytest.approx(1e3 * (0.2 + 10e-6 * reads), rel=0.02)
    device_model = part["memory_ms"] + part["storage_ms"] - part["overlap_ms"]
    assert part["model_tbt_ms"] == pytest.approx(device_model, abs=0.05)
    # other threads or the other kind of read: the line does not apply, the device model does
    four = Device("fake", 37.8e9, REQUEST_BOUND, 4, "test", decode=cal)
    pr = predict(m, four, 2651 * MiB, ctx=35, two_phase=False)
    assert not pr["tbt_fitted"] and pr["tbt_ms"] == pr["model_tbt_ms"]
    two = predict(m, d, 2651 * MiB, ctx=35, two_phase=True)
    assert not two["tbt_fitted"] and two["tbt_ms"] == two["model_tbt_ms"]
