"""Issue 20, outputs half: output locations checked before any work, a late failed save that keeps the run
and says where, and every failure as one `pi2: error:` line (OSError, usage error, unexpected bug).
Issue 34: the engine's and the CLI's output files never written through a link, over a device or FIFO,
or left half-written."""

import errno
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.results import store


def _no_run(monkeypatch):
    """Any engine driver being asked for means the bench started: fail the test."""
    import pi2cli.engines as engines

    def refuse(name):
        raise AssertionError("the bench went on to its engines although its results could not be saved")

    monkeypatch.setattr(engines, "get_driver", refuse)


def _bench(tmp_path, results_dir, *extra):
    return CliRunner().invoke(cli, ["bench", "-m", str(tmp_path / "m.pi2"), "-e", "pi2", "--limit", "1",
                                    "--results-dir", str(results_dir), *extra])  # fmt: skip


def test_bench_under_a_file_refuses_before_running(tmp_path, monkeypatch):
    _no_run(monkeypatch)
    (tmp_path / "file").write_text("x")
    result = _bench(tmp_path, tmp_path / "file" / "results")
    assert result.exit_code == 1, result.output
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("pi2: error: --results-dir ")
    assert "Not a directory" in result.stderr and "nothing was run" in result.stderr


def test_bench_into_a_read_only_results_dir_refuses_before_running(tmp_path, monkeypatch):
    # Tests may run as root, for whom chmod does not make a directory read-only: the probe file's
    # creation fails as it does on a read-only mount.
    _no_run(monkeypatch)
    results = tmp_path / "ro"
    results.mkdir()
    real = tempfile.mkstemp

    def read_only(*args, dir=None, **kwargs):
        if dir is not None and str(dir).startswith(str(results)):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(dir))
        return real(*args, dir=dir, **kwargs)

    monkeypatch.setattr(tempfile, "mkstemp", read_only)
    result = _bench(tmp_path, results)
    assert result.exit_code == 1, result.output
    assert (
        result.stderr.strip()
        == f"pi2: error: --results-dir {results / 'runs'}: Read-only file system (nothing was run)"
    )


def _full_disk(monkeypatch, full_dir):
    """ENOSPC for every file written under full_dir (the results), as a disk filling mid-bench gives."""
    real = store.atomic_write_text

    def write(path, text):
        if str(path).startswith(str(full_dir)):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real(path, text)

    monkeypatch.setattr(store, "atomic_write_text", write)


def test_a_save_that_fails_at_the_end_keeps_the_run_and_says_where(tmp_path, monkeypatch):
    unsaved = tmp_path / "unsaved"
    monkeypatch.setenv("PI2_UNSAVED_DIR", str(unsaved))
    _full_disk(monkeypatch, tmp_path / "results")
    run = fake_run()
    with pytest.raises(store.RunNotSaved) as err:
        store.save_run(run, tmp_path / "results")
    message = str(err.value)
    kept = unsaved / f"{run['run_id']}.json"
    assert "No space left on device" in message and f"kept it at {kept}" in message and "\n" not in message
    assert json.loads(kept.read_text())["run_id"] == run["run_id"]
    # Moved back once there is room, it is an ordinary run.
    monkeypatch.undo()
    (tmp_path / "results" / "runs").mkdir(parents=True)
    kept.rename(tmp_path / "results" / "runs" / kept.name)
    assert [r["run_id"] for r in store.list_runs(tmp_path / "results")] == [run["run_id"]]


def test_a_run_the_schema_refuses_is_kept_too(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_UNSAVED_DIR", str(tmp_path / "unsaved"))
    run = fake_run()
    run["counters"]["peak_rss_bytes"] = 1 << 70
    with pytest.raises(store.schema.ResultSchemaError, match="kept it at"):
        store.save_run(run, tmp_path / "results")
    assert (tmp_path / "unsaved" / f"{run['run_id']}.json").exists()


@pytest.fixture
def broken_model(tmp_path, smollm2_gguf):
    """A .pi2 the engine refuses at load, next to a real GGUF twin (for the chat template)."""
    d = tmp_path / "broken"
    d.mkdir()
    (d / "model.gguf").symlink_to(smollm2_gguf)
    (d / "model.pi2").write_bytes(b"PI2\0" + b"\0" * 60)
    return d / "model.pi2"


@needs_engine
def test_a_failed_run_shows_its_reason_in_the_bench_table(tmp_path, broken_model, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    result = CliRunner().invoke(cli, ["bench", "-m", str(broken_model), "-w", "code", "--limit", "1", "-n", "2",
                                      "--results-dir", str(tmp_path / "r")])  # fmt: skip
    assert result.exit_code == 1, result.output
    (row,) = [ln.split() for ln in result.stdout.splitlines() if ln.startswith(" pi2")]  # the table's one row
    assert "failed" in row, result.stdout
    (why,) = [ln for ln in result.stdout.splitlines() if ln.startswith("  pi2 / code: ")]  # after the table
    assert "failed: pi2-engine exited" in why, result.stdout


@needs_engine
def test_a_bench_whose_disk_fills_at_save_time_keeps_the_run(tmp_path, broken_model, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PI2_UNSAVED_DIR", str(tmp_path / "unsaved"))
    _full_disk(monkeypatch, tmp_path / "r")
    result = CliRunner().invoke(cli, ["bench", "-m", str(broken_model), "-w", "code", "--limit", "1", "-n", "2",
                                      "--results-dir", str(tmp_path / "r")])  # fmt: skip
    assert result.exit_code == 1, result.output
    (kept,) = (tmp_path / "unsaved").glob("*.json")
    (error,) = [ln for ln in result.stderr.splitlines() if ln.startswith("pi2: ")]  # (the rest: progress)
    assert error.startswith("pi2: error: cannot save run ") and "No space left on device" in error
    assert f"kept it at {kept}" in error
    assert json.loads(kept.read_text())["status"] == "failed"


# --------------------------------------------------------------------------------- one line, every error
def _pi2(*args, env=None):
    """The real entry point (pi2cli.cli:main), as a user's shell runs it."""
    return subprocess.run([sys.executable, "-c", "from pi2cli.cli import main; main()", *args], text=True,
                          capture_output=True, env={**os.environ, **(env or {})}, timeout=120)  # fmt: skip


@pytest.mark.slow
def test_usage_errors_are_one_line():
    for args in (["bnch"], ["bench", "--bogus"], ["plan", "-m"], ["results", "list", "--limit", "zero"]):
        p = _pi2(*args)
        assert p.returncode == 2 and p.stderr.count("\n") == 1 and p.stderr.startswith("pi2: error: "), (
            args,
            p.stderr,
        )
        assert "--help" in p.stderr


@pytest.mark.slow
def test_os_errors_are_path_and_reason(tmp_path):
    (tmp_path / "file").write_text("x")
    out = tmp_path / "file" / "plan.json"
    p = _pi2("plan", "-m", str(tmp_path / "m.pi2"), "-b", "1G", "-o", str(out))
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"pi2: error: --out {out}: directory {out.parent}: Not a directory")
    synth = _pi2("models", "synth", "--like", "turbosparse-mistral-7b", "--layers", "1", "--hidden", "64",
                 "--ffn", "256", "--out", str(tmp_path / "file" / "m"))  # fmt: skip
    assert synth.returncode == 1 and synth.stderr.count("\n") == 1 and "Not a directory" in synth.stderr
    conv = _pi2("convert", str(tmp_path / "file"), "--out", str(tmp_path / "file" / "x.pi2"))
    assert conv.returncode == 1 and conv.stderr.count("\n") == 1 and "Not a directory" in conv.stderr
    report = _pi2("report", "--out", str(tmp_path / "file" / "rep"), "--results-dir", str(tmp_path / "r"))
    assert (
        report.returncode == 1
        and report.stderr.strip() == f"pi2: error: --out {tmp_path / 'file' / 'rep'}: Not a directory"
    )


def test_unexpected_exceptions_are_one_line_unless_debugging(tmp_path):
    code = ("import pi2cli.commands.workloads as w, click\n"
            "@click.command(name='workloads')\n"
            "def boom():\n    raise ZeroDivisionError('division by zero')\n"
            "w.command = boom\nfrom pi2cli.cli import main; main()")  # fmt: skip
    p = subprocess.run([sys.executable, "-c", code, "workloads"], text=True, capture_output=True, timeout=60)
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("pi2: error: internal error: ZeroDivisionError: division by zero")
    debug = subprocess.run([sys.executable, "-c", code, "workloads"], text=True, capture_output=True, timeout=60,
                           env={**os.environ, "PI2_DEBUG": "1"})  # fmt: skip
    assert "Traceback" in debug.stderr


# ------------------------------------------------------------------ the engine's output files (issue 34)
# `eval --logits-out` (a whole file: temp beside it, fsync, rename) and `--events` (a stream the host
# tails: opened in place) take a regular file or nothing: a link, a device, a FIFO or a read-only
# directory at the target is one error line, a non-zero exit, the target as it was and nothing left
# beside it.
@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    from crafted_models import write_tiny_model

    return write_tiny_model(tmp_path_factory.mktemp("tiny") / "m.pi2")


def _read_only(directory):
    """argv prefix that runs a command with `directory` read-only: chmod for a user, a read-only bind
    mount in a private mount namespace for root (whom permissions do not stop)."""
    if os.geteuid() != 0:
        directory.chmod(0o555)
        return []
    script = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
    probe = subprocess.run(["unshare", "-m", "sh", "-c", script, str(directory), "true"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("root without mount namespaces: no way to make a directory read-only")
    return ["unshare", "-m", "sh", "-c", script, str(directory)]


def _target(kind, tmp_path):
    """(path, prefix, state()): the target, an argv prefix, and a snapshot of what is there."""
    d = tmp_path / "out"
    d.mkdir()
    prefix = []
    if kind == "symlink":
        (tmp_path / "victim").write_text("someone else's file\n")
        path = d / "f"
        path.symlink_to(tmp_path / "victim")
    elif kind == "device":
        path = "/dev/full"
    elif kind == "fifo":
        path = d / "f"
        os.mkfifo(path)
    else:  # read-only directory
        path = d / "f"
        prefix = _read_only(d)

    def state():
        def stat(p):
            s = os.lstat(p)
            return (s.st_mode, s.st_rdev, s.st_size, s.st_mtime_ns, s.st_ino)

        listing = {name: stat(d / name) for name in os.listdir(d)}
        victim = (tmp_path / "victim").read_text() if kind == "symlink" else None
        return listing, victim, stat(path) if os.path.lexists(path) else None

    return path, prefix, state


def _engine_run(prefix, *args, preexec=None):
    from engine_helpers import engine_bin

    return subprocess.run([*prefix, str(engine_bin()), *map(str, args)], capture_output=True, text=True,
                          timeout=60, preexec_fn=preexec)  # fmt: skip


def _refused(done, flag, path):
    assert done.returncode == 1, (done.returncode, done.stderr)
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"pi2-engine: error: {flag} {path}: "), done.stderr


TARGETS = ["symlink", "device", "fifo", "read_only_dir"]


@needs_engine
@pytest.mark.parametrize("kind", TARGETS)
def test_eval_logits_out_refuses_what_is_not_a_regular_file(tiny_model, tmp_path, kind):
    path, prefix, state = _target(kind, tmp_path)
    before = state()
    done = _engine_run(prefix, "eval", "-m", tiny_model, "--tokens", "1,2", "--logits-out", path)
    _refused(done, "--logits-out", path)
    assert state() == before  # the target untouched, no .partial or temp file beside it


@needs_engine
@pytest.mark.parametrize("kind", TARGETS)
def test_events_refuses_what_is_not_a_regular_file(tiny_model, tmp_path, kind):
    path, prefix, state = _target(kind, tmp_path)
    before = state()
    done = _engine_run(prefix, "generate", "-m", tiny_model, "-p", "hi", "-n", "2", "--events", path)
    _refused(done, "--events", path)
    assert done.stdout == ""
    assert state() == before


def _disk_full_at(limit):
    """A child whose files cannot grow past `limit` bytes (EFBIG, as a full disk gives ENOSPC)."""
    import resource
    import signal

    def preexec():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    return preexec


@needs_engine
def test_eval_logits_out_on_a_full_disk_keeps_the_old_file_and_leaves_nothing(tiny_model, tmp_path):
    out = tmp_path / "logits.bin"
    out.write_bytes(b"old")
    done = _engine_run([], "eval", "-m", tiny_model, "--tokens", "1,2,3", "--all", "--logits-out", out,
                       preexec=_disk_full_at(300))  # fmt: skip
    _refused(done, "--logits-out", out)
    assert "write failed: File too large" in done.stderr
    assert out.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["logits.bin"]
    ok = _engine_run([], "eval", "-m", tiny_model, "--tokens", "1,2,3", "--all", "--logits-out", out)
    assert (
        ok.returncode == 0
        and out.stat().st_size == 3 * 64 * 4
        and sorted(os.listdir(tmp_path)) == ["logits.bin"]
    )


@needs_engine
@pytest.mark.parametrize("command", ["generate", "chat"])
def test_events_lost_to_a_full_disk_fail_the_run(tiny_model, tmp_path, command):
    # The run used to exit 0 with its events gone.
    events = tmp_path / "events.jsonl"
    args = ["-p", "hi", "-n", "8"] if command == "generate" else []
    from engine_helpers import engine_bin

    done = subprocess.run([str(engine_bin()), command, "-m", str(tiny_model), *args, "--events", str(events)],
                          input='{"prompt": "hi", "n_predict": 8}\n', capture_output=True, text=True, timeout=60,
                          preexec_fn=_disk_full_at(200))  # fmt: skip
    assert done.returncode == 1, done.stderr
    (line,) = [ln for ln in done.stderr.splitlines() if ln.strip()]
    assert line == f"pi2-engine: error: --events {events}: write failed: File too large", done.stderr


# ----------------------------------------------------------------- the CLI's output files (issue 34)
# pi2cli.safe_write: the host's files follow the engine's rules.
def _host_target(kind, tmp_path):
    path, prefix, state = _target(kind, tmp_path)
    return Path(path), prefix, state


def _write_in_child(prefix, path, preexec=None, text="x" * 5000):
    code = f"from pi2cli import safe_write; safe_write.write_text({str(path)!r}, {text!r})"
    return subprocess.run([*prefix, sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                          preexec_fn=preexec)  # fmt: skip


@pytest.mark.parametrize("kind", TARGETS)
def test_safe_write_refuses_what_is_not_a_regular_file(tmp_path, kind):
    path, prefix, state = _host_target(kind, tmp_path)
    before = state()
    done = _write_in_child(prefix, path)
    assert done.returncode == 1 and "OSError" in done.stderr, done.stderr
    reason = done.stderr.strip().splitlines()[-1]
    if kind != "read_only_dir":
        assert f"{path}" in reason and ("symbolic link" in reason or "not a regular file" in reason), reason
    assert state() == before


def test_safe_write_on_a_full_disk_keeps_the_old_file_and_leaves_nothing(tmp_path):
    out = tmp_path / "plan.json"
    out.write_text("old")
    done = _write_in_child([], out, preexec=_disk_full_at(1000))
    assert done.returncode == 1 and "File too large" in done.stderr, done.stderr
    assert out.read_text() == "old" and sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_a_planted_partial_link_is_never_written_through(tmp_path):
    # The old writers opened a predictable temp name (PATH.partial, .NAME.partial-PID) with O_TRUNC:
    # a symlink planted under it sent the write (and the truncation) to the file it pointed at.
    from crafted_models import write_tiny_model

    from pi2cli.models.gguf_twin import GgufTwinWriter
    from pi2cli.models.profile import save_profile
    from pi2cli.plan.profile import write_json_atomic

    victim = tmp_path / "victim"
    victim.write_text("someone else's file\n")
    out = tmp_path / "plan.json"
    for planted in ("plan.json.partial", f".plan.json.partial-{os.getpid()}", "m.pi2.partial",
                    f".m.pi2.partial-{os.getpid()}", f".p.npz.partial-{os.getpid()}.npz"):  # fmt: skip
        (tmp_path / planted).symlink_to(victim)
    (tmp_path / ".t.gguf.partial").symlink_to(victim)  # the GGUF twin's temp name is fixed (resumable)
    write_json_atomic(out, {"format": "pi2-plan"})
    write_tiny_model(tmp_path / "m.pi2")
    save_profile(tmp_path / "p.npz", {"a": np.zeros(3, np.float32)}, {"k": 1})
    twin = GgufTwinWriter(tmp_path / "t.gguf", [])
    twin.declare("a", (32,), "f32")
    twin.start()
    twin.write("a", np.ones(32, np.float32))
    twin.close()
    assert victim.read_text() == "someone else's file\n"
    assert json.loads(out.read_text()) == {"format": "pi2-plan"}
    assert (tmp_path / "m.pi2").stat().st_size > 4096 and (tmp_path / "p.npz").stat().st_size > 0
    assert (tmp_path / "t.gguf").read_bytes()[:4] == b"GGUF"
    assert not [p for p in os.listdir(tmp_path) if p.endswith(".tmp")]


def test_an_output_that_is_a_link_is_refused_before_any_work(tmp_path):
    (tmp_path / "victim").write_text("keep")
    out = tmp_path / "plan.json"
    out.symlink_to(tmp_path / "victim")
    p = _pi2("plan", "-m", str(tmp_path / "m.pi2"), "-b", "1G", "-o", str(out))
    assert p.returncode == 1 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"pi2: error: --out {out}: is a symbolic link"), p.stderr
    assert (tmp_path / "victim").read_text() == "keep" and out.is_symlink()


def test_models_profile_refuses_a_link_at_out_before_profiling(tmp_path, monkeypatch):
    """The profile takes minutes of numpy forward passes: an --out it will refuse (a link) is refused
    first, not after the work."""
    from click.testing import CliRunner

    from pi2cli.cli import cli
    from pi2cli.models import profile as prof
    from pi2cli.paths import REPO_ROOT

    def must_not_run(*args, **kwargs):
        raise AssertionError("profiled before checking --out")

    monkeypatch.setattr(prof, "workload_texts", must_not_run)
    (tmp_path / "victim").write_text("keep")
    (tmp_path / "m.pi2").write_bytes(b"")
    out = tmp_path / "p.npz"
    out.symlink_to(tmp_path / "victim")
    r = CliRunner().invoke(cli, ["models", "profile", "-m", str(tmp_path / "m.pi2"), "-w",
                                 str(REPO_ROOT / "workloads" / "code.jsonl"), "--out", str(out)])  # fmt: skip
    assert r.exit_code == 1 and "symbolic link" in r.stderr and r.stderr.count("\n") == 1, r.output
    assert (tmp_path / "victim").read_text() == "keep" and out.is_symlink()
