"""`pi2 serve`: pi2-engine's OpenAI-compatible server (docs/ENGINE.md, `serve`) run from the host, on this
machine or on a phone, until Ctrl-C.

Here: the host build listens on 127.0.0.1, inside a memory cgroup of the budget where this machine has
one (pi2cli.hw.cgroup, as `pi2 bench` runs engines); its first stderr line names the port, and GET
/health answering 200 means it serves.
On an adb device: what is missing is pushed first (pi2cli.hw.push: content hashes, so a second serve
copies nothing), the engine starts through one adb shell under a watchdog (llamacpp/device.py:
watched_command: when the host's adb connection goes away -- pi2 killed, the cable pulled -- the shell's
stdin ends and the watchdog kills the engine, so nothing keeps running on the phone), binds the device's
loopback, and `adb forward tcp:HOST_PORT tcp:PORT` makes it reachable here.
Stopping (Ctrl-C, SIGTERM): SIGTERM to the engine (it ends running requests at their next token), SIGKILL
after STOP_WAIT_S; on a device the forward is removed and the engine's pid checked gone.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.targets.base import TargetError

LISTENING = re.compile(r"listening on http://[^\s:]+:(\d+)")
STOP_WAIT_S = 10.0
LOOPBACK = "127.0.0.1"

Echo = Callable[[str], None]


@dataclass
class ServeConfig:
    """What `pi2 serve` was asked for. policy None: powerinfer2 when the model carries activation
    predictors (and the build has the sparse engine), else dense -- as `pi2 bench` picks it; a plan's
    own policy wins over that guess."""

    model: str  # a .pi2 path, or a registry name found in the local store
    device: str | None = None
    port: int = 8080  # where the engine listens (the device's loopback for a phone); 0: any free one
    host_port: int | None = None  # adb: the forward's port here; None: the same number as the engine's
    api_key: str | None = None
    memory_budget: int | None = None
    policy: str | None = None
    plan: Path | None = None
    threads: int | None = None
    ctx: int | None = None
    chat_template: str | None = None
    start_timeout_s: float = 600.0


@dataclass
class Serving:
    """A server that answers: what a user or a script (`--json`) needs to reach it."""

    url: str  # base URL here (through the forward for a device); the API is under /v1
    pid: int  # the engine's pid on its machine
    device: str  # local, or the adb serial
    port: int  # where the engine listens, on its machine
    host_port: int  # the port of `url`
    model: str  # the model file on the engine's machine
    policy: str
    api_key: bool
    budget: dict = field(default_factory=dict)

    def curl(self) -> str:
        auth = ' -H "Authorization: Bearer $PI2_API_KEY"' if self.api_key else ""  # the shell fills it in
        body = '{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 64}'
        return f"curl -s {self.url}/v1/chat/completions -H 'Content-Type: application/json'{auth} -d '{body}'"

    def to_json(self) -> dict:
        return {**asdict(self), "curl": self.curl()}


# ------------------------------------------------------------------------------------ the command line
def serve_argv(binary: str, model: str, cfg: ServeConfig, *, policy: str, plan: str | None) -> list[str]:
    """`pi2-engine serve` on loopback; the sparse tail in args.py's order (policy, plan, threads, budget
    last), so a plan overrides the policy's defaults and the budget given here overrides the plan's."""
    from pi2cli.engines.pi2.args import sparse_flags

    argv = [binary, "serve", "-m", model, "--host", LOOPBACK, "--port", str(int(cfg.port))]
    if cfg.ctx:
        argv += ["--ctx", str(int(cfg.ctx))]
    if cfg.chat_template:
        argv += ["--chat-template", cfg.chat_template]
    if cfg.api_key:
        argv += ["--api-key", cfg.api_key]
    return argv + sparse_flags(policy=policy, plan=plan, threads=cfg.threads, memory_budget=cfg.memory_budget)


def choose_policy(cfg: ServeConfig, model: Path, plan_data: dict) -> str:
    """--policy, else the plan's, else as the bench picks: powerinfer2 on a model with predictors."""
    from pi2cli.engines.pi2.driver import model_has_predictor

    if cfg.policy or plan_data.get("policy"):
        return str(cfg.policy or plan_data["policy"])
    return "powerinfer2" if model_has_predictor(model) else "dense"


def local_model(text: str) -> Path:
    from pi2cli.models.store import model_arg

    model = Path(model_arg(text))
    if not model.is_file():
        raise Pi2Error(f"{model}: no such model file")
    if model.suffix != ".pi2":
        raise Pi2Error(f"{model}: pi2-engine serves .pi2 files (convert with `pi2 convert`)")
    return model


# ---------------------------------------------------------------------------------------- readiness
def wait_healthy(port: int, deadline: float, down: Callable[[], str | None]) -> None:
    """GET /health until it answers 200 (needs no API key), the engine is down, or the deadline passes."""
    url = f"http://{LOOPBACK}:{port}/health"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via $http_proxy
    last = ""
    while True:
        why = down()
        if why:
            raise Pi2Error(why)
        try:
            with opener.open(url, timeout=5) as resp:
                if resp.status == 200:
                    return
                last = f"HTTP {resp.status}"
        except (urllib.error.URLError, OSError) as exc:
            last = str(getattr(exc, "reason", exc))
        if time.monotonic() > deadline:
            raise Pi2Error(f"{url} did not answer: {last}")
        time.sleep(0.1)


class EngineLog:
    """The engine's stderr, line by line: the port of its 'listening on' line, a tail for the error line,
    and every line after that shown on our stderr (cancellations, its last words on stopping)."""

    def __init__(self, echo: Echo):
        self.echo, self.tail, self.partial = echo, deque(maxlen=20), ""
        self.port: int | None = None
        self.listening = threading.Event()

    def feed(self, data: str) -> None:
        *lines, self.partial = (self.partial + data).split("\n")
        for line in map(str.rstrip, lines):
            self.tail.append(line)
            if self.listening.is_set():
                self.echo(line)
            m = LISTENING.search(line)
            if m and not self.listening.is_set():
                self.port = int(m.group(1))
                self.listening.set()
                self.echo(line)
                if "chat template none" in line:  # else the curl line we print would get a 400
                    self.echo(
                        "pi2 serve: the model has no chat template: /v1/chat/completions answers 400 until "
                        "--chat-template chatml|llama2|llama3 names one (/v1/completions serves it)"
                    )

    def last_error(self) -> str:
        lines = [ln for ln in [*self.tail, self.partial] if ln.strip()]
        return lines[-1].removeprefix("pi2-engine: error: ") if lines else "no output"


def exit_text(code: int | None) -> str:
    return f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"code {code}"


# ------------------------------------------------------------------------------------- this machine
class LocalServer:
    """pi2-engine serve as a child process here (own session: Ctrl-C reaches pi2, which stops it)."""

    def __init__(
        self, argv: list[str], budget_bytes: int | None, echo: Echo, device: str = "local", cgroup=None
    ):
        """cgroup: a Budget the caller holds (`pi2 bench --via server`: the run's cgroup), else one of
        budget_bytes is made here and left when the engine stops."""
        self.argv, self.budget_bytes, self.device = argv, budget_bytes, device
        self.log = EngineLog(echo)
        self.proc: subprocess.Popen | None = None
        self.cgroup, self.held = cgroup, cgroup is not None

    def down(self) -> str | None:
        code = self.proc.poll()
        if code is None:
            return None
        self.pump.join(2)  # its last stderr line may still be in the pipe
        return f"pi2-engine serve exited ({exit_text(code)}): {self.log.last_error()}"

    def start(self, timeout_s: float) -> tuple[int, int]:
        """Start it and wait until it serves; (pid, port)."""
        from pi2cli.hw.cgroup import Budget

        deadline = time.monotonic() + timeout_s
        if not self.held:
            self.cgroup = Budget(self.budget_bytes).__enter__()
        try:
            self.proc = self.cgroup.popen(self.argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.PIPE, start_new_session=True)  # fmt: skip
        except OSError as exc:
            raise Pi2Error(f"cannot start {self.argv[0]}: {exc.strerror}") from None
        self.pump = threading.Thread(target=self._pump, daemon=True)
        self.pump.start()
        while not self.log.listening.wait(0.1):
            if why := self.down():
                raise Pi2Error(why)
            if time.monotonic() > deadline:
                raise Pi2Error(
                    f"pi2-engine serve did not listen within {timeout_s:.0f} s: {self.log.last_error()}"
                )
        wait_healthy(self.log.port, deadline, self.down)
        return self.proc.pid, self.log.port

    def _pump(self) -> None:
        for line in self.proc.stderr:
            self.log.feed(line.decode(errors="replace"))

    def budget_record(self) -> dict:
        rec = self.cgroup.record() if self.cgroup and self.budget_bytes else {}
        return {k: rec[k] for k in ("limit_bytes", "enforced", "how") if k in rec}

    def wait(self) -> None:
        """Until the engine ends: only an error ends it (a stop is ours, after Ctrl-C)."""
        self.proc.wait()
        raise Pi2Error(self.down() or "pi2-engine serve exited")

    def stop(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(STOP_WAIT_S)
        if self.cgroup is not None and not self.held:  # the cgroup goes once the engine is gone
            cgroup, self.cgroup = self.cgroup, None
            cgroup.__exit__(None, None, None)


# ------------------------------------------------------------------------------------------- a phone
class DeviceServer:
    """pi2-engine serve on an adb device, reached here through `adb forward`."""

    def __init__(self, target, argv: list[str], budget_bytes: int | None, host_port: int | None, echo: Echo):
        self.target, self.argv, self.budget_bytes, self.want_host_port = target, argv, budget_bytes, host_port
        self.device = target.name
        self.log = EngineLog(echo)
        self.proc = None  # pi2cli.targets.adb.AdbProcess
        self.host_port: int | None = None

    def down(self) -> str | None:
        proc = self.proc
        if proc.poll() is None:
            return None
        if proc.error:
            return proc.error
        return f"pi2-engine serve on {self.device} exited ({exit_text(proc.returncode)}): {self.log.last_error()}"

    def start(self, timeout_s: float) -> tuple[int, int]:
        from pi2cli.engines.llamacpp.device import watched_command
        from pi2cli.targets.adb import AdbProcess, adb_errors

        deadline = time.monotonic() + timeout_s
        try:
            self.proc = AdbProcess(self.target, watched_command(self.argv, self.target.workdir),
                                   lambda _name, data: self.log.feed(data.decode(errors="replace")))  # fmt: skip
        except adb_errors() as exc:
            raise Pi2Error(f"lost the device {self.device}: cannot start pi2-engine serve: {exc}") from None
        while not self.log.listening.wait(0.1):
            if why := self.down():
                raise Pi2Error(why)
            if time.monotonic() > deadline:
                raise Pi2Error(f"pi2-engine serve on {self.device} did not listen within {timeout_s:.0f} s: "
                               f"{self.log.last_error()}")  # fmt: skip
        want = self.log.port if self.want_host_port is None else self.want_host_port
        try:
            self.host_port = self.target.forward(self.log.port, want)
        except TargetError as exc:
            raise Pi2Error(str(exc)) from None
        wait_healthy(self.host_port, deadline, self.down)
        return self.proc.pid, self.log.port

    def budget_record(self) -> dict:
        how = "not enforced on adb devices (no cgroup control): pi2-engine sizes its neuron cache to it"
        return {"limit_bytes": self.budget_bytes, "enforced": False, "how": how} if self.budget_bytes else {}

    def wait(self) -> None:
        while True:
            try:
                self.proc.wait(1.0)
                break
            except TimeoutError:
                continue
            except TargetError:
                break
        raise Pi2Error(self.down() or f"pi2-engine serve on {self.device} exited")

    def stop(self) -> None:
        """SIGTERM to the engine's pid, SIGKILL after STOP_WAIT_S, remove the forward; then check the pid
        is no pi2-engine any more. A device that went away already lost the engine (the watchdog) and
        its forwards (the adb server drops them)."""
        proc, pid = self.proc, self.proc.pid if self.proc else None
        if proc is not None and proc.poll() is None and pid:
            with contextlib.suppress(TargetError):
                self.target.sh(f"kill {int(pid)} 2>/dev/null; true", timeout=10)
            with contextlib.suppress(TimeoutError, TargetError):
                proc.wait(STOP_WAIT_S)
            if proc.poll() is None:
                proc.kill()  # kill -9 PID on the device
        if self.host_port is not None:
            with contextlib.suppress(TargetError):
                self.target.remove_forward(self.host_port)
            self.host_port = None
        if pid and proc.error is None:
            try:
                left = self.target.sh(
                    f"tr '\\0' ' ' < /proc/{int(pid)}/cmdline 2>/dev/null; true", timeout=10
                )
            except TargetError:
                return
            if "pi2-engine" in left.stdout:
                raise Pi2Error(f"pi2-engine (pid {pid}) is still running on {self.device}: "
                               f"adb -s {shlex.quote(self.device)} shell kill -9 {pid}")  # fmt: skip


# -------------------------------------------------------------------------------------------- serve
def prepare(cfg: ServeConfig, echo: Echo):
    """Resolve the model and target, push to a device what is missing, and build the server (not started)."""
    from pi2cli.engines.pi2.driver import engine_binary
    from pi2cli.targets import get_target

    model = local_model(cfg.model)
    plan_data: dict = {}
    if cfg.plan is not None:
        from pi2cli.plan.plan import load_plan

        plan_data = load_plan(cfg.plan)
        if cfg.memory_budget is None and plan_data.get("memory_budget") is not None:
            from dataclasses import replace

            from pi2cli.units import parse_size

            # as `pi2 bench --plan`: the plan's budget is the server's (a cgroup here; the engine's anyway)
            budget = parse_size(plan_data["memory_budget"], what=f"plan {cfg.plan}: memory_budget")
            cfg = replace(cfg, memory_budget=budget)
    try:
        target = get_target(cfg.device)
    except TargetError as exc:
        raise Pi2Error(str(exc)) from None
    if target.kind == "local":
        binary = engine_binary()
    else:
        from pi2cli.hw.push import engine_files

        binary = next((p for p in engine_files(target) if p.name == "pi2-engine"), None)
        if binary is None:
            raise Pi2Error(
                f"no pi2-engine build for {target.name} (run `{target.build_hint()}`)", exit_code=2
            )
    prefix = target.command_prefix() if target.on_this_machine else []
    policy = choose_policy(cfg, model, plan_data)
    if target.on_this_machine:
        plan = str(Path(cfg.plan).resolve()) if cfg.plan else None
        argv = serve_argv(str(binary), str(model), cfg, policy=policy, plan=plan)
        server = LocalServer(prefix + argv, cfg.memory_budget, echo, target.name)
        return server, str(model), policy
    if "shell_v2" not in getattr(target, "features", set()):
        raise Pi2Error(f"device {target.name} has no adb shell v2: cannot run pi2-engine serve on it")
    remote_model, remote_plan, remote_binary = push_for_serve(target, binary, model, cfg.plan, echo)
    argv = serve_argv(remote_binary, remote_model, cfg, policy=policy, plan=remote_plan)
    return DeviceServer(target, argv, cfg.memory_budget, cfg.host_port, echo), remote_model, policy


def push_for_serve(
    target, binary: Path, model: Path, plan: Path | None, echo: Echo
) -> tuple[str, str | None, str]:
    """`pi2 push` of the engine, the model (and the plan): only what the device lacks is copied."""
    from pi2cli.hw.push import collect_items, push_files
    from pi2cli.units import format_size

    workdir = target.workdir.rstrip("/")
    items = collect_items(
        target, workdir, engine=[binary], models=[model], plans=[Path(plan)] if plan else []
    )
    echo(f"pi2 serve: pushing what {target.name} lacks of {', '.join(i.local.name for i in items)}")
    report = push_files(target, items, workdir)
    data = report.to_json()
    echo(f"pi2 serve: {target.name}:{workdir}: {data['copied']} copied ({format_size(data['copied_bytes'])}), "
         f"{data['skipped']} already there")  # fmt: skip
    remote = {i.kind: i.remote for i in items}
    return remote["model"], remote.get("plan"), remote["engine"]


def serve(cfg: ServeConfig, on_ready: Callable[[Serving], None], echo: Echo) -> Serving | None:
    """Run the server until Ctrl-C / SIGTERM (then stop it and return what served), or raise Pi2Error
    when it cannot start or dies. An interruption before it serves is raised as it came (pi2 exits 130)."""
    server, model, policy = prepare(cfg, echo)
    ready = None
    try:
        pid, port = server.start(cfg.start_timeout_s)
        host_port = port if isinstance(server, LocalServer) else server.host_port
        ready = Serving(url=f"http://{LOOPBACK}:{host_port}", pid=pid, device=server.device, port=port,
                        host_port=host_port, model=model, policy=policy, api_key=bool(cfg.api_key),
                        budget=server.budget_record())  # fmt: skip
        on_ready(ready)
        server.wait()
    except KeyboardInterrupt as stop:
        if ready is None:
            raise
        from pi2cli.signals import signal_name

        echo(f"pi2 serve: {signal_name(stop)}: stopping pi2-engine serve on {server.device}")
    finally:
        server.stop()
    return ready
