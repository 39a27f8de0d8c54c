"""`pi2 farm check FILE`: the file is valid, and what is reachable, one line per device and per problem.

The file's own errors stop here (pi2cli.farm.file raises one Pi2Error). Then, without running
anything: every model exists (with its GGUF twin when llama.cpp is in the matrix), the results
directory can take files, and each device answers (through its own adb server where it has one),
with its architecture, SoC and sensors. A device behind its own adb server has that server asked first
(probe_adb_server), so a server that does not resolve or answer is told from one that answers with no
such device.
"""

from __future__ import annotations

import socket
from pathlib import Path

from pi2cli.farm.file import Farm, cells_for, load_farm

PROBE_TIMEOUT_S = 3.0


def probe_adb_server(server: str, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when HOST:PORT is an adb server that answers `host:version`; else why not, in a few words:
    it does not resolve, nothing answers there, or what answers is not an adb server."""
    host, _, port_text = server.rpartition(":")
    try:
        port = int(port_text)
        if not 0 < port < 65536:
            raise ValueError
    except ValueError:
        return f"adb server {server}: port must be 1-65535"
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as err:
        reason = err.strerror if isinstance(err, socket.gaierror) and err.strerror else str(err)
        return f"adb server {server} does not resolve ({reason})"
    try:
        with socket.create_connection(addresses[0][4][:2], timeout=timeout) as conn:
            conn.settimeout(timeout)
            conn.sendall(b"000chost:version")
            reply = conn.recv(4)
    except OSError as err:
        reason = "no reply" if isinstance(err, TimeoutError) else (err.strerror or str(err))
        return f"adb server {server} does not answer ({reason})"
    if reply != b"OKAY":
        return f"adb server {server} answers, but not as an adb server (got {reply[:4]!r})"
    return None


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
        problems.append(str(exc))
    try:
        store.check_writable(farm.results_dir)
    except Pi2Error as exc:
        problems.append(str(exc))
    for device in farm.devices:
        n = len(cells_for(farm, device))
        server_problem = probe_adb_server(device.adb_server) if device.adb_server else None
        if server_problem:
            problems.append(f"device {device.name}: not reachable: {server_problem}")
            continue
        try:
            with environment(device_env(device)):
                target = get_target(device.name)
                facts = target.facts()
                sensors = read_sensors(target)
        except (TargetError, Pi2Error, OSError) as exc:
            text = str(exc)
            # the server answered the probe: "no device" here means an empty or other device list
            where = f" via adb server {device.adb_server} (which answers)" if device.adb_server else ""
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
