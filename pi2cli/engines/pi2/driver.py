"""The pi2 engine's driver: `pi2-engine chat` sessions on any target (chat.py) for `pi2 bench`, and
one turn of one for `pi2 generate` (engines/generate.py); every argv from args.py."""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from pi2cli.engines.base import Driver
from pi2cli.engines.pi2.args import engine_argv
from pi2cli.engines.pi2.chat import HOW, Pi2ChatSession, open_chat_session
from pi2cli.engines.pi2.events import parse_events
from pi2cli.errors import Pi2Error
from pi2cli.paths import host_build_dir


def engine_binary() -> Path:
    path = host_build_dir() / "pi2-engine"
    if not path.is_file():
        raise Pi2Error(f"{path} is not built (run `make engine`)", exit_code=2)
    return path


def model_has_predictor(model: Path) -> bool | None:
    """The .pi2 header's predictor flag (what `pi2-engine info --json` prints as has_predictor); None
    when the header cannot be read, so the engine itself reports what is wrong with the file (the run
    is then on record as failed with the engine's own error)."""
    from pi2cli.models.pi2file import Pi2File

    try:
        return Pi2File(model, verify=False).header.has_predictor
    except (Pi2Error, OSError, ValueError):
        return None


@dataclass
class GenerateRun:
    """One `pi2-engine generate` run: its events grouped (events.parse_events; {} when it failed), the
    engine's own error line when it failed, and the budget record (pi2cli.hw.cgroup)."""

    events: dict
    error: str | None = None
    budget: dict = field(default_factory=dict)


def run_generate(model: Path, *, budget_bytes: int | None = None, evict=(), timeout: float | None = 3600,
                 **argv) -> GenerateRun:  # fmt: skip
    """`pi2-engine generate` on `model` to completion, for the measurements that need the engine's raw
    events (the predictor check, benchmarks/): inside a memory cgroup of `budget_bytes` that also goes
    to the engine as --memory-budget (last, args.py), `evict`ed from the page cache first. argv: the
    keywords of args.engine_argv (prompt, n_predict, temperature, seed, policy, more, ...)."""
    from pi2cli.hw.cgroup import run_budgeted

    with tempfile.TemporaryDirectory(prefix="pi2-gen-") as tmp:
        events = Path(tmp) / "events.jsonl"
        cmd = engine_argv(
            engine_binary(), "generate", model, events=events, memory_budget=budget_bytes, **argv
        )
        done = run_budgeted(cmd, budget_bytes, evict=evict, timeout=timeout)
        if done.returncode != 0:
            return GenerateRun({}, (done.stderr.strip().splitlines() or ["no output"])[-1], done.budget)
        return GenerateRun(parse_events(events.read_text().splitlines()), None, done.budget)


class Pi2Driver(Driver):
    """The pi2 engine: `pi2-engine chat` on any target, on the .pi2 twin of the model.

    The policy follows the model: `powerinfer2` when it carries activation predictors, `dense`
    otherwise (configure()). With a memory budget the engine gets `--memory-budget BYTES` too (it sizes
    its neuron cache from it), while the host still enforces the budget with a cgroup as for every
    engine."""

    name = "pi2"
    policy = "dense"
    model_suffix = ".pi2"
    how = HOW
    via = "pipe"  # `pi2-engine chat` over stdin; server_chat.py drives `pi2-engine serve`
    options = ("plan",)

    def __init__(self):
        super().__init__()
        self.plan_local: Path | None = None  # `pi2 bench --plan`: a plan file from `pi2 plan`
        self.plan_data: dict = {}

    def set_option(self, name: str, value) -> None:
        from pi2cli.plan.plan import load_plan

        assert name == "plan"
        self.use_plan(Path(value), load_plan(value))

    def use_plan(self, path: Path, data: dict) -> None:
        """Run with `--plan PATH` (its settings; the bench's budget and --threads override it)."""
        from pi2cli.builds.capabilities import plan_keys

        self.plan_local, self.plan_data = Path(path), dict(data)
        self.extra_settings["plan"] = {"file": Path(path).name,
                                       **{k: data[k] for k in plan_keys() if k in data}}  # fmt: skip

    def local_binary(self, target) -> Path:
        from pi2cli.hw.push import engine_files

        found = [p for p in engine_files(target) if p.name == "pi2-engine"]
        if not found:
            raise Pi2Error(f"no pi2-engine build for {target.name} (run `make engine`)", exit_code=2)
        return found[0]

    def files(self, target) -> dict[str, list[Path]]:
        if target.on_this_machine:
            return {}
        files = {"engine": [self.local_binary(target)]}
        if self.plan_local is not None:
            files["plans"] = [self.plan_local]
        return files

    def prepare_generate(self, target, request) -> tuple[str, int]:
        """`pi2 generate -m X.pi2`: the driver's own policy (pi2: dense, the engine's default, as
        `pi2-engine generate` runs it; llmflash: llmflash); only the bench picks powerinfer2 for a
        model with predictors (configure()). The context has room for the prompt and every token asked
        for, as `pi2-engine generate` sizes its own (n_prompt + n_predict): a text token is at least one
        byte (a few more for BOS and the leading space SentencePiece adds), so this never falls short,
        and a long generation is not cut at the chat's default context."""
        model = Path(request.model)
        if not model.is_file():
            raise Pi2Error(f"{model}: no such model file")
        if model.suffix != ".pi2":
            raise Pi2Error(f"{model}: pi2-engine runs .pi2 files (convert with `pi2 convert`)")
        model_arg, _ = super().prepare_generate(target, request)
        self.policy = type(self).policy
        return model_arg, len(request.prompt.encode()) + 4 + int(request.n_predict)

    def generate_extra(self, session, turn) -> dict:
        """The engine's start and summary events: threads, kernels, bytes read and the sparse figures."""
        counters = session.counters
        common = ("peak_rss_bytes", "bytes_read", "load_s", "peak_rss_source")
        return {"threads": session.start_event.get("threads"), "kernels": session.start_event.get("kernels"),
                "bytes_read": counters.get("bytes_read"),
                # the sparse engine's figures (policy, io_method, storage_bytes_read, hit_rate, io_share, ...)
                "sparse": {k: v for k, v in counters.items() if k not in common}}  # fmt: skip

    def configure(self, target, model_local: Path) -> None:
        """Choose the policy for this model (before engine_info records it): the plan's, else
        powerinfer2 on a model with predictors, dense on one without."""
        self.policy = "powerinfer2" if model_has_predictor(model_local) else "dense"
        if self.plan_local is not None:
            self.policy = str(self.plan_data.get("policy", self.policy))

    def engine_options(self, budget_bytes: int | None, binary_dir: str | None = None) -> dict:
        """This driver's sparse settings as keywords of args.sparse_flags. The plan is read where it is
        here, and on a device where files() put it (WORKDIR/plans beside WORKDIR/bin, pi2cli.hw.push)."""
        plan = None
        if self.plan_local is not None:
            here = str(self.plan_local.resolve())
            plan = f"{binary_dir.rsplit('/', 1)[0]}/plans/{self.plan_local.name}" if binary_dir else here
        return {"policy": self.policy, "plan": plan, "memory_budget": budget_bytes}

    def open_chat(self, target, model: str, *, binary_dir: str | None, threads: int | None, n_ctx: int | None,
                  cgroup=None, budget_bytes: int | None = None, seed: int = 0,
                  temperature: float = 0.0) -> Pi2ChatSession:  # fmt: skip
        binary = f"{binary_dir}/pi2-engine" if binary_dir else str(self.local_binary(target))
        return open_chat_session(target, binary, model, n_ctx=n_ctx, cgroup=cgroup, seed=seed, threads=threads,
                                 temperature=temperature, **self.engine_options(budget_bytes, binary_dir))  # fmt: skip

    def engine_info(self, target) -> dict:
        from pi2cli import __version__
        from pi2cli.hw.push import sha256_file
        from pi2cli.results.schema import pi2_commit

        binary = self.local_binary(target)
        build_type = None
        cache = binary.parent / "CMakeCache.txt"
        if cache.is_file():
            for line in cache.read_text(errors="replace").splitlines():
                if line.startswith("CMAKE_BUILD_TYPE:"):
                    build_type = line.split("=", 1)[1] or None
        return {"name": self.name, "version": __version__, "commit": pi2_commit().get("commit"),
                "build_flags": None, "build_type": build_type, "policy": self.policy,
                "binary_sha256": sha256_file(binary)}  # fmt: skip
