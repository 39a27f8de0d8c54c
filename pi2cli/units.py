"""Sizes in one place: parse what a user types ("8G", "1.5GiB", "512M", "19GB") and print bytes the way they read.

Every size the host takes (memory budgets on `pi2 bench` and `pi2 plan`, a plan's "memory_budget") goes
through parse_size, so they all accept the same spellings and share one sane upper bound: a budget
above MAX_MEMORY_BYTES is a typo (no phone or host has 16 TiB of memory), and letting it through
stores numbers SQLite cannot hold and writes plans the engine refuses. The units are read as
pi2-engine's own parser (native/src/base/common.c) reads them: a bare K/M/G/T and KiB/MiB/GiB/TiB are
powers of 1024 (what a memory budget is usually meant as), kB/MB/GB/TB powers of 1000 (as a phone's
spec sheet or a disk says them), so `19GB` is 19e9 bytes, 17.7 GiB, never 19 GiB.
"""

from __future__ import annotations

import math
import re

from pi2cli.errors import Pi2Error

KiB, MiB, GiB, TiB = 1 << 10, 1 << 20, 1 << 30, 1 << 40
# Below 4 MiB a memory cgroup cannot even start the engine's process; nothing runs under such a budget.
MIN_MEMORY_BYTES = 4 * MiB
MAX_MEMORY_BYTES = 16 * TiB

# digits, an optional fraction, an optional K/M/G/T, an optional "iB" (binary) or "B" (decimal after a
# unit letter, bytes alone). No exponents, no hex: the engine reads these too and "1e3" means nothing to
# a person typing a budget.
_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*([kmgt]?)(ib|b)?$", re.I)
_SCALE = {"": 1, "k": KiB, "m": MiB, "g": GiB, "t": TiB}
_DECIMAL = {"": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(
    text: str | int,
    *,
    what: str = "--memory-budget",
    minimum: int = MIN_MEMORY_BYTES,
    maximum: int = MAX_MEMORY_BYTES,
) -> int:
    """'8G', '512M', '1.5GiB', '19GB', '1073741824' (or an int) -> bytes, within [minimum, maximum], else
    one Pi2Error line naming `what`. G/GiB = 2^30, GB = 10^9 (and so for K, M, T)."""
    if isinstance(text, bool):
        raise Pi2Error(f"{what} {text!r}: not a size (use e.g. 8G, 512M, 1.5GiB, 19GB)")
    if isinstance(text, int):
        value = text
    else:
        m = _SIZE_RE.match(str(text).strip())
        if not m:
            raise Pi2Error(f"{what} {str(text)!r:.60}: not a size (use e.g. 8G, 512M, 1.5GiB, 19GB)")
        number, unit, suffix = m.group(1), m.group(2).lower(), (m.group(3) or "").lower()
        if suffix == "ib" and not unit:
            raise Pi2Error(f"{what} {str(text)!r:.60}: not a size (use e.g. 8G, 512M, 1.5GiB, 19GB)")
        scale = (_DECIMAL if suffix == "b" else _SCALE)[unit]  # "GB": 10^9; "G", "GiB": 2^30
        # Whole numbers stay exact ints (no float rounding of 2^53+ byte counts); fractions via float.
        value = int(number) * scale if "." not in number else math.floor(float(number) * scale)
    return check_size(value, what=what, minimum=minimum, maximum=maximum, shown=str(text))


def check_size(
    value: int,
    *,
    what: str = "memory budget",
    minimum: int = MIN_MEMORY_BYTES,
    maximum: int = MAX_MEMORY_BYTES,
    shown: str | None = None,
) -> int:
    """The one "too small" / "too large" rule for a size in bytes (a budget parsed here, or one a
    library caller passes as a number); returns it, else one Pi2Error line naming `what`."""
    shown = shown if shown is not None else str(value)
    if value < minimum:
        raise Pi2Error(f"{what} {shown!r:.60}: too small (at least {format_size(minimum)})")
    if value > maximum:
        raise Pi2Error(f"{what} {shown!r:.60}: too large (at most {format_size(maximum)})")
    return value


def format_size(n: float | None, *, none: str = "unlimited") -> str:
    """Bytes in the largest unit that keeps the number at least 1: "96 MiB", "1.5 GiB", "512 B".
    Whole numbers print without decimals, others with up to three significant digits."""
    if n is None:
        return none
    n = float(n)
    for unit, scale in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)):
        if abs(n) >= scale:
            return f"{_number(n / scale)} {unit}"
    return f"{_number(n)} B"


def _number(x: float) -> str:
    if x == int(x):
        return str(int(x))
    return f"{x:.3g}" if abs(x) < 100 else f"{x:.0f}"


def describe_size(n: int) -> str:
    """Bytes as a person checks a budget they typed: "19 GB = 17.7 GiB" where the number is a whole
    count of decimal units, else format_size's binary reading ("8 GiB"), so which unit was read is plain."""
    binary = format_size(n)
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6)):
        if n >= scale and n % scale == 0 and n % (1 << 20):
            return f"{n // scale} {unit} = {binary}"
    return binary
