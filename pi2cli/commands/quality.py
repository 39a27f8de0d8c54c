"""`pi2 quality`: how far a sparse configuration's next-token distributions are from the dense
model's, teacher-forced over a workload's real text (docs/QUALITY.md)."""

import json
from pathlib import Path

import click

from pi2cli.quality.runner import DEFAULT_CHUNKS, DEFAULT_CTX, QualityConfig, measure

POLICIES = ["dense", "bundle", "llmflash", "cache", "powerinfer2"]


def format_quality(q: dict) -> str:
    def ci(key: str, fmt: str) -> str:
        c = q.get(f"{key}_ci")
        return f" [{format(c[0], fmt)}, {format(c[1], fmt)}]" if c else ""

    return (f"KL {q['kl_nats']:.4f} nats/token{ci('kl_nats', '.4f')}, top-1 agreement "
            f"{q['top1_agreement']:.1%}{ci('top1_agreement', '.1%')}, perplexity {q['ppl_sparse']:.3f} vs dense "
            f"{q['ppl_dense']:.3f}: ratio {q['ppl_ratio']:.4f}{ci('ppl_ratio', '.4f')} "
            f"({q['tokens_scored']} tokens of {q['workload']}, {q['chunks']} x {q['ctx']})")  # fmt: skip


@click.command(name="quality")
@click.option("--model", "-m", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The .pi2 under test (with predictors for the sparse policies).")  # fmt: skip
@click.option("--policy", type=click.Choice(POLICIES), default="powerinfer2", show_default=True)
@click.option("--memory-budget", default=None, help="The engine's --memory-budget for the run under test.")
@click.option("--reference", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="The dense model to compare with [default: the same file under --policy dense].")  # fmt: skip
@click.option("--workload", "-w", type=click.Choice(["multi-turn", "code", "math", "role-play"]),
              default="multi-turn", show_default=True, help="Whose evaluation text to score.")  # fmt: skip
@click.option("--ctx", type=click.IntRange(4, 4096), default=DEFAULT_CTX, show_default=True,
              help="Tokens per chunk (each chunk a fresh context; its second half is scored).")  # fmt: skip
@click.option("--chunks", type=click.IntRange(1, 1000), default=DEFAULT_CHUNKS, show_default=True)
@click.option("--batch", type=click.IntRange(1, 7), default=1, show_default=True,
              help="Tokens per forward pass (below 8, so powerinfer2 never takes its dense prefill path).")  # fmt: skip
@click.option("--threads", "-t", type=click.IntRange(1, 1024), default=None)
@click.option("--engine-flag", "extra", multiple=True, help="Another pi2-engine flag for the run under test.")
@click.option("--json", "as_json", is_flag=True, help="Print the quality block as JSON.")
def command(model, policy, memory_budget, reference, workload, ctx, chunks, batch, threads, extra, as_json):
    """Score a configuration against the dense model on the same tokens: mean KL(dense || sparse) in
    nats per token, top-1 agreement and the perplexity ratio, each with a 95% bootstrap interval.

    The text is the evaluation part of the workload's records (never the part CATS calibrates on),
    cut into chunks as llama.cpp's llama-perplexity cuts them.

    \b
    Examples:
      pi2 quality -m smollm2-cats50.pi2
      pi2 quality -m smollm2-cats50.pi2 --policy powerinfer2 --memory-budget 128M --reference smollm2.pi2
    """
    cfg = QualityConfig(model=model, policy=policy, memory_budget=memory_budget, extra=list(extra),
                        reference=reference, workload=workload, ctx=ctx, chunks=chunks, batch=batch,
                        threads=threads)  # fmt: skip
    q = measure(cfg)
    click.echo(json.dumps(q) if as_json else format_quality(q))
