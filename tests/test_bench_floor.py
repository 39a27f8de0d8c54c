"""The bandwidth floor: a run whose token times are faster than the device can read the model's weights
is stored as `invalid` with the reason, never `ok`, and farm series never see it."""

import sys
from pathlib import Path

import pytest
from engine_helpers import needs_engine
from results_fakes import fake_run

from pi2cli.bench import floor as F
from pi2cli.bench.run import BenchConfig, run_bench
from pi2cli.farm.history import FINISHED, build_series
from pi2cli.results import schema as S
from pi2cli.results import store
from pi2cli.targets import get_target

sys.path.insert(0, str(Path(__file__).parent))

FLOOR = {"floor_ns": 100_000, "bytes_per_token": 7 << 20, "membw_bytes_per_s": 7.3e10, "threads": 1}


def test_a_run_below_the_floor_is_stored_invalid_with_the_reason(tmp_path):
    bursty = fake_run(tbt_ms=0.01)  # 10 µs a token: what host stamps of a burst look like
    reason = F.apply_floor(bursty, FLOOR)
    assert bursty["status"] == "invalid" and reason and bursty["error"] == reason
    assert "below the bandwidth floor" in reason and "0.100 ms" in reason and "GB/s measured" in reason
    path = store.save_run(bursty, tmp_path)  # the schema takes it
    assert store.load_run(path)["status"] == "invalid" and bursty["counters"]["tbt_floor_ns"] == 100_000
    honest = fake_run(tbt_ms=2.0)
    assert F.apply_floor(honest, FLOOR) is None and honest["status"] == "ok"
    # no floor measured: recorded as such, the run stays as it was
    other = fake_run(tbt_ms=0.01)
    assert F.apply_floor(other, {"unavailable": "no pi2-probe"}) is None and other["status"] == "ok"
    assert other["counters"]["tbt_floor"] == "unavailable: no pi2-probe"


def test_farm_series_use_only_valid_runs():
    runs = []
    for night in ("2026-11-01", "2026-11-02", "2026-11-03"):
        good, bad = fake_run(tbt_ms=2.0, seed=1), fake_run(tbt_ms=0.01, seed=2)
        F.apply_floor(bad, FLOOR)
        for r in (good, bad):
            r["farm"] = {"night": night, "cell": "c"}
            runs.append(r)
    (series,) = build_series(runs)
    assert min(series.medians_ms()) > 1.5  # the 0.01 ms nights never enter
    assert "invalid" in FINISHED  # a resume does not redo it: it would be timed the same way
    from pi2cli.farm.dashboard import _scale

    assert _scale([0.01, 4.0], 10, 100)[1] == 0.0  # a time axis stops at zero (it read -0.303 ms)


@pytest.mark.slow
def test_bytes_per_token_agree_between_the_two_files_of_one_model(tiny_model):
    dense_pi2 = F.bytes_per_token(tiny_model, "dense")
    gguf = F.bytes_per_token(tiny_model.with_suffix(".gguf"), None)
    sparse = F.bytes_per_token(tiny_model, "powerinfer2")
    assert dense_pi2 == gguf  # llama.cpp's GGUF and pi2's dense policy read the same weights
    assert 0 < sparse < dense_pi2  # the sparse policy's floor leaves the FFN out


@pytest.mark.slow
def test_a_moe_token_reads_only_its_experts(synth_model):
    """Experts' own tensors (bundles, predictors, .E suffixes in the .pi2; _exps in the GGUF) count for
    the experts a token is routed to only, in both files alike."""
    model = synth_model("tiny-moe")
    dense = F.bytes_per_token(model, "dense")
    assert dense == F.bytes_per_token(model.with_suffix(".gguf"), None)
    from pi2cli.models.pi2file import Pi2File

    f = Pi2File(model, verify=False)
    assert (f.header.n_expert, f.header.n_expert_used) == (8, 2)
    preds = sum(e.nbytes for n, e in f.tensors.items() if ".pred_" in n and n[-1].isdigit())  # per expert
    shared = sum(e.nbytes for n, e in f.tensors.items() if e.region == 1 and n != "token_embd.weight"
                 and not n[-1].isdigit())  # attention, norms, routers, output: every token reads them  # fmt: skip
    # the sparse floor: those, and a quarter of the predictors (2 of 8 experts), not all of them
    assert F.bytes_per_token(model, "powerinfer2") == shared + preds // 4


@needs_engine
def test_the_floor_is_measured_on_the_target_and_binds_the_bench(tiny_model, tmp_path, monkeypatch):
    target = get_target(None)
    floor = F.tbt_floor(target, tiny_model, "powerinfer2", 1)
    assert floor["floor_ns"] > 0 and floor["membw_bytes_per_s"] > 1e8, floor
    # a device whose memory read 1 kB/s: its floor is far above any real token, so the run is invalid
    monkeypatch.setattr(F, "best_bandwidth", lambda *a: 1e3)
    cfg = BenchConfig(model=str(tiny_model), engines=["pi2"], workloads=["code"], limit=1, n_gen=4, threads=1,
                      results_dir=str(tmp_path / "results"))  # fmt: skip
    (outcome,) = run_bench(cfg)
    assert outcome.run["status"] == "invalid" and "bandwidth floor" in outcome.run["error"]
    assert S.summarize(outcome.run)["status"] == "invalid"
