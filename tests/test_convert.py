"""`pi2 convert`: bad inputs give one error line and leave no output behind."""

from click.testing import CliRunner

from pi2cli.cli import cli


def run(*args):
    return CliRunner().invoke(cli, ["convert", *map(str, args)])


def test_missing_and_unreadable_sources(tmp_path):
    out = tmp_path / "o.pi2"
    result = run(tmp_path / "nope.gguf", "--out", out)
    assert result.exit_code == 1 and "no such file" in result.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    result = run(junk, "--out", out)
    assert result.exit_code == 1 and "not a readable GGUF" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    result = run(junk, "--out", tmp_path / "o.bin")
    assert result.exit_code == 1 and "must end in .pi2" in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["junk.gguf"]


def test_unsupported_architecture(tmp_path):
    import gguf
    import numpy as np

    src = tmp_path / "m.gguf"
    w = gguf.GGUFWriter(src, "gpt2")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    result = run(src, "--out", tmp_path / "m.pi2")
    assert result.exit_code == 1 and "architecture 'gpt2' is not supported" in result.stderr
    assert not (tmp_path / "m.pi2").exists()
