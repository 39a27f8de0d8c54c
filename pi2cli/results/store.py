"""Where runs live: results/runs/<run_id>.json (one file per run) plus the SQLite index.

The results directory is `--results-dir`, else $PI2_RESULTS, else results/ in the repository
(pi2cli.paths.results_dir). The index is <results dir>/pi2.sqlite unless $PI2_RESULTS_INDEX or an
explicit `index_path` says otherwise.
"""

import json
import os
import secrets
import sqlite3
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from pi2cli import safe_write
from pi2cli.errors import Pi2Error
from pi2cli.outputs import os_error_text
from pi2cli.paths import results_dir as default_results_dir
from pi2cli.results import schema
from pi2cli.results.index import Index, read_run_file

INDEX_NAME = "pi2.sqlite"


def resolve_results_dir(results_dir: str | os.PathLike | None = None) -> Path:
    return default_results_dir(results_dir)


def runs_dir(results_dir: str | os.PathLike | None = None) -> Path:
    return resolve_results_dir(results_dir) / "runs"


def index_path(results_dir: str | os.PathLike | None = None, index: str | os.PathLike | None = None) -> Path:
    override = index or os.environ.get("PI2_RESULTS_INDEX")
    return Path(override) if override else resolve_results_dir(results_dir) / INDEX_NAME


def open_index(results_dir: str | os.PathLike | None = None, index: str | os.PathLike | None = None,
               *, sync: bool = True) -> Index:  # fmt: skip
    """The index for writing (save_run), brought in line with its JSON files (rebuilt if missing)."""
    path = index_path(results_dir, index)
    try:
        idx = Index(path, runs_dir(results_dir))
        idx.warnings = idx.sync() if sync else []
    except (sqlite3.Error, OSError) as err:
        raise Pi2Error(f"cannot use the results index {path}: {err} (set --index or $PI2_RESULTS_INDEX "
                       f"to a writable place)") from None  # fmt: skip
    return idx


def open_listing(
    results_dir: str | os.PathLike | None = None, index: str | os.PathLike | None = None
) -> Index:
    """The index for reading (list, show, compare, report), in line with runs/*.json, writing nothing
    that it does not have to and never needing to write:

    1. the index file opened read-only, used as is when it matches the run files (the usual case);
    2. else brought in line, or built, through a read-write connection, when the disk takes it;
    3. else (a read-only or full disk, a lock, a bad --index) a copy in memory, synced there; its
       `notice` says the index on disk was not updated."""
    path, base = index_path(results_dir, index), runs_dir(results_dir)
    readonly = None
    try:
        readonly = Index.open_readonly(path, base)
        stale, fresh, warnings = readonly.plan_sync()
        if not stale and not fresh:
            readonly.warnings = warnings
            return readonly
    except (sqlite3.Error, OSError):
        pass  # missing, another version, unreadable: build or update it below
    try:
        idx = Index(path, base)
        try:
            idx.warnings = idx.sync()
        except BaseException:
            idx.close()
            raise
        if readonly is not None:
            readonly.close()
        return idx
    except (sqlite3.Error, OSError) as err:
        reason = os_error_text(err) if isinstance(err, OSError) else str(err)
    try:
        memory = Index.in_memory(path, base, readonly if readonly is not None and readonly.readonly else None)
    finally:
        if readonly is not None:
            readonly.close()
    memory.warnings = memory.sync()
    memory.notice = f"results index {path} not updated ({reason}); listed from the run files"
    return memory


def warn_bad_file(message: str) -> None:
    """How list/compare/report tell about a run file they had to skip: one line each, on stderr."""
    print(f"pi2: warning: skipped {message}", file=sys.stderr)


def atomic_write_text(path: Path, text: str) -> None:
    """Readers see the old file or the whole new one, never a part, and never a write through a link
    or over a device planted at `path` (pi2cli/safe_write.py: the one way pi2 writes a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    safe_write.write_text(path, text)


def save_run(
    run: dict,
    results_dir: str | os.PathLike | None = None,
    *,
    index: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> Path:
    """Summarise and validate `run`, write results/runs/<run_id>.json atomically, index it; returns the path.

    Failed runs (see schema.mark_failed) are saved too, so a failure is on record. An existing run id
    is an error unless overwrite=True."""
    try:
        schema.summarize(run)
        schema.validate(run)
        text = json.dumps(run, indent=1, allow_nan=False) + "\n"
    except (TypeError, ValueError, KeyError, schema.ResultSchemaError) as err:
        message = str(err) if isinstance(err, Pi2Error) else f"not storable as JSON ({err})"
        raise schema.ResultSchemaError(f"run {run.get('run_id')}: {message}{_keep_unsaved(run)}") from None
    path = runs_dir(results_dir) / f"{run['run_id']}.json"
    if path.exists() and not overwrite:
        raise Pi2Error(f"run {run['run_id']} already exists at {path}")
    try:
        atomic_write_text(path, text)
    except OSError as err:
        raise RunNotSaved(f"cannot save run {run['run_id']}: {os_error_text(err, path.parent)}"
                          f"{_keep_unsaved(run, text)}") from None  # fmt: skip
    try:
        with open_index(results_dir, index, sync=False) as idx:
            idx.upsert(run, path)
    except (Pi2Error, sqlite3.Error, OSError) as err:
        # The JSON file is the truth and is safely written; the next listing indexes it.
        message = str(err)
        print(f"pi2: warning: saved {path} but could not index it ({message})", file=sys.stderr)
    return path


class RunNotSaved(Pi2Error):
    """The run could not be written where it belongs; the message says where it was kept instead."""


def _keep_unsaved(run: dict, text: str | None = None) -> str:
    """Write a run that could not be stored to the fallback place; returns "; kept it at PATH ..." for the
    error message (or why not even that worked), so a long benchmark is never lost to a late failure."""
    from pi2cli.outputs import unsaved_dir

    try:
        if text is None:  # the schema refused it: keep what there is, odd values and all, for a person to see
            text = json.dumps(run, indent=1, default=repr) + "\n"
        name = str(run.get("run_id") or "run")
        name = name if schema._RUN_ID_RE.match(name) else f"run-{secrets.token_hex(4)}"
        kept = unsaved_dir() / f"{name}.json"
        atomic_write_text(kept, text)
    except (Pi2Error, OSError, TypeError, ValueError) as err:
        return f"; could not keep it anywhere either ({err})"
    return f"; kept it at {kept} (move it into the results directory's runs/ once that works)"


def check_writable(
    results_dir: str | os.PathLike | None = None, index: str | os.PathLike | None = None
) -> None:
    """Before a bench runs: its runs/ directory and its index's directory can take files, else one
    Pi2Error now, not a lost benchmark later."""
    from pi2cli.outputs import check_dir_writable

    # create=False: a bench refused for another reason afterwards leaves no empty directories behind.
    check_dir_writable(runs_dir(results_dir), "--results-dir", " (nothing was run)", create=False)
    check_dir_writable(index_path(results_dir, index).parent, "results index directory", " (nothing was run)",
                       create=False)  # fmt: skip


def rebuild_index(results_dir: str | os.PathLike | None = None, index: str | os.PathLike | None = None
                  ) -> tuple[int, list[str]]:  # fmt: skip
    """Throw the index away and rebuild it from runs/*.json: (runs indexed, warnings for bad files)."""
    path = index_path(results_dir, index)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Build the new one beside the old and rename it in, so readers never meet a half-built index.
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with Index(tmp, runs_dir(results_dir)) as idx:
            warnings = idx.sync()
            count = idx.conn.execute("SELECT count(*) FROM runs").fetchone()[0]
        safe_write.commit(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return count, warnings


def list_runs(
    results_dir: str | os.PathLike | None = None,
    *,
    index: str | os.PathLike | None = None,
    on_bad_file: Callable[[str], None] | None = warn_bad_file,
    **filters,
) -> list[dict]:
    """Index rows (flat dicts: run_id, created_at, engine, engine_label, model, workload, budget_bytes,
    device, threads, decode_ts, tbt_p50_ns, ...), newest first, filtered by Index.query's keywords (model,
    engine, workload, since, status, limit, device, threads). Entries of runs/ that are not usable run
    files (unreadable, special, too large, breaking the schema) are skipped, each reported once through
    `on_bad_file` (a stderr warning)."""
    if since := filters.get("since"):
        try:
            schema.parse_time(since)
        except ValueError:
            raise Pi2Error(
                f"--since {since!r}: not a date or time (use e.g. 2026-11-21 or 2026-11-21T08:00)"
            ) from None
    if not runs_dir(results_dir).is_dir() and not index_path(results_dir, index).exists():
        return []  # nothing recorded here: do not create an index for a directory that has no runs
    with open_listing(results_dir, index) as idx:
        if on_bad_file:
            if idx.notice:
                print(f"pi2: warning: {idx.notice}", file=sys.stderr)
            for warning in idx.warnings:
                on_bad_file(warning)
        return idx.query(**filters)


def load_run(ref: str | os.PathLike, results_dir: str | os.PathLike | None = None,
             *, index: str | os.PathLike | None = None) -> dict:  # fmt: skip
    """One run by id, unique id prefix, or path to a run JSON file; validated and summarised."""
    as_path = Path(ref)
    if str(ref).endswith(".json") and as_path.is_file():
        return read_run_file(as_path)
    with open_listing(results_dir, index) as idx:
        rows = idx.find(str(ref))
    if not rows:
        raise Pi2Error(f"no run {str(ref)!r} in {runs_dir(results_dir)} (see `pi2 results list`)")
    if len(rows) > 1:
        names = ", ".join(r["run_id"] for r in rows[:4])
        raise Pi2Error(
            f"run {str(ref)!r} is ambiguous: {len(rows)} runs match ({names}{', ...' if len(rows) > 4 else ''})"
        )
    return read_run_file(runs_dir(results_dir) / rows[0]["path"])


def load_runs(
    refs: Sequence[str | os.PathLike] = (),
    results_dir: str | os.PathLike | None = None,
    *,
    index: str | os.PathLike | None = None,
    on_bad_file: Callable[[str], None] | None = warn_bad_file,
    **filters,
) -> list[dict]:
    """Runs by reference (see load_run), or, with no refs, every indexed run matching `filters`
    (list_runs' keywords), newest first; a file that went bad since it was indexed is skipped with a warning."""
    if refs:
        return [load_run(ref, results_dir, index=index) for ref in refs]
    rows = list_runs(results_dir, index=index, on_bad_file=on_bad_file, **filters)
    base = runs_dir(results_dir)
    runs = []
    for row in rows:
        try:
            runs.append(read_run_file(base / row["path"]))
        except Pi2Error as err:
            if on_bad_file:
                on_bad_file(str(err))
    return runs


def latest_per_group(runs: Sequence[dict]) -> list[dict]:
    """What `pi2 compare` and `pi2 report` use when no runs are named: per engine and group
    (schema.group_key: model, workload, budget and its enforcement, device, threads) the newest ok run,
    and the newest run of each other status (failed, aborted, timeout, invalid, ...) that is newer than
    it, so a failure since the last good run is shown beside it, never hidden, and an engine that never
    ran well still appears."""
    newest: dict[tuple, dict] = {}
    for run in runs:
        key = (schema.engine_label(run), schema.group_key(run), run["status"])
        if key not in newest or _when(run) > _when(newest[key]):
            newest[key] = run
    chosen = []
    for (engine, group, status), run in newest.items():
        ok = newest.get((engine, group, schema.STATUS_OK))
        if status == schema.STATUS_OK or ok is None or _when(run) > _when(ok):
            chosen.append(run)
    return sorted(chosen, key=lambda r: (schema.group_sort_key(schema.group_key(r)), schema.engine_label(r),
                                         r["status"] != schema.STATUS_OK, _when(r)))  # fmt: skip


def _when(run: dict) -> tuple:
    return (schema.parse_time(run["created_at"]), run["run_id"])
