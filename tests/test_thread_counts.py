"""The engine's output does not depend on how many compute threads run it.

Every matrix row, neuron and output element is computed by one thread in a fixed order, whichever
thread takes it (parmat.c's chunks, the sparse FFN's tickets and down slices), so the logits, and the
text sampled from them, are the same at every thread count: in memory and under a budget that reads
neurons from storage while the threads compute. 3 and 8 threads do not divide the work evenly, and 8
on a small machine are more threads than cores (workers then join jobs late or not at all). Nor does it
depend on how the decode GEMV walks its rows (PI2_X4_STREAMS: runs of rows read side by side).
"""

import json
import os
import subprocess
from pathlib import Path

import pytest
from engine_helpers import engine_bin

from pi2cli.models import synth

THREADS = [1, 2, 3, 4, 8]


@pytest.fixture(scope="module")
def ffn_heavy(tmp_path_factory, smollm2_gguf) -> Path:
    """Four layers whose FFN is most of the file, so a budget below the file size reads neurons."""
    out = tmp_path_factory.mktemp("threads")
    cfg = synth.SynthConfig(tokenizer_gguf=smollm2_gguf, dense_down=False, calib_seqs=6, eval_seqs=2,
                            like="turbosparse-mistral-7b", n_layer=4, hidden=128)  # fmt: skip
    synth.synthesize(cfg, out)
    return out / "model.pi2"


def _run(
    model: Path, tmp: Path, threads: int, *extra: str, env: dict | None = None
) -> tuple[list[dict], str]:
    events = tmp / f"events-{threads}.jsonl"
    cmd = [str(engine_bin()), "generate", "-m", str(model), "-p", "Once upon a time there was", "-n", "24",
           "--ignore-eos", "--events", str(events), "--threads", str(threads), *extra]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=600,
                          env=os.environ | env if env else None)  # fmt: skip
    assert done.returncode == 0, done.stderr
    return [json.loads(line) for line in events.read_text().splitlines()], done.stderr


def _ids(model: Path, tmp: Path, threads: int, *extra: str) -> tuple[list[int], dict]:
    lines, _ = _run(model, tmp, threads, *extra)
    return [e["id"] for e in lines if e["event"] == "token"], lines[-1]


@pytest.mark.slow
@pytest.mark.parametrize("sampling", [("--temperature", "0"), ("--temperature", "0.8", "--seed", "3")])
@pytest.mark.parametrize("where", ["memory", "budget"])
def test_text_is_the_same_at_every_thread_count(ffn_heavy, tmp_path, where, sampling):
    extra = ["--policy", "powerinfer2", *sampling]
    if where == "budget":
        extra += ["--memory-budget", str(ffn_heavy.stat().st_size - 10 * 2**20)]
    runs = {t: _ids(ffn_heavy, tmp_path, t, *extra) for t in THREADS}
    for t, (_, s) in runs.items():
        assert s["threads"] == t
        if where == "budget":  # the neurons came from storage while the threads computed
            assert s["bytes_read_after_load"] > 0, s
        else:
            assert s["bytes_read_after_load"] == 0, s
    texts = {t: ids for t, (ids, _) in runs.items()}
    assert all(ids == texts[1] for ids in texts.values()), texts


@pytest.mark.slow
def test_decode_profile_counts_the_pool_and_the_phases(ffn_heavy, tmp_path):
    _, s = _ids(ffn_heavy, tmp_path, 3, "--policy", "powerinfer2", "--temperature", "0")
    p = s["decode_profile"]
    assert p["tokens"] == 23
    assert p["pool_jobs"] > 0 and p["ffn_ms"] > 0 and p["attention_ms"] > 0 and p["output_ms"] > 0
    assert p["waves"] >= 2  # one a layer at least
    for key in (
        "worker_sleeps",
        "caller_sleeps",
        "skipped_joins",
        "ffn_predict_ms",
        "ffn_wave_ms",
        "io_wait_ms",
    ):
        assert p[key] >= 0
    _, d = _ids(ffn_heavy, tmp_path, 2, "--policy", "dense", "--temperature", "0")
    assert d["decode_profile"]["pool_jobs"] > 0 and "ffn_wave_ms" not in d["decode_profile"]


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["dense", "powerinfer2"])
def test_logits_are_byte_identical_at_every_thread_count(ffn_heavy, tmp_path, policy):
    # eval --all: every position's logits, a batch of 16 (dense FFN GEMM and the attention's parts) and
    # then single tokens (decode's path: the waves and their down pass)
    tokens = "1,400,2213,17,9000,33,881,4242,12,7,3001,95,640,2,77,1500"
    got = {}
    for t in THREADS:
        out = tmp_path / f"logits-{t}.bin"
        for batch in ("16", "1"):
            cmd = [str(engine_bin()), "eval", "-m", str(ffn_heavy), "--tokens", tokens, "--logits-out", str(out),
                   "--all", "--policy", policy, "--threads", str(t), "--batch", batch]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stderr
            got[(t, batch)] = out.read_bytes()
    assert len(set(got.values())) <= 2 and all(got[(t, b)] == got[(1, b)] for t, b in got)


@pytest.mark.slow
def test_one_submitter_issues_decode_reads_and_the_text_stays(ffn_heavy, tmp_path):
    # powerinfer2 under a budget: decode's misses and phase-two reads come from the submitter thread
    # (the paper's I/O core) on the core --io-affinity names, not from the compute threads;
    # --no-io-submitter restores the old way
    budget = ["--memory-budget", str(ffn_heavy.stat().st_size - 10 * 2**20)]
    sample = ["--policy", "powerinfer2", "--temperature", "0.8", "--seed", "4", *budget]
    ids, s = _ids(ffn_heavy, tmp_path, 4, *sample, "--io-affinity", "0")
    assert s["io_submitter"] is True and 0 < s["submitter_reads"] <= s["storage_reads"]
    old, o = _ids(ffn_heavy, tmp_path, 4, *sample, "--io-affinity", "0", "--no-io-submitter")
    assert o["io_submitter"] is False and o["submitter_reads"] == 0
    assert ids == old
    # unnamed, the I/O core is one the compute threads leave free: with every usable core computing,
    # the compute threads issue (a third thread on 2 cores made each token 13% slower)
    cores = len(os.sched_getaffinity(0))
    _, busy = _ids(ffn_heavy, tmp_path, cores, *sample)
    assert busy["io_submitter"] is False and busy["submitter_reads"] == 0
    if cores > 1:
        _, spare = _ids(ffn_heavy, tmp_path, cores - 1, *sample)
        assert spare["io_submitter"] is True and spare["submitter_reads"] > 0
    # held whole in memory, decode never reads: no thread is started
    _, m = _ids(ffn_heavy, tmp_path, 4, "--policy", "powerinfer2", "--temperature", "0")
    assert m["io_submitter"] is False and m["bytes_read_after_load"] == 0


@pytest.mark.slow
def test_text_is_the_same_at_every_gemv_stream_count(ffn_heavy, tmp_path):
    """The output head (49152 rows) is wide enough for every stream count where rows are interleaved by
    four (AVX-512); the start event says what ran, and a value the kernels lack is said and ignored."""
    texts = {}
    for streams in ("1", "2", "4", "8"):
        lines, _ = _run(ffn_heavy, tmp_path, 2, "--temperature", "0", env={"PI2_X4_STREAMS": streams})
        assert lines[0]["event"] == "start" and lines[0]["x4_streams"] == int(streams)
        texts[streams] = [e["id"] for e in lines if e["event"] == "token"]
    assert all(ids == texts["1"] for ids in texts.values()), texts
    lines, err = _run(ffn_heavy, tmp_path, 2, "--temperature", "0", env={"PI2_X4_STREAMS": "3"})
    assert "PI2_X4_STREAMS=3 ignored" in err and lines[0]["x4_streams"] == 1
