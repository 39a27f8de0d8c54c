"""`pi2 serve`: the click front of pi2cli.engines.pi2.serve (all logic lives there)."""

from __future__ import annotations

import json
from pathlib import Path

import click

POLICIES = ["dense", "bundle", "llmflash", "cache", "powerinfer2"]


@click.command(name="serve")
@click.option("--model", "-m", required=True,
              help="The .pi2 model, or a registry name found in the local store (`pi2 models list`).")  # fmt: skip
@click.option("--device", "-d", default=None,
              help="Where the server runs: local (default), or an adb serial / HOST:PORT (`pi2 devices`); "
                   "engine, model and plan are pushed there first when missing.")  # fmt: skip
@click.option("--memory-budget", default=None,
              help="Memory budget of the whole server, e.g. 2G: the engine sizes its neuron cache to keep its "
                   "peak RSS under it; here it also runs in a memory cgroup of that size where one is usable.")  # fmt: skip
@click.option("--port", default=8080, show_default=True, type=click.IntRange(0, 65535),
              help="Where the engine listens (127.0.0.1 of its machine; the phone's for --device); 0: any free one.")  # fmt: skip
@click.option("--host-port", default=None, type=click.IntRange(0, 65535),
              help="--device: the port here that `adb forward` sends to the engine's; 0: any free one.  "
                   "[default: the engine's port]")  # fmt: skip
@click.option("--api-key", default=None, envvar="PI2_API_KEY", show_envvar=True,
              help="Require 'Authorization: Bearer KEY' on /v1/ requests.")  # fmt: skip
@click.option("--policy", type=click.Choice(POLICIES), default=None,
              help="Sparse policy.  [default: powerinfer2 when the model has activation predictors, else "
                   "dense; a --plan's own]")  # fmt: skip
@click.option("--plan", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Run with this plan (`pi2 plan --out`); --memory-budget and --threads override its.")  # fmt: skip
@click.option(
    "--threads", "-t", type=click.IntRange(1), default=None, help="Compute threads [default: all cores]."
)
@click.option("--ctx", type=click.IntRange(16, 1 << 20), default=None,
              help="KV cache positions (the longest conversation).  [default: the engine's]")  # fmt: skip
@click.option("--chat-template", type=click.Choice(["chatml", "llama2", "llama3"]), default=None,
              help="How chats are rendered.  [default: the model's own; SmolLM2 converted from a plain GGUF "
                   "needs chatml]")  # fmt: skip
@click.option("--json", "as_json", is_flag=True,
              help="Once it serves, print one JSON object (url, pid, device, port, host_port, model, policy, "
                   "budget, curl) on stdout.")  # fmt: skip
def command(model, device, memory_budget, port, host_port, api_key, policy, plan, threads, ctx, chat_template,
            as_json):  # fmt: skip
    """Serve a model over OpenAI's API (pi2-engine serve) until Ctrl-C.

    Any OpenAI client talks to it: base_url http://127.0.0.1:PORT/v1, routes /v1/chat/completions and
    /v1/completions (streamed or not), /v1/models, /health (docs/ENGINE.md, `serve`). It listens on
    loopback only. With --device the engine runs on the phone, bound to the phone's loopback, and
    `adb forward` brings it here. Ctrl-C (or SIGTERM) stops the engine -- on the phone too, by its pid,
    checked gone -- removes the forward and exits 0.

    \b
    Examples:
      pi2 serve -m models/smollm2/model.pi2 --chat-template chatml
      pi2 serve -m smollm2-135m --device R5CT1234 --memory-budget 1G
      pi2 serve -m synth/model.pi2 --device 127.0.0.1:5555 --port 0 --host-port 0 --json
      curl -s http://127.0.0.1:8080/v1/chat/completions -H 'Content-Type: application/json' \\
           -d '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}'
    """
    from pi2cli.engines.pi2.serve import ServeConfig, serve
    from pi2cli.errors import Pi2Error
    from pi2cli.units import format_size, parse_size

    if host_port is not None and device in (None, "local"):
        raise Pi2Error("--host-port goes with --device (the port of an adb forward); here use --port")
    cfg = ServeConfig(model=model, device=device, port=port, host_port=host_port, api_key=api_key,
                      memory_budget=parse_size(memory_budget) if memory_budget else None, policy=policy,
                      plan=plan, threads=threads, ctx=ctx, chat_template=chat_template)  # fmt: skip

    def echo(line: str) -> None:
        click.echo(line, err=True)

    def ready(s) -> None:
        if as_json:
            click.echo(json.dumps(s.to_json()))
            return
        budget = ""
        if s.budget.get("limit_bytes"):
            held = "" if s.budget.get("enforced") else ", held by the engine alone"
            budget = f", memory budget {format_size(s.budget['limit_bytes'])}{held}"
        click.echo(
            f"pi2 serve: {s.model} on {s.device} (policy {s.policy}{budget}, pid {s.pid}) at {s.url}/v1"
        )
        click.echo(f"  {s.curl()}")
        click.echo("Ctrl-C stops it.")

    serve(cfg, ready, echo)
