"""Issue 20: the same crafted .pi2 files fed to both readers (pi2cli/models/pi2file.py and pi2-engine), each
refused with one line naming the rule it breaks (docs/FORMAT.md, "Validation rules").

Checksums are fixed after each edit, so every case reaches the check it is about instead of stopping at
a checksum mismatch."""

import struct
import zlib

import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine, run_engine

from pi2cli.cli import cli
from pi2cli.models.pi2file import (
    ENTRY_BYTES,
    HEADER_BYTES,
    SEC_METADATA,
    SEC_RESIDENT,
    SEC_TABLE,
    Pi2File,
    Pi2FormatError,
)
from pi2cli.models.randmodel import write_random_model


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A valid model (the engine loads it) with two tensors it does not bind: one to reshape, and a
    predictor threshold, so the crafted shapes reach the table checks rather than a binding check."""
    path = tmp_path_factory.mktemp("rules") / "base.pi2"
    return write_random_model(path, n_ff=64, n_layer=1,
                              extra_tensors={"extra.weight": np.ones((4, 32)), "blk.0.pred_threshold": [0.5]})  # fmt: skip


def _header_crc(raw: bytearray) -> None:
    struct.pack_into("<I", raw, HEADER_BYTES - 4, zlib.crc32(bytes(raw[: HEADER_BYTES - 4])))


def _section(raw, s):
    return struct.unpack_from("<QQ", raw, 128 + 24 * s)


def with_table(raw: bytearray, table: bytes, n: int) -> bytes:
    """The .pi2 `raw` with its tensor table replaced by `table` (n entries): the tokenizer and metadata
    sections move after it (page-aligned) and every offset, size and checksum is redone."""
    t_off, _ = _section(raw, SEC_TABLE)
    out = bytearray(raw[:t_off]) + table
    out += b"\0" * (-len(out) % 4096)
    tail = []
    for s in (3, 4):  # tokenizer and metadata move after the longer table
        off, size = _section(raw, s)
        tail.append((len(out), size, raw[off : off + size]))
        out += raw[off : off + size] + b"\0" * (-size % 4096)
    struct.pack_into("<QQI", out, 128 + 24 * SEC_TABLE, t_off, len(table), zlib.crc32(table))
    for s, (off, size, data) in zip((3, 4), tail, strict=True):
        struct.pack_into("<QQI", out, 128 + 24 * s, off, size, zlib.crc32(bytes(data)))
    struct.pack_into("<I", out, 112, n)
    struct.pack_into("<Q", out, 120, len(out))
    _header_crc(out)
    return bytes(out)


def _table_crc(raw: bytearray) -> None:
    off, size = _section(raw, SEC_TABLE)
    struct.pack_into("<I", raw, 128 + 24 * SEC_TABLE + 16, zlib.crc32(bytes(raw[off : off + size])))
    _header_crc(raw)


def _entry(raw, name: str) -> int:
    """Offset of the table entry of tensor `name`."""
    off, size = _section(raw, SEC_TABLE)
    for at in range(off, off + size, ENTRY_BYTES):
        if raw[at : at + 64].rstrip(b"\0") == name.encode():
            return at
    raise KeyError(name)


def _set_entry(
    raw, name, *, n_dims=None, ne=None, region=None, offset=None, nbytes=None, type_id=None, new_name=None
):
    at = _entry(raw, name)
    if type_id is not None:
        struct.pack_into("<I", raw, at + 64, type_id)
    if n_dims is not None:
        struct.pack_into("<I", raw, at + 68, n_dims)
    if ne is not None:
        struct.pack_into("<4Q", raw, at + 72, *ne)
    if region is not None:
        struct.pack_into("<I", raw, at + 104, region)
    if offset is not None:
        struct.pack_into("<Q", raw, at + 112, offset)
    if nbytes is not None:
        struct.pack_into("<Q", raw, at + 120, nbytes)
    if new_name is not None:
        raw[at : at + 64] = new_name.encode().ljust(64, b"\0")
    _table_crc(raw)


def _truncated(raw):
    return raw[: len(raw) - 4096]


def _short(raw):
    return raw[:100]


def _magic(raw):
    raw[0:8] = b"GGUF\0\0\0\0"
    return raw


def _header_u32(offset, value):
    """An edit setting the header's u32 at `offset` with the header checksum redone, so only the rule
    on that field can refuse the file."""

    def edit(raw):
        struct.pack_into("<I", raw, offset, value)
        _header_crc(raw)
        return raw

    return edit


def _header_checksum(raw):
    raw[30] ^= 0xFF
    return raw


def _gate_predictor_alone(raw):
    """flags bit3 (the CATS gate predictor) without bit2 (predictors present)."""
    (flags,) = struct.unpack_from("<I", raw, 76)
    struct.pack_into("<I", raw, 76, (flags & ~4) | 8)
    _header_crc(raw)
    return raw


def _section_past_eof(raw):
    off, _ = _section(raw, SEC_METADATA)
    struct.pack_into("<Q", raw, 128 + 24 * SEC_METADATA + 8, len(raw) - off + 4096)
    _header_crc(raw)
    return raw


def _overflowing_shape(raw):
    """1 x 2^32 x 2^32 F32: 2^64 elements, which 64-bit arithmetic makes 0 bytes."""
    _set_entry(raw, "extra.weight", n_dims=3, ne=(1, 1 << 32, 1 << 32, 1), nbytes=0)
    return raw


def _threshold_out_of_bounds(raw):
    """The threshold of issue 20: shape wraps to 0 bytes, data placed at the very end of the region."""
    size = _section(raw, SEC_RESIDENT)[1]
    _set_entry(raw, "blk.0.pred_threshold", n_dims=3, ne=(1, 1 << 32, 1 << 32, 1), nbytes=0,
               offset=size // 4096 * 4096 + (4096 if size % 4096 == 0 else 0))  # fmt: skip
    return raw


def _data_past_eof(raw):
    size = _section(raw, SEC_RESIDENT)[1]
    _set_entry(raw, "extra.weight", offset=(size // 4096 + 16) * 4096)
    return raw


def _duplicate_names(raw):
    _set_entry(raw, "extra.weight", new_name="blk.0.pred_threshold", ne=(1, 1, 1, 1), n_dims=1, nbytes=4)
    return raw


def _bad_region(raw):
    _set_entry(raw, "extra.weight", region=3)
    return raw


def _bad_dims(raw):
    _set_entry(raw, "extra.weight", n_dims=0)
    return raw


def _bad_type(raw):
    _set_entry(raw, "extra.weight", type_id=99)
    return raw


def _size_mismatch(raw):
    _set_entry(raw, "extra.weight", nbytes=1 << 40)
    return raw


def _unaligned(raw):
    _set_entry(raw, "extra.weight", offset=_entry_offset(raw, "extra.weight") + 4)
    return raw


def _entry_offset(raw, name):
    return struct.unpack_from("<Q", raw, _entry(raw, name) + 112)[0]


def _no_name(raw):
    at = _entry(raw, "extra.weight")
    raw[at : at + 64] = b"x" * 64
    _table_crc(raw)
    return raw


# (case, edit, rule, words in the Python reader's line): the engine refuses every one too
CASES = [
    ("short", _short, 1, "truncated"),
    ("truncated", _truncated, 6, "truncated"),
    ("bad magic", _magic, 2, "bad magic"),
    ("bad version", _header_u32(8, 2), 3, "format version 2"),
    ("header checksum", _header_checksum, 4, "header checksum"),
    ("n_embd", _header_u32(28, 65), 8, "n_embd 65"),
    ("gate predictor without predictors", _gate_predictor_alone, 8, "gate predictor"),
    ("n_tensors 0", _header_u32(112, 0), 10, "n_tensors 0"),
    ("section past EOF", _section_past_eof, 11, "beyond the end of the file"),
    ("overflowing shape", _overflowing_shape, 17, "its shape needs"),
    ("threshold out of bounds", _threshold_out_of_bounds, 17, "its shape needs"),
    ("data past EOF", _data_past_eof, 18, "extends past the end"),
    ("duplicate names", _duplicate_names, 19, "appears twice"),
    ("bad region", _bad_region, 16, "region 3"),
    ("bad n_dims", _bad_dims, 15, "0 dims"),
    ("unknown type", _bad_type, 17, "type 99"),
    ("size mismatch", _size_mismatch, 17, "its shape needs"),
    ("unaligned offset", _unaligned, 18, "4 KiB-aligned"),
    ("unterminated name", _no_name, 14, "NUL-terminated"),
]


def _craft(base, tmp_path, edit):
    path = tmp_path / "bad.pi2"
    path.write_bytes(bytes(edit(bytearray(base.read_bytes()))))
    return path


def test_the_base_model_is_valid_for_both(base):
    assert "extra.weight" in Pi2File(base).tensors
    assert run_engine("info", "-m", base).returncode == 0


@pytest.mark.parametrize(("case", "edit", "rule", "words"), CASES, ids=[c[0] for c in CASES])
def test_python_reader_refuses_with_one_line_naming_the_rule(base, tmp_path, case, edit, rule, words):
    path = _craft(base, tmp_path, edit)
    with pytest.raises(Pi2FormatError) as err:
        Pi2File(path)
    message = str(err.value)
    assert "\n" not in message and str(path) in message and words in message, message
    assert f"(.pi2 rule {rule}," in message
    for args in (["models", "show", str(path)], ["plan", "-m", str(path), "-b", "1G"]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 1 and result.exception is None or isinstance(result.exception, SystemExit)
        assert result.stderr.count("\n") == 1 and result.stderr.startswith("pi2: error: "), (
            args,
            result.stderr,
        )
        assert f"rule {rule}" in result.stderr


@needs_engine
@pytest.mark.parametrize(
    ("case", "edit"),
    [(c[0], c[1]) for c in CASES],
    ids=[c[0] for c in CASES],
)  # fmt: skip
def test_the_engine_refuses_the_same_files(base, tmp_path, case, edit):
    path = _craft(base, tmp_path, edit)
    done = run_engine("info", "-m", path, check=False)
    assert done.returncode != 0, f"pi2-engine info accepted the {case} file"
    assert len(done.stderr.strip().splitlines()) == 1 and str(path) in done.stderr, done.stderr


def test_metadata_must_be_a_json_object_for_python(base, tmp_path):
    """Python-only rule 20: the engine passes metadata through unread; the Python reader parses it."""
    raw = bytearray(base.read_bytes())
    off, size = _section(raw, SEC_METADATA)
    raw[off : off + size] = b"\xff" * size
    struct.pack_into("<I", raw, 128 + 24 * SEC_METADATA + 16, zlib.crc32(bytes(raw[off : off + size])))
    _header_crc(raw)
    path = tmp_path / "meta.pi2"
    path.write_bytes(bytes(raw))
    with pytest.raises(Pi2FormatError, match=r"metadata is not UTF-8 JSON .*rule 20"):
        Pi2File(path)


def _many_tensors(base, path, n, duplicate=True):
    """The base model with its table replaced by n small F32 entries (all valid, all at resident offset 0)
    whose last one repeats the first name: only the duplicate check can refuse it."""
    raw = bytearray(base.read_bytes())
    entry = struct.Struct("<64sII4QIIQQ")
    names = [f"t{i}".encode() for i in range(n - 1)] + [b"t0" if duplicate else b"last"]
    table = b"".join(entry.pack(name, 0, 1, 1, 1, 1, 1, SEC_RESIDENT, 0, 0, 4) for name in names)
    path.write_bytes(with_table(raw, table, n))
    return path


def test_a_100k_tensor_file_with_a_late_duplicate_is_refused_fast(base, tmp_path):
    import time

    path = _many_tensors(base, tmp_path / "many.pi2", 100_000)
    start = time.perf_counter()
    with pytest.raises(Pi2FormatError, match=r"'t0' appears twice .*rule 19"):
        Pi2File(path)
    # A name set reads it in ~0.1 s, the old O(n^2) scan in 17 s: 5 s tells them apart on a loaded 2-vCPU
    # machine too (a 1 s bound missed by 0.07 s while other builds ran).
    assert time.perf_counter() - start < 5.0
    # Without the duplicate the same file is valid: the duplicate is what was refused.
    assert len(Pi2File(_many_tensors(base, tmp_path / "ok.pi2", 100_000, duplicate=False)).tensors) == 100_000
