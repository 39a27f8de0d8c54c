"""Engine drivers: one subpackage per system, its Driver (interface in base.py) in its driver.py, for
both `pi2 generate` and `pi2 bench`; pi2/ also holds what runs pi2-engine for other layers (args.py,
events.py, serve.py, measure.py: the predictor statistics the engine counts).

A new engine is one subpackage with a driver.py plus one line in DRIVERS.
"""

import importlib

from pi2cli.engines.base import Driver
from pi2cli.errors import Pi2Error
from pi2cli.results.schema import VIAS

# engine name -> module:class of its driver (pi2cli.engines.base.Driver)
DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2.driver:Pi2Driver",
    "llama.cpp": "pi2cli.engines.llamacpp.driver:LlamaCppDriver",
    "llmflash": "pi2cli.engines.llmflash.driver:LlmFlashDriver",
    "mlc-llm": "pi2cli.engines.mlc.driver:MlcDriver",
}


# engine name -> its driver over `pi2-engine serve` (`pi2 bench --via server`). The engines not named
# here are driven one way only: llama.cpp through llama-server, mlc-llm through its runner.
SERVER_DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2.server_chat:Pi2ServerDriver",
    "llmflash": "pi2cli.engines.pi2.server_chat:LlmFlashServerDriver",
}


def get_driver(name: str, via: str = "pipe") -> Driver:
    """The driver of engine `name`; via "server": its driver over pi2-engine serve where it has one."""
    if name not in DRIVERS:
        raise Pi2Error(f"unknown engine '{name}' (known: {', '.join(DRIVERS)})")
    if via not in VIAS:
        raise Pi2Error(f"--via {via!r}: use one of {', '.join(VIAS)}")
    table = SERVER_DRIVERS if via == "server" and name in SERVER_DRIVERS else DRIVERS
    module_name, class_name = table[name].split(":")
    return getattr(importlib.import_module(module_name), class_name)()
