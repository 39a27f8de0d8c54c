"""The one budget rule: the smallest memory budget is the engine's own `pi2-engine size`, for every path.

`pi2-engine size` (native/src/engine/size_cmd.c over sparse_size.c, the functions the engine sizes itself with
when it opens) answers, for a policy, a context, a thread count and the budget itself, whether the
budget holds the fixed region and `min_budget_bytes`: measured on a .pi2 file (`-m FILE`: the model
opened as chat opens it) or estimated for a registry shape (`--facts`). The budget is part of the
question: the batch chat opens with (so the scratch) follows it, and with no budget at all the engine
plans for the whole model resident (a 2-layer 8192-neuron model: 61 MiB smallest asked without a
budget, 33 MiB asked at 38 MiB, where it runs).
`pi2 bench` (every budget, before anything is pushed or run), `pi2 plan` (a file or a registry shape)
and `pi2 farm check` (every model x budget of the matrix) ask it with the settings the run will have and
refuse a budget below it in one line naming the minimum, so one budget never runs on one path and fails
on another, and no engine of a comparison runs under a budget another refuses. Each sparse policy has
its own minimum (powerinfer2 stages prefill chunks, llmflash does not); a comparison needs the largest
of its engines'. llama.cpp and pi2's dense policy have none of their own: only the cgroup holds them.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import subprocess
from pathlib import Path

from pi2cli import safe_write
from pi2cli.errors import Pi2Error, failure_line
from pi2cli.units import describe_size

SPARSE = ("powerinfer2", "llmflash", "cache", "bundle")


def _size(args: list[str], binary: Path | None) -> dict:
    from pi2cli.paths import host_build_dir

    binary = Path(binary) if binary else host_build_dir() / "pi2-engine"
    if not binary.is_file():
        raise Pi2Error(f"{binary} is not built (run `make engine`): pi2 asks it for the smallest budget",
                       exit_code=2)  # fmt: skip
    try:
        done = subprocess.run([str(binary), "size", *args, "--json"], stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, errors="replace", timeout=300)  # fmt: skip
    except (OSError, subprocess.SubprocessError) as exc:
        raise Pi2Error(f"pi2-engine size failed: {exc}") from None
    return _parse(done.stdout, done.stderr, "")


def _parse(stdout: str, stderr: str, where: str) -> dict:
    """One `size --json` answer; a missing one or one without a minimum is one Pi2Error line."""
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = failure_line(stderr, "no output", "pi2-engine")
        raise Pi2Error(f"pi2-engine size{where} failed: {why}") from None
    if not isinstance(out, dict) or not out.get("min_budget_bytes"):
        why = out.get("error") if isinstance(out, dict) else None
        raise Pi2Error(f"pi2-engine size{where} gave no smallest budget: {why or 'no answer'}")
    return out


def _answer(out: dict) -> tuple[int, bool]:
    """(min_budget_bytes, whether the budget asked fits) of one answer ("error": it does not)."""
    return int(out["min_budget_bytes"]), "error" not in out


def _settings(policy: str, ctx: int | None, threads: int | None, budget: int | None) -> list[str]:
    args = ["--policy", policy]
    if budget:
        args += ["--memory-budget", str(int(budget))]
    if ctx:
        args += ["--ctx", str(int(ctx))]
    if threads:
        args += ["--threads", str(int(threads))]
    return args


Answers = dict[str, tuple[int, bool]]  # policy -> (smallest budget in bytes, whether the budget fits)


def minimums_for_file(model: Path, policies, ctx: int | None, threads: int | None, budget: int | None,
                      binary: Path | None = None) -> Answers:  # fmt: skip
    """The engine's answer for a .pi2 file and `budget`, per sparse policy (others have no minimum).

    The engine measures what the process holds when it opens (VmRSS), which moves by ~0.1 MiB from one
    open to the next; so each answer is kept (cache_dir()/min-budgets.json, keyed by the file, the
    engine binary and the settings) and every path reads the same measurement, not a fresh one."""
    from pi2cli.paths import cache_dir, host_build_dir

    binary = Path(binary) if binary else host_build_dir() / "pi2-engine"
    store = cache_dir() / "min-budgets.json"
    try:
        known = json.loads(store.read_text())
    except (OSError, ValueError):
        known = {}
    known = known if isinstance(known, dict) else {}
    out, changed = {}, False
    for p in dict.fromkeys(policies):
        if p not in SPARSE:
            continue
        key = "|".join(str(x) for x in (_stamp(model), _stamp(binary), p, ctx, threads, budget))
        if not (isinstance(known.get(key), list) and len(known[key]) == 2):
            known[key] = list(_answer(_size(["-m", str(model), *_settings(p, ctx, threads, budget)], binary)))
            changed = True
        out[p] = (int(known[key][0]), bool(known[key][1]))
    if changed:
        known = dict(list(known.items())[-256:])  # the newest answers: files come and go (tests' temp models)
        with contextlib.suppress(OSError):
            store.parent.mkdir(parents=True, exist_ok=True)
            safe_write.write_text(store, json.dumps(known))  # never through a link planted beside it
    return out


def _stamp(path: Path) -> str:
    """A file as it is now: its path, size and modification time (a rebuilt engine or a new model differs)."""
    try:
        st = Path(path).stat()
    except OSError:
        return str(path)
    return f"{Path(path).resolve()}:{st.st_size}:{st.st_mtime_ns}"


def minimums_for_facts(facts: dict, policies, ctx: int | None, threads: int | None, budget: int | None,
                       binary: Path | None = None) -> Answers:  # fmt: skip
    """The same for a model known by its shape (a registry entry): the engine's estimate."""
    import tempfile

    out = {}
    with tempfile.NamedTemporaryFile("w", suffix=".json", prefix="pi2-facts-") as f:
        json.dump(facts, f)
        f.flush()
        for p in dict.fromkeys(policies):
            if p in SPARSE:
                out[p] = _answer(_size(["--facts", f.name, *_settings(p, ctx, threads, budget)], binary))
    return out


def _mib(n: int) -> str:
    """Rounded up (to 0.1 MiB, or 0.01 GiB from 1 GiB on), so the number printed is a budget that works."""
    if n >= 1 << 30:
        return f"{-(-n * 100 // (1 << 30)) / 100:.2f} GiB"
    return f"{-(-n * 10 // (1 << 20)) / 10:.1f} MiB"


def refusal(budget: int, answers: Answers, what: str, ctx: int | None, threads: int | None) -> str | None:
    """The one line that refuses `budget`, or None when every policy fits in it."""
    if all(fits for _, fits in answers.values()):
        return None
    minimums = {p: least if fits else max(least, budget + 1) for p, (least, fits) in answers.items()}
    need_policy = max(minimums, key=minimums.get)
    others = ", ".join(f"{p} {_mib(v)}" for p, v in minimums.items() if p != need_policy)
    at = ", ".join(x for x in (f"--ctx {ctx}" if ctx else "", f"--threads {threads}" if threads else "") if x)
    return (f"--memory-budget {describe_size(budget)} is below the smallest budget pi2-engine runs {what} in: "
            f"{_mib(minimums[need_policy])} ({need_policy}{'; ' + others if others else ''}"
            f"{'; at ' + at if at else ''}; `pi2-engine size`)")  # fmt: skip


def bench_policies(engines: list[str], model_pi2: Path | None) -> list[str]:
    """The sparse policies a bench's engines run: llmflash always, pi2 powerinfer2 on a model with
    predictors (else dense, which has no minimum of its own)."""
    out = []
    if "llmflash" in engines:
        out.append("llmflash")
    if "pi2" in engines and model_pi2 is not None and Path(model_pi2).is_file():
        from pi2cli.models.pi2file import Pi2File

        try:
            if Pi2File(model_pi2, verify=False).header.has_predictor:
                out.append("powerinfer2")
        except (ValueError, OSError):
            pass  # the engine says what is wrong with the file when it opens it
    return out


def check_bench(engines: list[str], model_pi2: Path | None, budgets, ctx: int | None, threads: int | None,
                name: str = "") -> None:  # fmt: skip
    """`pi2 bench`: refuse (one Pi2Error line) any budget below its engines' smallest, before any run."""
    given = [b for b in budgets if b is not None]
    policies = bench_policies(engines, model_pi2)
    if not given or not policies:
        return
    for budget in given:
        answers = minimums_for_file(model_pi2, policies, ctx, threads, budget)
        line = refusal(budget, answers, name or Path(model_pi2).name, ctx, threads)
        if line:
            raise Pi2Error(line)


def farm_refusals(farm) -> list[str]:
    """`pi2 farm check`: one line per model x budget of the matrix below the smallest budget of the
    matrix's engines (all of them, so a night never runs one engine where another is refused), at the
    context each workload's cells will run with (the bench's context_for) and the farm's threads."""
    from pi2cli.model_files import context_for, model_display_name, resolve_model
    from pi2cli.workloads import load_workload

    given = [b for b in farm.budgets if b is not None]
    lines = []
    for model in farm.models:
        path = Path(model)
        if not given or path.suffix != ".pi2" or not path.is_file():
            continue  # a missing file is reported on its own; a .gguf runs no sparse policy
        policies = bench_policies(farm.engines, path)
        if not policies:
            continue
        template = resolve_model(str(path), convert_missing_pi2=False).template
        for workload in farm.workloads:
            ctx = context_for(
                load_workload(workload, farm.conversations, farm.seed or None), template, farm.n_gen
            )
            for budget in given:
                answers = minimums_for_file(path, policies, ctx, farm.threads, budget)
                line = refusal(budget, answers, model_display_name(path), ctx, farm.threads)
                if line:
                    lines.append(f"model {model}, workload {workload}: {line}")
    return lines


def check_on_target(
    target, prepared: list, budgets, ctx: int | None, threads: int | None, name: str = ""
) -> None:
    """A target that runs another build than this machine's (an arm64 phone, an emulator, whose
    /proc/self/status also counts the emulator's pages) is asked through its own engine, on the file
    pushed there: its answer, not this machine's, is what the engine will hold to when it opens. The
    test daemon and x86-64 emulators run this machine's build on the same file: the answer above holds."""
    import platform

    from pi2cli.targets.base import normalize_arch

    given = [b for b in budgets if b is not None]
    engine = next((p for p in prepared if p.driver.name in ("pi2", "llmflash")), None)
    same_build = target.arch == normalize_arch(platform.machine()) and not getattr(target, "emulated", False)
    if not given or engine is None or target.native_here or same_build:
        return
    policies = bench_policies([p.driver.name for p in prepared], engine.model_local)
    if target.on_this_machine:  # qemu-user: the cross build through the emulator
        exe = [*target.command_prefix(), str(engine.driver.local_binary(target))]
    else:
        exe = [f"{engine.binary_dir}/pi2-engine"]
    for budget in given:
        answers = {
            p: size_on_target(target, exe, engine.model_remote, p, ctx, threads, budget) for p in policies
        }
        line = refusal(
            budget, answers, f"{name or Path(engine.model_local).name} on {target.name}", ctx, threads
        )
        if line:
            raise Pi2Error(line)


def size_on_target(target, exe: list[str], model: str, policy: str, ctx: int | None, threads: int | None,
                   budget: int | None) -> tuple[int, bool]:  # fmt: skip
    """The engine's answer on `target` itself (`exe`: its pi2-engine command there, `model`: the file there):
    (min_budget_bytes, whether `budget` fits)."""
    from pi2cli.targets.base import TargetError

    argv = [*exe, "size", "-m", model, *_settings(policy, ctx, threads, budget), "--json"]
    try:
        done = target.sh(" ".join(shlex.quote(a) for a in argv), timeout=600)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    return _answer(_parse(done.stdout, done.stderr, f" on {target.name}"))
