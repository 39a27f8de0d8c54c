"""The results readers read only regular files of a run's size, never block, and need no write: a FIFO, a
link to /dev/zero, a device node, a 2 GB file and malformed JSONs in runs/ are one warning each; a
read-only or full disk still lists (from a read-only SQLite connection, or from memory)."""

import contextlib
import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from results_fakes import fake_run

from pi2cli.paths import REPO_ROOT
from pi2cli.results import index as I
from pi2cli.results import store


def _pi2(*args: str, timeout: float = 90) -> subprocess.CompletedProcess:
    """The CLI in a child process, so a reader that blocks fails the test instead of hanging it."""
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    return subprocess.run([sys.executable, "-m", "pi2cli", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, stdin=subprocess.DEVNULL)  # fmt: skip


def _hostile_runs_dir(results_dir: Path) -> list[str]:
    """Two good runs beside a FIFO, a link to /dev/zero, a device node (where mknod works), a 2 GB sparse
    file and 20 malformed JSONs; returns the bad entries' names."""
    store.save_run(fake_run("llama.cpp", seed=1), results_dir)
    store.save_run(fake_run("pi2", policy="powerinfer2", tbt_ms=10, seed=2), results_dir)
    runs = results_dir / "runs"
    bad = []
    os.mkfifo(runs / "fifo.json")
    (runs / "zero.json").symlink_to("/dev/zero")
    bad += ["fifo.json", "zero.json"]
    with contextlib.suppress(PermissionError, OSError):
        os.mknod(runs / "null.json", 0o600 | 0o020000, os.makedev(1, 3))  # a character device: /dev/null's
        bad.append("null.json")
    with open(runs / "big.json", "wb") as f:
        f.truncate(2 << 30)  # sparse: 2 GiB of size, no blocks
    bad.append("big.json")
    for i in range(20):
        (runs / f"bad{i:02d}.json").write_text(
            ["{", "[1, 2]", '{"run_id": 5}', "\u00ff", ""][i % 5] + "x" * i
        )
        bad.append(f"bad{i:02d}.json")
    return bad


@pytest.fixture(scope="module")
def hostile(tmp_path_factory):
    results_dir = tmp_path_factory.mktemp("hostile")
    return results_dir, _hostile_runs_dir(results_dir)


@pytest.mark.slow
@pytest.mark.parametrize("command", [["results", "list"], ["results", "list", "--json"], ["compare"],
                                     ["report", "--out", "{tmp}/rep"]])  # fmt: skip
def test_special_files_are_named_once_and_never_block(hostile, tmp_path, command):
    results_dir, bad = hostile
    args = [a.replace("{tmp}", str(tmp_path)) for a in command]
    start = time.monotonic()
    out = _pi2(*args, "--results-dir", str(results_dir))
    took = time.monotonic() - start
    assert out.returncode == 0, out.stderr
    assert took < 60  # seconds, machine loaded; an old reader blocked on the FIFO forever
    warnings = out.stderr.splitlines()
    assert all(w.startswith("pi2: warning: skipped ") for w in warnings), out.stderr
    for name in bad:
        assert sum(f"/{name}:" in w for w in warnings) == 1, (name, out.stderr)
    assert len(warnings) == len(bad)
    joined = "\n".join(warnings)
    assert "fifo.json: a FIFO, not a regular file" in joined
    assert "zero.json: a symbolic link, not a regular file" in joined
    assert "big.json: 2 GiB, larger than any run file" in joined
    if "null.json" in bad:
        assert "null.json: a character device" in joined
    if command[0] == "report":
        assert (tmp_path / "rep" / "index.html").is_file()
    else:
        assert "llama.cpp" in out.stdout and "pi2:powerinfer2" in out.stdout


def test_read_run_file_refuses_what_is_not_a_regular_file(tmp_path):
    os.mkfifo(tmp_path / "f.json")
    (tmp_path / "z.json").symlink_to("/dev/zero")
    for name, words in (("f.json", "a FIFO"), ("z.json", "a symbolic link")):
        with pytest.raises(I.Pi2Error, match=words):
            I.read_run_file(tmp_path / name)  # returns at once: O_NONBLOCK, O_NOFOLLOW
    with open(tmp_path / "big.json", "wb") as f:
        f.truncate(I.MAX_RUN_FILE_BYTES + 1)
    with pytest.raises(I.Pi2Error, match="larger than any run file"):
        I.read_run_file(tmp_path / "big.json")


def test_an_index_in_step_is_read_through_a_read_only_connection(tmp_path, monkeypatch):
    run = fake_run()
    store.save_run(run, tmp_path)
    store.list_runs(tmp_path)  # in step now
    opened = []
    real = sqlite3.connect

    def spy(database, *args, **kwargs):
        opened.append((str(database), kwargs.get("uri", False)))
        return real(database, *args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", spy)
    before = (tmp_path / "pi2.sqlite").stat().st_mtime_ns
    assert [r["run_id"] for r in store.list_runs(tmp_path)] == [run["run_id"]]
    assert store.load_run(run["run_id"], tmp_path)["run_id"] == run["run_id"]
    path = (tmp_path / "pi2.sqlite").absolute()
    assert opened == [(f"file:{path}?mode=ro", True)] * 2  # listing and finding: read-only, nothing else
    assert (tmp_path / "pi2.sqlite").stat().st_mtime_ns == before


def test_a_stale_index_that_cannot_be_written_lists_from_memory(tmp_path, monkeypatch, capsys):
    first = fake_run(seed=1)
    store.save_run(first, tmp_path)
    store.list_runs(tmp_path)
    second = fake_run(seed=2, workload="code")
    (tmp_path / "runs" / f"{second['run_id']}.json").write_text(__import__("json").dumps(second))

    def refuse(self):
        raise sqlite3.OperationalError("attempt to write a readonly database")

    monkeypatch.setattr(I.Index, "_connect", refuse)
    rows = store.list_runs(tmp_path)
    assert {r["run_id"] for r in rows} == {first["run_id"], second["run_id"]}
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "not updated (attempt to write a readonly database)" in err[0]


@contextlib.contextmanager
def _tmpfs(where: Path, size: str):
    where.mkdir()
    try:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                              capture_output=True, text=True)  # fmt: skip
    except OSError:
        done = None
    if done is None or done.returncode != 0:
        pytest.skip("needs root to mount a small tmpfs (a full and a read-only disk)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path) -> None:
    with open(disk / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * 65536)
            f.flush()


@pytest.mark.slow
def test_full_and_read_only_disks_still_list(tmp_path):
    """A full disk used to fail every listing with sqlite's "cannot rollback - no transaction is active"."""
    with _tmpfs(tmp_path / "disk", "2m") as disk:
        results_dir = disk / "results"
        runs = [fake_run(seed=i, workload=f"w{i}") for i in range(3)]
        store.save_run(runs[0], results_dir)
        assert len(store.list_runs(results_dir)) == 1
        for run in runs[1:]:  # saved behind the index's back: it is stale
            (results_dir / "runs" / f"{run['run_id']}.json").write_text(__import__("json").dumps(run))
        _fill(disk)
        for command in (["results", "list", "--json"], ["compare", "--format", "json"],
                        ["results", "show", runs[2]["run_id"]]):  # fmt: skip
            out = _pi2(*command, "--results-dir", str(results_dir))
            assert out.returncode == 0, out.stderr
            assert "cannot rollback" not in out.stderr
            assert all(r["run_id"] in out.stdout for r in (runs[2:] if command[1] == "show" else runs))
        subprocess.run(["mount", "-o", "remount,ro", str(disk)], check=True)
        with pytest.raises(OSError):
            (disk / "probe").write_text("x")
        out = _pi2("results", "list", "--results-dir", str(results_dir))
        assert out.returncode == 0, out.stderr
        assert all(r["workload"]["name"] in out.stdout for r in runs)


@pytest.mark.slow
def test_a_second_file_with_a_stored_run_id_is_named_not_silently_swapped_in(tmp_path):
    """A copy of a run file (a backup, a planted file) holds a run_id another file holds: one row can
    hold only one, so the copy is skipped with a warning naming both, every listing alike -- it once
    replaced the first file's row without a word, and the two then took turns at each sync."""
    import json

    path = store.save_run(fake_run("pi2", policy="powerinfer2", seed=3), tmp_path)
    run = json.loads(Path(path).read_text())
    copy = tmp_path / "runs" / "zz-copy.json"
    copy.write_text(json.dumps({**run, "tags": ["planted"]}))
    for _ in range(2):
        out = _pi2("results", "list", "--json", "--results-dir", str(tmp_path))
        assert out.returncode == 0, out.stderr
        rows = json.loads(out.stdout)
        assert [r["run_id"] for r in rows] == [run["run_id"]] and rows[0]["path"].endswith(Path(path).name)
        warnings = out.stderr.splitlines()
        assert len(warnings) == 1 and "zz-copy.json" in warnings[0] and Path(path).name in warnings[0], (
            out.stderr
        )
