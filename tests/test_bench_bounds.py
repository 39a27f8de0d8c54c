"""The decode bounds benchmarks/prefill_tbt.py quotes pi2 against (issue 15's 90%): plain arithmetic on
the runs' per-token figures, checked on numbers worked by hand."""

import importlib
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture(scope="module")
def prefill_tbt():
    sys.path.insert(0, str(BENCH))
    try:
        yield importlib.import_module("prefill_tbt")
    finally:
        sys.path.remove(str(BENCH))


def test_the_bounds_overlap_reads_with_compute_and_block_order_only_with_the_ffn(prefill_tbt):
    # in memory: 100 ms a token, 60 of them in the FFN; under the budget two tokens read 0 and 10000
    # bundles at 100k reads/s (0 and 100 ms) and pi2 took 100 + 150 ms
    mem = {"tbt_ms": [100.0] * 5, "token_ffn_ms": [60.0] * 5}
    bud = {"token_reads": [0, 10000], "decode_tps": 2 / 0.25}
    b = prefill_tbt.budget_bound(mem, bud, rate=lambda r: 1e5)
    assert b["compute_ms"] == 100.0
    # perfect overlap: max(100, 0) + max(100, 100) = 200 ms for two tokens
    assert b["bound_tok_s"] == pytest.approx(10.0)
    assert b["share"] == pytest.approx(0.8)
    # reads only during the FFN: (40 + max(60, 0)) + (40 + max(60, 100)) = 240 ms
    assert b["outside_ffn_ms"] == pytest.approx(40.0) and b["ffn_ms"] == pytest.approx(60.0)
    assert b["block_order_bound_tok_s"] == pytest.approx(2 / 0.24)
    assert b["block_order_share"] == pytest.approx(0.24 / 0.25)


def test_runs_without_ffn_times_get_only_the_overlap_bound(prefill_tbt):
    b = prefill_tbt.budget_bound(
        {"tbt_ms": [100.0]}, {"token_reads": [5000], "decode_tps": 5.0}, rate=lambda r: 1e5
    )
    assert b["bound_tok_s"] == pytest.approx(10.0) and "block_order_share" not in b


def test_the_storage_rate_is_the_faster_of_free_running_reads_and_the_tokens_waves(prefill_tbt):
    # 4 blocks of 1000 neurons; waves probed within a block's span of 1000 bundles
    facts = SimpleNamespace(n_ff=1000, n_blocks=4, full_len=7168)
    rand = {"block": 7168, "qd": 512, "iops": 80e3, "mb_per_s": 573.0}
    # as pi2-probe storage --wave N --range SPAN --json prints them (tests/test_probe.py: with the range)
    waves = [
        {"block": 7168, "qd": 512, "wave": w, "range": 1000 * 7168, "iops": i}
        for w, i in ((64, 70e3), (1024, 120e3))
    ]
    rate = prefill_tbt.storage_rate(facts, rand, waves)
    assert rate(4 * 64) == pytest.approx(80e3)  # short waves are slower than free-running reads: those count
    assert rate(4 * 1024) == pytest.approx(120e3)
    assert rate(4 * 4096) == pytest.approx(120e3)  # held flat past the largest wave probed
    assert 80e3 < rate(4 * 512) < 120e3  # log-linear between the waves
