"""`pi2 farm report --out DIR`: one static, self-contained index.html (jinja2, inline SVG, no scripts).

On top a summary table (one row per series: the newest night, its median time per token, the verdict
of pi2cli.farm.regressions with ratio and interval); then per series the nightly trend (median time per
token with each night's 95% bootstrap interval, the slower stretch of a flagged series in red); then per
device its thermal record (CPU temperature before and after each run, gate waits, throttling).
"""

from __future__ import annotations

import html
from pathlib import Path

import numpy as np
from jinja2 import Environment

from pi2cli.farm.history import Series, series_label

W, H, PAD = 640, 200, 40

TEMPLATE = """<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>pi2 farm: {{ title }}</title>
<style>
body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1300px; color: #222; }
table { border-collapse: collapse; width: 100%; font-size: 13px; }
th, td { border-bottom: 1px solid #ddd; padding: 3px 6px; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.flagged td { background: #fde8e8; }
.series, .device { display: inline-block; vertical-align: top; margin: 0 1em 1.5em 0; }
h3 { font-size: 14px; margin: 0.3em 0; }
svg text { font-size: 11px; fill: #444; }
.note { color: #666; font-size: 13px; }
</style></head><body>
<h1>pi2 farm: {{ title }}</h1>
<p class="note">{{ n_series }} series, {{ n_runs }} runs, nights {{ first_night }} to {{ last_night }}.
Statistic: the median time per token (TBT) of each night, from every token's time; the verdict compares
the newest night with up to {{ window }} earlier nights (change-point test, p &lt; {{ alpha }}, and a
bootstrap interval of the ratio above 1 by at least {{ min_effect }}). Synthetic models say so.
Series hold ok runs only{% if left_out %} (not in any series: {{ left_out }}){% endif %}.</p>
<p class="note" id="tested">{{ tested_line }}</p>
<h2>Summary</h2>
<table id="summary"><thead><tr><th>device</th><th>model</th><th>engine</th><th>workload</th><th>budget</th>
<th>newest night</th><th>nights</th><th>TBT median ms</th><th>ratio [95% CI]</th><th>p</th><th>energy J/token</th>
<th>verdict</th></tr></thead><tbody>
{% for r in rows %}<tr class="{{ 'flagged' if r.flagged else 'ok' }}">{% for c in r.key %}<td>{{ c }}</td>{% endfor %}
<td>{{ r.newest }}</td><td class="num">{{ r.nights }}</td><td class="num">{{ r.median }}</td>
<td class="num">{{ r.ratio }}</td><td class="num">{{ r.p }}</td><td class="num">{{ r.energy }}</td>
<td>{{ 'REGRESSION: ' if r.flagged else '' }}{{ r.reason }}</td></tr>
{% endfor %}</tbody></table>
<h2>Nightly trend per series</h2>
{% for s in trends %}<div class="series{{ ' flagged' if s.flagged else '' }}"><h3>{{ s.label }}</h3>{{ s.svg }}</div>
{% endfor %}
<h2>Thermal record per device</h2>
{% for d in devices %}<div class="device"><h3>{{ d.name }}</h3>{{ d.svg }}
<p class="note">{{ d.note }}</p></div>
{% endfor %}
</body></html>
"""


def _scale(values: list[float], lo_px: float, hi_px: float):
    lo, hi = min(values), max(values)
    if hi == lo:
        lo, hi = lo - 1, hi + 1
    span = hi - lo
    # times and temperatures are not negative: the margin never takes the axis below 0
    lo, hi = max(lo - 0.08 * span, 0.0) if lo >= 0 else lo - 0.08 * span, hi + 0.08 * span
    return (lambda v: hi_px - (v - lo) / (hi - lo) * (hi_px - lo_px)), lo, hi


def _axes(ylabel: str, lo: float, hi: float, labels: list[str], x) -> list[str]:
    parts = [f'<line x1="{PAD}" y1="{H - PAD}" x2="{W - 10}" y2="{H - PAD}" stroke="#999"/>',
             f'<line x1="{PAD}" y1="10" x2="{PAD}" y2="{H - PAD}" stroke="#999"/>',
             f'<text x="4" y="14">{html.escape(ylabel)}</text>',
             f'<text x="4" y="{H - PAD}">{lo:.3g}</text><text x="4" y="24">{hi:.3g}</text>']  # fmt: skip
    step = max(1, len(labels) // 6)
    for i in range(0, len(labels), step):
        parts.append(f'<text x="{x(i) - 20:.1f}" y="{H - PAD + 16}">{html.escape(labels[i][5:])}</text>')
    return parts


def trend_svg(series: Series, verdict) -> str:
    """Median TBT per night (ms) with each night's 95% bootstrap interval; the slower stretch in red."""
    rng = np.random.default_rng(0)
    nights = series.nights
    med, low, high = [], [], []
    for n in nights:
        s = series.samples[n]
        boot = np.median(s[rng.integers(0, len(s), size=(300, len(s)))], axis=1)
        med.append(float(np.median(s)) / 1e6)
        lo_, hi_ = np.percentile(boot, [2.5, 97.5]) / 1e6
        low.append(float(lo_))
        high.append(float(hi_))
    y, lo, hi = _scale(low + high, 10, H - PAD)

    def x(i):
        return PAD + 10 + (i * (W - PAD - 30) / max(1, len(nights) - 1))

    parts = _axes("TBT ms", lo, hi, nights, x)
    slow_from = (
        nights.index(verdict.change_night) if verdict.flagged and verdict.change_night in nights else None
    )
    points = " ".join(f"{x(i):.1f},{y(m):.1f}" for i, m in enumerate(med))
    parts.append(f'<polyline fill="none" stroke="#3367d6" stroke-width="1.5" points="{points}"/>')
    for i, n in enumerate(nights):
        color = "#d33" if slow_from is not None and i >= slow_from else "#3367d6"
        parts.append(f'<line x1="{x(i):.1f}" y1="{y(low[i]):.1f}" x2="{x(i):.1f}" y2="{y(high[i]):.1f}" '
                     f'stroke="{color}"/>')  # fmt: skip
        parts.append(f'<circle class="night{" regression" if color == "#d33" else ""}" cx="{x(i):.1f}" '
                     f'cy="{y(med[i]):.1f}" r="3" fill="{color}"><title>{n}: {med[i]:.3f} ms '
                     f'[{low[i]:.3f}, {high[i]:.3f}]</title></circle>')  # fmt: skip
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">{"".join(parts)}</svg>'


def thermal_svg(runs: list[dict]) -> tuple[str, str]:
    """CPU temperature before (blue) and after (orange) each of a device's runs, in run order."""
    before = [r["farm"]["conditions"].get("cpu_temp_before_c") for r in runs]
    after = [r["farm"]["conditions"].get("cpu_temp_after_c") for r in runs]
    waits = [r["farm"]["gate"].get("waited_s") or 0 for r in runs]
    throttled = sum(1 for r in runs if r["farm"]["conditions"].get("throttled_after"))
    unmet = sum(1 for r in runs if not r["farm"]["gate"].get("met"))
    note = (f"{len(runs)} runs; gate waits {sum(waits):.0f} s in all (longest {max(waits, default=0):.0f} s); "
            f"gate not met (ran anyway) {unmet}; throttled after {throttled}")  # fmt: skip
    known = [v for v in before + after if v is not None]
    if not known:
        return "<p class='note'>no temperature reported</p>", note
    y, lo, hi = _scale(known, 10, H - PAD)

    def x(i):
        return PAD + 10 + (i * (W - PAD - 30) / max(1, len(runs) - 1))

    parts = _axes("°C", lo, hi, [r["farm"]["night"] for r in runs], x)
    for values, color, name in ((before, "#3367d6", "before"), (after, "#e8710a", "after")):
        for i, v in enumerate(values):
            if v is not None:
                parts.append(f'<circle class="temp-{name}" cx="{x(i):.1f}" cy="{y(v):.1f}" r="2.5" fill="{color}">'
                             f'<title>{runs[i]["farm"]["night"]} {name}: {v:.1f} °C</title></circle>')  # fmt: skip
    return f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}">{"".join(parts)}</svg>', note


def _energy(series: Series) -> str:
    runs = series.runs.get(series.nights[-1], [])
    values = [r["farm"]["energy"]["j_per_token"] for r in runs
              if r["farm"].get("energy", {}).get("status") == "measured" and r["farm"]["energy"].get("j_per_token")]  # fmt: skip
    return f"{np.mean(values):.4g}" if values else "unavailable"


def _left_out(runs: list[dict]) -> str:
    """ "2 invalid, 1 failed": the runs no series uses (only ok runs are measurements), by status."""
    from collections import Counter

    from pi2cli.results import schema

    counts = Counter(r["status"] for r in runs if r["status"] != schema.STATUS_OK)
    return ", ".join(f"{n} {schema.status_label(s)}" for s, n in sorted(counts.items()))


def write_dashboard(out: Path, title: str, runs: list[dict], series: list[Series], verdicts: list,
                    settings: dict) -> Path:  # fmt: skip
    from markupsafe import Markup

    from pi2cli.farm.regressions import summary_line

    rows, trends = [], []
    for s, v in zip(series, verdicts, strict=True):
        ratio = "-" if v.ratio is None else f"{v.ratio:.3f} [{v.low:.3f}, {v.high:.3f}]"
        rows.append({"key": s.key, "newest": v.newest, "nights": v.nights, "flagged": v.flagged,
                     "median": f"{np.median(s.samples[s.nights[-1]]) / 1e6:.3f}", "ratio": ratio,
                     "p": "-" if v.p_value is None else f"{v.p_value:.3g}", "reason": v.reason,
                     "energy": _energy(s)})  # fmt: skip
        trends.append({"label": series_label(s.key), "flagged": v.flagged, "svg": Markup(trend_svg(s, v))})
    devices = []
    for name in sorted({r["farm"]["device"] for r in runs}):
        mine = [r for r in runs if r["farm"]["device"] == name]
        svg, note = thermal_svg(mine)
        devices.append({"name": name, "svg": Markup(svg), "note": note})
    nights = sorted({r["farm"]["night"] for r in runs}) or ["-"]
    text = Environment(autoescape=True).from_string(TEMPLATE).render(
        title=title, rows=rows, trends=trends, devices=devices, n_series=len(series), n_runs=len(runs),
        tested_line=summary_line(verdicts), left_out=_left_out(runs),
        first_night=nights[0], last_night=nights[-1], **settings)  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    from pi2cli.safe_write import write_text as atomic_write_text

    atomic_write_text(path, text)
    return path
