"""The farm's parts without devices: the file's checks (one line per problem), the regression test's
false-alarm and detection rates on simulated histories, gating on a fake device, schedule lines."""

import numpy as np
import pytest
from click.testing import CliRunner

from pi2cli.cli import cli
from pi2cli.farm.file import Gate, cells_for, load_farm
from pi2cli.farm.gating import wait_for_gate
from pi2cli.farm.regressions import assess
from pi2cli.farm.sensors import parse_cpufreq, parse_gauge, parse_screen
from pi2cli.targets.base import CommandResult

GOOD = """name = "n"
[[device]]
name = "local"
[[device]]
name = "R5CT1"
adb_server = "lab:5037"
engines = ["pi2"]
[matrix]
models = ["m/model.pi2"]
engines = ["pi2", "llama.cpp"]
workloads = ["code", "math"]
budgets = ["none", "150M"]
"""


def test_a_good_file_and_its_cells(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text(GOOD)
    farm = load_farm(path)
    assert farm.models == [str(tmp_path / "m" / "model.pi2")] and farm.budgets == [None, 150 << 20]
    assert farm.devices[1].adb_server == "lab:5037" and farm.gate.max_cpu_temp_c == 45
    assert len(cells_for(farm, farm.devices[0])) == 8 and len(cells_for(farm, farm.devices[1])) == 4
    keys = [c.key for d in farm.devices for c in cells_for(farm, d)]
    assert len(keys) == len(set(keys))


@pytest.mark.parametrize(
    "change, message",
    [
        (("[matrix]", "[matrx]"), "unknown key 'matrx'"),
        (('engines = ["pi2", "llama.cpp"]', 'engines = ["pi3"]'), "unknown engine 'pi3'"),
        (('workloads = ["code", "math"]', 'workloads = ["poetry"]'), "unknown workload 'poetry'"),
        (('budgets = ["none", "150M"]', 'budgets = ["lots"]'), "matrix.budgets"),
        (('adb_server = "lab:5037"', 'adb_server = "lab"'), "adb_server must be HOST:PORT"),
        (('name = "R5CT1"\nadb_server = "lab:5037"', 'name = "local"'), "device 'local' is listed twice"),
        (('engines = ["pi2"]\n', 'engines = ["mlc-llm"]\n'), "engine 'mlc-llm' is not in matrix.engines"),
        (('name = "n"', 'name = "n"\nrepetitions = 0'), "farm.repetitions must be an integer >= 1"),
        (('name = "n"', 'name = "n"\n[gate]\nscreen_off = "yes"'), "gate.screen_off must be true or false"),
        (("[[device]]", "[[device]"), "not valid TOML"),
    ],
)
def test_each_problem_is_one_line(tmp_path, change, message):
    path = tmp_path / "farm.toml"
    path.write_text(GOOD.replace(*change, 1))
    r = CliRunner().invoke(cli, ["farm", "check", str(path)])
    assert r.exit_code == 1
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pi2: error: ") and message in lines[0], r.stderr


@pytest.mark.slow
def test_check_names_unreachable_devices_and_missing_models(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text(
        GOOD.replace('adb_server = "lab:5037"\n', "").replace('name = "R5CT1"', 'name = "127.0.0.1:9"')
    )
    r = CliRunner().invoke(cli, ["farm", "check", str(path)])
    assert r.exit_code == 1 and "device local: reachable" in r.stdout
    errors = r.stderr.strip().splitlines()
    assert (
        len(errors) == 2
        and "model.pi2: no such file" in errors[0]
        and "127.0.0.1:9: not reachable" in errors[1]
    )


# ------------------------------------------------------------------------------------------ statistics
def history(rng, slowdown, nights=10, start=8, night_sd=0.01, token_sd=0.10, tokens=200):
    """Token times of `nights` nights: each night off by its own small factor (night-to-night spread),
    tokens spread around it; from night `start` on, slower by `slowdown`."""
    names = [f"2026-11-{i:02d}" for i in range(1, nights + 1)]
    samples = {}
    for i, name in enumerate(names, 1):
        factor = np.exp(rng.normal(0, night_sd)) * (1 + slowdown if i >= start else 1)
        samples[name] = 1e6 * factor * np.exp(rng.normal(0, token_sd, tokens))
    return names, samples


def flag_rate(slowdown, n=80, seed=1, **kw):
    rng = np.random.default_rng(seed)
    return np.mean(
        [assess(("s",), *history(rng, slowdown, **kw), resamples=100, seed=i).flagged for i in range(n)]
    )


@pytest.mark.slow
def test_false_alarm_and_detection_rates():
    """The figures docs/FARM.md quotes (nightly spread 1%, token spread 10%, 200 tokens a night,
    slowdown from night 8 of 10, defaults alpha 0.05 and min effect 2%)."""
    rates = {s: flag_rate(s) for s in (0.0, 0.02, 0.05, 0.10)}
    print("flag rates:", rates)
    assert rates[0.0] <= 0.06  # false alarms on no-change histories
    assert rates[0.05] >= 0.8 and rates[0.10] >= 0.98  # real slowdowns are caught
    assert rates[0.0] < rates[0.02] < rates[0.05] <= rates[0.10]


@pytest.mark.slow
def test_one_noisy_night_is_not_a_regression():
    """An odd night in the middle (8% slow) is never flagged; a jittery newest night (token spread x3,
    same median) no more often than a quiet history is (the false-alarm rate)."""
    odd = jittery = 0
    for seed in range(40):
        rng = np.random.default_rng(seed)
        names, samples = history(rng, 0.0)
        samples[names[4]] = samples[names[4]] * 1.08
        odd += assess(("s",), names, samples, resamples=100).flagged
        names, samples = history(rng, 0.0)
        samples[names[-1]] = samples[names[-1]] * np.exp(rng.normal(0, 0.3, len(samples[names[-1]])))
        jittery += assess(("s",), names, samples, resamples=100).flagged
    assert odd == 0 and jittery <= 4
    assert "not tested: 2 night(s), needs at least 3" in assess(("s",), names[:2], samples).reason


# --------------------------------------------------------------------------------------------- gating
class FakePhone:
    """Answers the sensor script: hot for the first `hot_polls` reads, screen on once."""

    name = "fake"

    def __init__(self, hot_polls: int):
        self.polls, self.hot_polls = 0, hot_polls

    def sh(self, command, timeout=60):
        self.polls += 1
        temp = 50000 if self.polls <= self.hot_polls else 36000
        screen = "ON" if self.polls == 1 else "OFF"
        out = (f"@@thermal\ncpu-0 {temp}\n@@battery\n  level: 80\n  temperature: 300\n@@power\n"
               f"Display Power: state={screen}\n@@gauge\nbattery Battery -400000 3900000\n@@cpufreq\n"
               f"/sys/devices/system/cpu/cpu0 300000 2000000 1500000 schedutil\n@@meminfo\nMemAvailable: 1024 kB\n")  # fmt: skip
        return CommandResult(0, out, "")


def test_gate_waits_until_cool_and_records_why():
    phone, slept = FakePhone(hot_polls=3), []
    rec = wait_for_gate(phone, Gate(max_cpu_temp_c=45, poll_s=5), sleep=slept.append)
    assert rec["met"] and rec["polls"] == 4 and slept == [5, 5, 5]
    assert rec["reasons"] == ["CPU 50.0 °C >= 45 °C", "screen is on"] and rec["unknown"] == []
    assert rec["sensors"]["throttled"] is True and rec["sensors"]["governor"] == "schedutil"
    assert rec["sensors"]["power_w"] == pytest.approx(1.56) and rec["sensors"]["free_memory_bytes"] == 1 << 20
    timeout = wait_for_gate(FakePhone(hot_polls=99), Gate(wait_timeout_s=0), sleep=slept.append)
    assert not timeout["met"] and timeout["still"] == ["CPU 50.0 °C >= 45 °C", "screen is on"]


def test_sensor_parsers():
    assert parse_gauge("usb USB 0 5000000\nbattery Battery 250000 4000000\n") == pytest.approx(1.0)
    assert parse_gauge("usb USB 0 5000000\n") is None
    assert parse_screen("  mWakefulness=Asleep\n") is False and parse_screen("") is None
    assert parse_cpufreq("cpu0 300000 2000000 2000000 performance\n")["throttled"] is False


def test_schedule_prints_a_crontab_line_and_a_systemd_timer(tmp_path):
    path = tmp_path / "farm.toml"
    path.write_text(GOOD)
    r = CliRunner().invoke(cli, ["farm", "schedule", str(path), "--kind", "cron", "--at", "03:15"])
    assert r.exit_code == 0 and r.stdout.startswith("15 3 * * * cd ")
    assert "farm run" in r.stdout and "--resume" in r.stdout and "farm regressions" in r.stdout
    r = CliRunner().invoke(cli, ["farm", "schedule", str(path), "--kind", "systemd"])
    assert "OnCalendar=*-*-* 02:00:00" in r.stdout and "ExecStart=/bin/sh -c" in r.stdout
    r = CliRunner().invoke(cli, ["farm", "schedule", str(path), "--at", "25:00"])
    assert r.exit_code == 1 and r.stderr.strip() == "pi2: error: --at '25:00': use HH:MM, e.g. 02:30"


def test_long_builds_say_what_and_how_long_off_a_terminal(tmp_path, monkeypatch, capsys):
    """Off a terminal rich shows no bar: a build prints one plain line first (what, time, log)."""
    from pi2cli.builds import cmake_run, engine_build
    from pi2cli.builds.baselines import llamacpp_build
    from pi2cli.errors import Pi2Error

    monkeypatch.setattr(cmake_run, "run_logged", lambda *a, **k: 1)  # configure "fails" at once
    with pytest.raises(Pi2Error):
        engine_build._build(tmp_path, "linux-arm64", [], 1, True)
    with pytest.raises(Pi2Error):
        llamacpp_build._build(tmp_path, tmp_path, "linux-arm64", [], 1, True)
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("pi2: building pi2-engine for linux-arm64 (about 1-3 minutes")
    assert err[1].startswith("pi2: building llama.cpp ") and str(tmp_path / "build.log") in err[1]


def _fake_adb_server() -> tuple[int, callable]:
    """A tiny adb server that answers host:version and lists no devices: (port, stop)."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed by stop()
                return
            with conn:
                request = conn.recv(4)
                request = conn.recv(int(request, 16)).decode() if request else ""
                if request == "host:version":
                    conn.sendall(b"OKAY00040029")
                elif request.startswith("host:devices"):
                    conn.sendall(b"OKAY0000")
                else:
                    conn.sendall(b"FAIL0007unknown")

    threading.Thread(target=serve, daemon=True).start()
    return listener.getsockname()[1], lambda: (stop.set(), listener.close())


def test_check_tells_an_unreachable_adb_server_from_one_with_no_devices(tmp_path):
    """`farm check` used to say "adb devices: none" for a server that does not even resolve."""
    import socket

    closed = socket.create_server(("127.0.0.1", 0))
    closed_port = closed.getsockname()[1]
    closed.close()  # nothing listens there now
    port, stop = _fake_adb_server()
    path = tmp_path / "farm.toml"
    try:
        for server, expected, unexpected in (
            (
                "no-such-host.invalid:5037",
                "adb server no-such-host.invalid:5037 does not resolve",
                "adb devices",
            ),
            (
                f"127.0.0.1:{closed_port}",
                f"adb server 127.0.0.1:{closed_port} does not answer",
                "adb devices",
            ),
            (f"127.0.0.1:{port}", f"via adb server 127.0.0.1:{port} (which answers)", "does not"),
        ):
            path.write_text(GOOD.replace("lab:5037", server))
            r = CliRunner().invoke(cli, ["farm", "check", str(path)])
            assert r.exit_code == 1
            line = next(ln for ln in r.stderr.splitlines() if "R5CT1" in ln)
            assert expected in line and unexpected not in line, line
            if "which answers" in line:
                assert "no device 'R5CT1'" in line
    finally:
        stop()


def test_regressions_say_plainly_when_nothing_could_be_tested():
    """It used to print "0 of 2 series flagged" when no series had the 3 nights a test needs."""
    from pi2cli.farm.regressions import summary_line

    names, samples = history(np.random.default_rng(3), 0.5)
    short = [assess(("a",), names[:2], samples), assess(("b",), names[:1], samples)]
    assert not any(v.tested for v in short)
    line = summary_line(short)
    assert (
        line.startswith("nothing could be tested: none of 2 series has the 3 nights") and "0 of" not in line
    )
    full = assess(("c",), names, samples, resamples=200)
    assert full.tested and full.flagged
    assert summary_line(short + [full]).startswith("1 of 1 tested series flagged")
    assert "2 series not tested" in summary_line(short + [full])
