"""Engine drivers: one module per system behind the interface in base.py, and what runs pi2-engine
for other layers (measure.py: the predictor statistics the engine counts).

A new engine is one file here plus one line in DRIVERS.
"""

import importlib

from pi2cli.engines.base import EngineDriver
from pi2cli.errors import Pi2Error

# engine name -> module:class
DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2:Pi2Engine",
    "llama.cpp": "pi2cli.engines.llamacpp:LlamaCppEngine",
    "llmflash": "pi2cli.engines.llmflash:LlmFlashEngine",
    "mlc-llm": "pi2cli.engines.mlc:MlcEngine",
}


def get_driver(name: str) -> EngineDriver:
    if name not in DRIVERS:
        raise Pi2Error(f"unknown engine '{name}' (known: {', '.join(DRIVERS)})")
    module_name, class_name = DRIVERS[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise Pi2Error(f"engine '{name}' is not built yet ({module_name} missing)", exit_code=2) from err
    return getattr(module, class_name)()


# engine name -> module:class of its `pi2 bench` driver (pi2cli.engines.base.BenchDriver)
BENCH_DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2_chat:Pi2BenchDriver",
    "llama.cpp": "pi2cli.engines.llamacpp_chat:LlamaCppBenchDriver",
    "llmflash": "pi2cli.engines.llmflash:LlmFlashBenchDriver",
    "mlc-llm": "pi2cli.engines.mlc_chat:MlcBenchDriver",
}
# engines `pi2 bench` knows of but cannot run yet, with the reason
BENCH_NOT_YET: dict[str, str] = {}


def get_bench_driver(name: str):
    if name in BENCH_NOT_YET:
        raise Pi2Error(f"engine '{name}' cannot be benched yet: {BENCH_NOT_YET[name]}", exit_code=2)
    if name not in BENCH_DRIVERS:
        known = ", ".join([*BENCH_DRIVERS, *BENCH_NOT_YET])
        raise Pi2Error(f"unknown engine '{name}' (known: {known})")
    module_name, class_name = BENCH_DRIVERS[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
