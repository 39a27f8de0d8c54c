"""The `pi2` command: a thin click front over plain functions.

Each command group lives in its own module under pi2cli/commands/ and exports `command`. Modules are
imported only when their command runs, so `pi2 --help` stays fast and one broken piece cannot take the
whole tool down.
"""

import importlib
import sys

import click

from pi2cli import __version__
from pi2cli.errors import Pi2Error

NOT_BUILT_EXIT = 2

# name -> one-line help shown by `pi2 --help`. Order is the order a user meets them in.
COMMANDS: dict[str, str] = {
    "build": "Build pi2-engine or llama.cpp for this host, android-arm64 or linux-arm64.",
    "devices": "List targets (this machine, adb phones, qemu-arm64) with their hardware facts.",
    "push": "Copy engine, models, plans and workloads to a device, skipping what is already there.",
    "models": "The model registry: list, show, pull, synthesize and profile models.",
    "convert": "Convert GGUF / PowerInfer GGUF / safetensors checkpoints to .pi2 (plus a GGUF twin).",
    "generate": "Generate text with pi2-engine or llama.cpp on this machine.",
    "workloads": "The dialogue, code, math and role-play workloads: list and show statistics.",
    "profile": "Measure a device's CPU, memory and storage throughput with pi2-probe (and the engine on a model).",
    "plan": "Choose cache sizes, hot set, threads and load strategy for a model, device and budget.",
    "serve": "Serve a model over OpenAI's API here or on a phone (adb forward) until Ctrl-C.",
    "bench": "Run engines x workloads on a device and record TTFT, TBT and memory.",
    "quality": "Score a sparse configuration against the dense model on real text: KL, top-1, perplexity.",
    "compare": "Compare runs side by side with speedups and confidence intervals.",
    "report": "Write a markdown and HTML report with plots from runs.",
    "results": "List and filter recorded runs in the results index.",
    "farm": "Nightly device-farm runs with regression flags.",
    "repro": "Reproduce the paper's experiments on this machine, each table beside the paper's.",
}


class CommandError(click.ClickException):
    """A Pi2Error as click's error, raised at this layer only: `pi2: error: MESSAGE`, its exit code."""

    def __init__(self, err: Pi2Error):
        super().__init__(str(err))
        self.exit_code = err.exit_code

    def show(self, file=None) -> None:
        click.echo(f"pi2: error: {self.format_message()}", err=True, file=file or sys.stderr)


class LazyGroup(click.Group):
    def invoke(self, ctx: click.Context):
        # every command runs under here (click parses a subcommand's options inside its group's invoke),
        # so this is the one place the library's error becomes click's
        try:
            return super().invoke(ctx)
        except Pi2Error as err:
            raise CommandError(err) from err

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in COMMANDS:
            return None
        module = importlib.import_module(f"pi2cli.commands.{name}")
        return module.command

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Help comes from the table above, so listing commands imports nothing.
        with formatter.section("Commands"):
            formatter.write_dl(list(COMMANDS.items()))


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="pi2")
def cli() -> None:
    """pi2: PowerInfer-2 on Android phones.

    Builds the sparse engine, pushes it and its models to phones over adb, runs the dialogue, code,
    math and role-play workloads against pi2 and the baselines (llama.cpp, LLM in a Flash, MLC-LLM),
    and turns TTFT, TBT and memory into results, comparisons and reports.

    Run `pi2 COMMAND --help` for what each command does and its options.
    """


def not_built(name: str, issue: str) -> click.Command:
    """A command that exists in the interface but is not implemented yet: says so and exits 2."""

    @click.command(
        name=name,
        context_settings={"ignore_unknown_options": True, "allow_extra_args": True},
        add_help_option=False,
        help=f"(not built yet: {issue})",
    )
    @click.pass_context
    def command(ctx: click.Context) -> None:
        click.echo(f"pi2 {name}: not built yet ({issue})", err=True)
        ctx.exit(NOT_BUILT_EXIT)

    return command


def usage_line(err: click.UsageError) -> str:
    """A click usage error as one line: what is wrong, and where to read how it should look."""
    ctx = err.ctx
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else " (see `pi2 --help`)"
    return f"pi2: error: {' '.join(err.format_message().split())}{where}"


def main() -> None:
    """Entry point: every failure is one `pi2: error: ...` line and a non-zero exit. User errors
    (Pi2Error), click usage errors (click prints three lines), OSErrors (as PATH: reason) and, as a last
    resort, any unexpected exception (its traceback only with PI2_DEBUG=1); exit 130 on Ctrl-C (click
    would say "Aborted!", exit 1), and SIGTERM / SIGHUP taken the same way (pi2cli.signals), exit 143 /
    129."""
    import contextlib
    import os

    from pi2cli import signals
    from pi2cli.outputs import os_error_text

    debug = os.environ.get("PI2_DEBUG", "") not in ("", "0")
    signals.install()
    try:
        code = cli.main(standalone_mode=False)
    except (KeyboardInterrupt, click.exceptions.Abort) as stop:
        stop = stop.__cause__ or stop if isinstance(stop, click.exceptions.Abort) else stop  # click wraps it
        name = signals.signal_name(stop)
        saved = getattr(getattr(stop, "outcome", None), "path", None)
        with contextlib.suppress(OSError):  # SIGHUP: the terminal may be gone
            click.echo(f"pi2: {'interrupted' if name == 'SIGINT' else f'stopped by {name}'}"
                       + (f" (the run is saved as aborted: {saved})" if saved else ""), err=True)  # fmt: skip
        raise SystemExit(signals.exit_code(stop)) from None
    except click.exceptions.Exit as done:
        raise SystemExit(done.exit_code) from None
    except click.UsageError as err:
        click.echo(usage_line(err), err=True)
        raise SystemExit(err.exit_code) from None
    except click.ClickException as err:
        err.show()
        raise SystemExit(err.exit_code) from None
    except Pi2Error as err:  # raised outside a command (none today): the same line
        click.echo(f"pi2: error: {err}", err=True)
        raise SystemExit(err.exit_code) from None
    except OSError as err:
        if debug:
            raise
        click.echo(f"pi2: error: {os_error_text(err)}", err=True)
        raise SystemExit(1) from None
    except Exception as err:  # a bug: still one line, the traceback on request
        if debug:
            raise
        text = " ".join(str(err).split())[:200]
        click.echo(f"pi2: error: internal error: {type(err).__name__}{': ' + text if text else ''} "
                   f"(a bug in pi2; PI2_DEBUG=1 shows the traceback)", err=True)  # fmt: skip
        raise SystemExit(1) from None
    raise SystemExit(code if isinstance(code, int) else 0)
