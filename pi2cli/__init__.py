"""pi2: the host suite for the PowerInfer-2 engine (build, push, bench, compare, report)."""

__version__ = "0.1.0"
