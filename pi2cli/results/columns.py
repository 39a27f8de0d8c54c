"""The columns of a run row, each declared once: its name, header, formatting and (for a run JSON) reader.

Four tables show runs: the `pi2 bench` table, the report's Runs table, `pi2 results list` and `pi2 compare`
(its text table and its CSV). Each selects the columns it shows from COLUMNS by name, so a column's header
and how its value is written live here and nowhere else. Columns that look alike but show another
statistic (the mean TTFT vs the index's median TTFT, the decode rate vs the mean of per-turn rates) are
separate columns with headers that say so; only schema.decode_rate is headed "decode tok/s". `read` takes a run JSON dict (docs/RESULTS.md); the index rows of `results list` and
the comparison rows of `compare` hold already-derived values, so those tables pass their values to `text`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pi2cli.results import schema


def num(digits: int, scale: float = 1.0) -> Callable[[Any], str]:
    """A fixed-point number after dividing by scale (2**20: bytes to MiB); '-' for none."""
    return lambda v: "-" if v is None else f"{v / scale:.{digits}f}"


def pct(v) -> str:
    return "-" if v is None else f"{v:.1%}"


def plain(v) -> str:
    return str(v)


@dataclass(frozen=True)
class Column:
    name: str  # the machine name (also the CSV header where a table writes one)
    header: str  # what a text table shows
    fmt: Callable[[Any], str] = plain
    read: Callable[[dict], Any] | None = None  # the value from a run JSON dict

    def text(self, value) -> str:
        return self.fmt(value)

    def cell(self, run: dict) -> str:
        """This column's text for one run JSON dict."""
        if self.read is None:
            raise ValueError(f"column {self.name!r} is not read from a run dict")
        return self.fmt(self.read(run))


def _summary(key: str) -> Callable[[dict], Any]:
    return lambda run: run["summary"].get(key)


def _ms(key: str) -> Callable[[dict], Any]:
    """A summary time in ns, read as ms (every time column is in ms, as compare's rows hold them)."""
    return lambda run: None if run["summary"].get(key) is None else run["summary"][key] / 1e6


def _decode_spread(run: dict) -> tuple[float | None, float | None, int]:
    s = run["summary"]
    return schema.decode_rate(run), s["stddev_ts"], s["n_turns"]


def _decode_spread_text(v) -> str:
    """The decode rate ± the stddev of the per-turn rates (when there is more than one turn; ±0.00 is shown,
    so a run with no spread reads differently from a one-turn run)."""
    rate, stddev, n_turns = v
    text = num(2)(rate)
    return text + f" ±{stddev:.2f}" if stddev is not None and n_turns > 1 else text


def _budget_enforced(run: dict) -> str:
    mem = run["memory"]
    text = schema.budget_label(mem["budget_bytes"])
    if mem["budget_bytes"] is not None:
        text += " (enforced)" if mem["enforced"] else " (not enforced)"
    return text


def _budget_held(run: dict) -> str:
    """The budget, marked where nothing held the run to it (an adb device, an engine pi2 does not start),
    as the group titles mark it (schema.budget_held_label)."""
    return schema.budget_held_label(run["memory"]["budget_bytes"], run["memory"]["enforced"])


def _peak_why(run: dict) -> str:
    text = num(0, 2**20)(run["summary"].get("peak_rss_bytes"))
    why = run["counters"].get("peak_over_budget")
    return f"{text} ({why})" if why else text


def status_cell(status: str, error: str | None, width: int = 80) -> str:
    """ "ok", or "failed: <reason>" so a failed run says why in the table itself, not only in `results show`."""
    label = schema.status_label(status)
    if status == schema.STATUS_OK or not error:
        return label
    text = schema.with_reason(label, error)
    return text if len(text) <= width else text[: width - 1] + "…"


def _status_pair(run: dict) -> tuple[str, str | None]:
    return run["status"], run["error"]


def _tbt_triple(v) -> str:
    return "/".join(num(1)(ms) for ms in v)


_COLUMNS = [
    Column("run_id", "run", read=lambda r: r["run_id"]),
    Column("created_at", "created (UTC)", lambda v: v[:19].replace("T", " "), lambda r: r["created_at"]),
    Column("engine", "engine", read=schema.engine_label),
    Column("model", "model", read=schema.model_label),
    Column("workload", "workload", read=lambda r: r["workload"]["name"]),
    Column("budget_bytes", "budget", schema.budget_label, lambda r: r["memory"]["budget_bytes"]),
    Column("budget_enforced", "budget", read=_budget_enforced),
    Column("budget_held", "budget", read=_budget_held),  # "(not enforced)" only where it was not
    Column("target", "device", read=schema.target_label),
    Column("threads", "threads", schema.threads_label, schema.run_threads),
    Column("commit", "commit", read=schema.commit_label),  # the engine's commit, else pi2's
    # the bench table's status: a failure's reason, cut to fit a terminal. Its value is (status, error).
    Column("status", "status", lambda v: status_cell(*v), _status_pair),
    # narrow tables: the status alone (the reasons follow the table, one line each). Value: (status, error).
    Column("status_label", "status", lambda v: schema.status_label(v[0]), _status_pair),
    # the report's status: the whole reason (a report is read, not glanced at)
    Column("status_error", "status", read=schema.status_text),
    Column("error", "reason", read=lambda r: r["error"]),  # compare's CSV: the reason in a cell of its own
    Column("synthetic", "synthetic", read=lambda r: r["model"]["synthetic"]),
    Column("baseline", "baseline"),  # compare: the engine label each row is compared with
    Column("n_turns", "turns", read=_summary("n_turns")),
    # THE decode statistic (schema.decode_rate): the only column headed "decode tok/s"
    Column("decode_ts", schema.DECODE_LABEL, num(2), schema.decode_rate),
    Column("decode_pooled", schema.DECODE_LABEL, _decode_spread_text, _decode_spread),  # ± per-turn stddev
    Column("avg_ts", "mean turn tok/s", num(2), _summary("avg_ts")),  # the mean of the per-turn rates
    Column("stddev_ts", "stddev tok/s", num(2), _summary("stddev_ts")),  # of the per-turn rates
    Column("ttft_ms", "TTFT ms", num(1), _ms("ttft_avg_ns")),  # the mean over turns
    Column("ttft_p50_ms", "TTFT P50 ms", num(1), _ms("ttft_p50_ns")),
    Column("tbt_p50_ms", "TBT P50 ms", num(2), _ms("tbt_p50_ns")),
    Column("tbt_p90_ms", "p90", num(2), _ms("tbt_p90_ns")),
    Column("tbt_p99_ms", "p99", num(2), _ms("tbt_p99_ns")),
    Column(
        "tbt_p90_p99_ms",
        "TBT P90/P99 ms",
        lambda v: f"{num(2)(v[0])} / {num(2)(v[1])}",
        lambda r: (_ms("tbt_p90_ns")(r), _ms("tbt_p99_ns")(r)),
    ),
    Column(
        "tbt_ms",
        "TBT P50/P90/P99 ms",
        _tbt_triple,
        lambda r: tuple(_ms(k)(r) for k in ("tbt_p50_ns", "tbt_p90_ns", "tbt_p99_ns")),
    ),
    Column("peak_rss_mib", "peak RSS MiB", num(0, 2**20), _summary("peak_rss_bytes")),
    # the report's: a peak above the run's budget says why beside it (schema.peak_over_budget's line)
    Column("peak_rss_why", "peak RSS MiB", read=lambda r: _peak_why(r)),
    Column("cache_hit_rate", "cache hit", pct, _summary("cache_hit_rate")),
    Column("io_share", "I/O share", pct, _summary("io_share")),
    # compare only: ratios over the baseline and the quality scores, written by pi2cli.results.compare
    Column("decode_speedup", "decode speedup"),
    Column("tbt_p50_speedup", "TBT P50 speedup"),
    Column("ttft_speedup", "TTFT speedup"),
    Column("quality", "quality vs dense"),
]
COLUMNS: dict[str, Column] = {c.name: c for c in _COLUMNS}


def select(*names: str) -> list[Column]:
    """The named columns, in that order (a KeyError names a column nobody declared)."""
    return [COLUMNS[n] for n in names]


def headers(columns: list[Column]) -> list[str]:
    return [c.header for c in columns]
