"""`pi2 profile` and `pi2 plan`: the planner's rules on made-up hardware, the commands end to end, and a
plan file driving pi2-engine (its summary shows the plan's settings) and `pi2 bench --plan`."""

import json
import os
import re
import subprocess
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import built, engine_bin, needs_engine

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.plan.facts import ModelFacts, engine_sizing, model_facts
from pi2cli.plan.plan import load_plan, make_plan
from pi2cli.plan.predict import read_time_s
from pi2cli.plan.profile import load_profile, measure, probe_steps, validate_profile

MiB = 1 << 20


# ----------------------------------------------------------------------------------- made-up inputs
def mistral7b(**kw) -> ModelFacts:
    """TurboSparse-Mistral-7B's shapes and measured statistics (as /work/models/tsm7b carries them)."""
    base = dict(name="tsm7b", arch="llama", ffn_act="drelu", neuron_type="Q4_0", n_layer=32, n_embd=4096,
                n_ff=14336, n_head=32, n_head_kv=8, head_dim=128, n_vocab=49152, has_predictor=True,
                part_bytes=2304, bundle_stride=8192, resident_bytes=1059995648,
                per_token_resident_bytes=859000000, other_bytes=1400000,
                measured={"precision": 0.377, "recall": 0.944, "sparsity": 0.898, "hot_coverage": 0.798,
                          "predicted_fraction": 0.256},
                profiled_hot_fraction=0.2)  # fmt: skip
    base.update(kw)
    return ModelFacts(**base)


def curve(points: dict[int, float]) -> list[dict]:
    """block -> IOPS at queue depth 32."""
    return [{"block": b, "qd": 32, "iops": iops, "mb_per_s": b * iops / 1e6, "lat_p50_us": 400.0,
             "lat_p99_us": 900.0, "reads": 1000} for b, iops in sorted(points.items())]  # fmt: skip


REQUEST_BOUND = curve({4096: 78000, 8192: 65000, 16384: 44000, 65536: 19000})  # this VM's virtio disk
BANDWIDTH_BOUND = curve({b: 800e6 / b for b in (4096, 8192, 16384, 65536)})  # 800 MB/s at every size


def profile(storage=REQUEST_BOUND, cores=2, clusters=(), membw=18.9) -> dict:
    return {
        "format": "pi2-profile", "version": 1, "target": {"name": "fake", "kind": "local", "arch": "x86_64"},
        "cores": {"count": cores, "clusters": [dict(c) for c in clusters]},
        "memory": {"total_bytes": 8 << 30},
        "membw": [{"threads": 1, "gb_per_s": membw / 2}, {"threads": cores, "gb_per_s": membw}],
        "storage": {"file": "m.pi2", "file_bytes": 5 << 30, "method": "io_uring", "o_direct": True, "curve": storage,
                    "qd1": dict(storage[0], qd=1)},
    }  # fmt: skip


# ------------------------------------------------------------------------------------- storage model
def test_read_time_follows_the_curve():
    for p in REQUEST_BOUND:
        assert read_time_s(REQUEST_BOUND, p["block"]) == pytest.approx(1 / p["iops"])
    mid = read_time_s(REQUEST_BOUND, 6144)
    assert 1 / 78000 < mid < 1 / 65000  # between its neighbours
    # below the smallest block: request-bound storage charges about one request, bandwidth-bound the bytes
    assert read_time_s(REQUEST_BOUND, 2560) == pytest.approx(1 / 78000, rel=0.1)
    assert read_time_s(BANDWIDTH_BOUND, 2560) == pytest.approx(2560 / 800e6, rel=1e-6)
    assert read_time_s(BANDWIDTH_BOUND, 1000) == read_time_s(BANDWIDTH_BOUND, 1024)  # 512-rounded


@needs_engine
def test_request_bound_storage_reads_whole_bundles():
    plan = make_plan(mistral7b(), profile(REQUEST_BOUND), 2651 * MiB, ctx=64)
    assert plan.settings["policy"] == "powerinfer2" and plan.settings["two_phase"] is False
    assert plan.info["predicted_whole_bundle_us"] < plan.info["predicted_two_phase_us"]
    # one read a miss, and the storage time is those reads at a whole bundle's cost
    info = plan.info
    assert info["predicted_reads_per_token"] == info["predicted_misses_per_token"] > 0
    want_ms = info["predicted_misses_per_token"] * info["predicted_whole_bundle_us"] / 1e3
    assert info["predicted_storage_ms"] == pytest.approx(want_ms, rel=1e-3)
    assert any("whole-bundle reads are cheaper" in w for w in plan.why)
    # reading the next layer's predicted misses during attention cost more reads than it overlapped
    assert plan.settings["lookahead"] is False and any("lookahead false" in w for w in plan.why)


@needs_engine
def test_bandwidth_bound_storage_reads_in_two_phases():
    plan = make_plan(mistral7b(), profile(BANDWIDTH_BOUND), 2651 * MiB, ctx=64)
    assert plan.settings["two_phase"] is True
    # a two-phase miss is a gate read and, for the share whose gate fires (precision 0.377), a rest read
    info = plan.info
    assert info["predicted_reads_per_token"] == pytest.approx(
        info["predicted_misses_per_token"] * 1.377, rel=1e-3
    )
    want_ms = info["predicted_misses_per_token"] * info["predicted_two_phase_us"] / 1e3
    assert info["predicted_storage_ms"] == pytest.approx(want_ms, rel=1e-3)
    assert any("two-phase reads (gate part first) are cheaper" in w for w in plan.why)


@needs_engine
def test_a_disturbed_storage_curve_is_flagged():
    assert not any("caution" in w for w in make_plan(mistral7b(), profile(), 2651 * MiB, ctx=64).why)
    busy = curve({4096: 21000, 8192: 26000, 16384: 22000, 65536: 2000})  # someone else was reading
    plan = make_plan(mistral7b(), profile(busy), 2651 * MiB, ctx=64)
    assert any("caution" in w and "8 KiB reads got more IOPS than 4 KiB" in w for w in plan.why)
    assert any("64 KiB reads got less bandwidth than 16 KiB" in w for w in plan.why)


@needs_engine
def test_two_phase_is_not_set_where_it_cannot_apply():
    plan = make_plan(mistral7b(ffn_act="swiglu"), profile(BANDWIDTH_BOUND), 2651 * MiB, ctx=64)
    assert "two_phase" not in plan.settings and any("does not apply" in w for w in plan.why)


# ------------------------------------------------------------------------------------------ the cache
@needs_engine
def test_cache_split_puts_the_hot_set_first_and_matches_the_engines_sizing():
    m = mistral7b()
    plan = make_plan(m, profile(), 2651 * MiB, ctx=64)
    s = plan.settings
    assert (s["hot_fraction"], s["cluster"]) == (0.2, 32) and 0 < s["hot_share"] < 1
    cache = engine_sizing(m, 2651 * MiB, 64, plan.settings["threads"], hot_fraction=s["hot_fraction"],
                          hot_share=s["hot_share"], cluster=32)["cache"]  # fmt: skip
    hot, cold = cache["hot_neurons_per_block"], cache["cold_slots"]
    assert cache["bytes"] == plan.info["predicted_cache_bytes"]  # the engine's own sizing, not a copy
    assert hot == plan.info["predicted_hot_neurons_per_block"] == 2880  # the whole hot set fits
    assert cold > 0 and any("the whole hot set" in w for w in plan.why)
    # a smaller budget: the hot set shrinks, the cold region keeps room for two blocks' predicted neurons
    small = make_plan(m, profile(), 1536 * MiB, ctx=64)
    assert small.info["predicted_hot_neurons_per_block"] < 2880 and small.settings["hot_share"] < 1
    assert any("does not fit" in w for w in small.why)
    assert small.info["predicted_reads_per_token"] > plan.info["predicted_reads_per_token"]
    # a longer context takes KV cache out of the same budget
    assert (
        make_plan(m, profile(), 2651 * MiB).info["predicted_cache_bytes"] < plan.info["predicted_cache_bytes"]
    )


@needs_engine
def test_a_budget_holding_the_whole_ffn_preloads_it():
    plan = make_plan(mistral7b(), profile(), 6 << 30, ctx=64)
    assert not {"hot_fraction", "hot_share", "cluster", "lookahead"} & set(plan.settings)
    assert any("everything preloaded" in w for w in plan.why) and plan.info["predicted_storage_ms"] == 0
    assert plan.info["predicted_reads_per_token"] == 0 and plan.info["predicted_hit_rate"] == 1


@needs_engine
def test_without_measured_coverage_the_engine_defaults_stay():
    m = mistral7b(measured={"precision": 0.4}, profiled_hot_fraction=None)
    plan = make_plan(m, profile(), 2651 * MiB, ctx=64)
    assert (plan.settings["hot_fraction"], plan.settings["hot_share"], plan.settings["cluster"]) == (
        0.2,
        0.5,
        32,
    )
    assert any("engine defaults" in w for w in plan.why)


@needs_engine
def test_a_model_without_predictors_runs_dense():
    plan = make_plan(mistral7b(has_predictor=False), profile(), 2651 * MiB, ctx=64)
    assert plan.settings["policy"] == "dense"
    assert not {"two_phase", "hot_fraction", "hot_share", "cluster"} & set(plan.settings)
    assert any("no activation predictors" in w for w in plan.why)
    assert plan.info["predicted_storage_ms"] > 0  # the FFN does not fit: dense pages it in


@needs_engine
def test_moe_reads_only_the_blocks_a_token_routes_to():
    moe = mistral7b(name="mixtral", arch="moe", n_expert=8, n_expert_used=2, n_ff=14336)
    dense = mistral7b()
    a = make_plan(moe, profile(), 8 << 30, ctx=64)
    b = make_plan(dense, profile(), 8 << 30, ctx=64)
    assert a.settings["policy"] == "powerinfer2" and "hot_share" in a.settings  # 8 experts' FFN does not fit
    assert "lookahead" not in a.settings  # the router decides the next layer's experts: nothing to look ahead
    assert moe.blocks_per_token == 2 * dense.blocks_per_token and moe.n_blocks == 8 * dense.n_blocks
    assert a.info["predicted_memory_ms"] > b.info["predicted_memory_ms"]  # two experts' FFN per token


# ------------------------------------------------------------------------------------------ the cores
BIG_LITTLE = ({"cpus": [0, 1, 2, 3], "max_mhz": 1800}, {"cpus": [4, 5, 6], "max_mhz": 2800},
              {"cpus": [7], "max_mhz": 3200})  # fmt: skip


@needs_engine
def test_big_and_little_cores_split_compute_and_io():
    # compute on the big and mid cores (fastest first), the I/O on one core: the slowest of them
    plan = make_plan(mistral7b(), profile(cores=8, clusters=BIG_LITTLE), 2651 * MiB, ctx=64)
    s = plan.settings
    assert s["threads"] == 3 and s["affinity"] == "7,4,5"
    assert s["io_threads"] == 1 and s["io_affinity"] == "6"  # io_uring: one submitter
    two = make_plan(mistral7b(), profile(cores=8, clusters=BIG_LITTLE), 2651 * MiB, ctx=64, threads=2)
    assert two.settings["affinity"] == "7,4" and two.settings["io_affinity"] == "6"
    more = make_plan(mistral7b(), profile(cores=8, clusters=BIG_LITTLE), 2651 * MiB, ctx=64, threads=7)
    assert more.settings["affinity"] == "7,4,5,0,1,2,3" and more.settings["io_affinity"] == "6"
    assert any("puts compute on little cores too" in w for w in more.why)
    every = make_plan(mistral7b(), profile(cores=8, clusters=BIG_LITTLE), 2651 * MiB, ctx=64, threads=8)
    assert "io_affinity" not in every.settings and any("no core left" in w for w in every.why)
    # the pread pool reads one request per thread: as many as the storage curve was measured with
    pread = profile(cores=8, clusters=BIG_LITTLE)
    pread["storage"]["method"] = "pread"
    assert make_plan(mistral7b(), pread, 2651 * MiB, ctx=64).settings["io_threads"] == 32


PHONE_1_5_2 = ({"cpus": [0, 1], "max_mhz": 2265, "capacity": 325},
               {"cpus": [2, 3, 4, 5, 6], "max_mhz": 3148, "capacity": 870},
               {"cpus": [7], "max_mhz": 3302, "capacity": 1024})  # fmt: skip


@needs_engine
def test_a_1_5_2_phone_computes_on_big_and_mid_and_reads_on_one_mid_core():
    plan = make_plan(mistral7b(), profile(cores=8, clusters=PHONE_1_5_2), 2651 * MiB, ctx=64)
    s = plan.settings
    assert (s["threads"], s["affinity"], s["io_threads"], s["io_affinity"]) == (5, "7,2,3,4,5", 1, "6")
    assert any("1 big + 5 mid + 2 little" in w for w in plan.why)
    # 8 cores of which the clusters name 7 (one offline while profiled): 8 threads cannot all be pinned
    short = profile(cores=8, clusters=({"cpus": [0], "max_mhz": 2265}, *PHONE_1_5_2[1:]))
    with pytest.raises(Pi2Error, match="--threads 8: the profile's clusters list 7 CPUs"):
        make_plan(mistral7b(), short, 2651 * MiB, ctx=64, threads=8)
    assert (
        make_plan(mistral7b(), short, 2651 * MiB, ctx=64, threads=7).settings["affinity"] == "7,2,3,4,5,6,0"
    )
    # the paper's 4 compute + 1 I/O layout is --threads 4
    four = make_plan(mistral7b(), profile(cores=8, clusters=PHONE_1_5_2), 2651 * MiB, ctx=64, threads=4)
    assert (four.settings["affinity"], four.settings["io_affinity"]) == ("7,2,3,4", "6")


@needs_engine
def test_the_estimate_reads_the_bandwidth_at_the_planned_threads():
    # 5 compute threads on a 1 + 5 + 2 phone: a profile from `pi2 profile` measures that count; an older one
    # (1 thread and every core) is interpolated, not read at its 1-thread row
    phone = profile(cores=8, clusters=PHONE_1_5_2, membw=30.0)
    plan = make_plan(mistral7b(), phone, 2651 * MiB, ctx=64)
    assert plan.info["measured_membw_gb_per_s"] == pytest.approx(15 + 15 * 4 / 7, rel=1e-3)
    phone["membw"].append({"threads": 5, "gb_per_s": 27.0})
    assert make_plan(mistral7b(), phone, 2651 * MiB, ctx=64).info["measured_membw_gb_per_s"] == 27.0
    assert [s[1][2] for s in probe_steps(8, threads_planned=5) if s[1][0] == "membw"] == ["1", "5", "8"]
    # the prediction from a measured profile (`pi2 plan`'s --profile of a device) uses the same threads
    from pi2cli.plan.predict import device_from_probe

    dev = device_from_probe(phone)
    assert (dev.threads, dev.membw_bytes_per_s) == (5, 27e9)
    alike = device_from_probe(profile(cores=2, membw=18.9))
    assert (alike.threads, alike.membw_bytes_per_s) == (2, 18.9e9)


@needs_engine
def test_capacity_tells_apart_cores_of_one_clock():
    # MediaTek Helio P60: four A53 and four A73 cores, all at 2.0 GHz: only cpu_capacity ranks them
    from pi2cli.hw.devices import describe_clusters
    from pi2cli.targets.base import parse_cpu_clusters

    freq = "\n".join(f"cpu{i} 2001000 {447 if i < 4 else 1024}" for i in range(8))
    clusters = parse_cpu_clusters(freq)
    assert clusters == [{"cpus": [0, 1, 2, 3], "max_mhz": 2001, "capacity": 447},
                        {"cpus": [4, 5, 6, 7], "max_mhz": 2001, "capacity": 1024}]  # fmt: skip
    assert describe_clusters(clusters) == "4x2.0/447 + 4x2.0/1024 GHz/cap"  # pi2 devices
    s = make_plan(mistral7b(), profile(cores=8, clusters=clusters), 2651 * MiB, ctx=64).settings
    assert (s["affinity"], s["io_affinity"]) == ("4,5,6", "7")
    # capacity outranks the clock: a faster-clocked cluster of weaker cores is the little one
    odd = (
        {"cpus": [0, 1], "max_mhz": 2400, "capacity": 400},
        {"cpus": [2, 3, 4], "max_mhz": 2000, "capacity": 1024},
    )
    s = make_plan(mistral7b(), profile(cores=5, clusters=odd), 2651 * MiB, ctx=64).settings
    assert (s["affinity"], s["io_affinity"]) == ("2,3", "4")


@needs_engine
def test_alike_cores_are_not_pinned():
    for clusters in ((), ({"cpus": [0, 1, 2, 3], "max_mhz": 2000},)):
        plan = make_plan(mistral7b(), profile(cores=4, clusters=clusters), 2651 * MiB, ctx=64)
        assert plan.settings["threads"] == 4 and not {"affinity", "io_affinity", "io_threads"} & set(
            plan.settings
        )
        assert any("all alike" in w and "no pinning" in w for w in plan.why)


# -------------------------------------------------------------------------------------- the plan file
def write_plan(path: Path, data: dict) -> Path:
    path.write_text(json.dumps(data))
    return path


@needs_engine
def test_plan_file_has_only_keys_the_engine_reads(tmp_path):
    plan = make_plan(
        mistral7b(), profile(cores=8, clusters=BIG_LITTLE), 2651 * MiB, ctx=64, pred_threshold=0.3
    )
    data = plan.to_json()
    assert load_plan(write_plan(tmp_path / "p.json", data)) == data  # the engine takes it
    assert data["format"] == "pi2-plan" and data["version"] == 1 and data["pred_threshold"] == 0.3
    assert data["memory_budget"] == 2651 * MiB and "\n" in data["why"]
    assert data["predicted_tbt_ms"] > 0 and data["predicted_tok_s"] == pytest.approx(1e3 / data["predicted_tbt_ms"],
                                                                                     rel=0.01)  # fmt: skip
    assert all(not isinstance(v, dict | list) for v in data.values())  # flat
    assert "pred_threshold" not in make_plan(mistral7b(), profile(), 2651 * MiB).settings  # only when asked
    # the rules are the engine's alone (`pi2-engine size --plan`): its one line, naming the file
    with pytest.raises(Pi2Error, match=r'p.json: unknown key "hot_fractoin"'):
        load_plan(write_plan(tmp_path / "p.json", {**data, "hot_fractoin": 0.2}))
    with pytest.raises(Pi2Error, match=r'"two_phase" is a string, expected true or false'):
        load_plan(write_plan(tmp_path / "p.json", {**data, "two_phase": "no"}))
    # "2 G" was taken by the host's own rules and refused by the engine's: now judged once
    with pytest.raises(Pi2Error, match=r"plan .*p.json: --memory-budget: expected a size .* got '2 G'"):
        load_plan(write_plan(tmp_path / "p.json", {**data, "memory_budget": "2 G"}))


@needs_engine
@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"budget": 900 * MiB}, "is too small for tsm7b: the fixed region needs"),
        ({"pred_threshold": 1.5}, "--pred-threshold must be a probability in (0, 1)"),
        ({"threads": 3}, "--threads 3: the device has 2 cores"),
        ({"profile": {"format": "pi2-profile", "version": 1}}, "cores.count"),
        ({"profile": dict(profile(), storage={"curve": []})}, "storage.curve is missing"),
        ({"profile": dict(profile(), format="x")}, "not a pi2 hardware profile"),
        ({"model": mistral7b(has_predictor=False), "pred_threshold": 0.5}, "needs a model with activation"),
    ],
)
def test_bad_inputs_are_one_line_errors(kw, message):
    args = {"model": mistral7b(), "profile": profile(), "budget": 2651 * MiB} | kw
    with pytest.raises(Pi2Error) as err:
        make_plan(args.pop("model"), args.pop("profile"), args.pop("budget"), **args)
    assert message in str(err.value) and "\n" not in str(err.value)


# --------------------------------------------------------------------------------------- the profile
def test_measure_keeps_each_block_sizes_best_round():
    calls = []

    def run(args):
        calls.append(args)
        if args[0] == "membw":
            return json.dumps(
                {"probe": "membw", "threads": int(args[2]), "mib_per_thread": 8, "gb_per_s": 10.0}
            )
        block, qd = int(args[args.index("--block") + 1]), int(args[args.index("--qd") + 1])
        iops = 1000.0 * (2 if len([c for c in calls if "--block" in c and c[2:5] == args[2:5]]) == 2 else 1)
        wave = int(args[args.index("--wave") + 1]) if "--wave" in args else 0  # the probe echoes its span
        span = int(args[args.index("--range") + 1]) if wave else 0
        return json.dumps({"probe": "storage", "block": block, "qd": qd, "wave": wave, "range": span, "iops": iops,
                           "mb_per_s": iops * block / 1e6, "lat_p50_us": 1.0, "lat_p99_us": 2.0, "reads": 10,
                           "method": "pread", "o_direct": True, "file_bytes": 1 << 30})  # fmt: skip

    steps = []
    out = measure(run, "/m.pi2", cores=4, seconds=0.4, membw_mib=8, step=lambda i, n, d: steps.append((i, n)))
    assert [m["threads"] for m in out["membw"]] == [1, 4]
    assert [p["block"] for p in out["storage"]["curve"]] == [4096, 8192, 16384, 65536]
    assert all(p["iops"] == 2000.0 for p in out["storage"]["curve"])  # round 2 was better: kept
    assert out["storage"]["qd1"]["qd"] == 1 and out["storage"]["method"] == "pread"
    # the engine's queue depth too, for the sizes a decode step's misses are read at
    assert [(p["block"], p["qd"], p["iops"]) for p in out["storage"]["deep"]] == [
        (4096, 512, 2000.0),
        (8192, 512, 2000.0),
    ]
    # and reads in waves as decode issues a block's misses, each wave size's better round
    assert [(p["wave"], p["range"], p["block"], p["iops"]) for p in out["storage"]["waves"]] == [
        (n, 128 << 20, 8192, 2000.0) for n in (64, 256, 1024, 2048)
    ]
    assert steps == [(i, len(probe_steps(4))) for i in range(len(probe_steps(4)))]
    assert all(
        c[c.index("--seconds") + 1] == "0.2" for c in calls if "--qd" in c and c[c.index("--qd") + 1] == "32"
    )


@pytest.mark.slow
def test_profile_command_on_this_machine(tmp_path):
    built("pi2-probe")
    store = tmp_path / "store.bin"
    store.write_bytes(bytes(range(256)) * (16 * 1024))  # 4 MiB
    out = tmp_path / "profile.json"
    result = CliRunner().invoke(cli, ["profile", "--file", str(store), "--out", str(out), "--seconds", "0.1",
                                      "--membw-mib", "4", "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == load_profile(out)
    validate_profile(data)
    assert data["cores"]["count"] >= 1 and data["memory"]["total_bytes"] > 0
    assert [p["block"] for p in data["storage"]["curve"]] == [4096, 8192, 16384, 65536]
    assert all(p["iops"] > 0 and p["qd"] == 32 for p in data["storage"]["curve"])
    assert data["storage"]["qd1"]["qd"] == 1 and data["storage"]["file_bytes"] == 4 << 20
    assert data["membw"][0]["threads"] == 1 and data["membw"][-1]["threads"] == data["cores"]["count"]
    # a missing file: one line, no profile left behind
    gone = tmp_path / "none.json"
    bad = CliRunner().invoke(cli, ["profile", "--file", str(tmp_path / "nope"), "--out", str(gone)])
    assert bad.exit_code == 1 and "no such file" in bad.output and not gone.exists()
    assert not list(tmp_path.glob("*.partial"))


# ---------------------------------------------------------------------------- commands and the engine
@pytest.fixture(scope="module")
def heavy(synth_model) -> Path:
    """Two layers whose FFN (32 MiB) is most of the file, with predictors and measured statistics."""
    return synth_model("ffn-32k")


@pytest.fixture
def profile_file(tmp_path) -> Path:
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile(REQUEST_BOUND)))
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


@pytest.mark.slow
def test_plan_command_json_and_file(heavy, profile_file, tmp_path):
    out = tmp_path / "plan.json"
    result = invoke("plan", "-m", heavy, "--memory-budget", "56M", "--profile", profile_file, "--ctx", "16",
                    "--out", out, "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data == load_plan(out)
    facts = model_facts(heavy)
    assert facts.has_predictor and facts.measured["hot_coverage"] > 0.5
    assert (
        data["policy"] == "powerinfer2" and data["memory_budget"] == 56 * MiB and data["model"] == str(heavy)
    )
    assert data["two_phase"] is False and data["device"] == "fake"
    table = invoke("plan", "-m", heavy, "--memory-budget", "56M", "--profile", profile_file, "--ctx", "16")
    assert table.exit_code == 0 and "why" in table.stdout and "--hot-share" in table.stdout
    # one number: the table's predicted_tok_s row and the why line are the JSON's
    assert re.search(rf"predicted_tok_s\s.*\b{re.escape(str(data['predicted_tok_s']))}\b", table.stdout)
    assert f"prediction: {data['predicted_tok_s']} tok/s" in data["why"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--memory-budget", "lots"], "not a size"),
        (["--memory-budget", "16M"], "is below the smallest budget pi2-engine runs"),
        (["--memory-budget", "56M", "--pred-threshold", "0"], "--pred-threshold must be a probability"),
        (["--memory-budget", "56M", "--profile", "MISSING"], "No such file"),
        (["--memory-budget", "56M", "--profile", "NOTJSON"], "not JSON"),
    ],
)
def test_plan_command_bad_input(heavy, profile_file, tmp_path, args, message):
    (tmp_path / "bad.json").write_text("{oops")
    args = [str(tmp_path / "missing.json") if a == "MISSING" else str(tmp_path / "bad.json") if a == "NOTJSON" else a
            for a in args]  # fmt: skip
    if "--profile" not in args:
        args += ["--profile", str(profile_file)]
    out = tmp_path / "plan.json"
    result = invoke("plan", "-m", heavy, *args, "--out", out)
    assert result.exit_code != 0 and message in result.output and "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1 and not out.exists()


@pytest.mark.slow
def test_profile_of_a_model_calibrates_decode_and_the_plan_predicts_with_it(heavy, synth_model, tmp_path):
    out = tmp_path / "profile.json"
    probes = ("--seconds", "0.05", "--membw-mib", "4")
    r = invoke("profile", "--file", heavy, "--out", out, *probes, "--calibrate-budget", "56M")
    assert r.exit_code == 0, r.output
    assert "decode calibration (" in r.output
    d = load_profile(out)["decode"]
    assert d["model"] == {"file_bytes": heavy.stat().st_size, "blocks": model_facts(heavy).n_blocks}
    assert d["budget_bytes"] == 56 * MiB and d["timed_steps"] == 31 and 0 < d["compute_s"] <= d["tbt_s"]
    assert sum(d["named"]["by_rank"]) > 0 and d["named"]["decode_steps"] > 0
    plan = invoke("plan", "-m", heavy, "-b", "56M", "--profile", out, "--ctx", "16", "--json")
    assert plan.exit_code == 0, plan.output
    data = json.loads(plan.stdout)
    assert data["predicted_compute_source"].startswith("the profile's decode calibration (31 steps")
    assert data["predicted_named_source"].startswith("measured")
    # another model: the bandwidth probe and the design's curve
    other = json.loads(invoke("plan", "-m", synth_model("sparse-1k"), "-b", "64M", "--profile", out, "--ctx", "16",
                              "--json").stdout)  # fmt: skip
    assert other["predicted_compute_source"] == "the bandwidth probe"
    # a calibration the engine refuses (a budget below its smallest): one line, the probes' profile kept
    kept = tmp_path / "kept.json"
    bad = invoke("profile", "--file", heavy, "--out", kept, *probes, "--calibrate-budget", "8M")
    assert bad.exit_code == 1 and "decode calibration" in bad.output and "Traceback" not in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and "decode" not in load_profile(kept)
    assert load_profile(kept)["storage"]["file_bytes"] == heavy.stat().st_size
    # --no-calibrate: the probes only
    r = invoke("profile", "--file", heavy, "--out", kept, *probes, "--no-calibrate")
    assert r.exit_code == 0 and "decode" not in load_profile(kept)


@needs_engine
def test_calibrating_a_model_smaller_than_its_fixed_region_runs_at_the_engines_least(tiny_model, tmp_path):
    # the default budget is at most the file; a 16 MB model's KV cache and scratch need twice that
    out = tmp_path / "profile.json"
    r = invoke("profile", "--file", tiny_model, "--out", out, "--seconds", "0.05", "--membw-mib", "4")
    assert r.exit_code == 0, r.output
    d = load_profile(out)["decode"]
    assert d["budget_bytes"] > tiny_model.stat().st_size and d["timed_steps"] == 31
    size = subprocess.run([str(engine_bin()), "size", "-m", str(tiny_model), "--policy", "powerinfer2", "--threads",
                           str(d["threads"]), "--memory-budget", str(d["budget_bytes"]), "--json"],
                          capture_output=True, text=True)  # fmt: skip
    answer = json.loads(size.stdout)
    assert "error" not in answer and d["budget_bytes"] <= answer["min_budget_bytes"] + (1 << 20), answer


@pytest.mark.slow
def test_plan_command_probes_this_machine_without_a_profile(heavy, tmp_path):
    result = invoke("plan", "-m", heavy, "-b", "56M", "--ctx", "16", "--seconds", "0.05", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["device"] == "local" and data["measured_iops_4k_qd32"] > 0 and data["predicted_tbt_ms"] > 0
    assert load_plan(write_plan(tmp_path / "probed-plan.json", data)) == data  # never beside a shared model


def test_plan_command_on_a_file_that_is_no_model(tmp_path, profile_file):
    junk = tmp_path / "junk.pi2"
    junk.write_bytes(b"not a model" * 100)
    result = invoke("plan", "-m", junk, "--memory-budget", "1G", "--profile", profile_file)
    assert (
        result.exit_code == 1
        and result.output.startswith("pi2: error: --model")
        and "Traceback" not in result.output
    )


@pytest.mark.slow
@pytest.mark.parametrize("budget", ["56M", "96M"])
def test_engine_runs_the_plan(heavy, profile_file, tmp_path, budget):
    # pi2 plan -> plan file -> pi2-engine generate --plan: the engine's summary shows the plan's settings.
    # 56M leaves a cache of part of the FFN (hot/cold split), 96M holds it all (preloaded). The bundles are
    # tiny (72-byte parts in one 512-byte read), so a gate-first read can only add requests: whole bundles.
    plan_path = tmp_path / "plan.json"
    result = invoke("plan", "-m", heavy, "-b", budget, "-P", profile_file, "--ctx", "16", "--out", plan_path)
    assert result.exit_code == 0, result.output
    plan = load_plan(plan_path)
    assert plan["two_phase"] is False
    events = tmp_path / "events.jsonl"
    done = subprocess.run([str(engine_bin()), "generate", "-m", str(heavy), "--plan", str(plan_path), "-p", "Hello there",
                           "-n", "6", "--ctx", "16", "--batch", "16", "--events", str(events)],
                          capture_output=True, text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = [json.loads(line) for line in events.read_text().splitlines() if '"summary"' in line][-1]
    assert summary["policy"] == "powerinfer2" and summary["memory_budget_bytes"] == plan["memory_budget"]
    assert summary["two_phase"] is False and summary["peak_rss_bytes"] <= plan["memory_budget"]
    if budget == "96M":
        assert "cluster" not in plan and "preload" in plan["why"]
        assert (
            summary["hot_neurons_per_block"] == 0 and summary["hit_rate"] == 1.0 and summary["preload_s"] > 0
        )
    else:
        assert summary["cluster"] == plan["cluster"] and plan["hot_share"] > 0
        assert plan["lookahead"] is False and summary["lookahead"] is False
        # the planner sizes the regions as the engine does: from the cache the engine really got, the
        # plan's hot share gives the engine's hot set exactly
        assert summary["hot_neurons_per_block"] > 0
        # the planner's estimate of the cache is close to what the engine measured for itself (the engine
        # measures its fixed region as RSS at open, which on a loaded machine came out 4.3 MiB higher once
        # in ~10 runs: a third of this small cache)
        assert summary["cache_bytes"] == pytest.approx(plan["predicted_cache_bytes"], rel=0.4), summary[
            "fixed_bytes"
        ]


def task_cpus(pid: int) -> dict[int, str]:
    """Each thread of a running process: its Cpus_allowed_list (what taskset -p shows per thread)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread just ended
            continue
        m = re.search(r"^Cpus_allowed_list:\s*(\S+)", status, re.M)
        if m:
            out[int(task.name)] = m.group(1)
    return out


@pytest.mark.slow
@pytest.mark.skipif(not {0, 1} <= os.sched_getaffinity(0), reason="needs CPUs 0 and 1")
def test_engine_pins_compute_and_io_threads_as_the_plan_says(heavy, tmp_path):
    # A plan's affinity pins the compute threads one per CPU (the calling thread on the first), its
    # io_affinity the pread pool's threads. The main thread sits on CPU 0 and I/O threads it starts inherit
    # that, so I/O threads found on CPU 1 were pinned there by io_affinity.
    plan = tmp_path / "pin.json"
    plan.write_text(json.dumps({"format": "pi2-plan", "version": 1, "policy": "powerinfer2", "threads": 2,
                                "affinity": "0,1", "io": "pread", "io_threads": 3, "io_affinity": "1"}))  # fmt: skip
    proc = subprocess.Popen([str(engine_bin()), "generate", "-m", str(heavy), "--plan", str(plan), "-p", "Hello",
                             "-n", "4000", "--ignore-eos", "--temperature", "0.8"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)  # fmt: skip
    seen: dict[int, str] = {}
    try:
        # threads pin themselves once they run: poll until all five are there and pinned, or time is up
        want = ["0", "1", "1", "1", "1"]  # sorted: the main thread on 0, the worker and the I/O threads on 1
        deadline = time.monotonic() + 60
        while sorted(seen.values()) != want and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
            seen = task_cpus(proc.pid)
    finally:
        proc.kill()
        err = proc.communicate()[1]
    assert len(seen) == 5, (seen, err[-500:])  # main + 1 compute worker + 3 I/O threads
    assert seen.pop(proc.pid) == "0"
    assert sorted(seen.values()) == ["1", "1", "1", "1"], seen


@pytest.mark.slow
def test_bench_runs_pi2_with_a_plan(heavy, profile_file, tmp_path):
    from pi2cli.results import store

    plan_path = tmp_path / "plan.json"
    assert (
        invoke(
            "plan", "-m", heavy, "-b", "320M", "-P", profile_file, "--ctx", "256", "-o", plan_path
        ).exit_code
        == 0
    )
    result = CliRunner().invoke(cli, ["bench", "-m", str(heavy), "-e", "pi2", "--plan", str(plan_path), "-w", "code",
                                      "--limit", "1", "-n", "4", "--ctx", "256", "--results-dir", str(tmp_path / "r"),
                                      "--json"])  # fmt: skip
    assert result.exit_code == 0, result.output
    (row,) = json.loads(result.stdout)["runs"]
    run = store.load_run(row["result_file"])
    assert run["status"] == "ok" and run["engine"]["policy"] == "powerinfer2"
    assert run["settings"]["plan"]["file"] == "plan.json" and run["settings"]["plan"]["two_phase"] is False
    assert run["memory"]["budget_bytes"] == 320 * MiB  # the plan's budget became the run's
    assert run["counters"]["memory_budget_bytes"] == 320 * MiB
    bad = CliRunner().invoke(cli, ["bench", "-m", str(heavy), "-e", "llama.cpp", "--plan", str(plan_path)])
    assert bad.exit_code == 1 and "--plan is for the pi2 engine" in bad.output


@pytest.mark.slow
def test_pi2_driver_puts_the_plan_between_policy_and_budget(tmp_path, heavy, monkeypatch):
    from pi2cli.engines.pi2.args import sparse_flags
    from pi2cli.engines.pi2.driver import Pi2Driver
    from pi2cli.targets import get_target

    plan_path = tmp_path / "p.json"
    plan_path.write_text(json.dumps({"format": "pi2-plan", "version": 1, "policy": "cache", "threads": 2}))
    driver = Pi2Driver()
    driver.use_plan(plan_path, load_plan(plan_path))
    driver.configure(get_target("local"), heavy)
    assert driver.policy == "cache"  # the plan's policy is what the result records
    assert sparse_flags(**driver.engine_options(1 << 30)) == ["--policy", "cache", "--plan", str(plan_path.resolve()),
                                           "--memory-budget", str(1 << 30)]  # fmt: skip


@needs_engine
def test_a_plan_key_that_is_not_utf8_is_one_error_line(tmp_path):
    # the engine quotes the unknown key as the file has it; the host reads that line, bytes and all
    bad = tmp_path / "p.json"
    bad.write_bytes(b'{"format": "pi2-plan", "version": 1, "\xf3(": 1}')
    with pytest.raises(Pi2Error, match="unknown key"):
        load_plan(bad)
