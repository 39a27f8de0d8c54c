"""What a pi2-engine build takes, from the engine itself: `pi2-engine capabilities --json` (flags per
command, plan keys, policies, the engine's defaults, kernel levels, events; docs/ENGINE.md). The host asks once per build instead of
keeping its own lists, so a flag or plan key added to the engine's option table is known here at once.

The host and the engine ship at one commit, so the host build answers for every build of it (a phone's
too, which cannot run here): there is no other version of the engine to ask about.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from pi2cli.errors import Pi2Error, failure_line
from pi2cli.paths import host_build_dir

_cache: dict[tuple, dict] = {}


def capabilities(binary: Path) -> dict:
    """`binary capabilities --json`, remembered per binary version; Pi2Error (one line) when the build
    does not answer with it."""
    binary = Path(binary)
    st = binary.stat()
    key = (str(binary), st.st_size, st.st_mtime_ns)
    if key not in _cache:
        try:
            done = subprocess.run([str(binary), "capabilities", "--json"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, errors="replace", timeout=60)  # fmt: skip
            caps = json.loads(done.stdout) if done.returncode == 0 else None
        except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
            caps = None
        if not isinstance(caps, dict) or not isinstance(caps.get("flags"), dict):
            raise Pi2Error(
                f"{binary} does not answer `capabilities --json`: rebuild it (make engine)", exit_code=2
            )
        _cache[key] = caps
    return _cache[key]


def host_engine(binary: Path | None = None, why: str = "pi2 asks it") -> Path:
    """The host build of pi2-engine (or `binary`); a missing one is one line saying how to build it."""
    binary = Path(binary) if binary else host_build_dir() / "pi2-engine"
    if not binary.is_file():
        raise Pi2Error(f"{binary} is not built: run `make setup` (or `pi2 build`); {why}", exit_code=2)
    return binary


def plan_keys(binary: Path | None = None) -> tuple[str, ...]:
    """The settings a plan file may carry, in the engine's order (plan.c's table), from the host build."""
    binary = host_engine(binary, "pi2 asks it which plan keys it takes")
    keys = capabilities(binary).get("plan_keys")
    if not isinstance(keys, list) or not keys:
        raise Pi2Error(
            f"{binary} does not list its plan keys (`capabilities --json`): rebuild it (make engine)"
        )
    return tuple(str(k) for k in keys)


def engine_defaults(binary: Path | None = None) -> dict[str, float]:
    """The engine's own defaults the planner works with (session_options.c's pi2_defaults: hot_fraction,
    hot_share, cluster, queue_depth, read_align, ctx, ...), from the host build's `capabilities --json`.
    The host states none of them itself, so a changed default reaches the planner at the next build."""
    binary = host_engine(binary, "pi2 asks it for its defaults")
    d = capabilities(binary).get("defaults")
    if not isinstance(d, dict) or not d:
        raise Pi2Error(
            f"{binary} does not publish its defaults (`capabilities --json`): rebuild it (`pi2 build`)"
        )
    return {str(k): (int(v) if float(v).is_integer() else float(v)) for k, v in d.items()}


def engine_default(name: str) -> float:
    """One of engine_defaults()."""
    d = engine_defaults()
    if name not in d:
        raise Pi2Error(f"the host's pi2-engine publishes no default {name!r}: rebuild it (`pi2 build`)")
    return d[name]


def check_plan(path: str | Path, binary: Path | None = None) -> dict:
    """The engine's verdict on a plan file (`pi2-engine size --plan FILE --json`: the plan's settings
    go through the engine's own parser, as `generate --plan` would take them): {"policy",
    "memory_budget_bytes", "threads"}. A plan the engine refuses is its one line as a Pi2Error."""
    binary = host_engine(binary, "pi2 asks it whether a plan file is valid")
    try:
        done = subprocess.run([str(binary), "size", "--plan", str(path), "--json"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=60)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise Pi2Error(f"plan {path}: pi2-engine could not check it ({exc})") from None
    if done.returncode != 0:
        why = failure_line(done.stderr, "refused", "pi2-engine")
        raise Pi2Error(why if str(path) in why else f"plan {path}: {why}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise Pi2Error(f"plan {path}: pi2-engine size gave no JSON: rebuild it (`pi2 build`)") from None


def engine_size(facts: dict, flags: list[str], binary: Path | None = None) -> dict:
    """`pi2-engine size --facts FACTS --json FLAGS...` from the host build: the engine's own fixed region,
    cache and hot/cold split for a model's shape (sparse_size.c, the functions the engine sizes itself
    with when it opens). A budget the engine finds too small comes back as {"error", "min_budget_bytes"}."""
    import tempfile

    binary = host_engine(binary, "the planner asks it how it sizes its cache")
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="pi2-facts-") as f:
        json.dump(facts, f)
        f.flush()
        done = subprocess.run([str(binary), "size", "--facts", f.name, *flags, "--json"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=120)  # fmt: skip
    try:
        out = json.loads(done.stdout)
    except json.JSONDecodeError:
        why = failure_line(done.stderr, "no output", "pi2-engine")
        raise Pi2Error(f"pi2-engine size failed: {why}") from None
    if done.returncode != 0 and "error" not in out:
        out["error"] = failure_line(done.stderr, "failed", "pi2-engine")
    return out
