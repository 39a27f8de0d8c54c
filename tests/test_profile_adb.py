"""`pi2 profile --device SERIAL` without a phone: the test daemon in tests/adbd stands in for one, pi2-probe
is pushed to WORKDIR/bin and run there over adb, and the storage file is a path on the device."""

import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import AdbServer  # noqa: E402

from pi2cli.cli import cli  # noqa: E402
from pi2cli.paths import host_build_dir  # noqa: E402
from pi2cli.plan.profile import validate_profile  # noqa: E402
from pi2cli.targets import get_target  # noqa: E402

WORKDIR = "/data/local/tmp/pi2"

pytestmark = pytest.mark.skipif(
    not (host_build_dir() / "pi2-probe").is_file(), reason="pi2-probe is not built (make engine)"
)


@pytest.fixture
def device(tmp_path, monkeypatch):
    server = AdbServer(tmp_path / "adbhome")
    monkeypatch.setenv("ANDROID_ADB_SERVER_PORT", str(server.port))
    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))
    try:
        with server.device(tmp_path / "dev") as dev:
            yield dev
    finally:
        server.stop()


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
