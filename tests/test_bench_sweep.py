"""`pi2 bench --mode pp-tg`: the prompt x generation x threads sweep for pi2, llmflash and llama.cpp on a
tiny synthetic model, here and through the test adb daemon; its dry run, warm-ups and samples CSV."""

import csv
import json
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from engine_helpers import needs_engine

from pi2cli.bench.sweep_cells import parse_generate_events
from pi2cli.bench.sweep_config import prompt_ids
from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.results import store

sys.path.insert(0, str(Path(__file__).parent))
from adbd.harness import private_device  # noqa: E402


def bench(*args):
    return CliRunner().invoke(cli, ["bench", "--mode", "pp-tg", *args], catch_exceptions=False)


def test_dry_run_prints_the_matrix_and_runs_nothing(tiny_model, tmp_path):
    r = bench("-m", str(tiny_model), "-e", "pi2", "-e", "llama.cpp", "-p", "16,64", "-n", "8", "-t", "1,2",
              "--repeat", "2", "--warmup", "1", "--dry-run", "--results-dir", str(tmp_path / "res"))  # fmt: skip
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    assert "8 cells" in lines[0] and "2 repetitions + 1 warm-up" in lines[0]
    rows = [ln.split() for ln in lines[2:-1]]
    assert len(rows) == 8 and {(row[0], row[-5], row[-4], row[-3]) for row in rows} == {
        (e, t, p, "8") for e in ("pi2", "llama.cpp") for t in ("1", "2") for p in ("16", "64")
    }
    assert all(float(row[-1]) > 0 for row in rows) and lines[-1].startswith("estimated total:")
    assert "nothing was run" in lines[-1] and not (tmp_path / "res").exists()


@pytest.mark.slow
@needs_engine
def test_sweep_every_engine_locally_with_warmups_and_samples(bench_env, tiny_model, tmp_path):
    csv_path = tmp_path / "samples.csv"
    r = bench("-m", str(tiny_model), "-e", "pi2", "-e", "llmflash", "-e", "llama.cpp", "-p", "8,32", "-n", "5",
              "-t", "1", "--repeat", "2", "--warmup", "1", "--results-dir", str(bench_env), "--samples-csv",
              str(csv_path), "--json")  # fmt: skip
    assert r.exit_code == 0, r.output
    runs = json.loads(r.stdout)["runs"]
    assert [(o["engine"], o["workload"]) for o in runs] == [
        (e, w) for e in ("pi2", "llmflash", "llama.cpp") for w in ("pp8-tg5", "pp32-tg5")
    ]
    by_id = {}
    for row in runs:
        run = store.load_run(row["result_file"])
        by_id[run["run_id"]] = run
        assert (
            row["status"] == "ok" and run["settings"]["mode"] == "pp-tg" and run["settings"]["threads"] == 1
        )
        p = int(row["workload"][2:].split("-")[0])
        if row["engine"] == "llama.cpp":  # whole tests timed by llama-bench: rates, no TBT
            assert {(t["prompt_id"], t["extra"]["n_depth"]) for t in run["turns"]} == {
                (f"pp{p}", 0),
                ("tg5", p),
            }
            assert len(run["turns"]) == 4 and row["decode_tps"] > 0 and row["prefill_tps"] > 0
            assert [r["n_depth"] for r in run["llama_bench"]] == [0, p]
            continue
        warm = [t for t in run["turns"] if t["warmup"]]
        assert (
            len(warm) == 1 and len(run["turns"]) == 3 and row["n_turns"] == 2
        )  # warm-up kept, not summarised
        for t in run["turns"]:  # exactly p prompt tokens, 5 generated, 4 device-clock gaps
            assert t["n_prompt"] == p and t["n_gen"] == 5 and len(t["samples_ns"]) == 4 and t["ttft_ns"] > 0
        assert row["tbt_p50_ms"] > 0 and row["peak_rss_bytes"] > 0
        assert run["counters"]["peak_rss_source"] == "engine VmHWM at exit"
    rows = list(csv.DictReader(csv_path.open()))
    for run_id, run in by_id.items():
        mine = [x for x in rows if x["run_id"] == run_id]
        if run["engine"]["name"] == "llama.cpp":
            assert sorted(x["kind"] for x in mine) == ["pp_test"] * 2 + ["tg_test"] * 2
        else:  # every turn (warm-up included, flagged): its TTFT and each TBT, as stored
            assert len(mine) == 3 * 5 and sum(x["kind"] == "ttft" for x in mine) == 3
            tbt = [int(x["ns"]) for x in mine if x["kind"] == "tbt" and x["warmup"] == "0"]
            assert tbt == [s for t in run["turns"] if not t["warmup"] for s in t["samples_ns"]]


@pytest.mark.slow
@needs_engine
def test_sweep_through_the_test_adb_daemon(bench_env, tiny_model, tmp_path, monkeypatch):
    with private_device(tmp_path, monkeypatch) as phone:
        r = bench("-m", str(tiny_model), "-e", "pi2", "-e", "llama.cpp", "-p", "8", "-n", "4", "-t", "1,2",
                  "--repeat", "1", "--warmup", "0", "--device", phone.serial, "--results-dir", str(bench_env), "--json")  # fmt: skip
        assert r.exit_code == 0, r.output
        runs = [store.load_run(o["result_file"]) for o in json.loads(r.stdout)["runs"]]
        assert [(run["engine"]["name"], run["settings"]["threads"]) for run in runs] == [
            ("pi2", 1),
            ("pi2", 2),
            ("llama.cpp", 1),
            ("llama.cpp", 2),
        ]
        for run in runs:
            assert run["status"] == "ok" and run["target"]["kind"] == "adb"
            if run["engine"]["name"] == "pi2":
                (t,) = run["turns"]
                assert t["n_prompt"] == 8 and len(t["samples_ns"]) == 3 and t["ttft_ns"] > 0
            else:  # llama-bench ran on the device, on its clock there, under the pushed pi2-rusage
                assert [t["prompt_id"] for t in run["turns"]] == ["pp8", "tg4"]
                assert run["summary"]["avg_ts"] > 0 and run["counters"]["peak_rss_bytes"] > 0
                assert run["llama_bench"][1]["n_depth"] == 8 and "on the target" in run["measurement"]
        runs_dir = phone.root / "pi2" / "runs"
        assert not list(runs_dir.glob("*.events.jsonl")) and not list(runs_dir.glob("*.rusage.json"))
        assert (phone.root / "pi2" / "bin" / "llama-bench").is_file()


def test_bad_sweep_input_is_one_line(tiny_model, tmp_path):
    res = ["--results-dir", str(tmp_path / "res")]
    for args, expect in (
        (["-e", "mlc-llm"], "engine 'mlc-llm' has no pp-tg sweep"),
        (["-n", "1"], "every --n-gen >= 2"),
        (["--warmup", "-1"], "Invalid value for '--warmup'"),
        (["-p", "8,x"], "comma-separated list"),
    ):
        r = bench("-m", str(tiny_model), *args, *res)
        assert r.exit_code != 0 and expect in r.output, (args, r.output)
        assert "Traceback" not in r.output
    chat = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "-t", "1,2", *res])
    assert chat.exit_code == 1 and "lists of values are for --mode pp-tg" in chat.output
    chat = CliRunner().invoke(cli, ["bench", "-m", str(tiny_model), "--dry-run", *res])
    assert chat.exit_code == 1 and "--dry-run goes with --mode pp-tg" in chat.output


def test_the_engine_must_prefill_exactly_the_prompt_asked_for():
    events = "\n".join(json.dumps(e) for e in (
        {"event": "start", "n_prompt": 7}, {"event": "token", "t": 1.0}, {"event": "token", "t": 1.5},
        {"event": "turn", "ttft_s": 0.01}, {"event": "summary", "peak_rss_bytes": 1}))  # fmt: skip
    with pytest.raises(Pi2Error, match="prefilled 7 prompt tokens, not the 8"):
        parse_generate_events(events, 8)
    g = parse_generate_events(events, 7)
    assert g.samples_ns == [500_000_000] and g.ttft_ns == 10_000_000 and g.n_gen == 2
    ids = prompt_ids(32000, 512)
    assert ids == prompt_ids(32000, 512) and len(ids) == 512 and min(ids) >= 3 and max(ids) < 32000


@needs_engine
def test_ctrl_c_saves_the_cell_as_aborted_and_keeps_the_samples(tiny_model, tmp_path, monkeypatch):
    from pi2cli.bench.config import Reporter
    from pi2cli.bench.recorder import BenchInterrupted
    from pi2cli.bench.sweep import run_sweep
    from pi2cli.bench.sweep_config import SweepConfig

    monkeypatch.setenv("PI2_CACHE", str(tmp_path / "cache"))

    class CtrlC(Reporter):
        done = 0

        def turn_done(self, label, decode_tps, ttft_ms):
            self.done += 1
            if self.done == 3:  # the second cell's first repetition
                raise KeyboardInterrupt

    cfg = SweepConfig(model=str(tiny_model), n_prompt=[4, 8], n_gen=[3], repeat=2, warmup=0,
                      results_dir=str(tmp_path / "res"), samples_csv=str(tmp_path / "s.csv"))  # fmt: skip
    with pytest.raises(BenchInterrupted) as info:
        run_sweep(cfg, CtrlC())
    aborted = store.load_run(info.value.outcome.path)
    assert aborted["status"] == "aborted" and aborted["workload"]["name"] == "pp8-tg3"
    assert len(aborted["turns"]) == 1  # the repetition that finished before Ctrl-C
    rows = list(csv.DictReader((tmp_path / "s.csv").open()))
    assert {r["n_prompt"] for r in rows} == {"4", "8"} and len(rows) == 3 * 3


def test_the_samples_csv_is_never_written_through_a_planted_link(tmp_path):
    """The CSV goes through safe_write: a link planted at the temp name pi2 once used (a pid anyone can
    guess) or at the CSV itself is never written through."""
    import os

    from pi2cli.bench.sweep import write_samples_csv

    victim = tmp_path / "victim"
    victim.write_text("keep me\n")
    out = tmp_path / "samples.csv"
    (tmp_path / f".samples.csv.partial-{os.getpid()}").symlink_to(victim)
    write_samples_csv(str(out), [])
    assert victim.read_text() == "keep me\n" and out.read_text().startswith("run_id,engine,")
    out.unlink()
    out.symlink_to(victim)
    with pytest.raises(OSError, match="symbolic link"):
        write_samples_csv(str(out), [])
    assert victim.read_text() == "keep me\n" and out.is_symlink()
