"""SIGTERM and SIGHUP handled as Ctrl-C is.

A CI runner, `systemd stop` and a closed terminal stop pi2 with SIGTERM or SIGHUP, whose default action
kills Python on the spot: no `finally`, no `except KeyboardInterrupt`, so the engine outlived the CLI,
the run in progress was never stored and temporary directories stayed behind. Raising Terminated (a
KeyboardInterrupt) from the handler sends those signals down the path Ctrl-C already takes: the engine
stopped first, the run stored as aborted (naming the signal), every temporary directory removed.
"""

from __future__ import annotations

import signal

HANDLED = (signal.SIGTERM, signal.SIGHUP)


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP, unwinding like Ctrl-C; `name` says which."""

    def __init__(self, signum: int):
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


def signal_name(exc: BaseException) -> str:
    """The signal behind an interruption: SIGTERM / SIGHUP, or SIGINT for a plain Ctrl-C."""
    return exc.name if isinstance(exc, Terminated) else getattr(exc, "signal_name", "SIGINT")


def exit_code(exc: BaseException) -> int:
    """What a shell reports for a process the signal ended: 128 + its number (130 for Ctrl-C)."""
    return 128 + signal.Signals[signal_name(exc)].value


def install() -> None:
    """Raise Terminated on the first SIGTERM / SIGHUP in the main thread. A repeat while pi2 stops the
    engine and stores the run is absorbed, so the cleanup it asked for runs to its end (SIGKILL still
    ends everything). A signal the parent set to be ignored (`nohup` ignores SIGHUP) stays ignored."""
    fired = []

    def handler(signum, frame):
        if fired:
            return
        fired.append(signum)
        raise Terminated(signum)

    for sig in HANDLED:
        if signal.getsignal(sig) is not signal.SIG_IGN:
            signal.signal(sig, handler)
