"""The native tokenizers against llama.cpp's: SmolLM2's byte-level BPE (the real GGUF) and a
SentencePiece BPE model trained here (no Llama vocabulary is available offline), both through the
vocab blob the .pi2 file stores and the pi2-tokenize tool."""

import json
import random
import re
import subprocess
from pathlib import Path

import gguf
import pytest
from engine_helpers import built

from pi2cli.errors import Pi2Error
from pi2cli.models.tokenizer_blob import (
    SUPPORTED_BPE_PRE,
    vocab_blob_from_fields,
    vocab_blob_from_gguf,
    vocab_blob_from_hf_dir,
)

TEXTS = [
    "Hello world",
    "Hello, world! How are you today?",
    " leading space",
    "trailing space ",
    "multiple   spaces    between words",
    "line one\nline two\n\nline four\n",
    "\n\n\n",
    "   ",
    "def f(x):\n    return x * 2\n\n\tif x:\n\t\tpass\n",
    "for (int i = 0; i < n; i++) { sum += a[i]; }",
    "12345",
    "3.14159 and 2,718 and 1e-10 and 007",
    "Version 2024-11-21: 100% of 1,000,000 users",
    "don't won't I'm you're we've they'll she'd IT'S DON'T",
    "naïve café résumé Übermaß",
    "東京は日本の首都です。",
    "Привет, мир! Γειά σου κόσμε",
    "emoji 🙂🎉👍🏽 and flags 🇫🇷",
    "mixed\ttabs\tand  spaces \t\n end",
    "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>",
    "text with <|endoftext|> in the middle",
    "almost special <|im_start| and <im_end>",
    "https://example.com/path?query=1&x=y#frag",
    "email@example.org, @mention #hashtag $100 ^caret ~tilde |pipe",
    "   indented\n        deeper\n",
    "ALLCAPS lowercase MiXeD CamelCaseWord snake_case_name",
    "a",
    "٣٤٥ Arabic-Indic digits and ½ ⅓ fractions",
    "quotes \"double\" 'single' `back` «guillemets» „low“",
    "zero\u200bwidth\u00a0nbsp\u3000ideographic space",
    "e\u0301 combining accents a\u0308",
    "windows\r\nline endings\r\n\r\n",
    "1234567890 and 12 and 1234",
    "a  \n  b \t\n\n c",
    "€100 … ‘quoted’ — dash",
    "I'M SHE'LL WE'D You'Re",
]


_POOL = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789" * 3)
    + [" "] * 20
    + list("\n\n\r\t'''\".,;:!?-_()[]{}<>/\\|@#$%^&*+=~`")
    + list("éèüßñçøÅ東京日本語中文한국어ПриветΓειά")
    + [
        "\u0301",
        "\u0308",
        "\u00a0",
        "\u3000",
        "\u2028",
        "\u0085",
        "🙂",
        "🎉",
        "👍🏽",
        "½",
        "²",
        "٣",
        "…",
        "—",
    ]
    + [
        "€",
        "«",
        "»",
        "\u200b",
        "\ufeff",
        "'s",
        "'t",
        "'re",
        "'ve",
        "'m",
        "'ll",
        "'d",
        "'S",
        "'LL",
        "  ",
        "   \n",
        "\r\n",
    ]
)


def random_texts(seed: int, n: int = 300) -> list[str]:
    """Seeded random mixes of what pre-tokenizers treat differently: letters, digits, punctuation,
    every kind of whitespace, contractions, marks, CJK, emoji."""
    rng = random.Random(seed)
    return ["".join(rng.choice(_POOL) for _ in range(rng.randint(1, 40))) for _ in range(n)]


def big_text() -> bytes:
    """~300 KB of real text that every Python ships: code, docs, indentation, odd characters."""
    mods = ("argparse", "difflib", "email.message", "html.parser", "json.decoder", "textwrap", "unicodedata")
    parts = []
    for name in mods:
        mod = __import__(name, fromlist=["_"])
        path = getattr(mod, "__file__", None)
        if path and path.endswith(".py"):
            parts.append(Path(path).read_bytes())
        parts.append((mod.__doc__ or "").encode())
    return b"\n".join(parts) + "".join(TEXTS).encode()


def tool(name: str) -> Path:
    return built(name)


def pi2_tokenize(blob_path: Path, data: bytes, *args: str) -> list[int]:
    done = subprocess.run(
        [tool("pi2-tokenize"), "--vocab", blob_path, *args], input=data, capture_output=True, check=True
    )
    return [int(x) for x in done.stdout.split()]


def pi2_decode(blob_path: Path, ids: list[int]) -> bytes:
    done = subprocess.run(
        [tool("pi2-tokenize"), "--vocab", blob_path, "--decode"],
        input=" ".join(map(str, ids)).encode(),
        capture_output=True,
        check=True,
    )
    return done.stdout


def llama_tokenize(bindir: Path, gguf_path: Path, data: bytes, tmp_path: Path, *args: str) -> list[int]:
    prompt = tmp_path / "prompt.txt"
    prompt.write_bytes(data)
    done = subprocess.run(
        [
            bindir / "llama-tokenize",
            "-m",
            gguf_path,
            "-f",
            prompt,
            "--no-escape",
            "--ids",
            "--log-disable",
            *args,
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, f"llama-tokenize failed: {done.stderr[-500:]}"
    lists = re.findall(r"^\[[0-9, ]*\]$", done.stdout, flags=re.M)
    assert lists, f"no id list in llama-tokenize output: {done.stdout[-300:]!r}"
    return [int(x) for x in lists[-1].strip("[]").split(",") if x.strip()]


# ---------- byte-level BPE: SmolLM2 ----------


@pytest.fixture(scope="module")
def smollm2_reader(smollm2_gguf):
    return gguf.GGUFReader(smollm2_gguf)


@pytest.fixture(scope="module")
def smollm2_blob(smollm2_reader, tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("vocab") / "smollm2.vocab"
    path.write_bytes(vocab_blob_from_gguf(smollm2_reader))
    return path


def write_vocab_gguf(
    path: Path,
    *,
    model: str,
    tokens,
    types,
    scores=None,
    merges=None,
    pre=None,
    ids=(1, 2, 0),
    add_bos=None,
    add_space_prefix=None,
):
    """A vocabulary-only GGUF that llama-tokenize loads (it reads a few hyperparameters even then)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_context_length(512)
    writer.add_embedding_length(64)
    writer.add_block_count(1)
    writer.add_feed_forward_length(128)
    writer.add_head_count(4)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_tokenizer_model(model)
    if pre is not None:
        writer.add_tokenizer_pre(pre)
    writer.add_token_list(tokens)
    if scores is not None:
        writer.add_token_scores(scores)
    writer.add_token_types(types)
    if merges is not None:
        writer.add_token_merges(merges)
    writer.add_bos_token_id(ids[0])
    writer.add_eos_token_id(ids[1])
    if ids[2] is not None:
        writer.add_unk_token_id(ids[2])
    if add_bos is not None:
        writer.add_add_bos_token(add_bos)
    if add_space_prefix is not None:
        writer.add_add_space_prefix(add_space_prefix)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def _split_at(ids: list[int], sep: int) -> list[list[int]]:
    parts = [[]]
    for i in ids:
        if i == sep:
            parts.append([])
        else:
            parts[-1].append(i)
    return parts


def _assert_same_ids(ours: list[int], ref: list[int], sep: int, label) -> None:
    """pi2's ids equal llama.cpp's; on a difference, name each differing part between `sep` tokens
    (label(i) says which text part i was) rather than dumping two long lists."""
    bad = [
        (i, o, r)
        for i, (o, r) in enumerate(zip(_split_at(ours, sep), _split_at(ref, sep), strict=False))
        if o != r
    ]
    assert not bad, "\n".join(f"{label(i)}:\n  pi2   {o}\n  llama {r}" for i, o, r in bad)
    assert ours == ref


@pytest.mark.slow
def test_smollm2_matches_llamacpp(smollm2_blob, smollm2_gguf, llamacpp_bindir, tmp_path):
    texts = [t.encode() for t in TEXTS + random_texts(1)] + [b"bad utf-8 \xff\xfe and a cut \xe6\x9d"]
    # One llama-tokenize run for all strings (loading the vocabulary dominates): joined by the
    # control token <|endoftext|> (id 0), which both tokenizers split on before anything else, so
    # each string is tokenized on its own exactly as if it came alone.
    joined = b"<|endoftext|>".join(texts)
    ours = pi2_tokenize(smollm2_blob, joined)
    ref = llama_tokenize(llamacpp_bindir, smollm2_gguf, joined, tmp_path)
    assert len(_split_at(ref, 0)) >= len(texts)
    _assert_same_ids(ours, ref, 0, lambda i: f"part {i}")
    # a long text in one piece (no special-token parsing: the sources contain "<|...|>"-free text anyway)
    data = big_text()
    ours = pi2_tokenize(smollm2_blob, data, "--no-special")
    assert len(ours) > 50_000
    assert ours == llama_tokenize(llamacpp_bindir, smollm2_gguf, data, tmp_path, "--no-parse-special")
    # and a few alone, with nothing before them
    for data in texts[:3] + texts[8:10]:
        assert pi2_tokenize(smollm2_blob, data) == llama_tokenize(
            llamacpp_bindir, smollm2_gguf, data, tmp_path
        )


@pytest.mark.slow
def test_smollm2_plain_special_text_matches_llamacpp(smollm2_blob, smollm2_gguf, llamacpp_bindir, tmp_path):
    data = TEXTS[19].encode()
    ours = pi2_tokenize(smollm2_blob, data, "--no-special")
    assert ours == llama_tokenize(llamacpp_bindir, smollm2_gguf, data, tmp_path, "--no-parse-special")
    assert 1 not in ours and 2 not in ours  # <|im_start|> / <|im_end|> stay text


@pytest.mark.slow
def test_smollm2_special_tokens_and_roundtrip(smollm2_blob):
    ids = pi2_tokenize(smollm2_blob, b"<|im_start|>user\nhi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2  # the control tokens themselves
    # every text, and all of them at once (with the control-token texts kept as text)
    for data in [t.encode() for t in TEXTS[:8]] + [b"\n--\n".join(t.encode() for t in TEXTS), big_text()]:
        assert pi2_decode(smollm2_blob, pi2_tokenize(smollm2_blob, data, "--no-special")) == data
    # control tokens decode to nothing
    assert pi2_decode(smollm2_blob, [1, 2, 0]) == b""


@pytest.mark.slow
@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama3", "qwen2", "dbrx"])
def test_other_pre_tokenizers_match_llamacpp(pre, smollm2_reader, llamacpp_bindir, tmp_path):
    """SmolLM2's vocabulary and merges under the other pre-tokenizers pi2 implements: each one splits
    digits, contractions, punctuation and whitespace differently, so a wrong rule shows up here."""
    fields = smollm2_reader.fields
    tokens = [bytes(fields["tokenizer.ggml.tokens"].parts[i]) for i in fields["tokenizer.ggml.tokens"].data]
    merges = [bytes(fields["tokenizer.ggml.merges"].parts[i]) for i in fields["tokenizer.ggml.merges"].data]
    types = [
        int(fields["tokenizer.ggml.token_type"].parts[i][0]) for i in fields["tokenizer.ggml.token_type"].data
    ]
    gguf_path = tmp_path / f"{pre}.gguf"
    # add_bos left unsaid: llama3 turns it on by default, the others off (BOS = 1 here)
    write_vocab_gguf(
        gguf_path,
        model="gpt2",
        tokens=[t.decode() for t in tokens],
        types=types,
        merges=[m.decode() for m in merges],
        pre=pre,
        ids=(1, 2, None),
    )
    blob = tmp_path / f"{pre}.vocab"
    blob.write_bytes(
        vocab_blob_from_fields(
            model="gpt2", tokens=tokens, token_types=types, merges=merges, pre=pre, bos_id=1, eos_id=2
        )
    )
    texts = [t.encode() for t in TEXTS + random_texts(2)]
    joined = b"<|endoftext|>".join(texts)
    ours = pi2_tokenize(blob, joined)
    ref = llama_tokenize(llamacpp_bindir, gguf_path, joined, tmp_path)
    assert (ref[0] == 1) == (pre == "llama3")
    _assert_same_ids(ours, ref, 0, lambda i: repr(texts[i]))


# ---------- SentencePiece BPE: a model trained here ----------


def _spm_corpus() -> str:
    """Varied text that ships with Python itself, plus lines that teach multi-byte characters."""
    import email

    parts = [json.__doc__ or "", email.__doc__ or ""]
    for mod in ("argparse", "subprocess", "collections", "pathlib", "textwrap", "unittest"):
        parts.append(Path(__import__(mod).__file__).read_text(encoding="utf-8"))
    parts += ["naïve café résumé déjà vu", "東京 大阪 京都", "Привет мир"] * 5
    return "\n".join(parts)


def _sp_vocab(sp) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and GGUF token types of a SentencePiece model, as llama.cpp's converter makes them."""
    tokens, scores, types = [], [], []
    for i in range(sp.get_piece_size()):
        tokens.append(sp.id_to_piece(i))
        scores.append(sp.get_score(i))
        if sp.is_unknown(i):
            types.append(2)
        elif sp.is_control(i):
            types.append(3)
        elif sp.is_byte(i):
            types.append(6)
        elif sp.is_unused(i):
            types.append(5)
        else:
            types.append(1)
    return tokens, scores, types


@pytest.fixture(scope="module")
def spm_model(tmp_path_factory):
    spm = pytest.importorskip("sentencepiece")
    root = tmp_path_factory.mktemp("spm")
    corpus = root / "corpus.txt"
    corpus.write_text(_spm_corpus(), encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus),
        model_prefix=str(root / "m"),
        model_type="bpe",
        vocab_size=1200,
        byte_fallback=True,
        split_digits=True,
        normalization_rule_name="identity",
        remove_extra_whitespaces=False,
        character_coverage=0.9995,
        num_threads=1,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(root / "m.model"))
    tokens, scores, types = _sp_vocab(sp)
    gguf_path = root / "spm-vocab.gguf"
    write_vocab_gguf(
        gguf_path,
        model="llama",
        tokens=tokens,
        types=types,
        scores=scores,
        ids=(sp.bos_id(), sp.eos_id(), sp.unk_id()),
        add_bos=True,
    )
    blob = root / "spm.vocab"
    blob.write_bytes(vocab_blob_from_gguf(gguf.GGUFReader(gguf_path)))
    return sp, gguf_path, blob


@pytest.mark.slow
@pytest.mark.parametrize("space_prefix", [True, False])
def test_spm_matches_llamacpp(spm_model, space_prefix, llamacpp_bindir, tmp_path):
    sp, gguf_path, blob = spm_model
    if not space_prefix:
        tokens, scores, types = _sp_vocab(sp)
        gguf_path = tmp_path / "no-prefix.gguf"
        write_vocab_gguf(
            gguf_path, model="llama", tokens=tokens, types=types, scores=scores, add_space_prefix=False
        )
        blob = tmp_path / "no-prefix.vocab"
        blob.write_bytes(vocab_blob_from_gguf(gguf.GGUFReader(gguf_path)))
    # joined by the control token </s> (id 2): both tokenizers split there first and treat the text
    # after a control token like the start of the text (space prefix and all)
    texts = [t.encode() for t in TEXTS + random_texts(3)]
    joined = b"</s>".join(texts)
    for args in ((), ("--no-bos",)):
        ours = pi2_tokenize(blob, joined, *args)
        ref = llama_tokenize(llamacpp_bindir, gguf_path, joined, tmp_path, *args)
        _assert_same_ids(ours, ref, 2, lambda i, args=args: f"part {i} {args}")
    for data in texts[:3]:
        assert pi2_tokenize(blob, data) == llama_tokenize(llamacpp_bindir, gguf_path, data, tmp_path)
    data = big_text()
    assert pi2_tokenize(blob, data) == llama_tokenize(llamacpp_bindir, gguf_path, data, tmp_path)


def test_spm_matches_sentencepiece(spm_model):
    sp, _, blob = spm_model
    for text in TEXTS + random_texts(4, 40):
        if "<" in text:  # sentencepiece itself has no notion of parsing control-token texts
            continue
        ours = pi2_tokenize(blob, text.encode(), "--no-bos")
        assert ours == sp.encode(text), text
        assert ours[0] != sp.bos_id()
        assert pi2_tokenize(blob, text.encode())[0] == sp.bos_id()


def test_spm_roundtrip_and_byte_fallback(spm_model):
    sp, _, blob = spm_model
    for data in [t.encode() for t in TEXTS[:8]] + [b"\n--\n".join(t.encode() for t in TEXTS), big_text()]:
        ids = pi2_tokenize(blob, data, "--no-bos", "--no-special")
        # SPM decoding keeps the leading space the tokenizer added
        assert pi2_decode(blob, ids) == b" " + data
    # characters the tiny vocabulary lacks come out as <0xNN> byte tokens
    ids = pi2_tokenize(blob, "🙂".encode(), "--no-bos")
    assert [sp.id_to_piece(i) for i in ids[-4:]] == ["<0xF0>", "<0x9F>", "<0x99>", "<0x82>"]


# ---------- the blob writer and the tool's errors ----------


def test_blob_writer_rejects_unsupported_vocabularies():
    with pytest.raises(Pi2Error, match="not supported"):
        vocab_blob_from_fields(model="bert", tokens=["a"])
    with pytest.raises(Pi2Error, match="pre-tokenizer"):
        vocab_blob_from_fields(model="gpt2", tokens=["a", "b"], merges=["a b"], pre="no-such-pre")
    with pytest.raises(Pi2Error, match="merges"):
        vocab_blob_from_fields(model="gpt2", tokens=["a"], pre="gpt-2")
    with pytest.raises(Pi2Error, match="no tokens"):
        vocab_blob_from_fields(model="llama", tokens=[])


def test_blob_writer_needs_a_tokenizer(tmp_path):
    path = tmp_path / "novocab.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(Pi2Error, match="no tokenizer"):
        vocab_blob_from_gguf(gguf.GGUFReader(path))


def test_blob_defaults_follow_llamacpp():
    blob = vocab_blob_from_fields(model="llama", tokens=["<unk>", "<s>", "</s>", "a"])
    # SPM: bos 1, eos 2, unk 0, add_bos and add_space_prefix on
    assert blob[8:48] == (
        b"\x01\0\0\0"
        + b"\x01\0\0\0"
        + b"\x03\0\0\0"
        + b"\x04\0\0\0"
        + b"\0\0\0\0"
        + b"\x01\0\0\0"
        + b"\x02\0\0\0"
        + b"\0\0\0\0"
        + b"\xff\xff\xff\xff"
        + b"\0\0\0\0"
    )


@pytest.mark.slow
def test_pi2_tokenize_rejects_a_bad_blob(tmp_path, smollm2_blob):
    good = smollm2_blob.read_bytes()
    for name, data in (("truncated", good[:1000]), ("magic", b"XX" + good[2:]), ("empty", b"")):
        path = tmp_path / f"{name}.vocab"
        path.write_bytes(data)
        done = subprocess.run(
            [tool("pi2-tokenize"), "--vocab", path], input="hi", capture_output=True, text=True
        )
        assert done.returncode == 1, name
        assert done.stdout == ""
        assert len(done.stderr.strip().splitlines()) == 1 and "error" in done.stderr


def test_every_supported_pre_tokenizer_is_native(tmp_path):
    """The Python writer's list of pre-tokenizer names and the native one stay in sync."""
    for pre in sorted(SUPPORTED_BPE_PRE):
        blob = tmp_path / "tiny.vocab"
        blob.write_bytes(
            vocab_blob_from_fields(model="gpt2", tokens=["a", "b", "ab", "Ġ"], merges=["a b"], pre=pre)
        )
        assert pi2_tokenize(blob, b"ab", "--no-bos") == [2], pre


# ---------- Hugging Face model directories ----------


def test_hf_dir_sentencepiece_matches_the_gguf_path(spm_model, tmp_path):
    """tokenizer.model read by pi2's own protobuf reader gives the same blob as the GGUF route."""
    sp, _, blob = spm_model
    model_dir = tmp_path / "hf"
    model_dir.mkdir()
    (model_dir / "tokenizer.model").write_bytes((blob.parent / "m.model").read_bytes())
    assert vocab_blob_from_hf_dir(model_dir) == blob.read_bytes()
    # an added special token past the SentencePiece pieces, as chat models ship them
    n = sp.get_piece_size()
    (model_dir / "config.json").write_text(json.dumps({"vocab_size": n + 2}))
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({"added_tokens_decoder": {str(n): {"content": "<|im_start|>", "special": True}}})
    )
    hf_blob = tmp_path / "hf.vocab"
    hf_blob.write_bytes(vocab_blob_from_hf_dir(model_dir))
    ids = pi2_tokenize(hf_blob, b"<|im_start|>hello", "--no-bos")
    assert ids == [n, *sp.encode("hello")]  # the text after a special token gets the space prefix
    assert pi2_decode(hf_blob, [n + 1]) == b""  # the [PAD] filler is unused: decodes to nothing


def test_hf_dir_rejects_unigram_and_unknown_layouts(tmp_path):
    with pytest.raises(Pi2Error, match="neither"):
        vocab_blob_from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text(json.dumps({"model": {"type": "Unigram"}}))
    with pytest.raises(Pi2Error, match="byte-level BPE"):
        vocab_blob_from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text(
        json.dumps(
            {
                "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                "pre_tokenizer": {"type": "Whitespace"},
            }
        )
    )
    with pytest.raises(Pi2Error, match="pre-tokenizer"):
        vocab_blob_from_hf_dir(tmp_path)
    (tmp_path / "tokenizer.model").write_bytes(b"\x0a\x03\x0a\x01a\x12\x02\x18\x01")  # one piece, unigram
    with pytest.raises(Pi2Error, match="unigram"):
        vocab_blob_from_hf_dir(tmp_path)


@pytest.fixture(scope="module")
def smollm2_hf_dir(smollm2_reader, tmp_path_factory) -> Path:
    """SmolLM2's vocabulary as a Hugging Face tokenizer.json, built with the tokenizers library."""
    tk = pytest.importorskip("tokenizers")
    fields = smollm2_reader.fields
    tokens = [
        bytes(fields["tokenizer.ggml.tokens"].parts[i]).decode() for i in fields["tokenizer.ggml.tokens"].data
    ]
    merges = [
        bytes(fields["tokenizer.ggml.merges"].parts[i]).decode() for i in fields["tokenizer.ggml.merges"].data
    ]
    tokenizer = tk.Tokenizer(
        tk.models.BPE(
            vocab={t: i for i, t in enumerate(tokens)}, merges=[tuple(m.split(" ", 1)) for m in merges]
        )
    )
    tokenizer.pre_tokenizer = tk.pre_tokenizers.Sequence(
        [
            tk.pre_tokenizers.Digits(individual_digits=True),
            tk.pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tokenizer.decoder = tk.decoders.ByteLevel()
    tokenizer.add_special_tokens([tk.AddedToken(t, special=True, normalized=False) for t in tokens[:17]])
    model_dir = tmp_path_factory.mktemp("smollm2-hf")
    tokenizer.save(str(model_dir / "tokenizer.json"))
    (model_dir / "tokenizer_config.json").write_text(
        json.dumps({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "add_bos_token": False})
    )
    return model_dir


@pytest.mark.slow
def test_hf_dir_byte_level_bpe_matches_gguf_and_hf(smollm2_hf_dir, smollm2_blob, tmp_path):
    import tokenizers

    blob = tmp_path / "hf.vocab"
    blob.write_bytes(vocab_blob_from_hf_dir(smollm2_hf_dir))
    texts = [t.encode() for t in TEXTS]
    joined = b"<|endoftext|>".join(texts)
    assert pi2_tokenize(blob, joined) == pi2_tokenize(smollm2_blob, joined)
    hf = tokenizers.Tokenizer.from_file(str(smollm2_hf_dir / "tokenizer.json"))
    for text in TEXTS:
        if "<|" not in text:
            assert pi2_tokenize(blob, text.encode()) == hf.encode(text).ids, text
