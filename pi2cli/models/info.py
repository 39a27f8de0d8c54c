"""What `pi2 models list/show/synth` print: registry tables, file summaries, measured statistics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from tabulate import tabulate

from pi2cli.errors import Pi2Error
from pi2cli.models.registry import QUANT_BYTES_PER_ELEMENT, ModelSpec, human_count
from pi2cli.units import format_size


def _pct(x) -> str:
    return "-" if x is None or x != x else f"{100 * x:.1f}%"


def registry_table(models) -> str:
    rows = []
    for m in models:
        experts = f"{m.n_expert}x top-{m.n_expert_used}" if m.is_moe else "dense"
        rows.append([m.name, m.arch, experts, human_count(m.param_counts()["total"]), m.activation,
                     _pct(m.published_sparsity), format_size(m.size_bytes("q4_0")), m.hf_repo or "-"])  # fmt: skip
    headers = ["name", "arch", "ffn", "params", "act", "sparsity", "q4_0 size", "source (Hugging Face)"]
    return tabulate(rows, headers=headers)


def format_spec(m: ModelSpec) -> str:
    counts = m.param_counts()
    lines = [
        f"{m.name}: {m.title}",
        f"  architecture   {m.arch}" + (f", {m.n_expert} experts, top-{m.n_expert_used}" if m.is_moe else ""),
        f"  dimensions     layers {m.n_layer}, hidden {m.hidden}, ffn {m.ffn}, heads {m.n_head} "
        f"(kv {m.n_kv_head}, head_dim {m.head_dim}), vocab {m.vocab}, context {m.context}",
        f"  rope / norm    theta {m.rope_theta:g}, rms eps {m.norm_eps:g}"
        + (", tied embeddings" if m.tied_embeddings else ""),
        f"  activation     {m.activation}   published sparsity {_pct(m.published_sparsity)}",
        "  parameters     "
        + ", ".join(f"{k} {human_count(v)}" for k, v in counts.items() if v and k != "total")
        + f"; total {human_count(counts['total'])} ({counts['total']:,})",
    ]
    active = m.active_ffn_params_per_token()
    if active:
        lines.append(f"  active FFN     {human_count(active)} parameters per token at the published sparsity")
    lines.append(
        "  size           "
        + ", ".join(f"{q} {format_size(m.size_bytes(q))}" for q in QUANT_BYTES_PER_ELEMENT)
        + " (all matrices in that type, norms f32)"
    )
    lines.append(
        f"  obtain from    {m.hf_repo or '-'}" + (f" (GGUF: {m.hf_gguf_repo})" if m.hf_gguf_repo else "")
    )
    if m.source:
        lines.append(f"  checkpoint     {m.source}")
    lines.append(f"  chat template  {m.chat_template_name}")
    if m.aliases:
        lines.append(f"  aliases        {', '.join(m.aliases)}")
    if m.notes:
        lines.append(f"  notes          {m.notes}")
    return "\n".join(lines)


def file_info(path: Path, verify: bool = False) -> dict:
    """Header, tensors and metadata of a .pi2 or .gguf file (one clear error when it is not one)."""
    path = Path(path)
    if not path.is_file():
        raise Pi2Error(f"{path}: no such model file")
    if path.suffix == ".gguf":
        return _gguf_info(path)
    from dataclasses import asdict

    from pi2cli.models.pi2file import Pi2File, Pi2FormatError

    try:
        f = Pi2File(path, verify=verify)
    except Pi2FormatError as exc:
        raise Pi2Error(str(exc)) from None
    h = f.header
    return {"path": str(path), "format": "pi2", "bytes": path.stat().st_size, "header": asdict(h),
            "n_tensors": len(f.tensors), "tokenizer_bytes": len(f.tokenizer_blob),
            "checksums": "verified" if verify else "not checked (use --verify)", "metadata": f.metadata}  # fmt: skip


def _gguf_info(path: Path) -> dict:
    import gguf

    try:
        r = gguf.GGUFReader(path)
    except Exception as exc:  # noqa: BLE001
        raise Pi2Error(f"{path}: not a readable GGUF ({exc})") from None
    meta = {}
    for key, field in r.fields.items():
        if key.startswith(("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.token_type")):
            meta[key] = f"[{len(field.data)} entries]"
        elif not key.startswith("GGUF."):
            try:
                meta[key] = field.contents()
            except Exception:  # noqa: BLE001
                meta[key] = "?"
    return {"path": str(path), "format": "gguf", "bytes": path.stat().st_size, "n_tensors": len(r.tensors),
            "metadata": meta}  # fmt: skip


def format_measured(summary: dict) -> str:
    m = summary.get("measured")
    if not m:
        return "  (no measured activation statistics in this file)"
    prof = summary.get("activation_profile", {})
    lines = [
        f"  measured on held-out tokens: sparsity {_pct(m['sparsity'])} (target {_pct(prof.get('target_sparsity'))}), "
        f"hot {int(100 * prof.get('hot_fraction', 0.2))}% covers {_pct(m['hot_coverage'])} of activations, "
        f"predictor recall {_pct(m['recall'])}, precision {_pct(m['precision'])}, "
        f"predicted {_pct(m['predicted_fraction'])} of neurons",
    ]
    rows = [[s["layer"], _pct(s["target_sparsity"]), _pct(s["sparsity"]), _pct(s["hot_coverage"]),
             _pct(s["recall"]), _pct(s["precision"])] for s in summary.get("layers", [])]  # fmt: skip
    lines.append(tabulate(rows, headers=["layer", "target", "sparsity", "hot cover", "recall", "precision"]))
    if prof.get("frequency_distribution"):
        lines.append(f"  frequency profile: {prof['frequency_distribution']}")
    if summary.get("predictor"):
        p = summary["predictor"]
        lines.append(
            f"  predictor: {p['kind']}, fc1 rows {p['rank']}, threshold for recall >= {p['target_recall']}"
        )
    return "\n".join(lines)


def format_file_info(data: dict) -> str:
    lines = [
        f"{data['path']}: {data['format']} file, {format_size(data['bytes'])}, {data['n_tensors']} tensors"
    ]
    meta = data.get("metadata", {})
    if data["format"] == "gguf":
        for key in ("general.name", "general.architecture", "llama.block_count", "llama.embedding_length",
                    "llama.feed_forward_length", "llama.expert_count", "pi2.synthetic", "pi2.ffn_activation"):  # fmt: skip
            if key in meta:
                lines.append(f"  {key} = {meta[key]}")
        return "\n".join(lines)
    h = data["header"]
    lines.append(
        f"  {h['arch']} ffn {h['ffn_act']}, layers {h['n_layer']}, hidden {h['n_embd']}, ffn {h['n_ff']}, "
        f"heads {h['n_head']} (kv {h['n_head_kv']}), vocab {h['n_vocab']}"
        + (f", {h['n_expert']} experts top-{h['n_expert_used']}" if h["n_expert"] else "")
    )
    lines.append(
        f"  neurons {h['neuron_type']}, bundle align {h['bundle_align']}, predictor {'yes' if h['has_predictor'] else 'no'}, "
        f"dense down {'yes' if h['dense_down'] else 'no'}, tokenizer {data['tokenizer_bytes']} bytes, checksums {data['checksums']}"
    )
    if meta.get("synthetic"):
        lines.append(
            f"  SYNTHETIC (like {meta.get('like')}, seed {meta.get('seed')}); GGUF twin {meta.get('gguf_twin')}"
        )
    lines.append(format_measured(meta))
    return "\n".join(lines)


def run_with_progress(work: Callable[[Callable[[str, int, int], None]], dict], label: str = "pi2") -> dict:
    """Run `work(progress)` under a rich progress bar on stderr, or with plain lines (at most one
    every 10 s, with elapsed time and ETA) when stderr is not a terminal, so a log file stays
    readable. The bar appears at the first progress report, so input errors found before any work
    print as one clean line."""
    import sys

    if not sys.stderr.isatty():
        return work(PlainProgress(label, sys.stderr))
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    bar = Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                   TimeElapsedColumn(), TimeRemainingColumn(), console=Console(stderr=True))  # fmt: skip
    task = None

    def progress(what: str, done: int, total: int) -> None:
        nonlocal task
        if task is None:
            bar.start()
            task = bar.add_task(label, total=total)
        bar.update(task, description=f"{label}: {what}", completed=done, total=total)

    try:
        return work(progress)
    finally:
        if task is not None:
            bar.stop()


class PlainProgress:
    """Progress as plain lines: `label: what (done/total) 3m10s elapsed, ETA 12m40s`. The rate is
    measured from the first report, so a resumed run's ETA counts only the work left."""

    def __init__(self, label: str, stream, every_s: float = 10.0, clock=None):
        import time

        self.label, self.stream, self.every_s = label, stream, every_s
        self.clock = clock or time.monotonic
        self.t0 = self.first = None
        self.last = float("-inf")

    def __call__(self, what: str, done: int, total: int) -> None:
        now = self.clock()
        if self.t0 is None:
            self.t0, self.first = now, done
        if now - self.last < self.every_s and done < total:
            return
        self.last = now
        elapsed = now - self.t0
        rate = (done - self.first) / elapsed if elapsed > 0 else 0.0
        eta = f", ETA {_mmss((total - done) / rate)}" if rate > 0 and done < total else ""
        print(
            f"{self.label}: {what} ({done}/{total}) {_mmss(elapsed)} elapsed{eta}",
            file=self.stream,
            flush=True,
        )


def _mmss(seconds: float) -> str:
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s"
