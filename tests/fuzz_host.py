"""The longer run of the host parser targets (tests/fuzz_host_targets.py) for `make fuzz`: each target
gets an equal share of SECONDS and is fed seeded random byte strings through hypothesis's
fuzz_one_input (hypothesis turns the bytes into the target's structured inputs). Any exception but
the one-line Pi2Error fails the run, printing the input and writing it under --findings.

    python tests/fuzz_host.py [--seconds 30] [--seed 1] [--findings DIR]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from fuzz_host_targets import TARGETS  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=30.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--findings", type=Path, default=Path("build/fuzz-host-findings"))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    share = args.seconds / len(TARGETS)
    status = 0
    for name, target in TARGETS.items():
        run_one = target.hypothesis.fuzz_one_input
        runs, end, found = 0, time.monotonic() + share, False
        while time.monotonic() < end:
            buf = rng.randbytes(rng.choice((16, 64, 256, 1024, 4096)))
            try:
                run_one(buf)
            except Exception:  # noqa: BLE001 -- any failure of the property is a finding
                args.findings.mkdir(parents=True, exist_ok=True)
                path = args.findings / f"{name}-{args.seed}-{runs}.bin"
                path.write_bytes(buf)
                print(f"fuzz-host {name}: FAILED on input {path}", file=sys.stderr)
                traceback.print_exc(limit=6)
                status, found = 1, True
                break
            runs += 1
        print(
            f"fuzz-host {name}: {runs} inputs in {share:.0f} s" + (" (stopped at a finding)" if found else "")
        )
    return status


if __name__ == "__main__":
    sys.exit(main())
