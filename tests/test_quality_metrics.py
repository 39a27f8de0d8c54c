"""Quality metrics on known logits (pi2cli/quality/metrics.py), the result schema's quality block,
and `pi2 compare` / `pi2 report` showing it beside the speedups."""

import math

import numpy as np
import pytest
from engine_helpers import needs_engine
from results_fakes import fake_run

from pi2cli.quality import metrics as M
from pi2cli.quality.text import chunks, is_calibration, scored, workload_text
from pi2cli.results import schema as S
from pi2cli.results.compare import compare_runs, render


def test_identical_logits_agree_completely():
    rng = np.random.default_rng(0)
    d = rng.normal(size=(40, 20)).astype(np.float32)
    s = M.summarize(M.score_positions(d, d.copy(), rng.integers(0, 20, 40)))
    assert s["kl_nats"] == 0 and s["top1_agreement"] == 1 and s["ppl_ratio"] == 1
    assert s["ppl_dense"] == s["ppl_sparse"]


def test_hand_computed_two_token_vocabulary():
    # dense p = (1/4, 3/4), sparse q = (3/4, 1/4): KL(p||q) = 1/4 ln(1/3) + 3/4 ln 3 = ln(3)/2
    d = np.log(np.array([[1.0, 3.0]] * 4))
    s = np.log(np.array([[3.0, 1.0]] * 4))
    sc = M.score_positions(d, s, np.array([1, 1, 1, 1]))
    assert np.allclose(sc.kl, math.log(3) / 2)
    assert not sc.top1.any()
    assert np.allclose(sc.nll_dense, -math.log(0.75)) and np.allclose(sc.nll_sparse, -math.log(0.25))
    out = M.summarize(sc)
    assert out["ppl_ratio"] == pytest.approx(3.0) and out["ppl_dense"] == pytest.approx(4 / 3)
    assert out["kl_nats_ci"] is None  # one block: nothing to resample


def test_intervals_cover_the_point_and_shrink_with_more_tokens():
    rng = np.random.default_rng(1)

    def run(n):
        d = rng.normal(size=(n, 30))
        return M.summarize(M.score_positions(d, d + 0.3 * rng.normal(size=d.shape), rng.integers(0, 30, n)))

    small, big = run(64), run(2048)
    for out in (small, big):
        for key in ("kl_nats", "top1_agreement", "ppl_ratio"):
            low, high = out[f"{key}_ci"]
            assert low <= out[key] <= high
    width = lambda o: o["kl_nats_ci"][1] - o["kl_nats_ci"][0]  # noqa: E731
    assert width(big) < width(small) / 2


def test_mismatched_shapes_are_refused():
    with pytest.raises(ValueError):
        M.score_positions(np.zeros((3, 4)), np.zeros((3, 5)), np.zeros(3, dtype=int))


def test_calibration_and_evaluation_text_are_disjoint_and_real():
    from pi2cli.workloads import read_workload

    ids = [r.id for r in read_workload("multi-turn")]
    cal = [i for i in ids if is_calibration(i)]
    assert 0.1 < len(cal) / len(ids) < 0.3
    ev, ca = workload_text("multi-turn", "evaluation"), workload_text("multi-turn", "calibration")
    ev_turns = set(ev.split("\n\n"))
    assert not any(block in ev_turns for block in ca.split("\n\n"))
    assert len(ev) > 50_000 and len(ca) > 10_000


def test_chunks_follow_llama_perplexity():
    from pi2cli.quality.text import Tokenized

    tok = Tokenized(np.arange(100, 110, dtype=np.int32), bos=1)
    c = chunks(tok, 4, 10)
    assert len(c) == 2 and c[0].tolist() == [1, 101, 102, 103] and c[1].tolist() == [1, 105, 106, 107]
    assert scored(4) == (2, 3)  # row 2 predicts the chunk's last token


def _quality(**over):
    q = M.summarize(M.score_positions(np.zeros((40, 3)), np.zeros((40, 3)), np.zeros(40, dtype=int)))
    q.update(reference="dense policy, same file", policy="powerinfer2", memory_budget=None, workload="dialogue",
             text="evaluation part", ctx=64, chunks=1, batch=1, how="fake")  # fmt: skip
    q.update(over)
    return q


def test_schema_validates_and_bounds_the_quality_block():
    run = fake_run("pi2", policy="powerinfer2")
    run["quality"] = _quality(kl_nats=0.02, kl_nats_ci=[0.01, 0.03], ppl_ratio=1.05, ppl_ratio_ci=[1.0, 1.1])
    S.validate(run)
    for bad, words in (
        ({"top1_agreement": 1.5}, "top1_agreement"),
        ({"kl_nats": -0.1}, "kl_nats"),
        ({"kl_nats_ci": [0.3, 0.1]}, "kl_nats_ci"),
        ({"ppl_ratio": float("inf")}, "ppl_ratio"),
        ({"chunks": 0}, "chunks"),
    ):
        run["quality"] = _quality(**bad)
        with pytest.raises(S.ResultSchemaError, match=words):
            S.validate(run)
    run["quality"] = {**_quality(), "surprise": 1}
    with pytest.raises(S.ResultSchemaError, match="unknown field"):
        S.validate(run)


@pytest.mark.slow
def test_compare_and_report_show_quality_beside_speedups(tmp_path):
    from pi2cli.results.report import write_report

    base = fake_run("llama.cpp", tbt_ms=40)
    sparse = fake_run("pi2", policy="powerinfer2", tbt_ms=20, seed=2)
    sparse["quality"] = _quality(kl_nats=0.0123, kl_nats_ci=[0.01, 0.015], top1_agreement=0.97,
                                 ppl_ratio=1.034, ppl_ratio_ci=[1.02, 1.05])  # fmt: skip
    for run in (base, sparse):
        S.validate(run)
    cmp = compare_runs([base, sparse])
    md = render(cmp, "md", wide=True)  # the quality column is one of --wide's (and the report's)
    assert "KL 0.0123 [0.0100, 0.0150]" in md and "ppl x1.034 [1.020, 1.050]" in md and "top-1 97.0%" in md
    csv = render(cmp, "csv").splitlines()
    assert "ppl_ratio_ci_high" in csv[0] and "1.05" in csv[2]
    files = write_report([base, sparse], tmp_path / "rep")
    assert any(p.name == "quality" for p in files.figures)
    assert "KL 0.0123" in files.markdown.read_text() and "Quality beside speed" in files.markdown.read_text()


def test_layer_statistics_on_a_known_activation_pattern():
    from pi2cli.quality.activations import layer_statistics

    active = np.zeros((50, 100), dtype=bool)
    active[:, :20] = True  # 20 always-on neurons, side by side in the file
    active[::2, 50] = True  # one more, every other token
    s = layer_statistics(active, np.random.default_rng(0))
    assert s["sparsity"] == pytest.approx(1 - (20 * 50 + 25) / 5000)
    assert s["top20_share"] == pytest.approx(1000 / 1025)  # the top 20 neurons; neuron 50 is the 21st
    # of the 21 on-neurons, 19 have an always-on right neighbour; neuron 19's and 50's neighbours are off
    assert s["adjacent_coactivation"] == pytest.approx(19 * 50 / (20 * 50 + 25))
    assert s["random_coactivation"] < s["adjacent_coactivation"]


def test_bench_hook_skips_dense_engines_and_never_loses_the_run(tmp_path):
    from pi2cli.quality.bench_hook import attach_quality

    run = fake_run("llama.cpp")
    assert (
        "skipped" in attach_quality(run, tmp_path / "m.gguf", "multi-turn", None, 2) and "quality" not in run
    )
    run = fake_run("pi2", policy="powerinfer2")
    line = attach_quality(run, tmp_path / "missing.pi2", "multi-turn", 128 << 20, 2)
    assert line.startswith("quality: not measured:") and "no such file" in line and "quality" not in run
    S.validate(run)  # the speed run is intact and still saves


@needs_engine
def test_pi2_quality_refuses_bad_input_with_one_line(tmp_path):
    from click.testing import CliRunner

    from pi2cli.cli import cli
    from pi2cli.models.randmodel import write_random_model

    model = write_random_model(tmp_path / "m.pi2")
    for args, words in (
        (["-m", str(tmp_path / "none.pi2")], "no such file"),
        (["-m", str(model), "--policy", "dense"], "measures nothing"),
        (["-m", str(model)], "no tokenizer section"),
    ):
        res = CliRunner().invoke(cli, ["quality", *args])
        assert res.exit_code != 0 and words in res.output, res.output
        assert len(res.output.strip().splitlines()) == 1, res.output
