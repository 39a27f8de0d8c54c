"""Issue 34: the Python .pi2 reader checks the tensor table at the engine's speed. A 1M-entry table (the
format's limit) took 7.7 s entry by entry while the engine loads it in 0.43 s; checked with numpy it is
a fraction of a second, and a bad entry anywhere in it is still reported as the engine reports it."""

import numpy as np
import pytest
from test_pi2file_rules import with_table

from pi2cli.models.pi2file import MAX_TENSORS, SEC_RESIDENT, Pi2File, Pi2FormatError
from pi2cli.models.randmodel import write_random_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write_random_model(tmp_path_factory.mktemp("speed") / "base.pi2", n_ff=64, n_layer=1,
                              extra_tensors={"extra.weight": np.ones((4, 32))})  # fmt: skip


def big_table_file(base, path, n, edit=None):
    """The base model with its table replaced by n valid F32 [1] entries at resident offset 0
    (names t0..t{n-1}); edit(table) may break some entries first."""
    raw = bytearray(base.read_bytes())
    dt = np.dtype([("name", "S64"), ("type", "<u4"), ("n_dims", "<u4"), ("ne", "<u8", (4,)), ("region", "<u4"),
                   ("reserved", "<u4"), ("offset", "<u8"), ("nbytes", "<u8")])  # fmt: skip
    table = np.zeros(n, dtype=dt)
    table["name"] = np.char.add(b"t", np.arange(n).astype("S7"))
    table["n_dims"], table["ne"], table["region"], table["nbytes"] = 1, 1, SEC_RESIDENT, 4
    if edit:
        edit(table)
    path.write_bytes(with_table(raw, table.tobytes(), n))
    return path


@pytest.mark.slow
def test_a_1m_entry_table_is_checked_whole_not_entry_by_entry(base, tmp_path, monkeypatch):
    """The linear path is guarded by what it does, not by a clock (speed is a benchmark's business):
    a valid table at the format's limit is checked by numpy with no entry taken one by one."""
    path = big_table_file(base, tmp_path / "1m.pi2", MAX_TENSORS)
    calls = []
    real = Pi2File._check_entry
    monkeypatch.setattr(Pi2File, "_check_entry", lambda self, i, v: calls.append(i) or real(self, i, v))
    f = Pi2File(path, verify=False)
    assert calls == []  # the entry-by-entry loop took 7.7 s for this table; numpy ~0.5 s CPU
    assert len(f.tensors) == MAX_TENSORS and "t999999" in f.tensors and "t1000000" not in f.tensors
    e = f.tensors["t123456"]
    assert (e.type, e.shape, e.region, e.offset, e.nbytes) == ("F32", (1,), SEC_RESIDENT, 0, 4)


N_BAD = 200_000  # enough to be slow entry by entry; the speed test above uses the format's limit
LATE = N_BAD - 10


def _bad_dim(t):
    t["ne"][LATE, 1] = 0


def _bad_region(t):
    t["region"][LATE] = 2


def _unaligned(t):
    t["offset"][LATE] = 8


def _past_the_end(t):
    t["offset"][LATE] = 1 << 40


def _no_nul(t):
    t["name"][LATE] = b"x" * 64


def _huge_shape(t):  # 2^32 x 2^32 x 2^32 rows: exact arithmetic, not a wrapped u64
    t["n_dims"][LATE] = 4
    t["ne"][LATE] = [1, 1 << 32, 1 << 32, 1 << 32]


def _dup_then_bad(t):  # the earlier problem wins, as in the engine: the duplicate at LATE, the bad dim after
    t["name"][LATE] = b"t0"
    t["ne"][LATE + 5, 1] = 0


def _bad_then_dup(t):
    t["ne"][LATE - 5, 1] = 0
    t["name"][LATE] = b"t0"


CASES = {
    "bad dimension": (_bad_dim, f"'t{LATE}' has a bad dimension 1 (0) (.pi2 rule 15"),
    "bad region": (_bad_region, f"'t{LATE}' names region 2"),
    "unaligned": (_unaligned, f"'t{LATE}' offset is not 4 KiB-aligned"),
    "past the end": (_past_the_end, f"'t{LATE}' extends past the end of the resident region"),
    "no NUL": (_no_nul, f"tensor entry {LATE} has no NUL-terminated name"),
    "huge shape": (_huge_shape, f"'t{LATE}' is 4 bytes, its shape needs {4 << 96}"),
    "duplicate first": (_dup_then_bad, "'t0' appears twice"),
    "bad entry first": (_bad_then_dup, f"'t{LATE - 5}' has a bad dimension 1"),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_late_bad_entry_is_reported_as_the_entry_by_entry_check_reports_it(base, tmp_path, case):
    edit, words = CASES[case]
    path = big_table_file(base, tmp_path / "bad.pi2", N_BAD, edit)
    with pytest.raises(Pi2FormatError) as err:
        Pi2File(path, verify=False)
    assert words in str(err.value), str(err.value)


def test_names_with_bytes_after_a_nul_compare_as_the_engine_compares_them(base, tmp_path):
    def inner(t):
        t["name"][7] = b"t3\0garbage"  # the engine's name is "t3": a duplicate of entry 3

    with pytest.raises(Pi2FormatError, match=r"'t3' appears twice"):
        Pi2File(big_table_file(base, tmp_path / "inner.pi2", 1000, inner), verify=False)

    def inner_unique(t):
        t["name"][7] = b"x7\0t3"

    f = Pi2File(big_table_file(base, tmp_path / "ok.pi2", 1000, inner_unique), verify=False)
    assert "x7" in f.tensors and "x7\0t3" not in f.tensors and len(list(f.tensors)) == 1000
