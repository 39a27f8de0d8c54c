"""`pi2 serve`: the engine's OpenAI-compatible server run from the host until Ctrl-C, here and on the test
adb daemon through `adb forward`; a client nobody here wrote (the `openai` package) gets chat completions
through the URL it prints; SIGINT stops it with exit 0 and no engine left running (on the device neither)
and no forward left; an engine that cannot start is one error line."""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest
from engine_helpers import needs_engine

from pi2cli.paths import host_build_dir

openai = pytest.importorskip("openai")
pytestmark = needs_engine

CHAT = [{"role": "user", "content": "Name a colour."}]


def pi2(*args: str, env: dict | None = None) -> subprocess.Popen:
    """`pi2 ARGS` in a session of its own, SIGINT at its default: a suite started in the background by a
    shell without job control inherits SIGINT ignored, and Python then keeps ignoring it (stop() below)."""
    return subprocess.Popen([sys.executable, "-c", "from pi2cli.cli import main; main()", *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, **(env or {})}, start_new_session=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip


def ready_json(proc: subprocess.Popen, timeout: float = 120) -> dict:
    """The one JSON object `--json` prints once the server answers."""
    got: list[str] = []
    reader = threading.Thread(target=lambda: got.append(proc.stdout.readline()), daemon=True)
    reader.start()
    reader.join(timeout)
    if not got or not got[0].strip():
        _, err = stop(proc, signal.SIGTERM)
        raise AssertionError(f"pi2 serve never got ready: {err}")
    return json.loads(got[0])


def stop(proc: subprocess.Popen, sig=signal.SIGINT) -> tuple[int, str]:
    """`kill -INT PID` (what Ctrl-C sends): pi2 alone, not its group, so pi2 itself must stop the engine."""
    os.kill(proc.pid, sig)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, err


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def engines_under(root: Path) -> list[int]:
    """pi2-engine processes run from the test phone's directory (its daemon runs them on this host)."""
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        ours = cmd and cmd[0].startswith(str(root)) and cmd[0].endswith("pi2-engine")
        if ours and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p.pid)
    return found


def client(info: dict, api_key: str = "none"):
    return openai.OpenAI(base_url=info["url"] + "/v1", api_key=api_key, max_retries=0, timeout=60)


def chat_twice(info: dict, api_key: str = "none") -> str:
    """A whole answer and a streamed one for the same greedy request: the same text."""
    c = client(info, api_key)
    whole = c.chat.completions.create(model="m", messages=CHAT, max_tokens=8, temperature=0)
    text = whole.choices[0].message.content
    assert text and whole.usage.completion_tokens == 8 and whole.choices[0].finish_reason == "length"
    chunks = c.chat.completions.create(model="m", messages=CHAT, max_tokens=8, temperature=0, stream=True)
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices) == text
    return text


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def error_lines(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert "Traceback" not in err, err
    return [ln for ln in lines if ln.startswith("pi2: error:")]


# ------------------------------------------------------------------------------------------ here
@pytest.mark.slow
def test_local_serve_answers_an_openai_client_and_sigint_stops_it(tiny_model):
    proc = pi2("serve", "-m", str(tiny_model), "--port", "0", "--chat-template", "chatml", "-t", "2", "--json",
               env={"PI2_API_KEY": "s3cret"})  # fmt: skip
    info = ready_json(proc)
    try:
        assert info["device"] == "local" and info["url"] == f"http://127.0.0.1:{info['port']}"
        assert info["host_port"] == info["port"] and info["model"] == str(tiny_model)
        assert info["policy"] == "powerinfer2"  # the synthetic model carries predictors, as `pi2 bench` picks
        assert info["api_key"] is True and "Authorization: Bearer $PI2_API_KEY" in info["curl"]
        assert info["curl"].startswith(f"curl -s {info['url']}/v1/chat/completions")
        engine = psutil.Process(info["pid"])
        assert engine.cmdline()[:2] == [str(host_build_dir() / "pi2-engine"), "serve"]
        assert chat_twice(info, api_key="s3cret")
        # the printed curl line, as a user pastes it into a shell that has the key
        pasted = subprocess.run(["sh", "-c", info["curl"]], capture_output=True, text=True, timeout=60,
                                env={**os.environ, "PI2_API_KEY": "s3cret"})  # fmt: skip
        assert json.loads(pasted.stdout)["choices"][0]["message"]["content"], pasted.stdout + pasted.stderr
        with pytest.raises(openai.AuthenticationError):  # the key reached the engine
            client(info, api_key="wrong").chat.completions.create(model="m", messages=CHAT, max_tokens=2)
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert not running(info["pid"]), "pi2-engine outlived pi2 serve"
    assert not error_lines(err) and "stopping pi2-engine serve" in err
    assert "pi2-engine serve: stopped" in err  # the engine's own last line: it stopped on SIGTERM, not killed


@pytest.mark.slow
def test_sigterm_stops_it_too(tiny_model):
    # a proxy that answers nothing: the readiness check must not go through it
    proc = pi2("serve", "-m", str(tiny_model), "--port", "0", "-t", "1", "--policy", "dense", "--memory-budget",
               "256M", "--json", env={"http_proxy": "http://127.0.0.1:9", "no_proxy": ""})  # fmt: skip
    info = ready_json(proc)
    assert info["policy"] == "dense" and running(info["pid"])
    cmd = psutil.Process(info["pid"]).cmdline()
    assert (
        cmd[cmd.index("--memory-budget") + 1] == str(256 << 20) and info["budget"]["limit_bytes"] == 256 << 20
    )
    code, err = stop(proc, signal.SIGTERM)
    assert code == 0, err
    assert not running(info["pid"])
    assert "has no chat template" in err  # said at start: the curl line would get a 400 without one


def test_missing_model_is_one_error_line(tmp_path):
    proc = pi2("serve", "-m", str(tmp_path / "nope.pi2"), "--port", "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert error_lines(err) == [f"pi2: error: {tmp_path / 'nope.pi2'}: no such model file"], err


def test_an_engine_that_cannot_load_the_model_is_one_error_line_with_its_reason(tmp_path):
    bad = tmp_path / "bad.pi2"
    bad.write_bytes(b"not a model")
    proc = pi2("serve", "-m", str(bad), "--port", "0")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    (line,) = error_lines(err)
    assert line.startswith("pi2: error: pi2-engine serve exited (code 1): ") and "truncated" in line, err


@pytest.mark.slow
def test_a_port_in_use_is_one_error_line(tiny_model):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = pi2("serve", "-m", str(tiny_model), "--port", str(busy.getsockname()[1]), "-t", "1")
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    (line,) = error_lines(err)
    assert line.startswith("pi2: error: pi2-engine serve exited (code 1): "), err


# ------------------------------------------------------------------------------ the test adb daemon
def forwards(adb_server, serial: str) -> list[str]:
    return [ln for ln in adb_server.call("forward", "--list").splitlines() if ln.startswith(serial + " ")]


@pytest.mark.slow
def test_device_serve_through_adb_forward_and_sigint_leaves_nothing_running(
    tiny_model, make_device, adb_server
):
    phone = make_device()
    host_port = free_port()  # a port named here: `adb forward tcp:HOST_PORT tcp:PORT`
    proc = pi2("serve", "--device", phone.serial, "-m", str(tiny_model), "--port", "0", "--host-port",
               str(host_port), "--chat-template", "chatml", "-t", "2", "--json")  # fmt: skip
    info = ready_json(proc)
    try:
        assert info["device"] == phone.serial and info["url"] == f"http://127.0.0.1:{host_port}"
        assert info["port"] != host_port  # the engine listens on the device's own port
        assert info["model"].startswith("/data/local/tmp/pi2/models/") and info["model"].endswith(".pi2")
        assert forwards(adb_server, phone.serial) == [f"{phone.serial} tcp:{host_port} tcp:{info['port']}"]
        (engine,) = engines_under(phone.root)  # the pushed binary, started by the device's shell
        assert engine == info["pid"]
        assert (phone.root / "pi2" / "bin" / "pi2-engine").is_file()
        assert chat_twice(info)
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert not error_lines(err) and "copied" in err
    assert "pi2-engine serve: stopped" in err  # its own last line: stopped by pi2, while adb still held it
    assert not engines_under(phone.root), "pi2-engine left running on the device"
    assert forwards(adb_server, phone.serial) == []

    # Again, the port here picked by the adb server: nothing is pushed twice.
    proc = pi2("serve", "--device", phone.serial, "-m", str(tiny_model), "--port", "0", "--host-port", "0",
               "-t", "1", "--json")  # fmt: skip
    info = ready_json(proc)
    try:
        assert info["host_port"] > 0 and forwards(adb_server, phone.serial)
        assert client(info).models.list().data[0].id.endswith(".pi2")
    finally:
        code, err = stop(proc)
    assert code == 0 and "0 copied" in err and "2 already there" in err, err
    assert not engines_under(phone.root) and forwards(adb_server, phone.serial) == []


@pytest.mark.slow
def test_device_forward_to_a_busy_port_is_one_error_line_and_stops_the_engine(
    tiny_model, make_device, adb_server
):
    phone = make_device()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        proc = pi2("serve", "--device", phone.serial, "-m", str(tiny_model), "--port", "0", "--host-port",
                   str(busy.getsockname()[1]), "-t", "1")  # fmt: skip
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    (line,) = error_lines(err)
    assert line.startswith(f"pi2: error: cannot forward a port to {phone.serial}:"), err
    deadline = time.monotonic() + 10
    while engines_under(phone.root) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not engines_under(phone.root) and forwards(adb_server, phone.serial) == []


@pytest.mark.slow
def test_device_engine_that_cannot_load_is_one_error_line(tmp_path, make_device):
    phone = make_device()
    bad = tmp_path / "bad.pi2"
    bad.write_bytes(b"not a model")
    proc = pi2("serve", "--device", phone.serial, "-m", str(bad), "--port", "0", "--host-port", "0")
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 1
    (line,) = error_lines(err)
    assert line.startswith(f"pi2: error: pi2-engine serve on {phone.serial} exited (code 1): "), err
    assert "truncated" in line and not engines_under(phone.root)


@pytest.mark.slow
def test_device_serve_with_a_plan_pushes_it_and_runs_under_its_budget(tiny_model, make_device, tmp_path):
    plan = tmp_path / "plan.json"
    made = subprocess.run([sys.executable, "-c", "from pi2cli.cli import main; main()", "plan", "-m", str(tiny_model),
                           "--memory-budget", "64M", "--out", str(plan)], capture_output=True, text=True, timeout=120)  # fmt: skip
    assert made.returncode == 0, made.stderr
    phone = make_device()
    proc = pi2("serve", "--device", phone.serial, "-m", str(tiny_model), "--plan", str(plan), "--port", "0",
               "--host-port", "0", "-t", "1", "--json")  # fmt: skip
    info = ready_json(proc)
    try:
        cmd = psutil.Process(info["pid"]).cmdline()
        # where it was pushed (the test daemon's /data/local/tmp is phone.root)
        assert cmd[cmd.index("--plan") + 1] == str(phone.root / "pi2" / "plans" / "plan.json")
        assert (phone.root / "pi2" / "plans" / "plan.json").read_bytes() == plan.read_bytes()
        assert cmd[cmd.index("--memory-budget") + 1] == str(64 << 20)  # the plan's budget, last (it wins)
        assert info["budget"] == {"limit_bytes": 64 << 20, "enforced": False, "how": info["budget"]["how"]}
        assert client(info).completions.create(model="m", prompt="The", max_tokens=4).choices[0].text
    finally:
        code, err = stop(proc)
    assert code == 0, err
    assert not engines_under(phone.root)
