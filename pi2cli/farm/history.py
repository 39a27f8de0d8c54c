"""The farm's runs as nights and series, read from the results directory (the run files are the truth).

A farm run is a result with a `farm` block (pi2cli.farm.worker writes it). A cell is finished for a
night when a run for it was saved with status ok or failed: resume skips those and redoes cells whose
run was lost (device_vanished) or aborted, or that never got a run at all.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pi2cli.results import schema as S

# invalid: token times below the bandwidth floor (pi2cli.bench.floor); a rerun would time it the same way
FINISHED = ("ok", "failed", "timeout", "invalid")


def farm_runs(results_dir: Path, farm: str | None = None) -> list[dict]:
    """Every run with a farm block (of `farm` when given), oldest first."""
    from pi2cli.results import store

    if not store.runs_dir(results_dir).is_dir():
        return []
    runs = [r for r in store.load_runs(results_dir=results_dir) if isinstance(r.get("farm"), dict)]
    if farm is not None:
        runs = [r for r in runs if r["farm"].get("name") == farm]
    return sorted(runs, key=lambda r: (r["created_at"], r["run_id"]))


def finished_cells(runs: list[dict], night: str) -> set[str]:
    return {r["farm"]["cell"] for r in runs if r["farm"].get("night") == night and r["status"] in FINISHED}


def series_key(run: dict) -> tuple[str, str, str, str, str]:
    """(device, model, engine, workload, budget): one line on the dashboard, one regression test."""
    return (run["target"]["name"], run["model"]["name"], S.engine_label(run), run["workload"]["name"],
            S.budget_label(run["memory"]["budget_bytes"]))  # fmt: skip


def series_label(key: tuple) -> str:
    return " · ".join(key)


@dataclass
class Series:
    key: tuple
    nights: list[str] = field(default_factory=list)  # sorted
    samples: dict[str, np.ndarray] = field(default_factory=dict)  # night -> every per-token time (ns)
    runs: dict[str, list[dict]] = field(default_factory=lambda: defaultdict(list))

    def medians_ms(self) -> list[float]:
        return [float(np.median(self.samples[n])) / 1e6 for n in self.nights]


def build_series(runs: list[dict]) -> list[Series]:
    """Runs (status ok, with per-token samples) grouped by series and night: failed, aborted and invalid
    runs (token times below the bandwidth floor) never feed a series or a regression test."""
    grouped: dict[tuple, Series] = {}
    pooled: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        if run["status"] != "ok" or not run.get("farm", {}).get("night"):
            continue
        key = series_key(run)
        night = run["farm"]["night"]
        values = S.tbt_samples_ns(run)
        if values.size == 0:
            continue
        series = grouped.setdefault(key, Series(key))
        series.runs[night].append(run)
        pooled[key][night].append(values)
    for key, series in grouped.items():
        series.nights = sorted(pooled[key])
        series.samples = {n: np.concatenate(pooled[key][n]) for n in series.nights}
    return sorted(grouped.values(), key=lambda s: s.key)


def nights_of(runs: list[dict]) -> list[str]:
    return sorted({r["farm"]["night"] for r in runs if r.get("farm", {}).get("night")})
