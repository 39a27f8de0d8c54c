"""What a device's sensors say, in one shell round trip: thermal zones, battery (dumpsys and the
power_supply gauge), screen state, cpufreq (current vs max, and the governor), free memory.

Everything a device may not have comes back as None, never as a guess: a desktop has no battery, the
test daemon has a fake one (tests/adbd --sensors), a phone has all of it.
"""

from __future__ import annotations

import re

from pi2cli.targets.base import max_temperature, parse_battery, parse_thermal, split_sections

SENSOR_SCRIPT = r"""
echo '@@thermal'
for z in /sys/class/thermal/thermal_zone*; do
  [ -r "$z/temp" ] && echo "$(cat $z/type 2>/dev/null | tr ' ' _) $(cat $z/temp 2>/dev/null)"
done
echo '@@battery'; dumpsys battery 2>/dev/null
echo '@@power'; dumpsys power 2>/dev/null | grep -E 'mWakefulness=|Display Power: state='
echo '@@gauge'
for p in /sys/class/power_supply/*; do
  [ -r "$p/current_now" ] && [ -r "$p/voltage_now" ] && \
    echo "${p##*/} $(cat $p/type 2>/dev/null) $(cat $p/current_now 2>/dev/null) $(cat $p/voltage_now 2>/dev/null)"
done
echo '@@cpufreq'
for c in /sys/devices/system/cpu/cpu[0-9]*/cpufreq; do
  [ -r "$c/scaling_cur_freq" ] && echo "${c%/cpufreq} $(cat $c/scaling_cur_freq) $(cat $c/cpuinfo_max_freq 2>/dev/null) $(cat $c/scaling_max_freq 2>/dev/null) $(cat $c/scaling_governor 2>/dev/null)"
done
echo '@@meminfo'; grep -E '^(MemAvailable|MemFree):' /proc/meminfo 2>/dev/null
"""

GAUGE_SCRIPT = r"""
for p in /sys/class/power_supply/*; do
  [ -r "$p/current_now" ] && [ -r "$p/voltage_now" ] && \
    echo "${p##*/} $(cat $p/type 2>/dev/null) $(cat $p/current_now 2>/dev/null) $(cat $p/voltage_now 2>/dev/null)"
done
"""


def read_sensors(target) -> dict:
    """One snapshot: cpu_temp_c, battery_temp_c, battery_percent, screen_on, power_w, governor,
    throttled (any core's current frequency capped below its max), free_memory_bytes."""
    s = split_sections(target.sh(SENSOR_SCRIPT, timeout=30).stdout)
    zones = parse_thermal(s.get("thermal", ""))
    battery = parse_battery(s.get("battery", ""), "")
    cpufreq = parse_cpufreq(s.get("cpufreq", ""))
    mem = re.search(r"^MemAvailable:\s*(\d+)", s.get("meminfo", ""), re.M)
    return {
        "cpu_temp_c": max_temperature(zones),
        "thermal_zones": zones,
        "battery_temp_c": battery.get("temperature_c"),
        "battery_percent": battery.get("level_percent"),
        "screen_on": parse_screen(s.get("power", "")),
        "power_w": parse_gauge(s.get("gauge", "")),
        "governor": cpufreq["governor"],
        "throttled": cpufreq["throttled"],
        "cpu_freq_khz": cpufreq["cur"],
        "free_memory_bytes": int(mem.group(1)) * 1024 if mem else None,
    }


def parse_screen(text: str) -> bool | None:
    """True/False from dumpsys power (Display Power state, else wakefulness); None without dumpsys."""
    m = re.search(r"Display Power: state=(\w+)", text)
    if m:
        return m.group(1).upper() != "OFF"
    m = re.search(r"mWakefulness=(\w+)", text)
    return None if not m else m.group(1) == "Awake"


def parse_gauge(text: str) -> float | None:
    """Watts the battery delivers, from power_supply current_now (µA) x voltage_now (µV); None without a
    battery gauge. Phones disagree on the sign of current while discharging, so its size is used."""
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[1] == "Battery" and all(re.fullmatch(r"-?\d+", p) for p in parts[2:]):
            return abs(int(parts[2])) * 1e-6 * int(parts[3]) * 1e-6
    return None


def parse_cpufreq(text: str) -> dict:
    """{"governor", "throttled", "cur"}. Throttled: some core's scaling_max_freq is below its
    cpuinfo_max_freq, the cap thermal drivers set. A current frequency below max is no evidence by
    itself (an idle core clocks down), so the current frequencies are recorded beside it, not judged."""
    governors, cur, throttled = set(), {}, None
    for line in text.splitlines():
        parts = line.split()
        if len(parts) < 2 or not parts[1].isdigit():
            continue
        cpu = parts[0].rsplit("/", 1)[-1]
        cur[cpu] = int(parts[1])
        if len(parts) >= 4 and parts[2].isdigit() and parts[3].isdigit():
            throttled = bool(throttled) or int(parts[3]) < int(parts[2])
        if len(parts) >= 5:
            governors.add(parts[4])
    return {"governor": ",".join(sorted(governors)) or None, "throttled": throttled, "cur": cur or None}


def read_power_w(target) -> float | None:
    return parse_gauge(target.sh(GAUGE_SCRIPT, timeout=10).stdout)
