"""The real-model check: SmolLM2-135M-Instruct (Q4_1 GGUF: token_embd Q8_0, matrices Q4_1, tied
output) converted to .pi2 chooses, greedily, the tokens llama.cpp chooses (llama-simple, its defaults:
flash attention on) on the same GGUF, and its first-token logits match the numpy reference.

Token agreement, teacher-forced: llama-simple's 32 greedy tokens (llama-tokenize of its text) go through
pi2-engine's batched pass; at every position llama.cpp's token must be pi2-engine's top token or within
a near-tie of it (NEAR_TIE of the largest |logit|). pi2-engine mirrors llama.cpp's roundings
(Q8 activations, F16 KV cache and query), not its exact float summation order, its vectorized exp
or flash attention's F16 accumulator (pi2 sums V in float), and llama.cpp's own AVX2 and AVX-512 builds sum differently: these prompts'
greedy texts agreed for all 32 tokens against an AVX-512 build (Sapphire Rapids, Zen 4) but part after
6-14 tokens against an AVX2 build (Zen 3), always at a near-tie, so free-running text equality is a
property of the build pair, not of the engine. Measured on Zen 3: llama.cpp's token is pi2's top token
at 102 of 108 positions, and its worst gap is 1.96% of the largest |logit|; an engine with attention
scores scaled by 1.1 (a real bug) reaches 4.7%.

Logits tolerance (last prompt position, vs pi2cli.models.numpy_llama with emulated roundings): same top token,
max |diff| <= 5% of max |logit| and KL(reference || engine) < 0.05 nats. Measured: 2.7% and 0.009;
pi2-engine's own scalar and AVX2 kernels differ from each other by 3.7% on the same input.
"""

import json
import subprocess

import numpy as np
import pytest
from engine_helpers import engine_logits, run_engine

from pi2cli.models.numpy_llama import Reference

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "<|im_start|>user\nWhat is 12 times 7?<|im_end|>\n<|im_start|>assistant\n",
    "In 1969, Neil Armstrong",
]
N = 32


def llamacpp_greedy(bindir, gguf, prompt: str) -> str:
    done = subprocess.run(
        [str(bindir / "llama-simple"), "-m", str(gguf), "-n", str(N), prompt],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    # llama-simple prints the prompt (special tokens rendered as text), the continuation, then "\n".
    assert done.stdout.startswith(prompt), done.stdout[:200]
    return done.stdout[len(prompt) :].removesuffix("\n")


def llamacpp_tokenize(bindir, gguf, text: str) -> list[int]:
    done = subprocess.run(
        [str(bindir / "llama-tokenize"), "-m", str(gguf), "-p", text, "--ids", "--log-disable",
         "--no-parse-special"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


# Of the largest |logit|: where float summation order alone can swap the top two (measured above).
NEAR_TIE = 0.025


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_tokens_match_llamacpp(prompt, smollm2_pi2, smollm2_gguf, llamacpp_bindir, tmp_path):
    events = tmp_path / "events.jsonl"
    run_engine("generate", "-m", smollm2_pi2, "-p", prompt, "-n", 1, "--temperature", "0",
               "--threads", "2", "--events", events)  # fmt: skip
    start = json.loads(events.read_text().splitlines()[0])
    prompt_ids = start["prompt_ids"]
    theirs_text = llamacpp_greedy(llamacpp_bindir, smollm2_gguf, prompt)
    theirs = llamacpp_tokenize(llamacpp_bindir, smollm2_gguf, theirs_text)
    assert theirs, f"llama.cpp generated nothing for {prompt!r}"
    logits = engine_logits(smollm2_pi2, prompt_ids + theirs, tmp_path, "--threads", "2")
    for j, token in enumerate(theirs):
        row = logits[len(prompt_ids) - 1 + j]
        gap = float(row.max() - row[token])
        assert gap <= NEAR_TIE * float(np.abs(row).max()), (
            f"after {j} tokens llama.cpp's token {token} is {gap:.3f} logits below pi2's top token "
            f"{int(row.argmax())} (not a near-tie)\nllama.cpp: {theirs_text!r}"
        )


def test_first_token_logits_match_reference(smollm2_pi2, tmp_path):
    tokens = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    ref = Reference(smollm2_pi2).forward(tokens)[-1]
    got = engine_logits(smollm2_pi2, tokens, tmp_path, "--threads", "2")[-1]
    assert got.argmax() == ref.argmax() == 7042  # " Paris"
    assert np.abs(got - ref).max() <= 0.05 * np.abs(ref).max()
    p = np.exp(ref - ref.max(), dtype=np.float64)
    q = np.exp(got - got.max(), dtype=np.float64)
    p, q = p / p.sum(), q / q.sum()
    assert float((p * np.log(p / q)).sum()) < 0.05


def test_pi2_generate_json_and_seeded_sampling(smollm2_pi2):
    from click.testing import CliRunner

    from pi2cli.cli import cli

    def gen(*extra):
        args = ["generate", "--model", str(smollm2_pi2), "--prompt", "The capital of France is", "-n", "16",
                "--threads", "2", "--json", *extra]  # fmt: skip
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    greedy = gen("--temperature", "0")
    assert greedy["text"].startswith(" Paris.")
    assert len(greedy["token_ids"]) == 16 and greedy["n_prompt"] == 5
    assert greedy["ttft_s"] > 0 and greedy["prefill_tps"] > 0 and greedy["decode_tps"] > 0
    assert greedy["peak_rss_bytes"] > 50 * 2**20 and len(greedy["token_times_s"]) == 16
    a, b = gen("--temperature", "0.9", "--seed", "1"), gen("--temperature", "0.9", "--seed", "1")
    c = gen("--temperature", "0.9", "--seed", "2")
    assert a["token_ids"] == b["token_ids"] != c["token_ids"]
