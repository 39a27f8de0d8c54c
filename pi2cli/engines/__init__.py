"""Engine drivers: one module per system behind the interface in base.py.

A new engine is one file here plus one line in DRIVERS.
"""

import importlib

from pi2cli.engines.base import EngineDriver
from pi2cli.errors import Pi2Error

# engine name -> module:class
DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2:Pi2Engine",
    "llama.cpp": "pi2cli.engines.llamacpp:LlamaCppEngine",
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
