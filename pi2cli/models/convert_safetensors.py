"""Hugging Face safetensors checkpoints (Llama-2 / ReLU-Llama / ProSparse, Mistral / TurboSparse /
Bamboo, Mixtral / TurboSparse-Mixtral) -> .pi2 plus its GGUF twin, streamed tensor by tensor.

The safetensors files are read with a small reader of our own (memory-mapped, bf16/f16/f32), because
numpy cannot hold bf16 and because a truncated or inconsistent file must be named precisely: every
tensor's byte range is checked against the file before anything is written. Q and K rows are
permuted as llama.cpp's converter does (GGUF order: adjacent-pair RoPE), so the .pi2 and the GGUF
hold the same rows. The vocabulary comes from a GGUF with the same tokens (--tokenizer-gguf), e.g.
the model's PowerInfer GGUF or any llama.cpp conversion: turning tokenizer.model / tokenizer.json
into GGUF vocab fields is not done here.

Predictors: a checkpoint that carries PowerInfer's predictor in every layer, as TurboSparse-Mistral's
BambooMLP merges it (`model.layers.L.mlp.predictor.fc1.weight` [rank, hidden] and `fc2.weight`
[ffn, rank], no biases: sigmoid(fc2 relu(fc1 h)) over the residual h before the FFN norm, the layout
PowerInfer GGUFs store as blk.L.fc1/fc2), keeps it as the .pi2's pred_fc1 / pred_fc2 / pred_threshold
exactly as the PowerInfer GGUF converter writes them (fc1 divided by the FFN norm, fc2's rows in bundle
order, threshold sigmoid(0) = 0.5, PowerInfer's default: a checkpoint records none). A mixture of
experts is read the same way per expert (`block_sparse_moe.experts.E.predictor`, by analogy: the
layout of TurboSparse-Mixtral's per-expert predictors is not published) into pred_fc1.E / pred_fc2.E.
Any other predictor layout (biases, missing blocks, other names) is not converted, and the conversion
says plainly that the model then runs dense (`dropped_predictors`, and the .pi2's metadata).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pi2cli.errors import Pi2Error
from pi2cli.models import gguf_twin

DTYPES = {"BF16": 2, "F16": 2, "F32": 4}

# config.json model_type -> (arch, FFN activation)
MODEL_TYPES = {
    "llama": ("llama", None),  # activation from hidden_act
    "mistral": ("llama", None),
    "sparsellama": ("llama", "relu"),  # ProSparse
    "bamboo": ("llama", "drelu"),  # Bamboo, TurboSparse-Mistral
    "mixtral": ("mixtral", None),
    "turbosparsemixtral": ("mixtral", "drelu"),
}
HIDDEN_ACTS = {"silu": "silu", "swish": "silu", "relu": "relu", "fatrelu": "relu"}


class SafetensorsDir:
    """All tensors of a checkpoint directory: name -> (file, dtype, shape, byte range), validated."""

    def __init__(self, root: Path):
        self.root = Path(root)
        files = sorted(self.root.glob("*.safetensors"))
        if not files:
            raise Pi2Error(f"{self.root}: no *.safetensors files")
        self.index: dict[str, tuple[np.memmap, str, tuple[int, ...], int, int, Path]] = {}
        for path in files:
            size = path.stat().st_size
            with open(path, "rb") as fh:
                head = fh.read(8)
                if len(head) < 8:
                    raise Pi2Error(f"{path.name}: truncated (no header length)")
                n = int.from_bytes(head, "little")
                if n <= 0 or 8 + n > size:
                    raise Pi2Error(
                        f"{path.name}: truncated or corrupt header (needs {8 + n} bytes, file has {size})"
                    )
                try:
                    header = json.loads(fh.read(n))
                except json.JSONDecodeError:
                    raise Pi2Error(f"{path.name}: header is not JSON") from None
            data = np.memmap(path, dtype=np.uint8, mode="r")
            base = 8 + n
            for name, info in header.items():
                if name == "__metadata__":
                    continue
                dtype, shape, (start, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
                if dtype not in DTYPES:
                    raise Pi2Error(
                        f"{path.name}: tensor {name} has dtype {dtype} (supported: {', '.join(DTYPES)})"
                    )
                if end - start != DTYPES[dtype] * int(np.prod(shape)):
                    raise Pi2Error(f"{path.name}: tensor {name} byte range does not match its shape {shape}")
                if base + end > size:
                    raise Pi2Error(
                        f"{path.name}: truncated: tensor {name} ends at offset {base + end}, file has {size} bytes"
                    )
                self.index[name] = (data, dtype, shape, base + start, base + end, path)

    def shape(self, name: str) -> tuple[int, ...]:
        if name not in self.index:
            raise Pi2Error(f"{self.root}: missing tensor {name}")
        return self.index[name][2]

    def get(self, name: str, shape: tuple[int, ...] | None = None) -> np.ndarray:
        """float32 values; checks the shape when given."""
        have = self.shape(name)
        if shape is not None and have != tuple(shape):
            raise Pi2Error(f"tensor {name} has shape {have}, the config implies {tuple(shape)}")
        data, dtype, shp, start, end, _ = self.index[name]
        raw = np.asarray(data[start:end])
        if dtype == "BF16":
            values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        elif dtype == "F16":
            values = raw.view(np.float16).astype(np.float32)
        else:
            values = raw.view(np.float32).copy()
        return values.reshape(shp)


@dataclass
class HfConfig:
    arch: str
    activation: str
    n_layer: int
    hidden: int
    ffn: int
    n_head: int
    n_kv_head: int
    vocab: int
    context: int
    rope_theta: float
    norm_eps: float
    n_expert: int
    n_expert_used: int
    tied: bool


def read_config(root: Path, activation: str | None = None) -> HfConfig:
    path = Path(root) / "config.json"
    try:
        cfg = json.loads(path.read_text())
    except OSError:
        raise Pi2Error(f"{root}: no config.json") from None
    except json.JSONDecodeError:
        raise Pi2Error(f"{path}: not JSON") from None
    mtype = cfg.get("model_type")
    if mtype not in MODEL_TYPES:
        raise Pi2Error(f"unknown architecture model_type={mtype!r} (known: {', '.join(MODEL_TYPES)})")
    arch, act = MODEL_TYPES[mtype]
    act = activation or act or HIDDEN_ACTS.get(str(cfg.get("hidden_act", "silu")))
    if act not in ("silu", "relu", "drelu"):
        raise Pi2Error(f"unsupported hidden_act {cfg.get('hidden_act')!r}; pass --activation")
    try:
        n_head = int(cfg["num_attention_heads"])
        return HfConfig(
            arch=arch, activation=act, n_layer=int(cfg["num_hidden_layers"]), hidden=int(cfg["hidden_size"]),
            ffn=int(cfg["intermediate_size"]), n_head=n_head,
            n_kv_head=int(cfg.get("num_key_value_heads") or n_head), vocab=int(cfg["vocab_size"]),
            context=int(cfg.get("max_position_embeddings", 4096)), rope_theta=float(cfg.get("rope_theta", 10000.0)),
            norm_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            n_expert=int(cfg.get("num_local_experts", 0)) if arch == "mixtral" else 0,
            n_expert_used=int(cfg.get("num_experts_per_tok", 0)) if arch == "mixtral" else 0,
            tied=bool(cfg.get("tie_word_embeddings", False)),
        )  # fmt: skip
    except KeyError as exc:
        raise Pi2Error(f"{path}: missing {exc.args[0]}") from None
    except (TypeError, ValueError, OverflowError) as exc:
        raise Pi2Error(f"{path}: a value is not a number ({exc})") from None


def check_hparams(c: HfConfig, path: Path) -> None:
    """The scalar hyperparameters as the engine will check them (finite, positive, in range; .pi2
    rule 8), before any output exists: NaN, negative or zero values used to convert to files both
    readers refuse."""
    from pi2cli.models.pi2file import hparam_problems

    keys = {"n_ctx_train": "max_position_embeddings", "rope_theta": "rope_theta", "rms_eps": "rms_norm_eps"}
    for name, value, why in hparam_problems(c.context, c.rope_theta, c.norm_eps):
        raise Pi2Error(f"{path}: {keys[name]} is {value!r}: {why} (the engine refuses it; nothing written)")


def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF rotate-half rows -> GGUF adjacent-pair rows (llama.cpp convert_hf_to_gguf's permute)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def convert(
    src: Path,
    out_dir: Path,
    tokenizer_gguf: Path,
    quant: str = "q4_0",
    activation: str | None = None,
    profile: Path | None = None,
    progress=None,
    pi2_path: Path | None = None,
    gguf_path: Path | None | bool = True,
) -> dict:
    """Write out_dir/model.pi2 and out_dir/model.gguf from a safetensors checkpoint directory.
    pi2_path / gguf_path name the outputs explicitly instead (gguf_path None or False: no twin;
    the .pi2 is the same either way)."""
    from pi2cli.models.pi2file import Pi2Header, Pi2Writer
    from pi2cli.models.synth import _tokenizer_blob

    c = read_config(src, activation)
    check_hparams(c, Path(src) / "config.json")
    st = SafetensorsDir(src)
    tok_fields, vocab = gguf_twin.load_tokenizer(tokenizer_gguf)
    if vocab != c.vocab:
        raise Pi2Error(f"tokenizer GGUF has {vocab} tokens, the checkpoint's vocab_size is {c.vocab}")
    orders = {}
    if profile is not None:
        from pi2cli.models.profile import hot_first_orders

        orders = hot_first_orders(profile, c.n_layer, c.n_expert, c.ffn)
    h, f, hd = c.hidden, c.ffn, c.hidden // c.n_head
    moe = c.arch == "mixtral"
    # every tensor is checked before any output exists
    if quant not in ("q4_0", "q4_1", "q8_0", "f16"):
        raise Pi2Error(f"--quant {quant}: choose q4_0, q4_1, q8_0 or f16")
    out_dir = Path(out_dir)
    if out_dir.exists() and not out_dir.is_dir():
        raise Pi2Error(f"--out {out_dir} exists and is not a directory")
    plan = _tensor_plan(c, st, quant)
    predictors, dropped = predictor_plan(c, st)
    pi2_path = Path(pi2_path) if pi2_path else out_dir / "model.pi2"
    gguf_path = out_dir / "model.gguf" if gguf_path is True else (Path(gguf_path) if gguf_path else None)
    pi2_path.parent.mkdir(parents=True, exist_ok=True)
    if gguf_path:
        gguf_path.parent.mkdir(parents=True, exist_ok=True)

    import gguf

    t = gguf.GGUFValueType
    pre = "llama."
    kv = [("general.type", "model", t.STRING, None), ("general.name", src.name, t.STRING, None),
          ("general.file_type", gguf_twin.FILE_TYPES[quant], t.UINT32, None),
          ("general.quantization_version", 2, t.UINT32, None),
          (pre + "block_count", c.n_layer, t.UINT32, None), (pre + "context_length", c.context, t.UINT32, None),
          (pre + "embedding_length", h, t.UINT32, None), (pre + "feed_forward_length", f, t.UINT32, None),
          (pre + "attention.head_count", c.n_head, t.UINT32, None),
          (pre + "attention.head_count_kv", c.n_kv_head, t.UINT32, None),
          (pre + "rope.freq_base", c.rope_theta, t.FLOAT32, None), (pre + "rope.dimension_count", hd, t.UINT32, None),
          (pre + "attention.layer_norm_rms_epsilon", c.norm_eps, t.FLOAT32, None),
          (pre + "vocab_size", c.vocab, t.UINT32, None), ("pi2.ffn_activation", c.activation, t.STRING, None)]  # fmt: skip
    if moe:
        kv += [(pre + "expert_count", c.n_expert, t.UINT32, None),
               (pre + "expert_used_count", c.n_expert_used, t.UINT32, None)]  # fmt: skip
    twin = gguf_twin.GgufTwinWriter(gguf_path, kv + list(tok_fields)) if gguf_path else _NoTwin()
    for name, shape, q, _ in plan:
        twin.declare(name, shape, q)
    header = Pi2Header(arch="moe" if moe else "llama", ffn_act=c.activation, n_vocab=c.vocab, n_embd=h,
                       n_layer=c.n_layer, n_head=c.n_head, n_head_kv=c.n_kv_head, n_ff=f,
                       neuron_type=quant.upper(), n_expert=c.n_expert, n_expert_used=c.n_expert_used,
                       n_ctx_train=c.context, rope_theta=c.rope_theta, rms_eps=c.norm_eps,
                       tied_embeddings=c.tied, dense_down=True, has_predictor=bool(predictors))  # fmt: skip
    blob, _ = _tokenizer_blob(tok_fields)
    meta = {"source": str(src), "converter": "pi2 models convert-safetensors", "synthetic": False,
            "gguf_twin": gguf_path.name if gguf_path else None,
            "activation_profile": str(profile) if profile else None}  # fmt: skip
    if predictors:
        meta["predictor"] = {"source": "checkpoint mlp.predictor fc1/fc2 (PowerInfer's format)",
                             "powerinfer_threshold": PREDICTOR_LOGIT_THRESHOLD,
                             "threshold": float(1.0 / (1.0 + np.exp(-PREDICTOR_LOGIT_THRESHOLD))),
                             "threshold_exact": True,
                             "fc1": "fc1 / ffn_norm (the predictor reads the residual before ffn_norm)"}  # fmt: skip
    if dropped:
        meta["dropped_predictors"] = {
            "count": len(dropped),
            "example": dropped[0],
            "why": dropped_reason(c, dropped),
        }
    writer = Pi2Writer(pi2_path, header, tokenizer_blob=blob, metadata=meta)
    try:
        ffn_parts: dict[str, np.ndarray] = {}
        for i, (name, shape, q, source) in enumerate(plan):
            values = source()
            raw = gguf_twin.encode(values.reshape(-1, shape[-1]), q).reshape(*shape[:-1], -1)
            twin.write(name, raw)
            if ".ffn_gate" in name or ".ffn_up" in name or ".ffn_down" in name:
                if "ffn_gate_inp" in name:
                    writer.add_tensor(name, raw.reshape(-1), q.upper(), shape=tuple(reversed(shape)))
                    continue
                ffn_parts[name.split(".")[2]] = (raw, values)
                if len(ffn_parts) == 3:
                    layer = int(name.split(".")[1])
                    _emit(writer, layer, ffn_parts, c, orders, quant)
                    ffn_parts = {}
            else:
                writer.add_tensor(name, raw.reshape(-1), q.upper(), shape=tuple(reversed(shape)))
            if progress:
                progress(name, i + 1, len(plan))
        for layer in sorted({i for i, _ in predictors or {}}):
            _add_predictors(writer, st, c, layer, predictors, orders)
        writer.close()
        twin.close()
    except BaseException:
        twin.abort()
        if writer.closed:
            pi2_path.unlink(missing_ok=True)
        else:
            writer.abort()
        raise
    return {"pi2": str(pi2_path), "gguf": str(gguf_path) if gguf_path else None, "arch": c.arch,
            "activation": c.activation, "layers": c.n_layer, "predictor": bool(predictors),
            "predictor_threshold": meta.get("predictor", {}).get("threshold"),
            "dropped_predictors": len(dropped), "dropped_reason": dropped_reason(c, dropped) if dropped else None}  # fmt: skip


PREDICTOR_LOGIT_THRESHOLD = 0.0  # PowerInfer's default: a neuron is predicted active when sigmoid > 0.5


def predictor_names(c: HfConfig) -> dict[tuple[int, int | None], tuple[str, str]]:
    """Where PowerInfer's predictor sits in a checkpoint, per FFN block: {(layer, expert): (fc1, fc2)}.
    Dense: BambooMLP's `mlp.predictor`; MoE: the same module in every expert (`block_sparse_moe.experts.E.
    predictor`), read by analogy with the dense layout."""
    if c.arch == "mixtral":
        return {(i, e): (f"model.layers.{i}.block_sparse_moe.experts.{e}.predictor.fc1.weight",
                         f"model.layers.{i}.block_sparse_moe.experts.{e}.predictor.fc2.weight")
                for i in range(c.n_layer) for e in range(c.n_expert)}  # fmt: skip
    return {(i, None): (f"model.layers.{i}.mlp.predictor.fc1.weight", f"model.layers.{i}.mlp.predictor.fc2.weight")
            for i in range(c.n_layer)}  # fmt: skip


def predictor_plan(c: HfConfig, st: SafetensorsDir) -> tuple[dict | None, list[str]]:
    """({(layer, expert): (fc1, fc2)} when every FFN block carries PowerInfer's predictor and nothing else
    sits under `.predictor.`, else None; the predictor tensors that will not be converted). Shapes and the
    FFN norm the predictor is moved behind are checked here, before any output exists."""
    names = sorted(n for n in st.index if ".predictor." in n)
    if not names:
        return None, names
    pairs = predictor_names(c)
    if sorted(n for pair in pairs.values() for n in pair) != names:
        return None, names
    for (i, _e), (a, b) in pairs.items():
        s1, s2 = st.shape(a), st.shape(b)
        if len(s1) != 2 or s1[1] != c.hidden or s2 != (c.ffn, s1[0]):
            raise Pi2Error(
                f"predictor tensors {a} {s1} / {b} {s2}: expected [rank, {c.hidden}] and [{c.ffn}, rank]"
            )
        g = st.get(f"model.layers.{i}.post_attention_layernorm.weight", (c.hidden,))
        if not np.all(np.isfinite(g) & (g != 0)):
            raise Pi2Error(f"model.layers.{i}.post_attention_layernorm.weight has zero or non-finite entries: "
                           f"the predictor cannot be moved behind the norm")  # fmt: skip
    return pairs, []


def dropped_reason(c: HfConfig, dropped: list[str]) -> str:
    return (f"{len(dropped)} predictor tensors ({dropped[0]}, ...) not converted: not PowerInfer's bias-free "
            f"fc1/fc2 in every FFN block; the .pi2 has no activation predictors, so pi2 runs it dense")  # fmt: skip


def _add_predictors(writer, st: SafetensorsDir, c: HfConfig, layer: int, pairs: dict, orders: dict) -> None:
    """One layer's predictors, per FFN block (expert): pred_fc1 = fc1 / ffn_norm (F16 unless that
    overflows), pred_fc2 = fc2's rows in bundle order (F16), and the layer's pred_threshold (one per
    block) = sigmoid(PowerInfer's threshold): what the PowerInfer GGUF converter writes."""
    g = st.get(f"model.layers.{layer}.post_attention_layernorm.weight", (c.hidden,)).astype(np.float64)
    moe = c.arch == "mixtral"
    blocks = range(c.n_expert) if moe else [None]
    for e in blocks:
        fc1, fc2 = pairs[(layer, e)]
        sfx = f".{e}" if moe else ""
        w1 = st.get(fc1).astype(np.float64) / g  # (rank, hidden)
        rank = w1.shape[0]
        fits_f16 = np.abs(w1).max(initial=0.0) < 60000.0
        writer.add_tensor(f"blk.{layer}.pred_fc1{sfx}", w1.astype(np.float32), "F16" if fits_f16 else "F32",
                          (c.hidden, rank))  # fmt: skip
        rows = st.get(fc2)  # (ffn, rank): row i scores neuron i
        order = orders.get(f"{layer}.{e}" if moe else f"{layer}")
        if order is not None:
            rows = rows[np.asarray(order)]
        writer.add_tensor(f"blk.{layer}.pred_fc2{sfx}", np.ascontiguousarray(rows), "F16", (rank, c.ffn))
    threshold = 1.0 / (1.0 + np.exp(-PREDICTOR_LOGIT_THRESHOLD))
    writer.add_tensor(f"blk.{layer}.pred_threshold", np.full(len(blocks), threshold, np.float32), "F32",
                      (len(blocks),))  # fmt: skip


class _NoTwin:
    """Stands in for the GGUF twin writer when no twin was asked for."""

    def declare(self, *args) -> None:
        pass

    def write(self, *args) -> None:
        pass

    def close(self) -> None:
        pass

    def abort(self) -> None:
        pass


def _emit(writer, layer, parts, c: HfConfig, orders, quant) -> None:
    moe = c.arch == "mixtral"
    names = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps") if moe else ("ffn_gate", "ffn_up", "ffn_down")
    (g_raw, _), (u_raw, _), (d_raw, d_val) = (parts[n] for n in names)
    for e in range(c.n_expert if moe else 1):
        key = f"{layer}.{e}" if moe else f"{layer}"
        order = orders.get(key)
        sl = (e,) if moe else ()
        writer.add_ffn(layer, g_raw[sl], u_raw[sl], d_val[sl], expert=e if moe else None, order=order,
                       down_raw=d_raw[sl].reshape(-1), down_raw_type=quant.upper())  # fmt: skip


def _tensor_plan(c: HfConfig, st: SafetensorsDir, q: str) -> list:
    """(gguf name, numpy shape, quant, loader) in GGUF order; every source tensor checked now."""
    h, f, hd = c.hidden, c.ffn, c.hidden // c.n_head
    plan = []

    def add(name, shape, quant, src, transform=None):
        if st.shape(src) != tuple(shape):
            raise Pi2Error(f"tensor {src} has shape {st.shape(src)}, the config implies {tuple(shape)}")

        def load():
            v = st.get(src, shape)
            return transform(v) if transform else v

        plan.append((name, tuple(shape), quant, load))

    add("token_embd.weight", (c.vocab, h), q, "model.embed_tokens.weight")
    for i in range(c.n_layer):
        p, s = f"blk.{i}.", f"model.layers.{i}."
        add(p + "attn_norm.weight", (h,), "f32", s + "input_layernorm.weight")
        add(
            p + "attn_q.weight",
            (c.n_head * hd, h),
            q,
            s + "self_attn.q_proj.weight",
            lambda w: permute_qk(w, c.n_head),
        )
        add(p + "attn_k.weight", (c.n_kv_head * hd, h), q, s + "self_attn.k_proj.weight",
            lambda w: permute_qk(w, c.n_kv_head))  # fmt: skip
        add(p + "attn_v.weight", (c.n_kv_head * hd, h), q, s + "self_attn.v_proj.weight")
        add(p + "attn_output.weight", (h, c.n_head * hd), q, s + "self_attn.o_proj.weight")
        add(p + "ffn_norm.weight", (h,), "f32", s + "post_attention_layernorm.weight")
        if c.arch == "mixtral":
            add(p + "ffn_gate_inp.weight", (c.n_expert, h), "f32", s + "block_sparse_moe.gate.weight")
            for gname, hf, shape in (("ffn_gate_exps", "w1", (f, h)), ("ffn_up_exps", "w3", (f, h)),
                                     ("ffn_down_exps", "w2", (h, f))):  # fmt: skip
                srcs = [s + f"block_sparse_moe.experts.{e}.{hf}.weight" for e in range(c.n_expert)]
                for src in srcs:
                    if st.shape(src) != shape:
                        raise Pi2Error(f"tensor {src} has shape {st.shape(src)}, the config implies {shape}")
                plan.append((p + gname + ".weight", (c.n_expert, *shape), q,
                             lambda srcs=srcs, shape=shape: np.stack([st.get(x, shape) for x in srcs])))  # fmt: skip
        else:
            add(p + "ffn_gate.weight", (f, h), q, s + "mlp.gate_proj.weight")
            add(p + "ffn_up.weight", (f, h), q, s + "mlp.up_proj.weight")
            add(p + "ffn_down.weight", (h, f), q, s + "mlp.down_proj.weight")
    add("output_norm.weight", (h,), "f32", "model.norm.weight")
    if not c.tied:
        add("output.weight", (c.vocab, h), q, "lm_head.weight")
    return plan
