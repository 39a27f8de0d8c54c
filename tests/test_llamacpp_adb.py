"""llama.cpp in `pi2 bench --device`: llama-server pushed to the test adb daemon, started there over adb
shell, reached through adb forward (the daemon's tcp: service), timed like a local server; and the
ways a run ends (normally, Ctrl-C, a device that vanishes) leave no server and no forward behind."""

import json
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from pi2cli.bench.recorder import BenchInterrupted, DeviceVanished
from pi2cli.bench.run import BenchConfig, Reporter, run_bench
from pi2cli.cli import cli
from pi2cli.engines.llamacpp.driver import LlamaCppDriver, build_target_for
from pi2cli.errors import Pi2Error
from pi2cli.hw.push import model_remote_name, sha256_file
from pi2cli.results import store
from pi2cli.targets import get_target

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import AdbServer, TestDevice  # noqa: E402


@pytest.fixture(scope="module")
def adb(tmp_path_factory):
    """One private adb server for the module (starting one takes seconds); devices come and go."""
    server = AdbServer(tmp_path_factory.mktemp("adbhome"))
    mp = pytest.MonkeyPatch()
    mp.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
    yield server
    mp.undo()
    server.stop()


@pytest.fixture
def phone(tmp_path, adb):
    with adb.device(tmp_path / "phone") as device:
        yield device


def servers_on(phone) -> list[psutil.Process]:
    """llama-server processes started from the phone's directory (the daemon runs them on this host)."""
    assert phone.root.is_dir()
    found = []
    for p in psutil.process_iter(["cmdline", "status"]):
        cmd = p.info["cmdline"] or []
        # the program itself, or qemu-aarch64 running it
        ours = any(a.startswith(str(phone.root)) and a.endswith("llama-server") for a in cmd[:2])
        if ours and p.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(p)
    return found


def wait_gone(phone, seconds: float = 10) -> list:
    deadline = time.monotonic() + seconds
    while (left := servers_on(phone)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


class Messages(Reporter):
    def __init__(self, stop_after: int | None = None, action=None):
        self.lines, self.left, self.action = [], stop_after, action

    def message(self, text):
        self.lines.append(text)

    def turn_done(self, label, decode_tps, ttft_ms):
        if self.left is not None:
            self.left -= 1
            if self.left == 0:
                if self.action is None:
                    raise KeyboardInterrupt
                self.action()


@pytest.mark.slow
def test_bench_llamacpp_on_the_test_adb_daemon(bench_env, tiny_model, phone, adb):
    r = CliRunner().invoke(cli, ["bench", "--model", str(tiny_model), "--engine", "llama.cpp", "--workload",
                                 "multi-turn", "--limit", "1", "-n", "8", "--device", phone.serial,
                                 "--results-dir", str(bench_env), "--json"], catch_exceptions=False)  # fmt: skip
    assert r.exit_code == 0, r.output
    (row,) = json.loads(r.stdout)["runs"]
    assert row["engine"] == "llama.cpp" and row["status"] == "ok" and row["n_turns"] >= 2
    for key in ("ttft_ms", "tbt_p50_ms", "tbt_p90_ms", "tbt_p99_ms", "decode_tps"):
        assert row[key] is not None and row[key] > 0, key
    run = store.load_run(row["result_file"])
    assert run["target"]["kind"] == "adb" and run["target"]["model"] == "pi2_test_adbd"
    assert "adb forward" in run["measurement"]
    turns = run["turns"]
    # (llama-server may hold back a token that ends inside a UTF-8 character: 7 of 8 streamed, as locally)
    assert all(t["status"] == "ok" and 7 <= t["n_gen"] <= 8 for t in turns)
    assert all(len(t["samples_ns"]) == t["n_gen"] - 1 and min(t["samples_ns"]) > 0 for t in turns)
    # the KV cache is kept across turns on the device, as locally
    assert all(t["extra"]["n_prompt_cached"] > 0 for t in turns[1:])
    # memory read on the device: the server's VmHWM (and PSS from smaps_rollup, which the host kernel has)
    assert row["peak_rss_bytes"] > 16 << 20 and run["memory_samples"]
    assert run["counters"]["peak_rss_source"] == "device VmHWM via shell"
    assert run["counters"]["peak_pss_bytes"] > 0
    pushed = phone.root / "pi2"
    twin = tiny_model.with_suffix(".gguf")
    on_device = pushed / "models" / model_remote_name(twin, sha256_file(twin))  # NAME-HASH.gguf
    assert (pushed / "bin" / "llama-server").is_file() and on_device.is_file()
    assert not list((pushed / "models").glob("*.pi2"))  # llama.cpp needs only the twin
    assert "forward" not in adb.call("forward", "--list") and not wait_gone(phone)

    # A second bench pushes nothing (content hashes match) and runs again.
    msgs = Messages()
    cfg = BenchConfig(model=str(tiny_model), engines=["llama.cpp"], workloads=["code"], limit=1, n_gen=4,
                      device=phone.serial, results_dir=str(bench_env))  # fmt: skip
    (outcome,) = run_bench(cfg, msgs)
    assert outcome.run["status"] == "ok"
    assert f"{phone.serial}: 0 copied, 2 already there" in msgs.lines


@pytest.mark.slow
def test_ctrl_c_stops_the_server_on_the_device_and_removes_the_forward(bench_env, tiny_model, phone, adb):
    cfg = BenchConfig(model=str(tiny_model), engines=["llama.cpp"], workloads=["code"], limit=3, n_gen=4,
                      device=phone.serial, results_dir=str(bench_env))  # fmt: skip
    seen = []
    msgs = Messages(stop_after=1, action=None)
    real = msgs.turn_done

    def spy(*a):
        seen.extend(servers_on(phone))
        seen.append(adb.call("forward", "--list"))
        real(*a)

    msgs.turn_done = spy
    with pytest.raises(BenchInterrupted) as info:
        run_bench(cfg, msgs)
    assert seen[0] and "tcp:" in seen[1]  # while it ran: a server on the device, a forward here
    run = store.load_run(info.value.outcome.path)
    assert run["status"] == "aborted" and len(run["turns"]) == 1
    assert not wait_gone(phone) and adb.call("forward", "--list").strip() == ""


@pytest.mark.slow
def test_device_that_vanishes_mid_run_is_a_failure_record_and_no_orphan(bench_env, tiny_model, phone, adb):
    cfg = BenchConfig(model=str(tiny_model), engines=["llama.cpp"], workloads=["code"], limit=3, n_gen=4,
                      device=phone.serial, results_dir=str(bench_env))  # fmt: skip
    start = time.monotonic()
    with pytest.raises(DeviceVanished) as info:
        run_bench(cfg, Messages(stop_after=1, action=phone.stop))  # the daemon dies: "unplugged"
    assert time.monotonic() - start < 60
    run = store.load_run(info.value.outcome.path)
    assert run["status"] == "device_vanished" and len(run["turns"]) == 1
    assert phone.serial in str(info.value) and "\n" not in str(info.value)
    # the watchdog saw its adb connection end and stopped the server; the adb server dropped the forward
    assert not wait_gone(phone)
    assert adb.call("forward", "--list").strip() == ""


@pytest.mark.slow
def test_server_that_cannot_start_on_the_device_is_a_failed_run(bench_env, tiny_model, phone, tmp_path):
    bad = tmp_path / "bad"
    bad.mkdir()
    data = tiny_model.with_suffix(".gguf").read_bytes()
    (bad / "model.gguf").write_bytes(data[: len(data) * 9 // 10])  # header intact, tensor data cut short
    (bad / "model.pi2").write_bytes(b"")
    r = CliRunner().invoke(cli, ["bench", "-m", str(bad / "model.pi2"), "-e", "llama.cpp", "-w", "code",
                                 "--limit", "1", "-n", "4", "--device", phone.serial, "--results-dir", str(bench_env),
                                 "--json"])  # fmt: skip
    assert r.exit_code == 1 and "Traceback" not in r.output, r.output
    assert r.stdout, r.output
    (row,) = json.loads(r.stdout)["runs"]
    assert (
        row["status"] == "failed" and "llama-server on" in row["error"] and "exited with code" in row["error"]
    )


def test_which_build_runs_where(monkeypatch):
    class T:
        def __init__(self, kind, arch, features=("shell_v2",)):
            self.kind, self.arch, self.name, self.features = kind, arch, "t", set(features)
            self.on_this_machine, self.native_here = kind in ("local", "qemu"), kind == "local"

    import platform

    from pi2cli.targets.base import normalize_arch

    here = normalize_arch(platform.machine())
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    assert build_target_for(T("local", here)) == "host"
    assert build_target_for(T("adb", here)) == "host"  # an emulator or the test daemon
    if here != "arm64":
        assert build_target_for(T("adb", "arm64")) == "linux-arm64"  # static: runs from /data/local/tmp
        monkeypatch.setenv("ANDROID_NDK_HOME", "/opt/ndk")
        assert build_target_for(T("adb", "arm64")) == "android-arm64"
    with pytest.raises(Pi2Error, match="no llama.cpp build"):
        build_target_for(T("adb", "mips"))
    d = LlamaCppDriver()
    assert d.supports(T("adb", "arm64")) is None and d.supports(T("local", here)) is None
    assert "shell v2" in d.supports(T("adb", "arm64", features=()))
    assert "mips" in d.supports(T("adb", "mips")) and "qemu" in d.supports(T("qemu", "arm64"))


def test_forward_to_a_vanished_device_is_one_clear_error(phone, adb):
    from pi2cli.targets import TargetError

    t = get_target(phone.serial)
    phone.stop()
    deadline = time.monotonic() + 10
    while adb.state(phone.serial) == "device" and time.monotonic() < deadline:
        time.sleep(0.05)
    with pytest.raises(TargetError, match="cannot forward a port to") as info:
        t.forward(8080)
    assert "\n" not in str(info.value)


def _cached_arm64_build() -> Path | None:
    """The linux-arm64 llama.cpp build when it is already in the cache (never built here: ~35 min)."""
    import shutil

    from pi2cli.builds.baselines.llamacpp_build import build_dir_for, cache_key, cmake_args, is_complete

    if shutil.which("qemu-aarch64") is None or shutil.which("aarch64-linux-gnu-gcc") is None:
        return None
    build = build_dir_for("linux-arm64", cache_key("linux-arm64", cmake_args("linux-arm64")))
    return build / "bin" if is_complete(build) else None


ARM64_BUILD = _cached_arm64_build()


@pytest.mark.slow
@pytest.mark.skipif(ARM64_BUILD is None, reason="no cached linux-arm64 llama.cpp build or no qemu-aarch64 "
                    "(`pi2 build --engine llama.cpp --target linux-arm64`)")  # fmt: skip
def test_arm64_device_gets_the_arm64_build(tiny_model, tmp_path, adb, monkeypatch):
    """A device that says arm64 gets the static linux-arm64 llama-server (no NDK here); the daemon runs
    it through qemu-aarch64 as binfmt_misc would. Emulated: this checks the path, not the speed."""
    monkeypatch.delenv("ANDROID_NDK_HOME", raising=False)
    device = TestDevice(tmp_path / "arm-phone", "--abi", "arm64-v8a", "--qemu")
    try:
        adb.connect(device.serial)
        cfg = BenchConfig(model=str(tiny_model), engines=["llama.cpp"], workloads=["code"], limit=1, n_gen=4,
                          device=device.serial, results_dir=str(tmp_path / "results"))  # fmt: skip
        (outcome,) = run_bench(cfg)
        run = outcome.run
        assert run["status"] == "ok" and run["target"]["arch"] == "arm64", run["error"]
        assert "aarch64" in run["engine"]["build_flags"]
        pushed = (device.root / "pi2" / "bin" / "llama-server").read_bytes()
        assert pushed == (ARM64_BUILD / "llama-server").read_bytes()
        assert run["turns"][0]["n_gen"] >= 3 and run["summary"]["peak_rss_bytes"] > 0
        assert not wait_gone(device)
    finally:
        adb.call("disconnect", device.serial, timeout=10)
        device.stop()


def _turn_p50s_ms(run: dict) -> list[float]:
    import numpy as np

    return [float(np.median(t["samples_ns"])) / 1e6 for t in run["turns"] if t["status"] == "ok"]


@pytest.mark.slow
def test_tbt_on_the_device_is_the_engines_not_the_forwards_bursts(bench_env, tiny_model, phone):
    """Over adb, a turn's token times are the server's own per-token stamps (clock "engine"), never the
    arrivals through the forward, and they agree with the same build on the same weights run here.
    Arrivals through a real phone's forward come in bursts; this daemon's forward once did too (host
    stamps read 0.007 ms) but no longer does (they read 1.5-2 ms, as local), so the bursts themselves are
    tested with a stand-in server in test_llamacpp_timing.py, and here the clock check is what tells
    stamps from arrivals. The agreement is a sanity bound on the device path (a unit or offset slip in
    turning its stamps into times would be 1000x off), 3x either way: on this shared 2-vCPU machine one
    turn's TBT sits near 0.9 ms or near 1.4-1.6 ms from run to run, and a turn's best of three, local and
    device alternated three times, has differed by 1.75x with the very same build."""
    import numpy as np

    p50s: dict[str, list[list[float]]] = {"local": [], "adb": []}
    for _ in range(3):
        for where, device in (("local", None), ("adb", phone.serial)):
            cfg = BenchConfig(model=str(tiny_model), engines=["llama.cpp"], workloads=["math"], limit=1, n_gen=32,
                              threads=1, device=device, results_dir=str(bench_env))  # fmt: skip
            (outcome,) = run_bench(cfg)
            run = outcome.run
            assert run["status"] == "ok", run["error"]
            assert all(t["extra"]["clock"] == "engine" for t in run["turns"])
            # the floor was measured and every turn is above it
            assert all(p * 1e6 > run["counters"]["tbt_floor_ns"] for p in _turn_p50s_ms(run))
            p50s[where].append(_turn_p50s_ms(run))
    local, adb = np.min(p50s["local"], axis=0), np.min(p50s["adb"], axis=0)
    assert len(local) == len(adb) >= 2
    for k, (a, b) in enumerate(zip(local, adb, strict=True)):
        assert 1 / 3 <= b / a <= 3, (k, p50s)


@pytest.mark.slow
def test_nights_on_a_bursty_device_flag_nothing_and_hold_no_impossible_value(bench_env, tiny_model, phone, adb,
                                                                             monkeypatch, tmp_path):  # fmt: skip
    """Three farm nights of llama.cpp and pi2 on the test daemon: every run is valid, no series' nightly
    TBT is below its bandwidth floor, and the regression test flags nothing."""
    from pi2cli.farm.history import build_series, farm_runs
    from pi2cli.farm.run import run_farm

    monkeypatch.delenv("ANDROID_ADB_SERVER_PORT")  # reached through the adb server the farm file names
    farm = tmp_path / "farm.toml"
    farm.write_text(f'name = "bursty"\nresults_dir = "{tmp_path / "results"}"\n[[device]]\nname = "{phone.serial}"\n'
                    f'adb_server = "127.0.0.1:{adb.port}"\n[matrix]\nmodels = ["{tiny_model}"]\n'
                    f'engines = ["pi2", "llama.cpp"]\nworkloads = ["math"]\n[limits]\nconversations = 1\n'
                    f'n_gen = 16\nthreads = 1\n[gate]\nmax_cpu_temp_c = "none"\n')  # fmt: skip
    for night in ("2026-11-01", "2026-11-02", "2026-11-03"):
        assert run_farm(farm, night=night).complete
    runs = farm_runs(tmp_path / "results", "bursty")
    assert len(runs) == 6 and all(r["status"] == "ok" for r in runs), [
        (r["status"], r["error"]) for r in runs
    ]
    floors = {r["engine"]["name"]: r["counters"]["tbt_floor_ns"] for r in runs}
    for series in build_series(runs):
        floor_ms = floors[series.key[2].split(":")[0]] / 1e6
        assert all(m > floor_ms for m in series.medians_ms()), (series.key, series.medians_ms(), floor_ms)
    # a shared machine's nights run up to 2-3x slower now and then (test_farm_run.py asks for a 300%
    # effect for that reason); host-stamped bursts were ~100x off the engine's time, far beyond it
    r = CliRunner().invoke(cli, ["farm", "regressions", str(farm), "--json", "--min-effect", "3"])
    assert r.exit_code == 0, r.output
    assert not any(v["flagged"] for v in json.loads(r.stdout)["series"])
    r = CliRunner().invoke(cli, ["farm", "report", str(farm), "--out", str(tmp_path / "site")])
    assert r.exit_code == 0, r.output
    page = (tmp_path / "site" / "index.html").read_text()
    axis = [float(v) for v in re.findall(r'<text x="4" y="\d+">(-?[0-9.e+-]+)</text>', page)]
    assert axis and min(axis) >= 0, axis  # no time axis below zero
