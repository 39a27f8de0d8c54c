"""pi2 farm: nightly device-farm runs (docs/FARM.md). file -> check -> run (worker per device, gating,
conditions, energy) -> history -> regressions -> dashboard; schedule for the nightly job."""
