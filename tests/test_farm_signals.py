"""`kill -TERM` to `pi2 farm run` (what `systemctl stop` of the nightly unit sends first) stops the
night as Ctrl-C would: each worker stops its engine and stores the cell in progress as aborted, and no
worker or engine outlives the farm (issue 34). Before, the signal reached the parent alone: it died on
the spot and its workers ran the night on, unseen."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from engine_helpers import alive, needs_engine

sys.path.insert(0, str(Path(__file__).parent))
from test_farm_run import device, write_farm  # noqa: E402


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        kids = subprocess.run(["pgrep", "-P", str(todo.pop())], capture_output=True, text=True).stdout.split()
        out += [int(k) for k in kids]
        todo += [int(k) for k in kids]
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.slow
@needs_engine
def test_sigterm_to_farm_run_stops_workers_and_engines_and_stores_the_cell(tiny_model, tmp_path):
    # one long cell (4000 tokens in the 4096-token context): the signal lands mid-generation
    farm = write_farm(tmp_path / "farm.toml", [device("local")], tiny_model, workloads=("math",),
                      gate="", n_gen=4000)  # fmt: skip
    env = {**os.environ, "PI2_CACHE": str(tmp_path / "cache")}
    proc = subprocess.Popen([sys.executable, "-c", "from pi2cli.cli import main; main()", "farm", "run", str(farm)],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        deadline, engine = time.monotonic() + 120, None
        while engine is None and time.monotonic() < deadline and proc.poll() is None:
            engine = next((p for p in _descendants(proc.pid) if "pi2-engine" in _cmdline(p)), None)
            time.sleep(0.1)
        assert engine is not None, "the night never started an engine"
        time.sleep(1.0)
        family = _descendants(proc.pid)
        os.kill(proc.pid, signal.SIGTERM)  # the parent alone, as `kill -TERM PID` does
        _, err = proc.communicate(timeout=60)
        t0 = time.monotonic()
        while any(alive(p) for p in family) and time.monotonic() - t0 < 5:
            time.sleep(0.05)
        left = [(p, _cmdline(p)) for p in family if alive(p)]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert left == [], f"outlived the farm: {left}"
    assert proc.returncode == 128 + signal.SIGTERM, err.decode()
    assert b"Traceback" not in err, err.decode()
    (path,) = (tmp_path / "results" / "runs").glob("*.json")
    run = json.loads(path.read_text())
    assert run["status"] == "aborted" and run["error"].startswith("aborted: SIGTERM;"), run["error"]
    assert run["farm"]["cell"], run.get("farm")
