"""`pi2 bench --run-timeout`: a time limit on one run, the engine stopped once it is passed.

A run past its limit unwinds the way Ctrl-C unwinds one (pi2cli.signals): RunTimedOut is a
KeyboardInterrupt that SIGALRM raises in the main thread, so wherever the bench is waiting (an engine
loading, a turn's tokens, llama-bench's process, a pp-tg cell) the path every stop already takes runs:
the engine process stopped (its process group here, `kill` on an adb device), the run saved with the
turns it finished, as `timeout` with the reason. Unlike Ctrl-C, the bench then goes on with the next
run. A timer thread that killed the engine instead would race the thread reading its output, and
could not stop an engine that is still loading.
"""

from __future__ import annotations

import signal
import threading
import time

from pi2cli.errors import Pi2Error


class RunTimedOut(KeyboardInterrupt):
    """The run passed its --run-timeout; `reason` is the run's one-line error."""

    def __init__(self, limit_s: float, elapsed_s: float, where: str):
        self.limit_s, self.elapsed_s, self.where = limit_s, elapsed_s, where
        self.reason = (f"timeout: the run passed its --run-timeout of {limit_s:g} s ({elapsed_s:.1f} s, {where}); "
                       f"the engine process was stopped")  # fmt: skip
        super().__init__(self.reason)


def check_run_timeout(seconds: float | None) -> None:
    """Refuse a limit that cannot work, before anything runs."""
    if seconds is None:
        return
    if not seconds > 0:
        raise Pi2Error(f"--run-timeout must be above 0 seconds, not {seconds:g}")
    if threading.current_thread() is not threading.main_thread():
        raise Pi2Error("--run-timeout needs the bench in the main thread (it stops a run with SIGALRM)")


class RunLimit:
    """`with RunLimit(seconds) as limit:` around one run's engine; None: no limit. `limit.where` says what
    the run is doing (the reason names it); set it as the run goes."""

    def __init__(self, seconds: float | None):
        self.seconds = seconds
        self.where = "starting the engine"
        self._previous = None
        self._started = 0.0
        self._fired = False

    def _fire(self, signum, frame) -> None:
        if self._fired:  # once: the cleanup it starts runs to its end
            return
        self._fired = True
        raise RunTimedOut(self.seconds, time.monotonic() - self._started, self.where)

    def __enter__(self) -> RunLimit:
        if self.seconds is not None:
            check_run_timeout(self.seconds)
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            self._started = time.monotonic()
            signal.setitimer(signal.ITIMER_REAL, self.seconds)
        return self

    def __exit__(self, *exc) -> bool:
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL if self._previous is None else self._previous)
        return False
