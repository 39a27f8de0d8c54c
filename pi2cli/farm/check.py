"""`pi2 farm check FILE`: the file is valid, and what is reachable, one line per device and per problem.

The file's own errors stop here (pi2cli.farm.file raises one Pi2Error). Then, without running
anything: every model exists (with its GGUF twin when llama.cpp is in the matrix), the results
directory can take files, and each device answers (through its own adb server where it has one),
with its architecture, SoC and sensors.
"""

from __future__ import annotations

from pathlib import Path

from pi2cli.farm.file import Farm, cells_for, load_farm


def check_farm(path: str | Path) -> tuple[Farm, list[str], list[str]]:
    """(farm, lines about what is fine, one line per problem)."""
    from pi2cli.errors import Pi2Error
    from pi2cli.farm.run import device_env, environment
    from pi2cli.farm.sensors import read_sensors
    from pi2cli.results import store
    from pi2cli.targets import get_target
    from pi2cli.targets.base import TargetError

    farm = load_farm(path)
    good, problems = [], []
    for model in farm.models:
        m = Path(model)
        if not m.exists():
            problems.append(f"model {model}: no such file")
            continue
        if "llama.cpp" in farm.engines and m.suffix == ".pi2" and not m.with_suffix(".gguf").is_file():
            problems.append(f"model {model}: llama.cpp needs its GGUF twin {m.with_suffix('.gguf').name}")
    from pi2cli.plan.min_budget import farm_refusals

    try:  # the engine's smallest budget, as bench will ask it for each cell
        problems.extend(farm_refusals(farm))
    except Pi2Error as exc:
        problems.append(exc.format_message())
    try:
        store.check_writable(farm.results_dir)
    except Pi2Error as exc:
        problems.append(exc.format_message())
    for device in farm.devices:
        n = len(cells_for(farm, device))
        try:
            with environment(device_env(device)):
                target = get_target(device.name)
                facts = target.facts()
                sensors = read_sensors(target)
        except (TargetError, Pi2Error, OSError) as exc:
            text = exc.format_message() if isinstance(exc, Pi2Error) else str(exc)
            where = f" via adb server {device.adb_server}" if device.adb_server else ""
            problems.append(f"device {device.name}{where}: not reachable ({text})")
            continue
        temp = sensors.get("cpu_temp_c")
        temp_text = f"{temp:.1f} °C" if temp is not None else "no temperature"
        gauge = (
            "battery gauge" if sensors.get("power_w") is not None else "no battery gauge (energy unavailable)"
        )
        good.append(f"device {device.name}: reachable, {facts.get('arch')}, {facts.get('soc') or 'unknown SoC'}"
                    f"{' (emulated)' if facts.get('emulated') else ''}, "
                    f"{temp_text}, {gauge}; {n} cells")  # fmt: skip
    return farm, good, problems
