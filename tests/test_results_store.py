"""The run store and its SQLite index: atomic writes, filters, rebuilds and concurrent writers."""

import json
import multiprocessing
import os
import sqlite3

import pytest
from click.testing import CliRunner
from results_fakes import fake_run

from pi2cli.cli import cli
from pi2cli.errors import Pi2Error
from pi2cli.results import schema as S
from pi2cli.results import store


def _save(results, **kwargs):
    run = fake_run(**kwargs)
    return run, store.save_run(run, results)


def test_save_writes_json_and_index_and_loads_back(tmp_path):
    run, path = _save(tmp_path, engine="pi2", policy="powerinfer2")
    assert path == tmp_path / "runs" / f"{run['run_id']}.json"
    assert json.loads(path.read_text())["summary"]["avg_ts"] == pytest.approx(run["summary"]["avg_ts"])
    assert (tmp_path / "pi2.sqlite").is_file()
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [path.name]  # no temporary files left
    assert store.load_run(run["run_id"], tmp_path)["run_id"] == run["run_id"]
    assert store.load_run(run["run_id"][:22], tmp_path)["run_id"] == run["run_id"]
    assert store.load_run(str(path))["run_id"] == run["run_id"]
    with pytest.raises(Pi2Error, match="already exists"):
        store.save_run(run, tmp_path)
    store.save_run(run, tmp_path, overwrite=True)


def test_bad_runs_are_not_written(tmp_path):
    run = fake_run()
    run["model"]["synthetic"] = "maybe"
    with pytest.raises(S.ResultSchemaError, match="run.model.synthetic"):
        store.save_run(run, tmp_path)
    assert not (tmp_path / "runs").exists() or not list((tmp_path / "runs").iterdir())


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    run, path = _save(tmp_path)
    before = path.read_bytes()
    run["tags"] = ["changed"]

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(store.RunNotSaved, match="disk full"):  # one line (kept elsewhere if possible)
        store.save_run(run, tmp_path, overwrite=True)
    monkeypatch.undo()
    assert path.read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == [path.name]


def test_unknown_and_ambiguous_references(tmp_path):
    _save(tmp_path, workload="math")
    _save(tmp_path, workload="code")
    with pytest.raises(Pi2Error, match="no run 'nope'"):
        store.load_run("nope", tmp_path)
    with pytest.raises(Pi2Error, match="ambiguous: 2 runs match"):
        store.load_run("20", tmp_path)


def test_index_filters(tmp_path):
    _save(
        tmp_path,
        engine="llama.cpp",
        model="Mixtral-47B",
        workload="dialogue",
        created_at="2026-11-01T10:00:00Z",
    )
    _save(
        tmp_path,
        engine="pi2",
        policy="dense",
        model="Mixtral-47B",
        workload="code",
        created_at="2026-11-10T10:00:00Z",
    )
    _save(
        tmp_path,
        engine="pi2",
        policy="powerinfer2",
        model="smollm2",
        workload="code",
        created_at="2026-11-20T10:00:00Z",
    )
    failed = fake_run(engine="pi2", model="smollm2", created_at="2026-11-21T10:00:00Z")
    S.mark_failed(failed, "aborted", "interrupted by the user")
    store.save_run(failed, tmp_path)

    def ids(**filters):
        return [(r["engine_label"], r["model"], r["workload"]) for r in store.list_runs(tmp_path, **filters)]

    assert len(ids()) == 4
    assert ids()[0] == ("pi2", "smollm2", "dialogue")  # newest first
    assert ids(model="mixtral") == [
        ("pi2:dense", "Mixtral-47B", "code"),
        ("llama.cpp", "Mixtral-47B", "dialogue"),
    ]
    assert len(ids(engine="pi2")) == 3
    assert ids(engine="pi2:dense") == [("pi2:dense", "Mixtral-47B", "code")]
    assert len(ids(workload="code")) == 2
    assert len(ids(since="2026-11-10")) == 3
    assert len(ids(since="2026-11-10T10:00:01")) == 2
    assert ids(status="aborted") == [("pi2", "smollm2", "dialogue")]
    assert len(ids(limit=1)) == 1
    assert len(ids(model="mixtral", engine="pi2", workload="code")) == 1
    with pytest.raises(Pi2Error, match="--since"):
        store.list_runs(tmp_path, since="last tuesday")


def test_index_is_rebuilt_and_kept_in_step_with_the_files(tmp_path):
    a, path_a = _save(tmp_path, workload="math")
    b, path_b = _save(tmp_path, workload="code")
    (tmp_path / "pi2.sqlite").unlink()
    assert {r["run_id"] for r in store.list_runs(tmp_path)} == {a["run_id"], b["run_id"]}
    path_a.unlink()  # removed behind the index's back
    (tmp_path / "runs" / "copied.json").write_text(json.dumps(fake_run(workload="roleplay")))
    assert sorted(r["workload"] for r in store.list_runs(tmp_path)) == ["code", "roleplay"]
    (tmp_path / "pi2.sqlite").write_bytes(b"this is not a database" * 100)  # corrupt: rebuilt
    assert len(store.list_runs(tmp_path)) == 2
    (tmp_path / "runs" / "broken.json").write_text("{not json")
    count, warnings = store.rebuild_index(tmp_path)
    assert count == 2 and len(warnings) == 1 and "broken.json: not JSON" in warnings[0]
    assert len(store.list_runs(tmp_path)) == 2


def _writer(results_dir, worker, n):
    for i in range(n):
        store.save_run(fake_run(workload=f"w{worker}", seed=i), results_dir)


@pytest.mark.slow
def test_concurrent_writers_all_land_in_the_index(tmp_path):
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 6)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    rows = store.list_runs(tmp_path)
    assert len(rows) == 24 and len({r["run_id"] for r in rows}) == 24
    with sqlite3.connect(tmp_path / "pi2.sqlite") as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"


def test_results_dir_from_environment_and_index_path_override(tmp_path, monkeypatch):
    monkeypatch.setenv("PI2_RESULTS", str(tmp_path / "env"))
    monkeypatch.setenv("PI2_RESULTS_INDEX", str(tmp_path / "elsewhere" / "idx.sqlite"))
    _save(None)
    assert len(list((tmp_path / "env" / "runs").glob("*.json"))) == 1
    assert (tmp_path / "elsewhere" / "idx.sqlite").is_file()
    assert not (tmp_path / "env" / "pi2.sqlite").exists()


def test_results_commands(tmp_path):
    run, _ = _save(tmp_path, engine="pi2", policy="dense", synthetic=True, model="syn-47b")
    _save(tmp_path, engine="llama.cpp")
    runner = CliRunner()
    listed = runner.invoke(cli, ["results", "list", "--results-dir", str(tmp_path)])
    assert listed.exit_code == 0, listed.output
    assert "syn-47b [synthetic]" in listed.stdout and "llama.cpp" in listed.stdout
    as_json = runner.invoke(
        cli, ["results", "list", "--engine", "pi2", "--json", "--results-dir", str(tmp_path)]
    )
    assert [r["run_id"] for r in json.loads(as_json.stdout)] == [run["run_id"]]
    shown = runner.invoke(cli, ["results", "show", run["run_id"], "--results-dir", str(tmp_path)])
    assert shown.exit_code == 0 and "syn-47b [synthetic]" in shown.stdout and "turns" in shown.stdout
    shown_json = runner.invoke(
        cli, ["results", "show", run["run_id"][:30], "--json", "--results-dir", str(tmp_path)]
    )
    assert json.loads(shown_json.stdout)["summary"]["n_turns"] == 3
    missing = runner.invoke(cli, ["results", "show", "nope", "--results-dir", str(tmp_path)])
    assert missing.exit_code == 1 and missing.stdout == ""
    assert missing.stderr.strip().startswith("pi2: error: no run 'nope'")
    since = runner.invoke(cli, ["results", "list", "--since", "1h", "--json", "--results-dir", str(tmp_path)])
    assert len(json.loads(since.stdout)) == 2
    reindexed = runner.invoke(cli, ["results", "reindex", "--results-dir", str(tmp_path)])
    assert reindexed.exit_code == 0 and "indexed 2 run(s)" in reindexed.stdout
    empty = runner.invoke(cli, ["results", "list", "--results-dir", str(tmp_path / "none")])
    assert empty.exit_code == 0 and "no runs match" in empty.stderr


def test_turn_extras_are_kept_and_unstorable_values_refused(tmp_path):
    run = fake_run(turns=1)
    S.add_turn(
        run, n_prompt=3, n_gen=3, ttft_ns=10, samples_ns=[5, 5], extra={"text": "hi", "token_ids": [1, 2, 3]}
    )
    path = store.save_run(run, tmp_path)
    assert json.loads(path.read_text())["turns"][1]["extra"]["token_ids"] == [1, 2, 3]
    bad = fake_run(turns=1)
    S.add_turn(bad, n_prompt=3, n_gen=3, ttft_ns=10, samples_ns=[5, 5], extra={"when": object()})
    with pytest.raises(S.ResultSchemaError, match="not storable as JSON"):
        store.save_run(bad, tmp_path)
    assert len(list((tmp_path / "runs").iterdir())) == 1


def test_an_unusable_index_is_one_clear_error_for_writing_and_a_warning_for_reading(tmp_path, capsys):
    run, _ = _save(tmp_path)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(Pi2Error, match="cannot use the results index"):
        store.open_index(tmp_path, blocker / "pi2.sqlite")  # its parent is a file
    capsys.readouterr()
    # Reading needs no index on disk: the runs are listed from their files, with one line saying so.
    rows = store.list_runs(tmp_path, index=blocker / "pi2.sqlite")
    assert [r["run_id"] for r in rows][-1] == run["run_id"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("pi2: warning: results index") and "not updated" in err[0]
