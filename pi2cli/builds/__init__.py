"""Building the engine and the baselines for a target (CMake runs, pinned sources, the build cache)."""
