"""pi2-rusage and pi2cli.hw.rusage: the peak RSS of a command run to completion comes from the kernel.

The helper (tests/helpers/alloc_touch.c) sleeps 50 ms with a tiny resident set, then touches N MiB and
exits at once: the truth is N MiB (plus a few hundred KiB of its own), and a poll of /proc/PID/status
would have to land in the instant between the allocation and the exit to see it."""

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest
from engine_helpers import built

from pi2cli.bench.recorder import MemorySampler
from pi2cli.engines.mlc.runner import run_command_runner
from pi2cli.errors import Pi2Error
from pi2cli.hw.cgroup import Budget, detect_cgroup
from pi2cli.hw.rusage import Measured, engine_pid, parse_report, wrapper_binary
from pi2cli.targets import get_target

MiB = 2**20
HELPER_SRC = Path(__file__).parent / "helpers" / "alloc_touch.c"


@pytest.fixture(scope="module")
def wrapper() -> Path:
    built("pi2-rusage")  # `make engine` builds it; missing, engine_helpers.built's rule applies
    return wrapper_binary()


@pytest.fixture(scope="module")
def helper(tmp_path_factory) -> Path:
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        pytest.skip("no C compiler (cc) to build tests/helpers/alloc_touch.c")
    out = tmp_path_factory.mktemp("helper") / "alloc_touch"
    subprocess.run([cc, "-O2", "-o", str(out), str(HELPER_SRC)], check=True)
    return out


def measured_run(cmd: list[str], popen=subprocess.Popen, **kwargs):
    """The bench's path: pi2-rusage around cmd, started by `popen`; (usage, stdout, stderr)."""
    with Measured(cmd) as m:
        proc = popen(m.cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)
        out, err = proc.communicate(timeout=60)
        usage = m.usage()
    assert proc.returncode == (128 - usage.returncode if usage.returncode < 0 else usage.returncode)
    return usage, out, err


@pytest.mark.parametrize("mib", [16, 96])
def test_a_50ms_run_is_measured_to_within_a_few_mib(helper, wrapper, mib):
    usage, out, _ = measured_run([str(helper), str(mib)])
    assert usage.wall_s >= 0.05  # its 50 ms sleep, then the peak in its last instant
    assert usage.returncode == 0 and usage.exit_code == 0 and usage.signal is None and "decode" in out
    assert mib * MiB <= usage.maxrss_bytes <= (mib + 3) * MiB, usage.maxrss_bytes / MiB


def test_the_floor_is_the_wrappers_not_pythons(helper, wrapper):
    ballast = bytearray(160 * MiB)  # this Python process now has a peak of 160+ MiB
    ballast[::4096] = b"x" * len(ballast[::4096])
    usage, _, _ = measured_run([str(helper), "1", "0"])
    assert usage.maxrss_bytes < 4 * MiB, usage.maxrss_bytes / MiB
    # Why the wrapper exists: wait4() on a child forked straight from Python reports Python's peak.
    direct = subprocess.Popen([str(helper), "1", "0"], stdout=subprocess.DEVNULL)
    _, _, ru = os.wait4(direct.pid, 0)
    direct.returncode = 0
    assert ru.ru_maxrss * 1024 > 150 * MiB
    del ballast


def test_exit_status_signals_and_exec_errors(helper, wrapper, tmp_path):
    usage, _, _ = measured_run([str(helper), "1", "0", "7"])
    assert usage.exit_code == 7 and usage.returncode == 7 and usage.signal is None
    usage, _, _ = measured_run(["sh", "-c", "kill -9 $$"])
    assert usage.signal == 9 and usage.exit_code is None and usage.returncode == -9
    usage, _, err = measured_run([str(tmp_path / "no-such-program")])
    assert usage.exec_errno == 2 and usage.returncode == 127 and "cannot run" in err
    not_exec = tmp_path / "plain.txt"
    not_exec.write_text("x")
    usage, _, _ = measured_run([str(not_exec)])
    assert usage.exec_errno == 13 and usage.returncode == 126
    # its own errors: one line, exit 125, the command never runs
    for args in (
        [],
        ["true"],
        ["-o"],
        ["-o", str(tmp_path / "no" / "dir" / "r.json"), "true"],
        ["--bogus", "x"],
    ):
        done = subprocess.run([str(wrapper), *args], capture_output=True, text=True)
        assert done.returncode == 125 and len(done.stderr.strip().splitlines()) == 1, (args, done.stderr)
        assert done.stderr.startswith("pi2-rusage: ")


def test_signals_are_forwarded_and_killing_the_wrapper_kills_the_command(helper, wrapper):
    with Measured([str(helper), "1", "30000"]) as m:
        proc = subprocess.Popen(m.cmd)
        child = wait_for_child(proc.pid)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 128 + signal.SIGTERM
        usage = m.usage()
        assert usage.pid == child and usage.signal == signal.SIGTERM
    with Measured([str(helper), "1", "30000"]) as m:
        proc = subprocess.Popen(m.cmd)
        child = wait_for_child(proc.pid)
        proc.kill()  # SIGKILL cannot be forwarded: PR_SET_PDEATHSIG takes the command down with it
        proc.wait(10)
        assert gone_within(child, 5.0)
        with pytest.raises(Pi2Error, match="wrote no report"):
            m.usage()


def test_inside_a_budget_cgroup_the_command_is_in_it_too(helper, wrapper):
    if not detect_cgroup().usable:
        pytest.skip("no memory cgroup can be created here")
    with Budget(64 * MiB) as budget:
        usage, out, _ = measured_run(["cat", "/proc/self/cgroup"], popen=budget.popen)
        assert usage.returncode == 0 and "pi2-budget" in out
        usage, _, _ = measured_run([str(helper), "32"], popen=budget.popen)
        record = budget.record()
    assert 32 * MiB <= usage.maxrss_bytes <= 35 * MiB
    assert record["peak_bytes"] >= 32 * MiB


def test_the_memory_sampler_follows_the_command_not_the_wrapper(helper, wrapper):
    with Measured([str(helper), "64", "800"]) as m:  # 800 ms small, then 64 MiB and out at once
        proc = subprocess.Popen(m.cmd, stdout=subprocess.DEVNULL)
        sampler = MemorySampler(get_target(None), proc.pid, interval_s=0.05, wrapper=True).start()
        proc.wait(10)
        sampler.stop()
        usage = m.usage()
    assert sampler.pid == usage.pid != proc.pid  # the command's own pid, not pi2-rusage's
    assert len(sampler.samples) >= 2 and sampler.error is None
    assert usage.maxrss_bytes >= 64 * MiB  # the peak at the very end: samples all but never see it


@pytest.mark.slow
def test_an_mlc_command_runner_gets_the_kernels_peak(helper, wrapper):
    done = run_command_runner(f"{helper} 48", {"messages": []}, timeout_s=30)
    assert "decode: 5.0" in done.stdout
    assert 48 * MiB <= done.peak_rss_bytes <= 51 * MiB
    with pytest.raises(Pi2Error, match="failed with code 3"):
        run_command_runner(f"{helper} 1 0 3", {"messages": []}, timeout_s=30)
    with pytest.raises(Pi2Error, match="was not found: no-such-mlc-runner"):
        run_command_runner("no-such-mlc-runner --x", {"messages": []}, timeout_s=30)
    with pytest.raises(Pi2Error, match="took longer than 1 s"):
        run_command_runner(f"{helper} 1 5000", {"messages": []}, timeout_s=1)


def test_parse_report_says_what_is_wrong():
    with pytest.raises(Pi2Error, match="wrote no report"):
        parse_report("")
    with pytest.raises(Pi2Error, match="malformed report"):
        parse_report('{"pid": 1}')
    usage = parse_report('{"pid": 5, "exit_code": null, "signal": 15, "exec_errno": 0, "maxrss_bytes": 4096, '
                         '"utime_s": 0.1, "stime_s": 0.0, "wall_s": 0.2}\n')  # fmt: skip
    assert usage.returncode == -15 and usage.maxrss_bytes == 4096


def wait_for_child(wrapper_pid: int, timeout_s: float = 5.0) -> int:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pid = engine_pid(wrapper_pid)
        if pid is not None:
            return pid
        time.sleep(0.005)
    raise AssertionError(f"pi2-rusage {wrapper_pid} started no command")


def gone_within(pid: int, timeout_s: float) -> bool:
    """The process has exited (gone, or a zombie nobody has reaped yet)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state in ("Z", "X"):
            return True
        time.sleep(0.02)
    return False


def test_without_pi2_rusage_nothing_runs_and_the_error_is_one_line(tmp_path, smollm2_gguf, monkeypatch):
    from click.testing import CliRunner

    from pi2cli.cli import cli

    monkeypatch.setenv("PI2_BUILD_DIR", str(tmp_path / "empty-build"))
    for args in (["-e", "llama.cpp", "--mode", "llama-bench"], ["-e", "mlc-llm", "--mlc-runner", "true"]):
        result = CliRunner().invoke(cli, ["bench", "-m", str(smollm2_gguf), *args, "--results-dir",
                                          str(tmp_path / "results")])  # fmt: skip
        assert result.exit_code == 1 and "Traceback" not in result.output, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "pi2-rusage is not built (run `make engine`)" in lines[0], lines
    assert not (tmp_path / "results").exists()
