"""`pi2 profile`: measure a target's hardware with pi2-probe and write the profile `pi2 plan` reads.

What is measured (pi2-probe, native/src/programs/main_probe.c, run ON the target):
  - memory read bandwidth with 1 thread and with every core (`pi2-probe membw`);
  - random-read storage throughput over a large file (the model file is the natural one) at the block
    sizes in STORAGE_BLOCKS with queue depth 32, the sizes in DEEP_BLOCKS at the engine's queue depth
    (DEEP_QD: decode issues a block's misses at once, hundreds to thousands of reads), plus 4 KiB at
    queue depth 1 (`pi2-probe storage`),
    through the engine's own reader (io_uring or a pread pool, O_DIRECT when the file system allows);
  - the cores (count, and per cluster their max frequency from cpufreq and their cpu_capacity where the
    kernel has one, so big, mid and little cores can be told apart) and the total memory, from the
    target's facts (pi2cli/targets).

The profile is one JSON object (docs/PLAN.md lists its fields). It is written to NAME.partial and renamed
when complete, so a failed or interrupted probe never leaves a file that looks like a profile.
"""

from __future__ import annotations

import json
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path

from pi2cli import __version__
from pi2cli.errors import Pi2Error, failure_line

PROFILE_FORMAT = "pi2-profile"
PROFILE_VERSION = 1
STORAGE_BLOCKS = (4096, 8192, 16384, 65536)  # bytes, queue depth STORAGE_QD
STORAGE_QD = 32
# The engine keeps up to 512 reads in flight (pi2_sparse_config_default: io.queue_depth); a disk that is
# not saturated at QD 32 reads small blocks faster there (this VM's virtio disk: ~1.4x at 2.5-7 KiB).
DEEP_BLOCKS, DEEP_QD = (4096, 8192), 512
LATENCY_BLOCK, LATENCY_QD = 4096, 1
# Decode reads a block's misses as one wave: sorted by offset within one FFN block's span, sent at once,
# collected whole (sparse_ffn.c); dense waves read faster than free-running random reads there (the
# block layer merges neighbours; docs/PLAN.md). Waves of these sizes within WAVE_RANGE (about one FFN
# block of the 7B and 47B shapes) at 8 KiB: 0.4% to 12.5% of the span's blocks.
WAVE_SIZES, WAVE_BLOCK, WAVE_RANGE = (64, 256, 1024, 2048), 8192, 128 << 20
DEFAULT_SECONDS = 2.0
DEFAULT_MEMBW_MIB = 256
MEMBW_PASSES = 3
STORAGE_ROUNDS = 2

# run(argv) -> stdout of a pi2-probe command on the target; raises Pi2Error when it fails.
ProbeRunner = Callable[[list[str]], str]
# step(index, total, description) before each probe: the command's progress bar.
StepCallback = Callable[[int, int, str], None]


def probe_steps(
    threads_all: int, rounds: int = STORAGE_ROUNDS, threads_planned: int | None = None
) -> list[tuple[str, list[str]]]:
    """(description, pi2-probe arguments without --file/--seconds) for every measurement, in order. The
    storage curve is measured in `rounds` interleaved rounds (each block size's best round is kept), so a
    burst of someone else's I/O spoils one point of one round rather than the shape of the curve. Memory
    bandwidth with 1 thread, with every core, and with `threads_planned` (the compute threads `pi2 plan`
    gives cores of different speeds: its estimate reads the bandwidth at that count)."""
    steps = [("memory bandwidth, 1 thread", ["membw", "--threads", "1"])]
    for t in sorted({t for t in (threads_planned, threads_all) if t and t > 1}):
        steps.append((f"memory bandwidth, {t} threads", ["membw", "--threads", str(t)]))
    for r in range(rounds):
        for block in STORAGE_BLOCKS:
            steps.append((f"storage {block // 1024} KiB reads, QD {STORAGE_QD} (round {r + 1}/{rounds})",
                          ["storage", "--block", str(block), "--qd", str(STORAGE_QD)]))  # fmt: skip
        for block in DEEP_BLOCKS:
            steps.append((f"storage {block // 1024} KiB reads, QD {DEEP_QD} (round {r + 1}/{rounds})",
                          ["storage", "--block", str(block), "--qd", str(DEEP_QD)]))  # fmt: skip
        for n in WAVE_SIZES:
            steps.append((f"storage {WAVE_BLOCK // 1024} KiB reads in waves of {n} (round {r + 1}/{rounds})",
                          ["storage", "--wave", str(n), "--range", str(WAVE_RANGE), "--block", str(WAVE_BLOCK),
                           "--qd", str(DEEP_QD)]))  # fmt: skip
    steps.append((f"storage {LATENCY_BLOCK // 1024} KiB reads, QD {LATENCY_QD}",
                  ["storage", "--block", str(LATENCY_BLOCK), "--qd", str(LATENCY_QD)]))  # fmt: skip
    return steps


def parse_probe_json(text: str, what: str) -> dict:
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except json.JSONDecodeError:
                break
            if isinstance(out, dict):
                return out
    raise Pi2Error(f"pi2-probe {what} printed no JSON result (got {text.strip()[:120]!r})")


def measure(
    run: ProbeRunner,
    file: str,
    cores: int,
    seconds: float = DEFAULT_SECONDS,
    membw_mib: int = DEFAULT_MEMBW_MIB,
    step: StepCallback | None = None,
    threads_planned: int | None = None,
) -> dict:
    """Every probe through `run`; returns {"membw": [...], "storage": {...}}."""
    if not seconds > 0:
        raise Pi2Error(f"--seconds must be positive, got {seconds}")
    if membw_mib < 1:
        raise Pi2Error(f"--membw-mib must be at least 1, got {membw_mib}")
    membw, best, deep, waves, latency = [], {}, {}, {}, None
    steps = probe_steps(max(1, cores), threads_planned=threads_planned)
    per_point = seconds / STORAGE_ROUNDS
    for i, (desc, args) in enumerate(steps):
        if step:
            step(i, len(steps), desc)
        if args[0] == "membw":
            out = parse_probe_json(run([*args, "--mib", str(membw_mib), "--passes", str(MEMBW_PASSES), "--json"]),
                                   desc)  # fmt: skip
            membw.append({"threads": out["threads"], "gb_per_s": out["gb_per_s"],
                          "mib_per_thread": out["mib_per_thread"]})  # fmt: skip
            continue
        wave = int(args[args.index("--wave") + 1]) if "--wave" in args else 0
        latency_probe = not wave and args[4] == str(LATENCY_QD)
        secs = seconds if latency_probe else per_point
        out = parse_probe_json(run([*args, "--file", file, "--seconds", f"{secs:g}", "--json"]), desc)
        point = {k: out[k] for k in ("block", "qd", "iops", "mb_per_s", "lat_p50_us", "lat_p99_us", "reads")}
        point.update(method=out["method"], o_direct=out["o_direct"], file_bytes=out["file_bytes"])
        if wave:
            point = {"wave": wave, "range": out["range"]} | point
            if wave not in waves or point["iops"] > waves[wave]["iops"]:
                waves[wave] = point
            continue
        keep = deep if args[4] == str(DEEP_QD) else best
        if latency_probe:
            latency = point
        elif point["block"] not in keep or point["iops"] > keep[point["block"]]["iops"]:
            keep[point["block"]] = point
    curve = [best[b] for b in sorted(best)]
    drop = ("method", "o_direct", "file_bytes")
    first = curve[0]
    storage = {"file": file, "file_bytes": first["file_bytes"], "method": first["method"],
               "o_direct": first["o_direct"], "seconds_per_point": per_point, "rounds": STORAGE_ROUNDS,
               "curve": [{k: v for k, v in p.items() if k not in ("method", "o_direct", "file_bytes")}
                         for p in curve],
               "deep": [{k: v for k, v in deep[b].items() if k not in drop} for b in sorted(deep)],
               "waves": [{k: v for k, v in waves[n].items() if k not in drop} for n in sorted(waves)],
               "qd1": {k: v for k, v in latency.items() if k not in drop}}  # fmt: skip
    return {"membw": membw, "storage": storage}


def build_profile(facts: dict, measured: dict) -> dict:
    """The profile object from the target's facts and the probes' results."""
    clusters = facts.get("clusters") or []
    cores = facts.get("cores") or sum(len(c["cpus"]) for c in clusters) or 1
    profile = {
        "format": PROFILE_FORMAT,
        "version": PROFILE_VERSION,
        "created_by": f"pi2 profile {__version__}",
        "created_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "target": {
            k: facts.get(k)
            for k in ("name", "kind", "arch", "emulated", "cpu_model", "soc", "model", "storage")
        },  # fmt: skip
        "cores": {"count": int(cores), "clusters": clusters},
        "memory": {"total_bytes": facts.get("ram_bytes")},
        **measured,
    }
    if facts.get("emulated"):
        profile["note"] = "emulated target: timings are the emulator's, not the hardware's"
    return profile


def write_json_atomic(path: Path, obj: dict) -> None:
    """PATH is either absent, the old file, or complete; never written through a link (pi2cli.safe_write)."""
    from pi2cli import safe_write

    path = Path(path)
    try:
        safe_write.write_text(path, json.dumps(obj, indent=1) + "\n")
    except OSError as exc:
        raise Pi2Error(f"cannot write {path}: {exc.strerror or exc}") from None


# ------------------------------------------------------------------------------------------- targets
def target_exe(target, name: str, push_reporter: Callable[[str], None] | None = None) -> list[str]:
    """The command that runs the engine build's binary `name` (pi2-probe, pi2-engine) on `target`: the host
    build here, the arm64 build under qemu, or the binary pushed (content-checked, skipped when already
    there) to WORKDIR/bin on an adb device."""
    from pi2cli.hw.push import collect_items, engine_files, push_files

    found = [p for p in engine_files(target) if p.name == name]
    if not found:
        raise Pi2Error(f"the engine build for {target.name} has no {name}: rebuild it (make engine)")
    local = found[0]
    if target.on_this_machine:
        return [*target.command_prefix(), str(local)]
    items = collect_items(target, target.workdir, engine=[local])
    if push_reporter:
        push_reporter(f"making sure {local.name} is on {target.name}")
    push_files(target, items, target.workdir)
    return [items[0].remote]


def probe_runner(target, push_reporter: Callable[[str], None] | None = None) -> ProbeRunner:
    """A runner for pi2-probe on `target` (target_exe)."""
    from pi2cli.targets import TargetError

    exe = target_exe(target, "pi2-probe", push_reporter)

    def run(args: list[str]) -> str:
        seconds = float(args[args.index("--seconds") + 1]) if "--seconds" in args else 0.0
        try:
            done = target.sh(" ".join(shlex.quote(a) for a in [*exe, *args]), timeout=seconds + 120)
        except TargetError as exc:
            raise Pi2Error(str(exc)) from None
        if done.returncode != 0:
            why = failure_line(done.stderr or done.stdout, f"exit {done.returncode}", "pi2-probe")
            raise Pi2Error(f"pi2-probe {args[0]} on {target.name} failed: {why}")
        return done.stdout

    return run


def check_file(target, file: str) -> None:
    """The storage probe's file must exist on the target; say which machine it was looked for on."""
    if target.on_this_machine:
        p = Path(file)
        if not p.is_file():
            raise Pi2Error(f"--file {file}: no such file")
        if p.stat().st_size < 2 * max(STORAGE_BLOCKS):
            raise Pi2Error(f"--file {file}: too small to probe storage (use a large file, e.g. the model)")
    elif not target.exists(file):
        raise Pi2Error(f"--file {file}: no such file on {target.name} (it is a path on the device; "
                       f"`pi2 push -m MODEL` puts models in {target.workdir}/models/)")  # fmt: skip


def profile_target(
    device: str | None,
    file: str,
    seconds: float = DEFAULT_SECONDS,
    membw_mib: int = DEFAULT_MEMBW_MIB,
    step: StepCallback | None = None,
    message: Callable[[str], None] | None = None,
    calibrate: bool | None = None,
    calibrate_budget: int | None = None,
) -> dict:
    """Probe `device` (local, qemu-arm64 or an adb serial) and return its profile. With a model as the file
    (calibrate None: a .pi2 name), the engine's decode calibration on it too (pi2cli.plan.calibrate); a
    calibration that fails leaves the probes' profile with `decode_error` set, for the caller to write
    before it reports the error."""
    from pi2cli.plan import calibrate as cal
    from pi2cli.targets import TargetError, get_target

    try:
        target = get_target(device)
        facts = target.facts()
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    check_file(target, file)
    run = probe_runner(target, message)
    planned = default_compute_threads(facts.get("clusters") or [])
    calibrate = file.endswith(".pi2") if calibrate is None else calibrate

    def probe_step(i: int, total: int, desc: str) -> None:
        if step:
            step(i, total + int(calibrate), desc)

    measured = measure(run, file, int(facts.get("cores") or 1), seconds, membw_mib, probe_step, planned)
    profile = build_profile(facts, measured)
    if calibrate:
        threads = planned or int(profile["cores"]["count"])
        total = len(probe_steps(max(1, int(facts.get("cores") or 1)), threads_planned=planned)) + 1
        if step:
            step(total - 1, total, f"decode calibration: pi2-engine on {Path(file).name}, {threads} threads")
        try:
            exe = target_exe(target, "pi2-engine", message)
            profile["decode"] = cal.calibrate(target, exe, file, profile["storage"]["file_bytes"], threads,
                                              facts.get("ram_bytes"), pick_membw(profile, threads),
                                              budget=calibrate_budget)  # fmt: skip
        except Pi2Error as exc:
            profile["decode_error"] = str(exc)
    return profile


# --------------------------------------------------------------------------------------------- reading
def read_json_file(path: str | os.PathLike, kind: str) -> object:
    """The JSON in a profile or plan file; a missing or malformed file is one Pi2Error line."""
    path = Path(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise Pi2Error(f"{kind} {path}: {exc.strerror or exc}") from None
    except json.JSONDecodeError as exc:
        raise Pi2Error(f"{kind} {path}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except UnicodeDecodeError as exc:
        raise Pi2Error(f"{kind} {path}: not UTF-8 text (byte {exc.start}); is this a {kind} file?") from None
    except (ValueError, RecursionError) as exc:  # an int of 5000 digits, nesting deeper than Python's stack
        raise Pi2Error(f"{kind} {path}: not usable JSON ({str(exc)[:80] or type(exc).__name__})") from None


def check_format(data: object, where: str, kind: str, what: str, fmt: str, version: int) -> None:
    """The "format" and "version" keys every profile and plan starts with."""
    if not isinstance(data, dict) or data.get("format") != fmt:
        raise Pi2Error(f'{where}: not a {what} (no "format": "{fmt}"; write one with `pi2 {kind}`)')
    if data.get("version") != version:
        raise Pi2Error(f"{where}: {kind} version {data.get('version')!r}, this pi2 reads {version}")


def load_profile(path: str | os.PathLike) -> dict:
    """A profile written by `pi2 profile`, checked enough that the planner can trust its fields."""
    data = read_json_file(path, "profile")
    validate_profile(data, str(path))
    return data


def validate_profile(data: object, where: str = "profile") -> None:
    check_format(data, where, "profile", "pi2 hardware profile", PROFILE_FORMAT, PROFILE_VERSION)

    def positive(v) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and v > 0

    cores = data.get("cores")
    if not isinstance(cores, dict) or not isinstance(cores.get("count"), int) or cores["count"] < 1:
        raise Pi2Error(f"{where}: cores.count must be a positive integer")
    for c in cores.get("clusters") or []:
        if not (isinstance(c, dict) and isinstance(c.get("cpus"), list) and positive(c.get("max_mhz"))):
            raise Pi2Error(f"{where}: each of cores.clusters needs cpus (a list) and max_mhz")
        if "capacity" in c and not positive(c["capacity"]):
            raise Pi2Error(f"{where}: cores.clusters capacity must be a positive number")
        if not all(isinstance(cpu, int) and not isinstance(cpu, bool) and cpu >= 0 for cpu in c["cpus"]):
            raise Pi2Error(f"{where}: cores.clusters cpus must be CPU numbers")
    membw = data.get("membw")
    if (
        not isinstance(membw, list)
        or not membw
        or not all(
            isinstance(m, dict) and positive(m.get("gb_per_s")) and positive(m.get("threads")) for m in membw
        )
    ):
        raise Pi2Error(f"{where}: membw must list {{threads, gb_per_s}} measurements")
    storage = data.get("storage")
    curve = storage.get("curve") if isinstance(storage, dict) else None
    if not isinstance(curve, list) or not curve:
        raise Pi2Error(f"{where}: storage.curve is missing (profile with `pi2 profile --file MODEL`)")
    for p in curve:
        if not (isinstance(p, dict) and positive(p.get("block")) and positive(p.get("iops"))
                and positive(p.get("mb_per_s"))):  # fmt: skip
            raise Pi2Error(f"{where}: each storage.curve point needs block, iops and mb_per_s > 0")
    blocks = [p["block"] for p in curve]
    if len(set(blocks)) != len(blocks):
        raise Pi2Error(f"{where}: storage.curve measures block {max(blocks, key=blocks.count)} twice")


# ------------------------------------------------------------------ what a profile says of the cores
def cluster_speed(c: dict) -> tuple:
    """How fast a cluster's cores are: capacity first (arm64's cpu_capacity weighs the microarchitecture,
    so two designs at one clock are told apart), max frequency next."""
    return (c.get("capacity") or 0, c["max_mhz"])


def default_compute_threads(clusters: list[dict]) -> int | None:
    """The planner's compute threads on clusters of different speeds: the big and mid cores less the one
    that issues the I/O (at least 1); None where the cores are all alike (then: every core)."""
    clusters = [c for c in clusters if c.get("cpus")]
    if len(clusters) <= 1:
        return None
    fast = sum(len(c["cpus"]) for c in sorted(clusters, key=cluster_speed)[1:])
    return max(1, fast - 1)


def pick_membw(profile: dict, threads: int) -> float:
    """Read bandwidth with `threads` threads: the measured row, else linear between the rows around it
    (bandwidth saturates as threads grow, so this errs low), else the nearest row."""
    rows = sorted(profile["membw"], key=lambda r: r["threads"])
    below = [r for r in rows if r["threads"] <= threads]
    above = [r for r in rows if r["threads"] > threads]
    if below and above and below[-1]["threads"] != threads:
        lo, hi = below[-1], above[0]
        f = (threads - lo["threads"]) / (hi["threads"] - lo["threads"])
        return (float(lo["gb_per_s"]) + f * (float(hi["gb_per_s"]) - float(lo["gb_per_s"]))) * 1e9
    return float((below[-1] if below else rows[0])["gb_per_s"]) * 1e9
