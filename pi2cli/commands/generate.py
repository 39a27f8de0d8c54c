"""`pi2 generate`: run one prompt through an engine on this machine (one turn of its chat session,
pi2cli.engines.generate) and print the text."""

import json
from pathlib import Path

import click

from pi2cli.engines import DRIVERS, get_driver
from pi2cli.engines.base import GenerateRequest
from pi2cli.engines.generate import generate


@click.command(name="generate")
@click.option(
    "--model",
    "-m",
    required=True,
    help="Model file: .pi2 for --engine pi2, .gguf for --engine llama.cpp; or a registry name found "
    "in the local store (`pi2 models list`).",
)
@click.option("--prompt", "-p", required=True, help="Prompt text (used as is; no chat template).")
@click.option(
    "-n", "--n-predict", default=64, show_default=True, type=click.IntRange(1), help="Tokens to generate."
)
@click.option(
    "--temperature", default=0.0, show_default=True, type=click.FloatRange(0), help="0 means greedy."
)
@click.option("--seed", default=0, show_default=True, type=int, help="Sampling seed.")
@click.option(
    "--engine",
    default="pi2",
    show_default=True,
    type=click.Choice(list(DRIVERS)),
    help="Which engine runs it.",
)
@click.option(
    "--threads", "-t", type=click.IntRange(1), default=None, help="Compute threads [default: all cores]."
)
@click.option(
    "--json", "as_json", is_flag=True, help="Print one JSON object (text, token ids, TTFT, tok/s, peak RSS)."
)
def command(model, prompt, n_predict, temperature, seed, engine, threads, as_json):
    """Generate text with pi2-engine or llama.cpp on this machine.

    \b
    Examples:
      pi2 generate -m smollm2.pi2 -p "The capital of France is" -n 16
      pi2 generate --engine llama.cpp -m smollm2.gguf -p "Hello" -n 16 --json
    """
    from pi2cli.models.store import model_arg

    model = Path(model_arg(model))
    if engine == "llama.cpp" and model.suffix == ".pi2" and model.with_suffix(".gguf").is_file():
        model = model.with_suffix(".gguf")  # a name resolves to the .pi2; llama.cpp runs its twin
    request = GenerateRequest(model=model, prompt=prompt, n_predict=n_predict, temperature=temperature,
                              seed=seed, threads=threads)  # fmt: skip
    result = generate(get_driver(engine), request)
    if as_json:
        click.echo(json.dumps(result.to_json(), default=str))
    else:
        click.echo(result.text)
        click.echo(
            f"{engine}: {len(result.token_ids)} tokens, TTFT {result.ttft_s * 1000:.1f} ms, "
            f"prefill {result.prefill_tps:.1f} tok/s, decode {result.decode_tps:.1f} tok/s, "
            f"peak RSS {result.peak_rss_bytes / 2**20:.0f} MiB",
            err=True,
        )
