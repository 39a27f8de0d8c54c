"""The run recorder every bench mode records through (pi2cli.bench.recorder), without an engine: a fake
target's memory, and runs that fail under a budget, are interrupted, time out or lose their device."""

import time
from types import SimpleNamespace

import pytest
from results_fakes import fake_run

from pi2cli.bench.config import Reporter
from pi2cli.bench.limit import RunTimedOut
from pi2cli.bench.recorder import BenchInterrupted, DeviceVanished, RunRecorder
from pi2cli.errors import Pi2Error
from pi2cli.results import store
from pi2cli.targets.base import TargetError


class FakeTarget:
    """A target whose process PID holds PID MiB resident (half of it proportional)."""

    name, kind, on_this_machine = "fake", "local", True

    def read_memory(self, pid):
        return SimpleNamespace(rss_bytes=pid << 20, pss_bytes=pid << 19)


def recorder(tmp_path, budget_bytes=None, annotate=None) -> RunRecorder:
    return RunRecorder(fake_run(turns=1), target=FakeTarget(), budget_bytes=budget_bytes, label="fake",
                       engine="pi2", workload="dialogue", reporter=Reporter(), results_dir=str(tmp_path),
                       annotate=annotate)  # fmt: skip


def follow_until_sampled(rec: RunRecorder, pid: int) -> None:
    stop = rec.follow(pid)
    deadline = time.monotonic() + 10
    while not rec._samplers[-1].samples and time.monotonic() < deadline:
        time.sleep(0.01)
    stop()


def test_a_failure_under_its_budget_is_saved_with_the_budget_as_its_reason(tmp_path):
    rec = recorder(tmp_path, budget_bytes=64 << 20)
    follow_until_sampled(rec, 10)  # two processes of one run (a pp-tg cell): one curve, one clock
    follow_until_sampled(rec, 20)
    rec.budget_record = {"enforced": True, "how": "cgroup memory.max", "oom_kills": 1}
    stopped = []
    rec.on_failure(lambda: stopped.append(True))
    outcome = rec.fail(Pi2Error("pi2-engine exited with code -9"))
    assert stopped == [True]  # the engine is stopped before anything is recorded
    run = store.load_run(outcome.path)
    assert run["status"] == "failed"
    reason = "killed by the out-of-memory killer at the 64 MiB budget: pi2-engine exited with code -9"
    assert run["error"] == reason
    rss = [s["rss_bytes"] for s in run["memory_samples"]]
    assert rss[0] == 10 << 20 and rss[-1] == 20 << 20
    times = [s["t_s"] for s in run["memory_samples"]]
    assert times == sorted(times)
    assert run["counters"]["peak_pss_bytes"] == 20 << 19  # polled: no kernel peak of PSS exists
    assert run["memory"]["budget_bytes"] == 64 << 20 and run["memory"]["enforced"] is True


def test_ctrl_c_saves_the_run_as_aborted_and_ends_the_bench(tmp_path):
    with pytest.raises(BenchInterrupted) as info:
        recorder(tmp_path).fail(KeyboardInterrupt())
    saved = store.load_run(info.value.outcome.path)
    assert saved["status"] == "aborted" and "SIGINT (Ctrl-C)" in saved["error"]


def test_a_timeout_is_saved_and_the_bench_goes_on(tmp_path):
    calls = []
    rec = recorder(tmp_path, annotate=lambda run: calls.append(run["run_id"]))
    outcome = rec.fail(RunTimedOut(10, 10.5, "in q1 turn 1/1"))
    assert store.load_run(outcome.path)["status"] == "timeout"
    assert calls == [outcome.run["run_id"]]  # annotated once, right before the save


def test_a_lost_device_is_saved_and_ends_the_bench(tmp_path):
    with pytest.raises(DeviceVanished, match="saved as device_vanished") as info:
        recorder(tmp_path).fail(TargetError("adb: lost the device 1a2b3c"))
    assert store.load_run(info.value.outcome.path)["status"] == "device_vanished"
