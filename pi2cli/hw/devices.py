"""What `pi2 devices` shows: every target, its state and (for those that answer) its hardware facts."""

from __future__ import annotations

from pi2cli.targets import TargetError, get_target, list_targets


def gather(with_facts: bool = True) -> list[dict]:
    rows = []
    for row in list_targets():
        row = dict(row)
        if with_facts and row["state"] in ("ready", "device"):
            try:
                row["facts"] = get_target(row["name"]).facts()
            except TargetError as exc:
                row["state"] = "error"
                row["error"] = str(exc)
        rows.append(row)
    return rows


def describe_clusters(clusters: list[dict]) -> str:
    """'4x1.8 + 3x2.4 + 1x3.0 GHz' for a big.LITTLE phone; with cpu_capacity known,
    '2x2.3/325 + 5x3.1/870 + 1x3.3/1024' (GHz/capacity: clusters of one clock can differ in design)."""
    if not clusters:
        return ""
    if all(c.get("capacity") for c in clusters):
        return (
            " + ".join(f"{len(c['cpus'])}x{c['max_mhz'] / 1000:.1f}/{c['capacity']}" for c in clusters)
            + " GHz/cap"
        )
    return " + ".join(f"{len(c['cpus'])}x{c['max_mhz'] / 1000:.1f}" for c in clusters) + " GHz"


def table_rows(rows: list[dict]) -> list[list[str]]:
    out = []
    for row in rows:
        f = row.get("facts") or {}
        cores = str(f.get("cores") or "")
        clusters = describe_clusters(f.get("clusters") or [])
        battery = f.get("battery") or {}
        batt = ""
        if battery.get("level_percent") is not None:
            batt = f"{battery['level_percent']}%"
            if battery.get("temperature_c") is not None:
                batt += f" {battery['temperature_c']:.0f}°C"
        state = row["state"] + (" (emulated)" if f.get("emulated") else "")
        if row.get("error"):
            state += f": {row['error']}"
        out.append([
            row["name"], row["kind"], state, f.get("arch") or "", f.get("soc") or "",
            " ".join(x for x in (cores, f"({clusters})" if clusters else "") if x),
            f"{f['ram_bytes'] / 2**30:.1f} GiB" if f.get("ram_bytes") else "",
            f.get("storage") or "", f.get("android") or "", batt,
            f"{f['temperature_c']:.0f}°C" if f.get("temperature_c") is not None else "",
        ])  # fmt: skip
    return out


HEADERS = ["target", "kind", "state", "arch", "SoC / CPU", "cores", "RAM", "storage", "Android", "battery",
           "temp"]  # fmt: skip
