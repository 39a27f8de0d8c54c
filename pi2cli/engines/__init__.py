"""Engine drivers: one driver per system (pi2.Driver subclasses, interface in base.py), for both
`pi2 generate` and `pi2 bench`, and what runs pi2-engine for other layers (measure.py: the predictor
statistics the engine counts).

A new engine is one driver class plus one line in DRIVERS.
"""

import importlib

from pi2cli.engines.base import Driver
from pi2cli.errors import Pi2Error
from pi2cli.results.schema import VIAS

# engine name -> module:class of its driver (pi2cli.engines.base.Driver)
DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2:Pi2Driver",
    "llama.cpp": "pi2cli.engines.llamacpp_chat:LlamaCppDriver",
    "llmflash": "pi2cli.engines.llmflash:LlmFlashDriver",
    "mlc-llm": "pi2cli.engines.mlc_chat:MlcDriver",
}


# engine name -> its driver over `pi2-engine serve` (`pi2 bench --via server`). The engines not named
# here are driven one way only: llama.cpp through llama-server, mlc-llm through its runner.
SERVER_DRIVERS: dict[str, str] = {
    "pi2": "pi2cli.engines.pi2_server_chat:Pi2ServerDriver",
    "llmflash": "pi2cli.engines.pi2_server_chat:LlmFlashServerDriver",
}


def get_driver(name: str, via: str = "pipe") -> Driver:
    """The driver of engine `name`; via "server": its driver over pi2-engine serve where it has one."""
    if name not in DRIVERS:
        raise Pi2Error(f"unknown engine '{name}' (known: {', '.join(DRIVERS)})")
    if via not in VIAS:
        raise Pi2Error(f"--via {via!r}: use one of {', '.join(VIAS)}")
    table = SERVER_DRIVERS if via == "server" and name in SERVER_DRIVERS else DRIVERS
    module_name, class_name = table[name].split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as err:
        raise Pi2Error(f"engine '{name}' is not built yet ({module_name} missing)", exit_code=2) from err
    return getattr(module, class_name)()
