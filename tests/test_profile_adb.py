"""`pi2 profile --device SERIAL` without a phone: the test daemon in tests/adbd stands in for one, pi2-probe
is pushed to WORKDIR/bin and run there over adb, and the storage file is a path on the device."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import private_device  # noqa: E402
from engine_helpers import built  # noqa: E402

from pi2cli.cli import cli  # noqa: E402
from pi2cli.plan.profile import validate_profile  # noqa: E402
from pi2cli.targets import get_target  # noqa: E402

WORKDIR = "/data/local/tmp/pi2"


@pytest.fixture(autouse=True)
def _probe_built():
    built("pi2-probe")  # the profile pushes it


@pytest.fixture
def device(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    with private_device(tmp_path, monkeypatch, "dev") as dev:
        yield dev


@pytest.mark.slow
def test_profile_on_an_adb_device(device, tmp_path):
    store = tmp_path / "store.bin"
    store.write_bytes(bytes(range(256)) * (16 * 1024))  # 4 MiB
    get_target(device.serial).push(store, f"{WORKDIR}/models/store.bin")
    out = tmp_path / "phone.json"
    args = ["profile", "--device", device.serial, "--file", f"{WORKDIR}/models/store.bin", "--seconds", "0.1",
            "--membw-mib", "4", "--out", str(out), "--json"]  # fmt: skip
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    validate_profile(data)
    assert data["target"]["kind"] == "adb" and data["target"]["name"] == device.serial
    assert (
        data["storage"]["file"] == f"{WORKDIR}/models/store.bin" and data["storage"]["file_bytes"] == 4 << 20
    )
    assert (device.root / "pi2" / "bin" / "pi2-probe").is_file()  # pushed there, content-checked
    # a path that is not on the device: one line that says where it looked
    bad = CliRunner().invoke(cli, ["profile", "--device", device.serial, "--file", f"{WORKDIR}/nope.pi2",
                                   "--out", str(tmp_path / "x.json")])  # fmt: skip
    assert bad.exit_code == 1 and f"no such file on {device.serial}" in bad.output
    assert len(bad.output.strip().splitlines()) == 1 and not (tmp_path / "x.json").exists()


@pytest.mark.slow
def test_a_1_5_2_phone_is_profiled_by_cluster_and_planned_onto_big_and_mid_cores(
    tmp_path, monkeypatch, tiny_model
):
    # The test daemon's --cpus serves /sys/devices/system/cpu of a Snapdragon 8 Gen 3-shaped phone: 2 little
    # (cpus 0-1), 5 mid (2-6), 1 big (7), each with cpufreq and cpu_capacity. The profile records the three
    # clusters; the plan computes on the big and mid cores and reads on one mid core.
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    with private_device(tmp_path, monkeypatch, "dev", "--cpus", str(tmp_path / "sys_cpu")) as dev:
        store = tmp_path / "store.bin"
        store.write_bytes(bytes(range(256)) * (16 * 1024))  # 4 MiB
        get_target(dev.serial).push(store, f"{WORKDIR}/models/store.bin")
        out = tmp_path / "phone.json"
        result = CliRunner().invoke(cli, ["profile", "--device", dev.serial, "--file",
                                          f"{WORKDIR}/models/store.bin", "--seconds", "0.1", "--membw-mib", "4",
                                          "--out", str(out)])  # fmt: skip
        assert result.exit_code == 0, result.output
        assert "1x 3302 MHz" in result.output and "capacity 1024" in result.output
    data = json.loads(out.read_text())
    validate_profile(data)
    assert data["cores"]["count"] == 8
    assert data["cores"]["clusters"] == [
        {"cpus": [0, 1], "max_mhz": 2265, "capacity": 325},
        {"cpus": [2, 3, 4, 5, 6], "max_mhz": 3148, "capacity": 870},
        {"cpus": [7], "max_mhz": 3302, "capacity": 1024},
    ]
    # 1 thread, the plan's 5 compute threads, and "every core", the phone's 8
    assert [m["threads"] for m in data["membw"]] == [1, 5, 8]
    plan = tmp_path / "plan.json"
    result = CliRunner().invoke(cli, ["plan", "-m", str(tiny_model), "--memory-budget", "64M", "--profile", str(out),
                                      "--ctx", "16", "--out", str(plan)])  # fmt: skip
    assert result.exit_code == 0, result.output
    p = json.loads(plan.read_text())
    assert p["threads"] == 5 and p["affinity"] == "7,2,3,4,5"  # the big core, then four mid ones
    assert p["io_affinity"] == "6" and p["io_threads"] >= 1  # one mid core issues the reads
    assert not {0, 1} & {
        int(c) for c in (p["affinity"] + "," + p["io_affinity"]).split(",")
    }  # little cores idle


@pytest.mark.slow
def test_a_model_on_the_device_is_calibrated_there(device, tmp_path, synth_model):
    # The engine is pushed beside the probe and decodes the model on the device; its events come back over
    # adb and the file it wrote there is removed.
    built("pi2-engine")
    model = synth_model("sparse-1k")
    remote = f"{WORKDIR}/models/sparse.pi2"
    get_target(device.serial).push(model, remote)
    out = tmp_path / "phone.json"
    result = CliRunner().invoke(cli, ["profile", "--device", device.serial, "--file", remote, "--seconds", "0.05",
                                      "--membw-mib", "4", "--calibrate-budget", "64M", "--out", str(out)])  # fmt: skip
    assert result.exit_code == 0, result.output
    d = json.loads(out.read_text())["decode"]
    assert d["model"]["file_bytes"] == model.stat().st_size and d["budget_bytes"] == 64 << 20
    assert d["compute_s"] > 0 and sum(d["named"]["by_rank"]) > 0
    assert (device.root / "pi2" / "bin" / "pi2-engine").is_file()
    assert not (device.root / "pi2" / "calibrate-events.jsonl").exists()
