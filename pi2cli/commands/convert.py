"""`pi2 convert`: GGUF, PowerInfer GGUF and Hugging Face safetensors checkpoints to .pi2 (plus a GGUF
twin for llama.cpp)."""

import json
from pathlib import Path

import click
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from pi2cli.commands.options import input_file_option
from pi2cli.errors import Pi2Error
from pi2cli.models.convert_any import convert_any, runs_dense_note
from pi2cli.models.pi2file import Pi2FormatError


@click.command(name="convert")
@click.argument("src", type=click.Path(path_type=Path))
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
    default=None,
    help="FFN activation [default: GGUF llama: swiglu; PowerInfer llama with predictors: relu; "
    "PowerInfer bamboo: drelu; safetensors: from config.json]. Plain GGUFs do not record it: "
    "ReLU-Llama/ProSparse GGUFs need relu.",
)
@input_file_option(
    "--profile",
    help="Activation profile (.npz from `pi2 models profile`): each layer's bundles hottest first.",
)
@click.option(
    "--quant",
    type=click.Choice(["q4_0", "q4_1", "q8_0", "f16"]),
    default=None,
    help="Safetensors only: weight type [default: q4_0]. GGUF weights keep their own types.",
)
@input_file_option(
    "--tokenizer-gguf",
    help="Safetensors only (required there): a GGUF with the same vocabulary, whose tokenizer is reused.",
)
@click.option(
    "--sparsify",
    type=click.Choice(["cats"]),
    default=None,
    help="Add a gate predictor by CATS thresholds (SwiGLU models; docs/MODELS.md).",
)
@click.option(
    "--sparsity",
    type=click.FloatRange(0.0, 1.0, max_open=True),
    default=None,
    help="With --sparsify: the fraction of FFN activations below each layer's threshold on the "
    "calibration text (0 keeps every neuron).",
)
@click.option(
    "--calibration",
    "calibration",
    type=click.Choice(["multi-turn", "code", "math", "role-play"]),
    default="multi-turn",
    show_default=True,
    help="With --sparsify: the workload whose calibration part (held apart from evaluation) sets t.",
)
@click.option(
    "--bundle-type",
    type=click.Choice(["source", "q8_0", "f16"]),
    default=None,
    help="With --sparsify: the bundles' type [default: q8_0 for 4-bit sources, whose re-quantized "
    "down columns would cost quality; else source].",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def command(src, out, gguf_twin, ffn_act, profile, quant, tokenizer_gguf, sparsify, sparsity, calibration,
            bundle_type, as_json):  # fmt: skip
    """Convert a model to .pi2: a llama-architecture GGUF (Llama-2, Mistral, Mixtral, SmolLM2...), a
    PowerInfer GGUF (ReLU-Llama, ProSparse, Bamboo, with their fc1/fc2 predictors), or a Hugging Face
    safetensors checkpoint (a directory, or one of its .safetensors files).

    GGUF: F32, F16, Q4_0, Q4_1 and Q8_0 tensors are copied bit for bit; the FFN goes into per-neuron
    bundles (gate row | up row | down column) for the sparse engine. PowerInfer GGUFs keep their
    transposed down in the bundles and their predictors as pred_fc1/pred_fc2 (docs/MODELS.md says how
    the threshold maps). Safetensors: quantized to --quant. The file appears only when complete.
    Layout: docs/FORMAT.md.

    \b
    Examples:
      pi2 convert SmolLM2-135M-Instruct.Q4_1.gguf --out smollm2.pi2 --gguf-twin smollm2.gguf
      pi2 convert prosparse-llama-2-7b.powerinfer.gguf --out prosparse.pi2 --profile p.npz
      pi2 convert ./Bamboo-base-v0_1 --tokenizer-gguf bamboo.gguf --out bamboo.pi2 --gguf-twin bamboo.gguf
      pi2 convert SmolLM2-135M-Instruct.Q4_1.gguf --sparsify cats --sparsity 0.5 --out smollm2-cats50.pi2
    """
    if sparsify is None and (sparsity is not None or bundle_type is not None):
        raise Pi2Error("--sparsity and --bundle-type go with --sparsify cats")
    if sparsify is not None:
        return _sparsify(src, out, sparsity, calibration, bundle_type, as_json, gguf_twin,
                         ffn_act=ffn_act, profile=profile, quant=quant, tokenizer_gguf=tokenizer_gguf)  # fmt: skip
    from pi2cli.outputs import check_file_writable

    check_file_writable(out, "--out")  # a conversion takes minutes: refuse an impossible output first
    if gguf_twin is not None:
        check_file_writable(gguf_twin, "--gguf-twin")
    with Progress(
        TextColumn("converting"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(), transient=True, disable=as_json,
    ) as bar:  # fmt: skip
        task = bar.add_task("convert", total=None)
        try:
            summary = convert_any(
                src, out, gguf_twin=gguf_twin, ffn_act=ffn_act, profile=profile, quant=quant,
                tokenizer_gguf=tokenizer_gguf,
                progress=lambda done, total: bar.update(task, completed=done, total=total),
            )  # fmt: skip
        except Pi2FormatError as err:  # a source whose shapes do not make a valid .pi2
            raise Pi2Error(f"{src}: {err}") from None
    if as_json:
        click.echo(json.dumps(summary))
        return
    click.echo(f"wrote {summary['out']} ({summary['bytes'] / 2**20:.1f} MiB, {summary['arch']}, "
               f"{summary['ffn_act']}, {summary['n_layer']} layers, bundles {summary['neuron_type']})")  # fmt: skip
    if summary.get("predictor"):
        click.echo(f"predictors: PowerInfer fc1/fc2, sigmoid threshold {summary['predictor_threshold']:.4g}")
        if not summary.get("predictor_threshold_exact"):
            click.echo("note: PowerInfer's threshold is not 0, so pi2's (normed-input) predictor selects the "
                       "same neurons only approximately; see docs/MODELS.md")  # fmt: skip
    if summary.get("gguf_twin"):
        click.echo(f"wrote {summary['gguf_twin']} (GGUF twin)")
    note = runs_dense_note(Path(summary["out"]))  # a sparse-kind model that will run dense: said, not hidden
    if note:
        click.echo(f"note: {note}")


def _sparsify(src, out, sparsity, calibration, bundle_type, as_json, gguf_twin, **others) -> None:
    from pi2cli.outputs import check_file_writable
    from pi2cli.quality.cats import convert_cats

    given = [f"--{k.replace('_', '-')}" for k, v in others.items() if v is not None]
    if given:
        raise Pi2Error(f"{given[0]} does not go with --sparsify (convert the dense model first)")
    if sparsity is None:
        raise Pi2Error("--sparsify cats needs --sparsity S (0 <= S < 1)")
    if out.suffix != ".pi2":
        raise Pi2Error(f"--out {out}: the output name must end in .pi2")
    check_file_writable(out, "--out")
    if gguf_twin is not None:
        check_file_writable(gguf_twin, "--gguf-twin")
    with Progress(TextColumn("calibrating"), TimeElapsedColumn(), transient=True, disable=as_json) as bar:
        bar.add_task("cats", total=None)
        try:
            summary = convert_cats(
                src, out, sparsity, calibration, bundle_type=bundle_type, gguf_twin=gguf_twin
            )
        except Pi2FormatError as err:
            raise Pi2Error(f"{src}: {err}") from None
    if as_json:
        click.echo(json.dumps(summary))
        return
    t = summary["calibration"]["thresholds"]
    click.echo(f"wrote {summary['out']} ({summary['bytes'] / 2**20:.1f} MiB, bundles {summary['bundle_type']}): "
               f"CATS gate predictor, target sparsity {sparsity:.0%}, thresholds {min(t):.4g}..{max(t):.4g} "
               f"from {summary['calibration']['tokens']} tokens of {calibration} (calibration part)")  # fmt: skip
    if summary.get("gguf_twin"):
        click.echo(f"wrote {summary['gguf_twin']} (GGUF twin: the dense source's weights, for llama.cpp)")
