"""The engine's defaults live in the engine alone: `pi2-engine capabilities --json` publishes them
(session_options.c: pi2_defaults, the macros sparse_open.c and session.c use), the host's planner and
predictor read them there. These tests compare every default the host plans with against the
engine's answer, and change the answer to see the host follow it (a copy on the host would not)."""

import json
import re
import subprocess
from pathlib import Path

import pytest
from test_plan import mistral7b, profile

from pi2cli.builds import capabilities as caps
from pi2cli.errors import Pi2Error
from pi2cli.paths import host_build_dir

ENGINE = host_build_dir() / "pi2-engine"
pytestmark = pytest.mark.skipif(not ENGINE.is_file(), reason="pi2-engine is not built (make engine)")
MiB = 1 << 20
# every default the host plans with, by the name the engine publishes it under
USED = ("hot_fraction", "hot_share", "cluster", "queue_depth", "read_align", "ctx")


def engine_answer() -> dict:
    done = subprocess.run([str(ENGINE), "capabilities", "--json"], capture_output=True, text=True, check=True)
    return json.loads(done.stdout)["defaults"]


def test_the_host_reads_every_default_it_uses_from_the_engine():
    published = engine_answer()
    assert set(USED) <= set(published)
    assert {k: caps.engine_defaults()[k] for k in USED} == {k: published[k] for k in USED}


def test_the_engine_sizes_with_the_defaults_it_publishes(tmp_path):
    """`size` without split flags uses the published cluster (the split's one integer default)."""
    from pi2cli.plan.facts import engine_sizing

    size = engine_sizing(mistral7b(), 2651 * MiB, 64, 2)
    assert size["cache"]["cluster"] == engine_answer()["cluster"]


@pytest.fixture
def other_defaults(monkeypatch):
    """The engine answering with other defaults, as a rebuilt engine with changed macros would."""
    real = caps.capabilities

    def answer(binary):
        out = dict(real(binary))
        out["defaults"] = {**out["defaults"], "hot_fraction": 0.3, "hot_share": 0.6, "cluster": 16,
                           "queue_depth": 64, "read_align": 4096, "ctx": 2048}  # fmt: skip
        return out

    monkeypatch.setattr(caps, "capabilities", answer)


def test_the_planner_follows_changed_defaults(other_defaults):
    from pi2cli.plan.plan import make_plan, split_cache
    from pi2cli.plan.predict import Device, predict

    m = mistral7b()
    assert (m.part_bytes, m.full_len, m.gate_len) == (2304, 8192, 4096)  # reads rounded to 4096, not 512
    # no measured coverage: the split is the engine's defaults, as it publishes them
    bare = mistral7b(measured={"sparsity": 0.9, "precision": 0.4})
    split = split_cache(bare, 1 << 30, lambda hf, hs, c: (int(hf * bare.n_ff), 0))
    assert (split.hot_fraction, split.hot_share, split.cluster) == (0.3, 0.6, 16)
    # the predictor's queue depth, and the context a plan is made for without --ctx
    dev = Device("fake", 18.9e9, profile()["storage"]["curve"], 2, "test")
    assert predict(m, dev, 1200 * MiB, ctx=64)["read_queue_depth"] <= 64
    assert make_plan(m, profile(), 2651 * MiB).info["predicted_for_ctx"] == 2048


def test_no_host_file_restates_them():
    """The names the copies had, gone from the host (a new copy under another name is the reviewer's)."""
    root = Path(__file__).resolve().parents[1] / "pi2cli"
    copies = re.compile(r"^\s*(ENGINE_DEFAULTS|QUEUE_DEPTH|DIRECT_ALIGN)\s*=", re.M)
    assert [str(p) for p in root.rglob("*.py") if copies.search(p.read_text())] == []


def test_a_missing_engine_is_one_line_saying_how_to_build_it(tmp_path):
    with pytest.raises(Pi2Error, match=r"is not built: run `make setup` \(or `pi2 build`\)") as err:
        caps.engine_defaults(tmp_path / "pi2-engine")
    assert "\n" not in str(err.value)
