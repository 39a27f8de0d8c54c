"""One entry for every converter: route a source by its kind (a safetensors checkpoint or directory, else
a GGUF) to the converter that reads it. `pi2 convert` and the CATS sparsifier both start here."""

from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.models.convert import convert_gguf

# --ffn-act names -> the safetensors converter's --activation names
HF_ACTIVATIONS = {"swiglu": "silu", "relu": "relu", "drelu": "drelu"}


def is_safetensors_source(src: Path) -> bool:
    return src.is_dir() or src.suffix == ".safetensors"


def convert_any(src: Path, out: Path, gguf_twin=None, ffn_act=None, profile=None, quant=None,
                tokenizer_gguf=None, progress=None) -> dict:  # fmt: skip
    """Route SRC by kind: a directory or .safetensors file goes to the safetensors converter, anything
    else is read as a GGUF. Options that mean nothing for the kind are refused, not ignored."""
    if out.suffix != ".pi2":
        raise Pi2Error(f"--out {out}: the output name must end in .pi2")
    if is_safetensors_source(src):
        from pi2cli.models.convert_safetensors import convert

        if not src.exists():
            raise Pi2Error(f"{src}: no such file or directory")
        root = src if src.is_dir() else src.parent
        if tokenizer_gguf is None:
            raise Pi2Error(
                f"{src} is a safetensors checkpoint: give --tokenizer-gguf (a GGUF with the same vocabulary)"
            )
        result = convert(
            root, out.parent, Path(tokenizer_gguf), quant or "q4_0",
            activation=HF_ACTIVATIONS[ffn_act] if ffn_act else None, profile=profile,
            progress=(lambda _name, done, total: progress(done, total)) if progress else None,
            pi2_path=out, gguf_path=gguf_twin,
        )  # fmt: skip
        return {"out": result["pi2"], "gguf_twin": result["gguf"], "arch": result["arch"],
                "source_format": "safetensors", "ffn_act": ffn_act or result["activation"],
                "n_layer": result["layers"], "neuron_type": (quant or "q4_0").upper(),
                "profile": str(profile) if profile else None, "bytes": out.stat().st_size,
                "predictor": result["predictor"], "predictor_threshold": result["predictor_threshold"],
                "predictor_threshold_exact": True if result["predictor"] else None,
                "dropped_predictors": result["dropped_predictors"], "dropped_reason": result["dropped_reason"]}  # fmt: skip
    if quant is not None:
        raise Pi2Error(
            "--quant applies to safetensors checkpoints; GGUF weights are copied in their own types"
        )
    if tokenizer_gguf is not None:
        raise Pi2Error(
            "--tokenizer-gguf applies to safetensors checkpoints; a GGUF carries its own vocabulary"
        )
    return convert_gguf(src, out, gguf_twin=gguf_twin, ffn_act=ffn_act, profile=profile, progress=progress)


def runs_dense_note(pi2: Path) -> str | None:
    """One line saying a .pi2 runs dense when a reader would expect it sparse: a ReLU/dReLU model (the
    sparse-activation kind) without activation predictors, or a conversion that left a checkpoint's
    predictors out. None otherwise (a plain SwiGLU model is dense by nature)."""
    from pi2cli.models.pi2file import Pi2File, Pi2FormatError

    try:
        f = Pi2File(pi2, verify=False)
    except (Pi2Error, Pi2FormatError, OSError, ValueError):
        return None
    if f.header.has_predictor:
        return None
    dropped = f.metadata.get("dropped_predictors")
    if isinstance(dropped, dict) and dropped.get("why"):
        return f"{pi2.name}: {dropped['why']} (policy dense)"
    if f.header.ffn_act in ("relu", "drelu"):
        return (f"{pi2.name}: a {f.header.ffn_act} model without activation predictors: pi2 runs it dense "
                f"(policy dense); convert a source that carries PowerInfer's fc1/fc2 predictors to run it sparse")  # fmt: skip
    return None
