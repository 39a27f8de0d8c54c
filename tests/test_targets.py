"""Targets without a phone: this machine, qemu-arm64, and the fact parsers on a phone's real answers."""

import platform
import shutil
import subprocess
import time

import pytest

from pi2cli.targets import TargetError, get_target
from pi2cli.targets.base import normalize_arch, parse_df_available, parse_facts, parse_status_memory

ANDROID_FACTS = """@@uname
aarch64
@@cpuinfo
processor\t: 0
BogoMIPS\t: 38.40
Hardware\t: Qualcomm Technologies, Inc SM8650
@@meminfo
MemTotal:       15624140 kB
@@freq
cpu0 2265600
cpu1 2265600
cpu2 3148800
cpu3 3148800
cpu4 2956800
cpu5 2956800
cpu6 2956800
cpu7 3302400
@@ncpu
8
@@getprop
[ro.build.version.release]: [14]
[ro.build.version.sdk]: [34]
[ro.product.model]: [SM-S928B]
[ro.soc.model]: [SM8650]
[ro.boot.bootdevice]: [1d84000.ufshc]
@@ufs
0x0400
@@blocks
sda 0
@@battery
Current Battery Service state:
  AC powered: false
  level: 87
  scale: 100
  temperature: 312
@@powersupply
@@thermal
cpu-0-0-0 41200
cpu-1-0-0 44800
battery 31000
@@end
"""


def test_parse_facts_of_an_android_phone():
    f = parse_facts(ANDROID_FACTS)
    assert f["arch"] == "arm64"
    assert f["soc"] == "SM8650"
    assert f["cores"] == 8
    assert f["clusters"] == [
        {"cpus": [0, 1], "max_mhz": 2265},
        {"cpus": [4, 5, 6], "max_mhz": 2956},
        {"cpus": [2, 3], "max_mhz": 3148},
        {"cpus": [7], "max_mhz": 3302},
    ]
    assert f["ram_bytes"] == 15624140 * 1024
    assert f["storage"] == "UFS 4.0"
    assert f["android"] == "14" and f["model"] == "SM-S928B"
    assert f["battery"] == {"level_percent": 87, "temperature_c": 31.2}
    assert f["temperature_c"] == 44.8  # hottest CPU zone, not the battery


def test_parse_memory_and_df():
    status = "Name:\tpi2-engine\nVmHWM:\t  204800 kB\nVmRSS:\t  102400 kB\n"
    mem = parse_status_memory(status, "Rss: 1 kB\nPss:\t   51200 kB\n")
    assert (mem.rss_bytes, mem.hwm_bytes, mem.pss_bytes) == (100 << 20, 200 << 20, 50 << 20)
    assert parse_status_memory("", "") is None
    toybox = "Filesystem            1K-blocks     Used Available Use% Mounted on\n/dev/block/dm-46 230000000 100000000 130000000  44% /data\n"
    assert parse_df_available(toybox) == 130000000 * 1024
    with pytest.raises(TargetError):
        parse_df_available("df: /nope: No such file or directory\n")


def test_local_facts_describe_this_machine():
    t = get_target("local")
    f = t.facts()
    assert f["arch"] == normalize_arch(platform.machine())
    assert f["cores"] >= 1 and f["ram_bytes"] > 1 << 28
    assert f["kind"] == "local" and f["emulated"] is False
    assert t.free_bytes("/definitely/not/there/yet") > 0  # walks up to an existing directory


def test_local_run_streams_output_reports_memory_and_kills(tmp_path):
    t = get_target("local", workdir=str(tmp_path))
    seen = []
    p = t.run(["sh", "-c", "echo out; echo err >&2; exit 3"], on_output=lambda n, d: seen.append((n, d)))
    assert p.wait(10) == 3
    assert ("stdout", b"out\n") in seen and ("stderr", b"err\n") in seen

    p = t.run(["sleep", "30"])
    mem = t.read_memory(p.pid)
    assert mem is not None and mem.rss_bytes > 0 and mem.hwm_bytes >= mem.rss_bytes
    with pytest.raises(TimeoutError):
        p.wait(0.1)
    start = time.monotonic()
    p.kill()
    assert p.poll() is not None and time.monotonic() - start < 5


def test_qemu_target_says_when_qemu_is_missing(monkeypatch):
    monkeypatch.setenv("PI2_QEMU_AARCH64", "/nonexistent/qemu-aarch64")
    with pytest.raises(TargetError, match="qemu-aarch64"):
        get_target("qemu-arm64")


@pytest.mark.skipif(not (shutil.which("qemu-aarch64") and shutil.which("aarch64-linux-gnu-gcc")),
                    reason="needs qemu-user and the aarch64 cross compiler")  # fmt: skip
def test_qemu_runs_an_arm64_binary_and_marks_itself_emulated(tmp_path):
    src = tmp_path / "hello.c"
    src.write_text('#include <stdio.h>\nint main(void){puts("hello from arm64");return 7;}\n')
    exe = tmp_path / "hello"
    subprocess.run(["aarch64-linux-gnu-gcc", "-O1", "-o", str(exe), str(src)], check=True, timeout=60)
    t = get_target("qemu-arm64", workdir=str(tmp_path))
    out = []
    p = t.run([str(exe)], on_output=lambda n, d: out.append(d))
    assert p.wait(30) == 7
    assert b"".join(out) == b"hello from arm64\n"
    facts = t.facts()
    assert facts["arch"] == "arm64" and facts["emulated"] is True and "correctness" in facts["note"]
    # here, but not natively: host programs (llama-bench, an MLC runner) do not run "on" it
    assert t.on_this_machine and not t.native_here


def test_each_target_names_the_engine_builds_that_run_on_it(tmp_path, monkeypatch):
    from pi2cli.targets.base import ShellTarget

    monkeypatch.delenv("PI2_BUILD_DIR", raising=False)
    phone = ShellTarget(name="p", kind="adb", arch="arm64", workdir="/data/local/tmp/pi2")
    assert phone.build_dirs(tmp_path) == [tmp_path / "android-arm64", tmp_path / "linux-arm64"]
    assert phone.build_hint() == "pi2 build --target android-arm64" and not phone.on_this_machine
    emulator = ShellTarget(name="e", kind="adb", arch="x86_64", workdir="/data/local/tmp/pi2")
    assert emulator.build_dirs(tmp_path) == [tmp_path / "host"] and emulator.build_hint() == "make engine"
    local = get_target("local")
    assert local.on_this_machine and local.build_dirs(tmp_path) == [tmp_path / "host"]
    assert local.native_here and not phone.native_here and not emulator.native_here
    monkeypatch.setenv("PI2_BUILD_DIR", str(tmp_path / "mine"))
    assert local.build_dirs(tmp_path) == [tmp_path / "mine"]
