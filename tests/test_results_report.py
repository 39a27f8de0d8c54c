"""pi2 report: plots, report.md and a self-contained index.html that really renders in a browser."""

import base64
import os
import re
import shutil
import subprocess

import pytest
from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.results import report as R
from pi2cli.results import schema as S
from pi2cli.results import store

GIB = 1 << 30


def _runs():
    runs = [
        fake_run("llama.cpp", tbt_ms=40, seed=1, budget_bytes=4 * GIB, memory_samples=True),
        fake_run("pi2", policy="powerinfer2", tbt_ms=20, seed=2, budget_bytes=4 * GIB, memory_samples=True),
        fake_run("pi2", policy="powerinfer2", tbt_ms=30, seed=3, budget_bytes=2 * GIB),
        fake_run("pi2", policy="dense", tbt_ms=60, seed=4, budget_bytes=4 * GIB),
        fake_run("pi2", policy="bundle", tbt_ms=45, seed=5, budget_bytes=4 * GIB),
        fake_run("pi2", policy="cache", tbt_ms=30, seed=6, budget_bytes=4 * GIB),
        fake_run("llama.cpp", workload="code", model="syn-47b", synthetic=True, tbt_ms=300, seed=7),
        fake_run(
            "pi2", policy="powerinfer2", workload="code", model="syn-47b", synthetic=True, tbt_ms=90, seed=8
        ),
    ]
    failed = fake_run("mlc-llm", seed=9)
    S.mark_failed(failed, "device_vanished", "adb: device 1a2b disconnected")
    for run in runs + [failed]:
        S.summarize(run)
    return runs + [failed]


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    out = tmp_path_factory.mktemp("report") / "out"
    runs = _runs()
    return out, R.write_report(runs, out, resamples=200), runs


@pytest.mark.slow
def test_every_plot_is_drawn_and_labels_synthetic_models(written):
    plots = {p.name: p for p in written[1].figures}
    assert set(plots) == {"decode", "tbt_cdf", "ttft", "memory", "budget", "ablation"}
    for name in ("decode", "tbt_cdf", "ttft"):  # these show the synthetic runs
        assert "syn-47b [synthetic]" in plots[name].text, name
        assert plots[name].png.startswith(b"\x89PNG")
    assert "+bundle" in plots["ablation"].text and "powerinfer2" in plots["ablation"].text
    assert "memory budget, GiB" in plots["budget"].text
    assert "budget 4 GiB" in plots["memory"].text
    # Plots that have nothing to show are left out rather than drawn empty.
    plain = [fake_run("llama.cpp"), fake_run("pi2", policy="powerinfer2")]
    for run in plain:
        S.summarize(run)
    assert R.plot_memory(plain) is None and R.plot_budget(plain) is None and R.plot_ablation(plain) is None


def test_report_files(written):
    out, paths, runs = written
    assert paths.html == out / "index.html" and paths.markdown == out / "report.md"
    pngs = sorted(p.name for p in (out / "plots").iterdir())
    assert pngs == ["ablation.png", "budget.png", "decode.png", "memory.png", "tbt_cdf.png", "ttft.png"]
    md = (out / "report.md").read_text()
    for name in pngs:
        assert f"](plots/{name})" in md
    assert "syn-47b [synthetic]" in md and "**Synthetic models are marked [synthetic]" in md
    assert "device vanished: adb: device 1a2b disconnected" in md
    assert "200 resamples" in md
    html = (out / "index.html").read_text()
    images = re.findall(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)"', html)
    assert len(images) == len(pngs)
    assert all(base64.b64decode(i).startswith(b"\x89PNG") for i in images)
    assert "syn-47b [synthetic]" in html
    assert not re.search(r'(src|href)="(https?:)?//', html)  # nothing fetched from outside
    assert [p.name for p in out.parent.iterdir()] == ["out"]  # no temporary directory left behind


def test_a_failing_report_leaves_nothing(tmp_path, monkeypatch):
    def boom(runs):
        raise RuntimeError("plotting failed")

    monkeypatch.setattr(R, "make_plots", boom)
    with pytest.raises(RuntimeError):
        R.write_report(_runs(), tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_report_command(tmp_path):
    for run in _runs()[:2]:
        store.save_run(run, tmp_path / "results")
    runner = CliRunner()
    out = tmp_path / "rep"
    result = runner.invoke(cli, ["report", "--out", str(out), "--results-dir", str(tmp_path / "results")])
    assert result.exit_code == 0, result.output
    assert (out / "index.html").is_file() and (out / "report.md").is_file()
    assert (out / "plots" / "decode.png").is_file() and (out / "plots" / "tbt_cdf.png").is_file()
    none = runner.invoke(
        cli, ["report", "--out", str(tmp_path / "x"), "--results-dir", str(tmp_path / "empty")]
    )
    assert none.exit_code == 1 and "no runs to use" in none.stderr and not (tmp_path / "x").exists()


def _chromium() -> str | None:
    for name in (os.environ.get("PI2_CHROMIUM"), "chromium", "chromium-browser", "google-chrome"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def _render(browser: str, page, profile, *extra: str) -> subprocess.CompletedProcess:
    args = [browser, "--headless", "--disable-gpu", "--no-sandbox", "--enable-logging=stderr", "--v=0",
            f"--user-data-dir={profile}", "--allow-file-access-from-files", *extra, page.as_uri()]  # fmt: skip
    return subprocess.run(args, capture_output=True, text=True, timeout=120)


# In CI chromium is installed by `make setup`, so a missing browser there is a failure, not a skip.
@pytest.mark.slow
@pytest.mark.skipif(
    _chromium() is None and not os.environ.get("CI"), reason="needs chromium (apt-get install -y chromium)"
)
def test_html_renders_in_headless_chromium(written, tmp_path):
    out, _, _ = written
    browser = _chromium()
    dom = _render(browser, out / "index.html", tmp_path / "profile", "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    body = re.search(r"<body([^>]*)>", dom.stdout).group(1)
    assert 'data-render-check="done"' in body
    assert 'data-images-total="6"' in body and 'data-images-loaded="6"' in body
    assert 'data-images-broken="0"' in body and 'data-script-errors="0"' in body
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []  # the page logs nothing, so any console line is an error
    assert "syn-47b [synthetic]" in dom.stdout

    # The check can fail: a copy with one broken image is caught.
    broken = tmp_path / "broken.html"
    broken.write_text(
        re.sub(r"base64,[A-Za-z0-9+/=]{40}", "base64,AAAA", (out / "index.html").read_text(), count=1)
    )
    bad = _render(browser, broken, tmp_path / "profile", "--dump-dom")
    assert 'data-images-broken="1"' in bad.stdout

    # One statistic, named the same in both tables; the Runs table fits a 1400 px window (no scrolling).
    wide = _render(browser, out / "index.html", tmp_path / "profile", "--dump-dom", "--window-size=1400,1000")
    assert re.search(r'data-runs-overflow="0"', wide.stdout), re.search(r"<body[^>]*>", wide.stdout).group(0)
    groups = int(re.search(r'data-run-groups="(\d+)"', wide.stdout).group(1))
    assert groups == 4  # fake-model at 2 and 4 GiB, syn-47b, and the failed mlc-llm run's group (no budget)
    assert wide.stdout.count("<th>decode tok/s</th>") == 2 * groups  # the Runs and Comparison table of each

    shot = tmp_path / "shot.png"
    snap = _render(
        browser, out / "index.html", tmp_path / "profile", f"--screenshot={shot}", "--window-size=1280,2400"
    )
    assert snap.returncode == 0 and shot.is_file()
    import matplotlib.image

    pixels = matplotlib.image.imread(shot)
    assert pixels.shape[0] >= 2000 and pixels.std() > 0.05  # something was drawn, not a blank page
