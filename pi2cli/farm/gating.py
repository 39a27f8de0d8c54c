"""Gating: before each run a device must be idle and cool, or the numbers measure the last run's heat.

`wait_for_gate` polls the device's sensors until every configured condition holds (screen off, CPU and
battery temperature under their ceilings, battery above its floor) or the timeout passes; the run then
goes ahead either way, and the record says how long it waited, why, and whether the gate was met.
Conditions a device cannot report (a desktop has no battery) are skipped and named as such.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from pi2cli.farm.file import Gate
from pi2cli.farm.sensors import read_sensors


def unmet(gate: Gate, sensors: dict) -> tuple[list[str], list[str]]:
    """(conditions not met, conditions the device cannot report), each as a short phrase."""
    failing, unknown = [], []

    def check(limit, value, name: str, bad: Callable[[float, float], bool], text: str) -> None:
        if limit is None:
            return
        if value is None:
            unknown.append(name)
        elif bad(value, limit):
            failing.append(text.format(value=value, limit=limit))

    check(gate.max_cpu_temp_c, sensors.get("cpu_temp_c"), "cpu temperature", lambda v, lim: v >= lim,
          "CPU {value:.1f} °C >= {limit:g} °C")  # fmt: skip
    check(gate.max_battery_temp_c, sensors.get("battery_temp_c"), "battery temperature", lambda v, lim: v >= lim,
          "battery {value:.1f} °C >= {limit:g} °C")  # fmt: skip
    check(gate.min_battery_percent, sensors.get("battery_percent"), "battery level", lambda v, lim: v < lim,
          "battery {value}% < {limit}%")  # fmt: skip
    if gate.screen_off:
        screen = sensors.get("screen_on")
        if screen is None:
            unknown.append("screen state")
        elif screen:
            failing.append("screen is on")
    return failing, unknown


def wait_for_gate(target, gate: Gate, say: Callable[[str], None] = lambda _t: None,
                  sleep: Callable[[float], None] = time.sleep) -> dict:  # fmt: skip
    """Poll until the gate holds or gate.wait_timeout_s passes. Returns the record stored with the run:
    {"met", "waited_s", "polls", "reasons" (the first unmet conditions), "unknown", "sensors" (last)}."""
    t0 = time.monotonic()
    polls, first_reasons = 0, []
    while True:
        sensors = read_sensors(target)
        polls += 1
        failing, unknown = unmet(gate, sensors)
        if polls == 1:
            first_reasons = failing
        waited = time.monotonic() - t0
        if not failing or waited >= gate.wait_timeout_s:
            break
        say(f"{target.name}: waiting ({'; '.join(failing)})")
        sleep(min(gate.poll_s, max(0.0, gate.wait_timeout_s - waited)))
    if failing:
        say(f"{target.name}: gate not met after {waited:.0f} s ({'; '.join(failing)}): running anyway")
    return {"met": not failing, "waited_s": round(waited, 3), "polls": polls, "reasons": first_reasons,
            "still": failing, "unknown": unknown, "sensors": sensors}  # fmt: skip
