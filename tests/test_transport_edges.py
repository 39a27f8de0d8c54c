"""Issue 20, transport edges: file names sha256sum escapes, a phone whose disk fills mid-push, and a
device that runs programs under qemu being recorded as emulated."""

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

sys.path.insert(0, str(Path(__file__).parent))

from pi2cli.bench.recorder import file_sha256  # noqa: E402
from pi2cli.cli import cli  # noqa: E402
from pi2cli.hw.push import PushItem, push_one  # noqa: E402
from pi2cli.targets import get_target  # noqa: E402


@pytest.mark.slow
@pytest.mark.parametrize("name", ["back\\slash.bin", "new\nline.bin", "both\\\nand space.bin"])
def test_names_sha256sum_escapes_push_and_verify(make_device, tmp_path, name):
    dev = make_device()
    target = get_target(dev.serial)
    local = tmp_path / "payload.bin"
    local.write_bytes(b"pi2" * 1000)
    remote = f"/data/local/tmp/pi2/{name}"
    target.mkdir("/data/local/tmp/pi2")
    item = PushItem(
        local=local, remote=remote, kind="model", size=local.stat().st_size, sha256=file_sha256(local)
    )
    push_one(target, item, None)  # raised "arrived corrupted" before: the hash line named an escaped path
    assert (dev.root / "pi2" / name).read_bytes() == local.read_bytes()
    assert target.hashes([remote, "/data/local/tmp/pi2/absent"]) == {remote: item.sha256}
    assert target.stats([remote])[remote][0] == local.stat().st_size


def test_a_full_phone_says_no_space_left_not_lost_device(make_device, tmp_path):
    dev = make_device("--full-after", str(1 << 20))
    model = tmp_path / "big.gguf"
    model.write_bytes(b"\1" * (3 << 20))
    r = CliRunner().invoke(
        cli, ["push", "--device", dev.serial, "--no-engine", "--no-workloads", "-m", str(model)]
    )
    assert r.exit_code == 1, r.output
    assert r.stderr.startswith("pi2: error: no space left on device ") and r.stderr.count("\n") == 1, r.stderr
    assert "lost the device" not in r.stderr
    assert dev.proc.poll() is None  # the daemon is alive and still answers
    assert get_target(dev.serial).sh("echo still here").stdout.strip() == "still here"
    assert not list((dev.root / "pi2" / "models").glob("big.gguf*"))


def test_a_device_running_programs_under_qemu_is_recorded_emulated(make_device):
    plain = get_target(make_device().serial).facts()
    assert plain["emulated"] is False
    emulated = get_target(make_device("--abi", "arm64-v8a", "--qemu").serial).facts()
    assert emulated["emulated"] is True and emulated["arch"] == "arm64"
