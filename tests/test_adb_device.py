"""The adb path end to end without a phone: the real adb server (bundled with adbutils) talks to the
test daemon in tests/adbd, and pi2's targets, `pi2 push` and `pi2 devices` run against it."""

import json
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from pi2cli.cli import cli  # noqa: E402
from pi2cli.hw.push import collect_items, model_remote_name, push_files, sha256_file  # noqa: E402
from pi2cli.targets import TargetError, get_target  # noqa: E402

WORKDIR = "/data/local/tmp/pi2"


@pytest.fixture
def files(tmp_path):
    model = tmp_path / "tiny.gguf"
    model.write_bytes(os.urandom(3 << 20))
    plan = tmp_path / "plan.json"
    plan.write_text('{"threads": 4}\n')
    build = tmp_path / "build" / "host"
    build.mkdir(parents=True)
    engine = build / "pi2-engine"
    engine.write_text("#!/bin/sh\necho engine says $1\n")
    engine.chmod(0o755)
    return {"model": model, "plan": plan, "build_root": tmp_path / "build"}


def on_device(model: Path) -> str:
    """The name a model lands under: NAME-HASH.EXT."""
    return model_remote_name(model, sha256_file(model))


def run_cli(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.slow
def test_adb_target_facts_commands_and_memory(make_device):
    dev = make_device()
    t = get_target(dev.serial)
    f = t.facts()
    assert f["kind"] == "adb" and f["model"] == "pi2_test_adbd" and f["android"] == "14"
    assert f["battery"] == {"level_percent": 100, "temperature_c": 30.0}
    assert f["cores"] >= 1 and f["ram_bytes"] > 0

    r = t.sh("echo to-out; echo to-err >&2; exit 5")
    assert (r.returncode, r.stdout, r.stderr) == (5, "to-out\n", "to-err\n")

    chunks = []
    p = t.run(["sh", "-c", "pwd; echo oops >&2; exit 4"], on_output=lambda n, d: chunks.append((n, d)))
    assert p.wait(10) == 4
    assert ("stdout", f"{WORKDIR}\n".encode()) in chunks  # the default cwd: the workdir, made on demand
    assert b"".join(d for n, d in chunks if n == "stderr") == b"oops\n"  # the pid marker is not output

    out = []
    p = t.run(["sh", "-c", 'echo "$PI2_X"'], env={"PI2_X": "a b"}, on_output=lambda n, d: out.append(d))
    assert p.wait(10) == 0 and b"".join(out) == b"a b\n"

    err = []
    p = t.run(["true"], cwd="/data/local/tmp/no/such/dir", on_output=lambda n, d: err.append(d))
    assert p.wait(10) == 127 and b"no/such/dir" in b"".join(err)

    p = t.run(["sleep", "30"], cwd="/data/local/tmp")
    assert p.pid is not None
    mem = t.read_memory(p.pid)
    assert mem is not None and mem.rss_bytes > 0
    assert p.poll() is None
    p.kill()
    assert p.wait(10) != 0


def test_chat_stream_write_after_the_device_vanished_is_a_target_error(make_device):
    """The stream's reader closes the connection when the device goes; a request written after that
    must be the same 'lost the device' TargetError as one written into a dead socket (the bench turns
    it into a device_vanished record), not adbutils' own 'Connection is closed'."""
    from pi2cli.engines.pi2.chat import adb_chat_process

    dev = make_device()
    process = adb_chat_process(get_target(dev.serial), ["sleep", "30"], cwd="/data/local/tmp")
    dev.stop()
    process.thread.join(10)  # the reader has seen the loss and closed the connection
    assert process.lost and "lost the device" in process.lost
    with pytest.raises(TargetError, match="lost the device"):
        process.write(b'{"prompt": "hi"}\n')
    process.close_stdin()  # closing a dead stream is quiet


@pytest.mark.slow
def test_push_copies_then_skips_unchanged_files(make_device, files, monkeypatch):
    dev = make_device()
    monkeypatch.setenv("PI2_BUILD_ROOT", str(files["build_root"]))
    args = ["push", "--device", dev.serial, "-m", str(files["model"]), "--plan", str(files["plan"]),
            "--no-workloads", "--json"]  # fmt: skip
    first = run_cli(*args)
    assert first.exit_code == 0, first.output
    report = json.loads(first.stdout)
    assert report["copied"] == 3 and report["skipped"] == 0
    landed = dev.root / "pi2"
    assert (landed / "models" / on_device(files["model"])).read_bytes() == files["model"].read_bytes()
    assert (landed / "plans" / "plan.json").read_text() == files["plan"].read_text()
    assert (landed / "bin" / "pi2-engine").stat().st_mode & stat.S_IXUSR
    assert not list(landed.rglob("*.partial"))

    second = json.loads(run_cli(*args).stdout)  # the acceptance: nothing changed, nothing copied
    assert second["copied"] == 0 and second["skipped"] == 3

    files["plan"].write_text('{"threads": 2}\n')
    third = json.loads(run_cli(*args).stdout)
    assert [f["remote"] for f in third["files"] if f["action"] == "copied"] == [f"{WORKDIR}/plans/plan.json"]

    # The manifest is only a shortcut: a file changed behind pi2's back is caught by its hash.
    (landed / "models" / on_device(files["model"])).write_bytes(os.urandom(3 << 20))
    fourth = json.loads(run_cli(*args).stdout)
    assert {f["remote"] for f in fourth["files"] if f["action"] == "copied"} == {
        f"{WORKDIR}/models/{on_device(files['model'])}"
    }
    assert (landed / "models" / on_device(files["model"])).read_bytes() == files["model"].read_bytes()

    # The pushed engine runs on the device.
    out = []
    p = get_target(dev.serial).run([f"{WORKDIR}/bin/pi2-engine", "hi"], on_output=lambda n, d: out.append(d))
    assert p.wait(10) == 0 and b"".join(out) == b"engine says hi\n"


@pytest.mark.slow
def test_two_models_with_the_same_file_name_stay_apart_on_the_device(make_device, tmp_path):
    """Every synthetic model is DIR/model.pi2 + DIR/model.gguf: a second push once replaced the first
    model's .pi2 and left its .gguf beside the new one. Both now stay, each under its name and hash."""
    dev = make_device()
    pushed = {}
    for name in ("synth-a", "synth-b"):
        d = tmp_path / name
        d.mkdir()
        for ext in (".pi2", ".gguf"):
            (d / f"model{ext}").write_bytes(os.urandom(1 << 16))
        r = run_cli("push", "--device", dev.serial, "--no-engine", "--no-workloads", "-m", str(d / "model.pi2"),
                    "-m", str(d / "model.gguf"), "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        pushed[name] = {f["local"]: f["remote"] for f in json.loads(r.stdout)["files"]}
    models = dev.root / "pi2" / "models"
    assert len(list(models.iterdir())) == 4  # two .pi2, two .gguf: nothing replaced
    for name, files in pushed.items():
        for local, remote in files.items():
            assert Path(remote).name.startswith(f"{name}-")
            assert (models / Path(remote).name).read_bytes() == Path(local).read_bytes()


def test_push_catches_a_corrupted_transfer(make_device, files):
    dev = make_device("--corrupt")
    r = run_cli("push", "--device", dev.serial, "--no-engine", "--no-workloads", "-m", str(files["model"]))
    assert r.exit_code == 1
    assert "corrupted" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    models = dev.root / "pi2" / "models"
    assert (
        not (models / on_device(files["model"])).exists()
        and not (models / (on_device(files["model"]) + ".partial")).exists()
    )


def test_push_checks_free_space_first(make_device, files):
    dev = make_device("--free-bytes", "1000000")
    r = run_cli("push", "--device", dev.serial, "--no-engine", "--no-workloads", "-m", str(files["model"]))
    assert r.exit_code == 1
    assert "not enough space" in r.stderr and "3 MiB to copy" in r.stderr
    assert not (dev.root / "pi2" / "models").exists()


def test_disconnect_mid_push_is_one_line_and_leaves_no_complete_file(make_device, files, adb_server):
    dev = make_device("--disconnect-after", str(1 << 20))
    start = time.monotonic()
    r = run_cli("push", "--device", dev.serial, "--no-engine", "--no-workloads", "-m", str(files["model"]))
    assert r.exit_code == 1 and time.monotonic() - start < 30
    assert r.stderr.startswith("pi2: error: ") and len(r.stderr.strip().splitlines()) == 1
    assert "not installed" in r.stderr
    assert not (dev.root / "pi2" / "models" / on_device(files["model"])).exists()
    assert dev.proc.wait(5) == 3  # the daemon really went away


def test_ctrl_c_during_push_removes_the_partial(make_device, files):
    dev = make_device()
    t = get_target(dev.serial)
    items = collect_items(t, WORKDIR, models=[files["model"]])

    class Interrupt:
        def __init__(self, item, stage):
            self.stage = stage

        def __enter__(self):
            def progress(done):
                if self.stage == "copy" and done >= 1 << 20:
                    raise KeyboardInterrupt

            return progress

        def __exit__(self, *exc):
            return False

    with pytest.raises(KeyboardInterrupt):
        push_files(t, items, progress_for=Interrupt)
    models = dev.root / "pi2" / "models"
    assert (
        not (models / on_device(files["model"])).exists()
        and not (models / (on_device(files["model"]) + ".partial")).exists()
    )


def test_devices_lists_states_and_facts(make_device):
    good = make_device()
    locked = make_device("--unauthorized", want="unauthorized")
    r = run_cli("devices", "--json")
    assert r.exit_code == 0, r.output
    rows = {row["name"]: row for row in json.loads(r.stdout)}
    assert rows["local"]["facts"]["cores"] >= 1
    assert rows[good.serial]["state"] == "device" and rows[good.serial]["facts"]["model"] == "pi2_test_adbd"
    assert rows[locked.serial]["state"] == "unauthorized" and "facts" not in rows[locked.serial]
    table = run_cli("devices").stdout
    assert "unauthorized" in table and "pi2 targets" in table
    with pytest.raises(TargetError, match="unauthorized: accept"):
        get_target(locked.serial)


@pytest.mark.slow
def test_sigint_during_cli_push_cleans_the_partial(make_device, files, adb_server):
    # The child gets the default SIGINT: a shell that runs the suite in the background (`cmd &`) starts it
    # with SIGINT ignored, and Python then keeps ignoring it, so the Ctrl-C under test would never arrive.
    dev = make_device("--slow", str(2 << 20))  # 3 MiB at 2 MiB/s: plenty of time to interrupt
    partial = dev.root / "pi2" / "models" / (on_device(files["model"]) + ".partial")
    proc = subprocess.Popen([sys.executable, "-m", "pi2cli", "push", "--device", dev.serial, "--no-engine",
                             "--no-workloads", "-m", str(files["model"])], env={**os.environ},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not (partial.exists() and partial.stat().st_size > 0):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=5)
            time.sleep(0.02)
        proc.send_signal(signal.SIGINT)
        _out, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
    # click reports Ctrl-C as "Aborted!" (exit 1) until cli.main handles it (exit 130, "pi2: interrupted").
    assert proc.returncode in (1, 130) and (b"Aborted" in err or b"interrupted" in err), err
    assert not partial.exists() and not (dev.root / "pi2" / "models" / on_device(files["model"])).exists()


def test_port_forward_reaches_a_server_on_the_device_and_is_removed(make_device):
    """`adb forward` through the daemon's tcp:PORT service: bytes flow both ways, a port nobody listens
    on is refused, and remove_forward leaves the adb server with no forward."""
    import socket
    import threading

    dev = make_device()
    t = get_target(dev.serial)
    listener = socket.create_server(("127.0.0.1", 0))  # "on the device": the daemon shares our loopback

    def echo_upper():
        conn, _ = listener.accept()
        with conn:
            while data := conn.recv(65536):
                conn.sendall(data.upper())

    threading.Thread(target=echo_upper, daemon=True).start()
    port = listener.getsockname()[1]
    local = t.forward(port)
    assert [(f.local, f.remote) for f in t.forwards()] == [(f"tcp:{local}", f"tcp:{port}")]
    payload = os.urandom(300_000).hex().encode()  # larger than one adb packet: flow control both ways
    with socket.create_connection(("127.0.0.1", local), timeout=10) as c:
        c.sendall(payload)  # no half-close: an adb stream closes both ways at once
        got = b""
        while len(got) < len(payload) and (chunk := c.recv(65536)):
            got += chunk
    assert got == payload.upper()
    listener.close()

    closed = t.forward(port)  # nothing listens there now: the open is refused
    with socket.create_connection(("127.0.0.1", closed), timeout=10) as c:
        c.settimeout(10)
        assert c.recv(10) == b""
    t.remove_forward(local)
    t.remove_forward(closed)
    t.remove_forward(closed)  # already gone: no error
    assert t.forwards() == []
