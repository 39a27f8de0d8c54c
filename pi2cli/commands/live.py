"""The base of the commands' progress displays: a rich live view on a terminal, plain lines elsewhere."""

from __future__ import annotations


class LiveDisplay:
    """`live` is the rich live object (a status line, progress bars) when stderr is a terminal, None
    otherwise; the display shows it for the duration of its with-block, so the terminal is restored
    however the command ends."""

    live = None

    def __enter__(self):
        if self.live:
            self.live.__enter__()
        return self

    def __exit__(self, *exc):
        if self.live:
            self.live.__exit__(*exc)
