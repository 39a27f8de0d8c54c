"""The .pi2 format: the Python writer/reader round trip, and the engine's loader refusing every kind
of damaged file with one line that names the file and the problem (never a crash)."""

import json
import struct
import zlib

import numpy as np
import pytest
from engine_helpers import run_engine

from pi2cli.models.pi2file import (
    HEADER_BYTES,
    SEC_NEURONS,
    SEC_RESIDENT,
    SEC_TABLE,
    Pi2File,
    Pi2FormatError,
    Pi2Header,
    Pi2Writer,
)
from pi2cli.models.randmodel import write_random_model


@pytest.fixture
def model(tmp_path):
    return write_random_model(tmp_path / "m.pi2", wtype="Q4_0", n_ff=96)


def test_roundtrip_bundles_order_and_geometry(tmp_path):
    rng = np.random.default_rng(1)
    h = Pi2Header(arch="llama", ffn_act="relu", n_vocab=32, n_embd=64, n_layer=1, n_head=2, n_head_kv=1,
                  n_ff=40, neuron_type="F32")  # fmt: skip
    gate, up, down = (
        rng.standard_normal((40, 64)),
        rng.standard_normal((40, 64)),
        rng.standard_normal((64, 40)),
    )
    order = rng.permutation(40)
    with Pi2Writer(tmp_path / "a.pi2", h, metadata={"synthetic": True}) as w:
        w.add_ffn(0, gate, up, down, order=order)
        w.add_tensor("token_embd.weight", rng.standard_normal((32, 64)), "F32")
    f = Pi2File(tmp_path / "a.pi2")
    ffn = f.ffn(0)
    np.testing.assert_array_equal(ffn["order"], order)
    np.testing.assert_allclose(ffn["gate"], gate[order].astype(np.float32))
    np.testing.assert_allclose(ffn["up"], up[order].astype(np.float32))
    np.testing.assert_allclose(ffn["down_cols"], down.T[order].astype(np.float32))
    np.testing.assert_allclose(f.tensor("blk.0.ffn_down.weight"), down.astype(np.float32))
    assert f.metadata == {"synthetic": True}
    # Every bundle starts on the bundle alignment; the region and every tensor on 4 KiB.
    assert f.header.bundle_stride % f.header.bundle_align == 0
    assert f.sections[SEC_NEURONS][0] == HEADER_BYTES
    assert all(e.offset % 4096 == 0 for e in f.tensors.values())
    assert (tmp_path / "a.pi2").stat().st_size % 4096 == 0


def test_writer_rejects_misuse_and_leaves_nothing(tmp_path):
    h = Pi2Header(arch="llama", ffn_act="swiglu", n_vocab=32, n_embd=64, n_layer=2, n_head=2, n_head_kv=1,
                  n_ff=32, neuron_type="Q8_0")  # fmt: skip
    z = np.zeros((32, 64))
    with pytest.raises(Pi2FormatError, match="order"), Pi2Writer(tmp_path / "b.pi2", h) as w:
        w.add_ffn(1, z, z, z.T)
    with pytest.raises(Pi2FormatError, match="permutation"), Pi2Writer(tmp_path / "b.pi2", h) as w:
        w.add_ffn(0, z, z, z.T, order=np.zeros(32))
    w = Pi2Writer(tmp_path / "b.pi2", h)
    assert not w.closed
    with pytest.raises(Pi2FormatError, match="only 0 of 2"):
        w.close()
    assert w.closed  # the failed close aborted the file
    with pytest.raises(AttributeError):
        w.closed = False  # read-only
    assert list(tmp_path.iterdir()) == []


def test_closed_after_a_complete_file(tmp_path):
    h = Pi2Header(arch="llama", ffn_act="relu", n_vocab=32, n_embd=32, n_layer=1, n_head=1, n_head_kv=1,
                  n_ff=32, neuron_type="F16")  # fmt: skip
    w = Pi2Writer(tmp_path / "c.pi2", h)
    w.add_ffn(0, np.zeros((32, 32)), np.zeros((32, 32)), np.zeros((32, 32)))
    assert not w.closed
    w.close()
    assert w.closed and (tmp_path / "c.pi2").is_file()
    with pytest.raises(Pi2FormatError, match="closed"):
        w.add_tensor("x", np.zeros(32), "F32")


def test_engine_info_reads_the_header(model):
    info = json.loads(run_engine("info", "-m", model, "--json", "--verify").stdout)
    assert info["arch"] == "llama" and info["n_ff"] == 96 and info["neuron_type"] == "Q4_0"
    assert info["metadata"]["synthetic"] is True and info["neurons_verified"] is True


def _damage(path, offset, data):
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def _fix_header_crc(path):
    raw = bytearray(path.read_bytes())
    struct.pack_into("<I", raw, HEADER_BYTES - 4, zlib.crc32(bytes(raw[: HEADER_BYTES - 4])))
    path.write_bytes(bytes(raw))


def _expect_refused(model, words, command="info"):
    done = run_engine(command, "-m", model, *(["-p", "x"] if command == "generate" else []), check=False)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert str(model) in lines[0] and words in lines[0], lines[0]
    assert done.stdout == ""


def test_truncated_file(model):
    data = model.read_bytes()
    model.write_bytes(data[: len(data) - 4096])
    _expect_refused(model, "truncated")
    model.write_bytes(data[:100])
    _expect_refused(model, "truncated")


def test_wrong_magic_and_version(model):
    data = model.read_bytes()
    _damage(model, 0, b"GGUF")
    _expect_refused(model, "bad magic")
    model.write_bytes(data)
    _damage(model, 8, struct.pack("<I", 2))
    _expect_refused(model, "format version 2")


def test_corrupted_header_field(model):
    _damage(model, 28, struct.pack("<I", 65))  # n_embd
    _expect_refused(model, "header checksum")
    _fix_header_crc(model)
    _expect_refused(model, "n_embd 65")


def test_corrupted_regions(model, tmp_path):
    f = Pi2File(model)
    res_off, neu_off = f.sections[SEC_RESIDENT][0], f.sections[SEC_NEURONS][0]
    data = model.read_bytes()
    _damage(model, res_off + 10, b"\xff\xfe")
    _expect_refused(model, "resident region checksum", command="generate")
    model.write_bytes(data)
    _damage(model, neu_off + 100, b"\xff\xfe")
    _expect_refused(model, "neuron region checksum", command="generate")
    assert run_engine("info", "-m", model).returncode == 0  # info alone skips the neuron region


def test_bad_table_entry_even_with_valid_checksums(model):
    f = Pi2File(model)
    table_off, table_len, _ = f.sections[SEC_TABLE]
    raw = bytearray(model.read_bytes())
    struct.pack_into("<Q", raw, table_off + 120, 1 << 40)  # first tensor's nbytes
    crc = zlib.crc32(bytes(raw[table_off : table_off + table_len]))
    struct.pack_into("<I", raw, 128 + 24 * SEC_TABLE + 16, crc)
    model.write_bytes(bytes(raw))
    _fix_header_crc(model)
    _expect_refused(model, "bytes, its shape needs")


def test_missing_file_and_bad_options(tmp_path):
    _expect_refused(tmp_path / "nope.pi2", "cannot open")
    done = run_engine("generate", "-m", tmp_path / "nope.pi2", "--threads", "zero", check=False)
    assert done.returncode == 2 and "--threads" in done.stderr


def test_random_header_damage_never_crashes(model):
    """Flip random header bytes (with a valid header CRC, so field checks run): the loader either
    accepts a harmless change or refuses with one line; never a signal."""
    rng = np.random.default_rng(7)
    data = model.read_bytes()
    refused = 0
    for _ in range(40):
        model.write_bytes(data)
        offset = int(rng.integers(8, 248))
        _damage(model, offset, bytes([int(rng.integers(0, 256))]))
        _fix_header_crc(model)
        done = run_engine("info", "-m", model, check=False)
        assert done.returncode in (0, 1), (offset, done.returncode, done.stderr)
        if done.returncode:
            refused += 1
            assert len(done.stderr.strip().splitlines()) == 1 and str(model) in done.stderr
    assert refused >= 30  # nearly every header byte matters
