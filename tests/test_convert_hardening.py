"""Issue 20: GGUFs with impossible dimensions or a misaligned tensor give one error line from `pi2 convert`
and no output, and an unsupported architecture is refused before any tensor is read."""

import struct

import pytest
from click.testing import CliRunner

from pi2cli.cli import cli


def _set_scalar(raw: bytearray, key: str, gguf_type: int, fmt: str, value) -> None:
    """Overwrite a scalar metadata value: the key (u64 length + bytes) is followed by its type and value."""
    at = raw.index(key.encode()) + len(key)
    assert struct.unpack_from("<I", raw, at)[0] == gguf_type
    struct.pack_into(fmt, raw, at + 4, value)


def _set_u32(raw: bytearray, key: str, value: int) -> None:
    _set_scalar(raw, key, 4, "<I", value)  # GGUF type 4: u32


def _set_f32(raw: bytearray, key: str, value: float) -> None:
    _set_scalar(raw, key, 6, "<f", value)  # GGUF type 6: f32


def _tensor_info(raw: bytearray, name: str) -> int:
    """Offset of the n_dims field of tensor `name`'s info record."""
    needle = struct.pack("<Q", len(name)) + name.encode()
    return raw.index(needle) + len(needle)


def _zero_dim(raw):
    at = _tensor_info(raw, "output_norm.weight")
    struct.pack_into("<Q", raw, at + 4, 0)


def _misaligned(raw):
    at = _tensor_info(raw, "token_embd.weight")
    (n_dims,) = struct.unpack_from("<I", raw, at)
    off_at = at + 4 + 8 * n_dims + 4
    (offset,) = struct.unpack_from("<Q", raw, off_at)
    struct.pack_into("<Q", raw, off_at, offset + 4)


CASES = {
    "block_count 0": (lambda raw: _set_u32(raw, "llama.block_count", 0), "block_count is 0"),
    "huge block_count": (lambda raw: _set_u32(raw, "llama.block_count", 1 << 30), "n_layer 1073741824 is above 1024"),
    "block_count beyond the tensors": (lambda raw: _set_u32(raw, "llama.block_count", 40), "holds tensors for 2 layer"),
    "embedding_length 0": (lambda raw: _set_u32(raw, "llama.embedding_length", 0), "embedding_length is 0"),
    "head_count 0": (lambda raw: _set_u32(raw, "llama.attention.head_count", 0), "head_count is 0"),
    "feed_forward_length 0": (lambda raw: _set_u32(raw, "llama.feed_forward_length", 0), "feed_forward_length is 0"),
    "zero tensor dimension": (_zero_dim, "zero dimension"),
    "misaligned tensor offset": (_misaligned, "not a multiple of the file's alignment"),
}  # fmt: skip


@pytest.mark.parametrize("case", list(CASES))
def test_bad_ggufs_are_one_line_and_leave_nothing(plain_gguf, tmp_path, case):
    edit, words = CASES[case]
    raw = bytearray(plain_gguf.read_bytes())
    edit(raw)
    src = tmp_path / "bad.gguf"
    src.write_bytes(bytes(raw))
    result = CliRunner().invoke(cli, ["convert", str(src), "--out", str(tmp_path / "o.pi2")])
    assert result.exit_code == 1, (result.output, result.exception)
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("pi2: error: "), result.stderr
    assert words in result.stderr, result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.gguf"]


def test_the_unedited_gguf_converts(plain_gguf, tmp_path):
    result = CliRunner().invoke(cli, ["convert", str(plain_gguf), "--out", str(tmp_path / "o.pi2")])
    assert result.exit_code == 0, result.output


def test_an_unsupported_architecture_is_refused_before_its_tensors_are_read(
    plain_gguf, tmp_path, monkeypatch
):
    import pi2cli.models.convert as convert

    def must_not_open(src):
        raise AssertionError("the tensors were read before the architecture was checked")

    monkeypatch.setattr(convert, "open_gguf", must_not_open)
    raw = bytearray(plain_gguf.read_bytes())
    at = raw.index(b"general.architecture") + len("general.architecture") + 4 + 8
    raw[at : at + 5] = b"gpt2x"  # "llama" -> "gpt2x", same length
    src = tmp_path / "gpt.gguf"
    src.write_bytes(bytes(raw))
    result = CliRunner().invoke(cli, ["convert", str(src), "--out", str(tmp_path / "o.pi2")])
    assert result.exit_code == 1 and "architecture 'gpt2x' is not supported" in result.stderr


def test_the_gguf_twin_is_never_written_through_a_planted_link(plain_gguf, tmp_path):
    """The twin's temp file is created exclusively under a random name: a link planted at the pid-named
    temp pi2 once used is never written through, and a link at the twin itself is refused, not replaced."""
    import os

    victim = tmp_path / "victim"
    victim.write_bytes(b"keep me\n")
    twin = tmp_path / "twin.gguf"
    (tmp_path / f".twin.gguf.partial-{os.getpid()}").symlink_to(victim)  # CliRunner runs in this process
    args = ["convert", str(plain_gguf), "--out", str(tmp_path / "o.pi2"), "--gguf-twin", str(twin)]
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    assert victim.read_bytes() == b"keep me\n" and twin.read_bytes()[:4] == b"GGUF"
    twin.unlink()
    twin.symlink_to(victim)
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 1 and "symbolic link" in result.stderr, result.output
    assert result.stderr.count("\n") == 1 and victim.read_bytes() == b"keep me\n" and twin.is_symlink()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
