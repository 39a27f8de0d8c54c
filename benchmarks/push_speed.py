"""How fast do files reach a device? Compares three ways of pushing one file over the same adb server:

  pi2      AdbTarget.push: sync SEND in 64 KiB DATA packets, with a progress callback (what pi2 push uses)
  adb      the adb binary adbutils bundles (`adb push`), which prints progress only on a terminal
  adbutils adbutils' sync.push, 4 KiB DATA packets, no progress

By default against the test adb daemon (tests/adbd) on loopback; --device SERIAL measures a real phone.

    python benchmarks/push_speed.py --size-mb 200
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size-mb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", help="an adb serial (default: start the test daemon)")
    args = parser.parse_args()

    from pi2cli.targets.adb import AdbTarget

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        server = device = None
        if args.device is None:
            from adbd.harness import AdbServer, TestDevice

            device = TestDevice(tmp)
            server = AdbServer(tmp / "home")
            os.environ["ANDROID_ADB_SERVER_PORT"] = str(server.port)
            server.connect(device.serial)
            serial = device.serial
        else:
            serial = args.device
        try:
            src = tmp / "blob.bin"
            with open(src, "wb") as f:
                for _ in range(args.size_mb):
                    f.write(os.urandom(1 << 20))
            size = src.stat().st_size
            target = AdbTarget(serial)
            remote = "/data/local/tmp/pi2/bench-blob.bin"
            target.mkdir("/data/local/tmp/pi2")
            adb_env = {**os.environ}

            def pi2_push():
                target.push(src, remote, progress=lambda n: None)

            def adb_push():
                import adbutils

                subprocess.run([adbutils.adb_path(), "-s", serial, "push", str(src), remote], env=adb_env,
                               check=True, capture_output=True, timeout=600)  # fmt: skip

            def adbutils_push():
                target.device.sync.push(src, remote)

            print(f"{size / 2**20:.0f} MiB to {serial}, best of {args.repeat}:")
            for name, fn in (("pi2", pi2_push), ("adb", adb_push), ("adbutils", adbutils_push)):
                best = float("inf")
                for _ in range(args.repeat):
                    t0 = time.perf_counter()
                    fn()
                    best = min(best, time.perf_counter() - t0)
                    assert target.hash(remote) is not None
                print(f"  {name:9s} {size / best / 2**20:8.1f} MiB/s  ({best:.2f} s)")
            target.remove(remote)
        finally:
            if server:
                server.stop()
            if device:
                device.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
