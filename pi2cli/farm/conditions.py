"""A run's conditions and energy: what a number needs beside it to be compared with another night's.

`EnergySampler` reads the battery gauge (power_supply current_now x voltage_now) every interval while
the run goes; energy per token is the mean power times the run's wall time over the tokens it generated.
Without a gauge the energy block says "unavailable" and why, rather than a number from nowhere.
`conditions` gathers the rest into one block: engine commit and binary hash, llama.cpp commit and build
flags, model and workload sha256, seed, SoC, governor, storage, free memory, temperatures before and
after, throttling after.
"""

from __future__ import annotations

import threading
import time

from pi2cli.farm.sensors import read_power_w
from pi2cli.targets.base import TargetError


class EnergySampler:
    def __init__(self, target, interval_s: float = 0.5):
        self.target, self.interval_s = target, interval_s
        self.samples: list[tuple[float, float]] = []  # (t_s since start, watts)
        self.error: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._t0 = self._t1 = 0.0

    def start(self) -> EnergySampler:
        self._t0 = time.monotonic()
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                watts = read_power_w(self.target)
            except (TargetError, OSError) as exc:
                self.error = str(exc)
                return
            if watts is None:
                self.error = "no battery gauge (power_supply current_now/voltage_now)"
                return
            self.samples.append((round(time.monotonic() - self._t0, 3), round(watts, 4)))
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        self._t1 = time.monotonic()
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)

    def block(self, tokens: int) -> dict:
        """The run's energy record: joules per generated token from the mean sampled power."""
        if not self.samples:
            return {"status": "unavailable", "reason": self.error or "no gauge reading during the run",
                    "samples": []}  # fmt: skip
        seconds = max(self._t1 - self._t0, 0.0)
        mean_w = sum(w for _, w in self.samples) / len(self.samples)
        joules = mean_w * seconds
        return {"status": "measured", "source": "power_supply current_now x voltage_now",
                "mean_power_w": round(mean_w, 4), "seconds": round(seconds, 3), "energy_j": round(joules, 4),
                "tokens": tokens, "j_per_token": round(joules / tokens, 6) if tokens else None,
                "interval_s": self.interval_s, "samples": [list(s) for s in self.samples]}  # fmt: skip


def conditions(run: dict, before: dict, after: dict | None, facts: dict) -> dict:
    """The run's conditions, from its own blocks and the sensor snapshots before and after it."""
    engine, settings = run["engine"], run["settings"]
    is_llama = engine["name"] == "llama.cpp"
    after = after or {}
    return {
        "engine_commit": engine.get("commit"),
        "engine_binary_sha256": engine.get("binary_sha256"),
        "llamacpp_commit": engine.get("commit") if is_llama else None,
        "llamacpp_flags": engine.get("build_flags") if is_llama else None,
        "pi2_commit": run["pi2"].get("commit"),
        "pi2_dirty": run["pi2"].get("dirty"),
        "model_sha256": run["model"].get("sha256"),
        "workload_sha256": run["workload"].get("sha256"),
        "seed": settings.get("seed"),
        "soc": facts.get("soc"),
        "storage": facts.get("storage"),
        "emulated": bool(facts.get("emulated")),
        "governor": before.get("governor"),
        "free_memory_bytes": before.get("free_memory_bytes"),
        "cpu_temp_before_c": before.get("cpu_temp_c"),
        "cpu_temp_after_c": after.get("cpu_temp_c"),
        "battery_temp_before_c": before.get("battery_temp_c"),
        "battery_temp_after_c": after.get("battery_temp_c"),
        "throttled_after": after.get("throttled"),
        "cpu_freq_after_khz": after.get("cpu_freq_khz"),
    }
