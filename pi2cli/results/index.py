"""The SQLite index over the run JSON files: one row per run, for fast listing and filtering.

The JSON files are the truth; the index is derived from them and can always be rebuilt. Every change is
one transaction (BEGIN IMMEDIATE), so concurrent writers queue on SQLite's lock instead of interleaving,
and a crash leaves the previous state. Opening the index brings it in line with runs/*.json (files
added, changed or removed behind its back), and a missing or unreadable index is rebuilt from scratch.
"""

import datetime as dt
import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pi2cli.errors import Pi2Error
from pi2cli.results import schema

INDEX_VERSION = "1"

_COLUMNS = {
    "run_id": "TEXT PRIMARY KEY",
    "created_at": "TEXT NOT NULL",  # UTC, fixed format, so text order is time order
    "status": "TEXT NOT NULL",
    "error": "TEXT",
    "engine": "TEXT NOT NULL",
    "engine_label": "TEXT NOT NULL",
    "policy": "TEXT",
    "engine_version": "TEXT",
    "engine_commit": "TEXT",
    "model": "TEXT NOT NULL",
    "model_sha256": "TEXT",
    "quant": "TEXT",
    "synthetic": "INTEGER NOT NULL",
    "workload": "TEXT NOT NULL",
    "target": "TEXT NOT NULL",
    "target_kind": "TEXT NOT NULL",
    "budget_bytes": "INTEGER",
    "budget_enforced": "INTEGER NOT NULL",
    "n_turns": "INTEGER",
    "avg_ts": "REAL",
    "stddev_ts": "REAL",
    "tbt_p50_ns": "INTEGER",
    "tbt_p99_ns": "INTEGER",
    "ttft_p50_ns": "INTEGER",
    "peak_rss_bytes": "INTEGER",
    "pi2_commit": "TEXT",
    "path": "TEXT NOT NULL",
    "file_mtime_ns": "INTEGER NOT NULL",
    "file_size": "INTEGER NOT NULL",
}


def normalize_time(text: str) -> str:
    return schema.parse_time(text).astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def row_for(run: dict, path: Path) -> dict:
    """The index row of a (validated) run stored at `path`."""
    summary = run.get("summary") or schema.summarize(run)
    stat = path.stat()
    return {
        "run_id": run["run_id"],
        "created_at": normalize_time(run["created_at"]),
        "status": run["status"],
        "error": run["error"],
        "engine": run["engine"]["name"],
        "engine_label": schema.engine_label(run),
        "policy": run["engine"]["policy"],
        "engine_version": run["engine"]["version"],
        "engine_commit": run["engine"]["commit"],
        "model": run["model"]["name"],
        "model_sha256": run["model"]["sha256"],
        "quant": run["model"]["quant"],
        "synthetic": int(run["model"]["synthetic"]),
        "workload": run["workload"]["name"],
        "target": run["target"]["name"],
        "target_kind": run["target"]["kind"],
        "budget_bytes": run["memory"]["budget_bytes"],
        "budget_enforced": int(run["memory"]["enforced"]),
        "n_turns": summary["n_turns"],
        "avg_ts": summary["avg_ts"],
        "stddev_ts": summary["stddev_ts"],
        "tbt_p50_ns": summary["tbt_p50_ns"],
        "tbt_p99_ns": summary["tbt_p99_ns"],
        "ttft_p50_ns": summary["ttft_p50_ns"],
        "peak_rss_bytes": summary["peak_rss_bytes"],
        "pi2_commit": run["pi2"]["commit"],
        "path": path.name,
        "file_mtime_ns": stat.st_mtime_ns,
        "file_size": stat.st_size,
    }


class Index:
    """A connection to one index file for one runs/ directory."""

    def __init__(self, path: Path, runs_dir: Path):
        self.path = Path(path)
        self.runs_dir = Path(runs_dir)
        self.warnings: list[str] = []  # from the last sync: one line per run file skipped
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self.conn = self._connect()
        except sqlite3.OperationalError:
            raise  # locked, read-only, no such directory...: a real problem, never a reason to delete
        except sqlite3.DatabaseError:
            # Not a database (truncated, overwritten): it is only derived data, so start again.
            self.path.unlink(missing_ok=True)
            self.conn = self._connect()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=60, isolation_level=None)
        conn.row_factory = sqlite3.Row
        conn.execute("PRAGMA busy_timeout = 60000")
        with _transaction(conn):
            columns = ", ".join(f"{name} {decl}" for name, decl in _COLUMNS.items())
            conn.execute(f"CREATE TABLE IF NOT EXISTS runs ({columns})")
            conn.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")
            conn.execute("CREATE INDEX IF NOT EXISTS runs_created ON runs (created_at)")
            version = conn.execute("SELECT value FROM meta WHERE key = 'index_version'").fetchone()
            if version is None:
                conn.execute("INSERT INTO meta VALUES ('index_version', ?)", (INDEX_VERSION,))
            elif version[0] != INDEX_VERSION:
                conn.execute("DROP TABLE runs")
                conn.execute(f"CREATE TABLE runs ({columns})")
                conn.execute("CREATE INDEX runs_created ON runs (created_at)")
                conn.execute("UPDATE meta SET value = ? WHERE key = 'index_version'", (INDEX_VERSION,))
        return conn

    def close(self) -> None:
        self.conn.close()

    def __enter__(self) -> "Index":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def upsert(self, run: dict, path: Path) -> None:
        row = row_for(run, path)
        names = ", ".join(row)
        marks = ", ".join("?" for _ in row)
        with _transaction(self.conn):
            self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})", tuple(row.values()))

    def sync(self) -> list[str]:
        """Bring the index in line with runs/*.json; returns one warning per file that could not be read.

        Unchanged files (same name, size and mtime) are not reread, so this costs one stat per run."""
        # Rows first, files second: a run saved in between is then seen as a new file (re-added, harmless)
        # rather than as a row without a file (deleted until the next sync).
        known = {row["path"]: (row["file_mtime_ns"], row["file_size"], row["run_id"])
                 for row in self.conn.execute("SELECT path, file_mtime_ns, file_size, run_id FROM runs")}  # fmt: skip
        files = {p.name: p for p in self.runs_dir.glob("*.json")} if self.runs_dir.is_dir() else {}
        warnings = []
        stale = [known[name][2] for name in known if name not in files]
        fresh = []
        for name, path in sorted(files.items()):
            stat = path.stat()
            if name in known and known[name][:2] == (stat.st_mtime_ns, stat.st_size):
                continue
            try:
                run = read_run_file(path)
                row = row_for(run, path)
                _check_storable(row, path)
            except Pi2Error as err:
                warnings.append(str(err.format_message()))
                if name in known:
                    stale.append(known[name][2])
                continue
            fresh.append(row)
        if stale or fresh:
            with _transaction(self.conn):
                self.conn.executemany("DELETE FROM runs WHERE run_id = ?", [(r,) for r in stale])
                for row in fresh:
                    names = ", ".join(row)
                    marks = ", ".join("?" for _ in row)
                    self.conn.execute(f"INSERT OR REPLACE INTO runs ({names}) VALUES ({marks})",
                                      tuple(row.values()))  # fmt: skip
        return warnings

    def query(
        self,
        *,
        model: str | None = None,
        engine: str | None = None,
        workload: str | None = None,
        since: str | None = None,
        status: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Rows newest first. model: case-insensitive substring; engine: name or label (pi2:dense);
        workload: exact; since: ISO time (UTC when no zone); status: ok / aborted / ..."""
        where, args = [], []
        if model:
            where.append("instr(lower(model), lower(?)) > 0")
            args.append(model)
        if engine:
            where.append("(engine = ? OR engine_label = ?)")
            args += [engine, engine]
        if workload:
            where.append("workload = ?")
            args.append(workload)
        if since:
            where.append("created_at >= ?")
            args.append(normalize_time(since))
        if status:
            where.append("status = ?")
            args.append(status)
        sql = "SELECT * FROM runs"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += " ORDER BY created_at DESC, run_id DESC"
        if limit:
            sql += f" LIMIT {int(limit)}"
        return [dict(row) for row in self.conn.execute(sql, args)]

    def find(self, ref: str) -> list[dict]:
        """Rows whose run id is `ref` or starts with it."""
        exact = self.conn.execute("SELECT * FROM runs WHERE run_id = ?", (ref,)).fetchall()
        if exact:
            return [dict(r) for r in exact]
        like = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        rows = self.conn.execute(
            "SELECT * FROM runs WHERE run_id LIKE ? ESCAPE '\\' ORDER BY run_id", (like,)
        )
        return [dict(r) for r in rows]


def _check_storable(row: dict, path: Path) -> None:
    """The schema's bounds keep every value SQLite-sized; this is the last guard, so one bad file can
    only ever be a warning, never an OverflowError that takes the whole directory down."""
    for key, value in row.items():
        if isinstance(value, int) and not -(1 << 63) <= value < (1 << 63):
            raise Pi2Error(f"{path}: {key} {value:.4g} does not fit the index")


@contextmanager
def _transaction(conn: sqlite3.Connection) -> Iterator[None]:
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def read_run_file(path: Path) -> dict:
    """Load and validate one run JSON; a bad file is a Pi2Error naming it."""
    try:
        text = Path(path).read_bytes()
    except OSError as err:
        raise Pi2Error(f"{path}: cannot read: {err.strerror or err}") from None
    if not text.strip():
        raise Pi2Error(f"{path}: empty (a save that was cut short?)")
    try:
        run = json.loads(text.decode("utf-8"))
    except json.JSONDecodeError as err:
        cut = " (truncated?)" if err.pos >= len(text.rstrip()) else ""
        raise Pi2Error(f"{path}: not JSON: {err.msg} (line {err.lineno}, column {err.colno}){cut}") from None
    except UnicodeDecodeError as err:
        raise Pi2Error(f"{path}: not UTF-8 text (byte {err.start})") from None
    except RecursionError:
        raise Pi2Error(f"{path}: JSON nested too deeply to be a run") from None
    except ValueError as err:  # e.g. an integer of more digits than Python converts
        raise Pi2Error(f"{path}: not usable JSON ({str(err)[:80]})") from None
    try:
        schema.validate(run)
    except schema.ResultSchemaError as err:
        raise schema.ResultSchemaError(f"{path}: {err.format_message()}") from None
    schema.summarize(run)  # a stored summary is never trusted over the samples it came from
    return run
