"""`pi2 convert`: GGUF checkpoints to .pi2 (plus an identical GGUF twin for llama.cpp)."""

import json
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pi2cli.convert import convert_gguf
from pi2cli.errors import Pi2Error


@click.command(name="convert")
@click.argument("src", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out", "-o", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The .pi2 to write."
)
@click.option(
    "--gguf-twin",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write a GGUF with the same weights, for llama.cpp comparisons.",
)
@click.option(
    "--ffn-act",
    type=click.Choice(["swiglu", "relu", "drelu"]),
    default="swiglu",
    show_default=True,
    help="FFN activation (GGUF does not record it: ReLU-Llama/ProSparse need relu).",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def command(src, out, gguf_twin, ffn_act, as_json):
    """Convert a llama-architecture GGUF (Llama-2, Mistral, Mixtral, SmolLM2...) to .pi2.

    F32, F16, Q4_0, Q4_1 and Q8_0 tensors are copied bit for bit; the FFN goes into per-neuron
    bundles (gate row | up row | down column) for the sparse engine. The file appears only when
    complete. Layout: docs/FORMAT.md.

    \b
    Example:
      pi2 convert SmolLM2-135M-Instruct.Q4_1.gguf --out smollm2.pi2 --gguf-twin smollm2.gguf
    """
    if out.suffix != ".pi2":
        raise Pi2Error(f"--out {out}: the output name must end in .pi2")
    with Progress(
        TextColumn("converting"), BarColumn(), TextColumn("{task.completed}/{task.total} layers"),
        TimeElapsedColumn(), transient=True, disable=as_json,
    ) as bar:  # fmt: skip
        task = bar.add_task("convert", total=None)
        summary = convert_gguf(
            src, out, gguf_twin=gguf_twin, ffn_act=ffn_act,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )  # fmt: skip
    if as_json:
        click.echo(json.dumps(summary))
    else:
        click.echo(f"wrote {summary['out']} ({summary['bytes'] / 2**20:.1f} MiB, {summary['arch']}, "
                   f"{summary['n_layer']} layers, bundles {summary['neuron_type']})")  # fmt: skip
        if gguf_twin:
            click.echo(f"wrote {gguf_twin} (GGUF twin)")
